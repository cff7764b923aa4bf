"""SCIF apps: %app* sections of a definition file, and `run/exec --app NAME` (singpy.recipe.apps)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs

RECIPE = """\
Bootstrap: localimage
From: base

%post
    echo main-post > /main-post

%appinstall tool
    echo "installed in $(pwd) as $SCIF_APPNAME" > installed
    printf '#!/bin/sh\\necho tool-bin-ran\\n' > bin/tool-bin
    chmod 755 bin/tool-bin

%apprun tool
    echo "tool runs: $* $TOOL_SETTING"
    tool-bin

%appenv tool
    export TOOL_SETTING=from-appenv

%applabels tool
    Maintainer tool-people

%apphelp tool
    How to use tool.

%appfiles tool
    data.txt share/data.txt

%apprun second
    echo second runs
"""


@pytest.fixture(scope="module")
def project(workdir: Path) -> Path:
    """A directory the test user can read: the base sandbox, the definition file, a data file."""
    path = workdir / "apps-project"
    if not path.exists():
        build_busybox_rootfs(path / "base")
        (path / "apps.def").write_text(RECIPE)
        (path / "data.txt").write_text("app data\n")
        readable_by_all(path)
    return path


@pytest.fixture
def apps_sif(singpy: Singpy, project: Path, workdir: Path) -> Path:
    """The image, built once per profile into a directory that profile's user owns."""
    out = workdir / f"apps-{singpy.profile}" / "apps.sif"
    if not out.exists():
        out.parent.mkdir(exist_ok=True)
        os.chown(out.parent, singpy.uid, singpy.gid)
        singpy.ok("build", str(out), "apps.def", cwd=project, timeout=120)
    return out


def test_run_app_runs_its_runscript_with_its_environment_and_bin(singpy: Singpy, apps_sif: Path) -> None:
    out = singpy.ok("run", "--app", "tool", str(apps_sif), "a", "b")
    assert out.splitlines() == ["tool runs: a b from-appenv", "tool-bin-ran"]
    assert singpy.ok("run", "--app", "second", str(apps_sif)) == "second runs\n"
    assert singpy.ok("run", str(apps_sif), env=singpy.env(APPTAINER_APP="second")) == "second runs\n"


def test_appinstall_ran_in_post_in_the_app_directory(singpy: Singpy, apps_sif: Path) -> None:
    out = singpy.ok("exec", str(apps_sif), "cat", "/main-post", "/scif/apps/tool/installed",
                    "/scif/apps/tool/share/data.txt")
    assert out.splitlines() == ["main-post", "installed in /scif/apps/tool as tool", "app data"]


def test_exec_app_sets_scif_variables(singpy: Singpy, apps_sif: Path) -> None:
    script = 'echo "$SCIF_APPNAME $SCIF_APPROOT $SCIF_APPDATA $SCIF_APPROOT_second $SINGULARITY_APPNAME"'
    out = singpy.ok("exec", "--app", "tool", str(apps_sif), "sh", "-c", script)
    assert out.split() == ["tool", "/scif/apps/tool", "/scif/data/tool", "/scif/apps/second", "tool"]
    assert singpy.ok("exec", str(apps_sif), "sh", "-c", "test -d /scif/data/tool/input && echo data-dirs") == (
        "data-dirs\n")


def test_app_metadata(singpy: Singpy, apps_sif: Path) -> None:
    labels = json.loads(singpy.ok("exec", str(apps_sif), "cat", "/scif/apps/tool/scif/labels.json"))
    assert labels == {"SCIF_APP_NAME": "tool", "Maintainer": "tool-people"}
    assert "How to use tool." in singpy.ok("exec", str(apps_sif), "cat", "/scif/apps/tool/scif/runscript.help")


def test_an_app_the_image_lacks_is_one_fatal(singpy: Singpy, apps_sif: Path) -> None:
    assert_one_fatal(singpy.run("run", "--app", "missing", str(apps_sif)), "no runscript for contained app: missing")


def test_an_app_name_that_is_a_path_is_refused_with_its_line(singpy: Singpy, project: Path) -> None:
    recipe = project / "bad.def"
    recipe.write_text("Bootstrap: localimage\nFrom: base\n\n%apprun ../../etc\n    true\n")
    recipe.chmod(0o644)
    result = singpy.run("build", "/nonexistent-dir-is-never-reached/out.sif", str(recipe), cwd=project)
    assert_one_fatal(result, f"{recipe}:4: %apprun needs an app name")

"""`singpy test` (the image's %test), `singpy run-help` (its %help) and `inspect --list-apps`, as Apptainer 1.5."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces
from tests.support.sifs import SINGPY

TEST_SCRIPT = '#!/bin/sh\necho "testing $*"\n[ -e /mnt/mark ] && cat /mnt/mark\nexit 3\n'
APPS = {"foo": {"test": "#!/bin/sh\necho foo tested\n", "runscript.help": "Help of foo.\n"},
        "bar": {}}


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.fixture(scope="module")
def tested_images(workdir: Path) -> dict[str, Path]:
    """One image with a %test, a %help and two SCIF apps (foo with a test and help, bar bare): sandbox and SIF."""
    root = workdir / "tested-sandbox"
    if not root.exists():
        build_busybox_rootfs(root)
        _write(root / ".singularity.d" / "test", TEST_SCRIPT, 0o755)
        _write(root / ".singularity.d" / "runscript.help", "Usage: run me\n\twith a tab\x1b[31m\n")
        for app, files in APPS.items():
            (root / "scif" / "apps" / app / "scif").mkdir(parents=True)
            for name, text in files.items():
                _write(root / "scif" / "apps" / app / "scif" / name, text, 0o755)
        (root / "scif" / "apps" / "not-an-app").mkdir()  # no scif/ inside: Apptainer does not list it
        readable_by_all(root)
    sif = workdir / "tested.sif"
    if not sif.exists():
        subprocess.run([SINGPY, "-q", "build", str(sif), str(root)], check=True)
        sif.chmod(0o644)
    return {"sandbox": root, "sif": sif}


@pytest.fixture(params=["sandbox", "sif"])
def tested(request: pytest.FixtureRequest, tested_images: dict[str, Path]) -> Path:
    return tested_images[request.param]


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    import os

    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def test_test_runs_the_test_script_and_exits_with_its_status(singpy: Singpy, tested: Path) -> None:
    result = singpy.run("test", str(tested), "one", "two")
    assert result.returncode == 3, result.stderr
    assert result.stdout == "testing one two\n"


def test_test_takes_the_action_flags(singpy: Singpy, tested: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "test-bind")
    (source / "mark").write_text("bound\n")
    result = singpy.run("test", "--contain", "-B", f"{source}:/mnt", str(tested))
    assert result.returncode == 3, result.stderr
    assert result.stdout == "testing \nbound\n"


@pytest.mark.parametrize("isolation", [[], ["--containall"]])
def test_test_without_a_test_script_succeeds_saying_so(singpy: Singpy, image: Path, isolation: list[str]) -> None:
    result = singpy.run("test", *isolation, str(image))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "No test script found in container, exiting" in result.stderr
    assert singpy.run("-q", "test", *isolation, str(image)).stderr == ""  # an INFO line: -q hides it


def test_test_of_an_app(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("test", "--app", "foo", str(tested)) == "foo tested\n"
    assert_one_fatal(singpy.run("test", "--app", "bar", str(tested)), "No tests for contained app: bar")


def test_test_needs_an_image(singpy: Singpy) -> None:
    assert_one_fatal(singpy.run("test"), "singpy test needs an IMAGE", code=1)


def test_run_help_shows_the_help_escaped(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("run-help", str(tested)) == "Usage: run me\n\twith a tab\\x1b[31m\n\n"


def test_run_help_of_an_app(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("run-help", "--app", "foo", str(tested)) == "Help of foo.\n\n"
    assert singpy.ok("run-help", "--app", "bar", str(tested)) == "No help sections were defined for this image\n"


def test_run_help_without_help(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("run-help", str(image)) == "No help sections were defined for this image\n"


@pytest.mark.parametrize("app", ["../foo", "foo/../../etc"])
def test_run_help_refuses_an_app_name_that_is_a_path(singpy: Singpy, tested: Path, app: str) -> None:
    assert_one_fatal(singpy.run("run-help", "--app", app, str(tested)), "invalid app name", code=1)


def test_inspect_list_apps(singpy: Singpy, tested: Path, image: Path) -> None:
    before = traces(tested)
    assert singpy.ok("inspect", "--list-apps", str(tested)) == "bar\nfoo\n"
    assert singpy.ok("inspect", "--list-apps", str(image)) == ""
    assert settled(before, tested) == before  # the unpacked apps of a SIF are gone from TMPDIR


def test_test_run_help_and_list_apps_leave_nothing(singpy: Singpy, tested: Path) -> None:
    before = traces(tested)
    singpy.run("test", str(tested))
    singpy.ok("run-help", "--app", "foo", str(tested))
    singpy.run("run-help", "--app", "../x", str(tested))
    assert settled(before, tested) == before


def test_a_test_script_leading_out_of_the_image_is_refused(singpy: Singpy, workdir: Path) -> None:
    """A link to a host file (which exists outside, not inside) never runs the host's file."""
    host_script = workdir / "host-test-script"
    _write(host_script, "#!/bin/sh\necho host script ran\n", 0o755)
    root = workdir / f"linked-test-{singpy.profile}"
    if not root.exists():
        build_busybox_rootfs(root)
        (root / ".singularity.d" / "test").symlink_to(host_script)
        readable_by_all(root)
    result = singpy.run("test", str(root))
    assert_one_fatal(result, "can't run the image's /.singularity.d/test: it is a link to")
    assert "host script ran" not in result.stdout


RECIPE = """Bootstrap: localimage
From: {base}

%help
    Built with a help section.

%test
    echo "recipe test $*"
    exit 7

%apprun tool
    echo running tool

%apphelp tool
    Help of the tool app.

%apptest tool
    echo tool tested

%apprun other
    echo running other
"""


@pytest.fixture(scope="module")
def built_sif(workdir: Path) -> Path:
    """An image `singpy build` made from a definition file with %help, %test and two SCIF apps (--notest: its
    %test fails on purpose, to show that `singpy test` returns its status)."""
    out = workdir / "recipe-apps.sif"
    if not out.exists():
        base = build_busybox_rootfs(workdir / "recipe-apps-base", runscript=None)
        recipe = workdir / "recipe-apps.def"
        recipe.write_text(RECIPE.format(base=base))
        subprocess.run([SINGPY, "-q", "build", "--notest", str(out), str(recipe)], check=True, capture_output=True)
        out.chmod(0o644)
    return out


def test_a_built_image_sections(singpy: Singpy, built_sif: Path) -> None:
    result = singpy.run("test", str(built_sif), "a", "b")
    assert (result.returncode, result.stdout) == (7, "recipe test a b\n"), result.stderr
    assert singpy.ok("test", "--app", "tool", str(built_sif)) == "tool tested\n"
    assert_one_fatal(singpy.run("test", "--app", "other", str(built_sif)), "No tests for contained app: other")
    assert singpy.ok("inspect", "--list-apps", str(built_sif)) == "other\ntool\n"
    assert "Built with a help section." in singpy.ok("run-help", str(built_sif))
    assert "Help of the tool app." in singpy.ok("run-help", "--app", "tool", str(built_sif))


def test_an_app_without_the_script_falls_back_to_the_test_of_an_app_named_singularity(
        singpy: Singpy, workdir: Path) -> None:
    """Apptainer's action script: `run --app` and `test --app` of an app without that script run
    /scif/apps/singularity/scif/test if it is executable (else the error of the tests above)."""
    root = workdir / "scif-fallback"
    if not root.exists():
        build_busybox_rootfs(root / "tree")
        _write(root / "tree" / "scif" / "apps" / "singularity" / "scif" / "test", '#!/bin/sh\necho "fallback $*"\n',
               0o755)
        (root / "tree" / "scif" / "apps" / "plain" / "scif").mkdir(parents=True)
        readable_by_all(root)
    for action in ("run", "test"):
        result = singpy.run(action, "--app", "plain", str(root / "tree"), "x")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "fallback x\n"

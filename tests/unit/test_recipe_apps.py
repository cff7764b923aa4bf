"""SCIF apps laid out as Apptainer lays them out (singpy.recipe.apps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from singpy.recipe import apps
from singpy.recipe.deffile import DefinitionError, parse

RECIPE = """Bootstrap: scratch

%apprun b-app
    echo b
%appinstall a.app
    make install
%applabels a.app
    Version 2
%appenv a.app
    export A=1
"""


def test_apps_in_order_of_first_appearance_and_their_sections() -> None:
    stage = parse(RECIPE, "r.def").stages[0]
    assert apps.app_names(stage, "r.def") == ["b-app", "a.app"]
    assert apps.app_script(stage, "appinstall", "a.app").strip() == "make install"
    post = apps.post_script(stage, ["b-app", "a.app"])
    assert ". /scif/apps/a.app/scif/env/01-base.sh\n\ncd /scif/apps/a.app\n    make install\n" in post
    assert post.count("cd /\n") == 4


@pytest.mark.parametrize("args", ["../etc", "/abs", ".hidden", "a/b"])
def test_an_app_name_must_be_one_plain_directory_name(args: str) -> None:
    stage = parse(f"Bootstrap: scratch\n\n%apprun {args}\n    true\n", "r.def").stages[0]
    with pytest.raises(DefinitionError, match="r.def:3: %apprun needs an app name"):
        apps.app_names(stage, "r.def")


def test_install_writes_the_app_tree_and_the_global_exports(tmp_path: Path) -> None:
    stage = parse(RECIPE, "r.def").stages[0]
    apps.install(str(tmp_path), stage, ["b-app", "a.app"], cwd=str(tmp_path))
    meta = tmp_path / "scif/apps/a.app/scif"
    assert json.loads((meta / "labels.json").read_text()) == {"SCIF_APP_NAME": "a.app", "Version": "2"}
    assert (meta / "env/90-environment.sh").read_text().strip() == "export A=1"
    assert "SCIF_APPNAME=a.app\n" in (meta / "env/01-base.sh").read_text()
    assert (tmp_path / "scif/apps/b-app/scif/runscript").read_text() == "#!/bin/sh\n\n    echo b\n\n"
    assert (tmp_path / "scif/data/b-app/output").is_dir() and (tmp_path / "scif/apps/b-app/bin").is_dir()
    exports = (tmp_path / ".singularity.d/env/94-appsbase.sh").read_text()
    assert "SCIF_APPROOT_a_app=/scif/apps/a.app\n" in exports  # a name's dots become _ in variable names
    assert 'export SCIF_APPENV_a_app="/scif/apps/a.app/scif/env/90-environment.sh"' in exports
    assert 'export SCIF_APPRUN_b_app="/scif/apps/b-app/scif/runscript"' in exports
    assert "SCIF_APPRUN_a_app" not in exports


def test_a_link_in_the_image_cannot_send_app_files_to_the_host(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "scif").symlink_to(outside)  # absolute: inside the image it means /tmp/.../outside, under the root
    apps.install(str(root), parse(RECIPE, "r.def").stages[0], ["b-app"], cwd=str(tmp_path))
    assert list(outside.iterdir()) == []
    assert (root / str(outside).lstrip("/") / "apps/b-app/scif/runscript").is_file()

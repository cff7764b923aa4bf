"""`inspect --app NAME`: the app's own labels, scripts, help and environment (/scif/apps/NAME/scif), as Apptainer's
inspect reads them in place of /.singularity.d, for a sandbox and a SIF made of it, as root and as the test user;
and the order Apptainer prints several sections in (labels last)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.app_images import with_sif, write_file
from tests.support.images import build_busybox_rootfs

FOO = {"runscript": "#!/bin/sh\necho foo runs\n", "runscript.help": "Help of foo.\n", "startscript": "",
       "labels.json": '{"APP": "foo", "SHOWN": "a\\u001b[31m"}\n', "env/90-environment.sh": "export FOO=1\n",
       "env/10-docker2singularity.sh": "export DOCKER=1\n"}  # an app's 10-docker*: not read (Apptainer's)


@pytest.fixture(scope="module")
def app_images(workdir: Path) -> dict[str, Path]:
    root = workdir / "inspect-app-sandbox"
    if not root.exists():
        build_busybox_rootfs(root)
        (root / ".singularity.d/labels.json").write_text('{"IMAGE": "label"}')
        for name, text in FOO.items():
            write_file(root / "scif/apps/foo/scif" / name, text)
        (root / "scif/apps/bar/scif").mkdir(parents=True)
        readable_by_all(root)
    return with_sif(root, workdir / "inspect-app.sif")


@pytest.fixture(params=["sandbox", "sif"])
def image(request: pytest.FixtureRequest, app_images: dict[str, Path]) -> str:
    return str(app_images[request.param])


def test_the_apps_sections_in_apptainers_order(singpy: Singpy, image: str) -> None:
    assert singpy.ok("inspect", "--app", "foo", image) == "APP: foo\nSHOWN: a\\x1b[31m\n"  # labels by default
    assert singpy.ok("inspect", "--app", "foo", "-l", "-e", "-H", "-r", "-s", image) == (
        "#!/bin/sh\necho foo runs\nHelp of foo.\n=== /scif/apps/foo/scif/env/90-environment.sh ===\nexport FOO=1\n\n"
        "APP: foo\nSHOWN: a\\x1b[31m\n")
    assert singpy.ok("inspect", "--app", "bar", "-l", "-r", image) == ""  # an app with none of them
    assert singpy.ok("inspect", "--app", "nope", "-r", image) == ""  # no such app: nothing, as Apptainer


def test_the_apps_json_document(singpy: Singpy, image: str) -> None:
    def attributes(*args: str) -> object:
        document = json.loads(singpy.ok("inspect", "--json", *args, image))
        assert document["type"] == "container"
        return document["data"]["attributes"]

    assert attributes("--app", "foo", "-r", "-e") == {"apps": {"foo": {
        "runscript": "#!/bin/sh\necho foo runs",
        "environment": {"/scif/apps/foo/scif/env/90-environment.sh": "export FOO=1"}}}}
    assert attributes("--app", "bar") == {"apps": {"bar": {}}}
    assert attributes("--app", "nope") == {}
    assert attributes("--all", "--app", "foo") == attributes("--all")  # --all: every app, as Apptainer


def test_without_app_labels_come_last(singpy: Singpy, image: str) -> None:
    shown = singpy.ok("inspect", "-l", "-r", image)
    runscript_end = shown.index('echo "args:     $*"\n') + len('echo "args:     $*"\n')
    assert shown.startswith("#!/bin/sh\n") and "IMAGE: label\n" in shown[runscript_end:]


def test_an_app_name_that_is_not_one_directory_is_refused(singpy: Singpy, image: str) -> None:
    assert_one_fatal(singpy.run("inspect", "--app", "../foo", image), "invalid app name '../foo'", code=1)

"""The images of the `singpy test`, `run-help` and `inspect --list-apps` tests (tests/integration/test_test_runhelp.py,
test_inspect_apps.py): `tested_images`, one image with a %test, a %help and two SCIF apps, as a sandbox and a SIF
(`tested`: each in turn), and `built_sif`, built by `singpy build` from a definition file with %help, %test and two
apps; `write_file` writes a file of such an image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.sifs import SINGPY

TEST_SCRIPT = '#!/bin/sh\necho "testing $*"\n[ -e /mnt/mark ] && cat /mnt/mark\nexit 3\n'
APPS = {"foo": {"test": "#!/bin/sh\necho foo tested\n", "runscript.help": "Help of foo.\n"},
        "bar": {}}


def write_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.fixture(scope="module", name="tested_images")
def fixture_tested_images(workdir: Path) -> dict[str, Path]:
    """One image with a %test, a %help and two SCIF apps (foo with a test and help, bar bare): sandbox and SIF."""
    root = workdir / "tested-sandbox"
    if not root.exists():
        build_busybox_rootfs(root)
        write_file(root / ".singularity.d" / "test", TEST_SCRIPT, 0o755)
        write_file(root / ".singularity.d" / "runscript.help", "Usage: run me\n\twith a tab\x1b[31m\n")
        for app, files in APPS.items():
            (root / "scif" / "apps" / app / "scif").mkdir(parents=True)
            for name, text in files.items():
                write_file(root / "scif" / "apps" / app / "scif" / name, text, 0o755)
        (root / "scif" / "apps" / "not-an-app").mkdir()  # no scif/ inside: Apptainer does not list it
        readable_by_all(root)
    return with_sif(root, workdir / "tested.sif")


def with_sif(sandbox: Path, sif: Path) -> dict[str, Path]:
    """The sandbox and a SIF `singpy build` makes of it (once), as {"sandbox": ..., "sif": ...}."""
    if not sif.exists():
        subprocess.run([SINGPY, "-q", "build", str(sif), str(sandbox)], check=True)
        sif.chmod(0o644)
    return {"sandbox": sandbox, "sif": sif}


@pytest.fixture(params=["sandbox", "sif"], name="tested")
def fixture_tested(request: pytest.FixtureRequest, tested_images: dict[str, Path]) -> Path:
    return tested_images[request.param]


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


@pytest.fixture(scope="module", name="built_sif")
def fixture_built_sif(workdir: Path) -> Path:
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

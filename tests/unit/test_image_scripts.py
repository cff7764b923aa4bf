"""singpy.image.scripts: the image's env scripts and runscript, found in the image alone (real trees)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.constants import ENV_DIR, RUNSCRIPT
from singpy.errors import ImageError
from singpy.image.scripts import ImageScripts, find_scripts
from singpy.mounts.rootpath import Tree


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "image"
    (base / ".singularity.d" / "env").mkdir(parents=True)
    (base / "opt" / "env").mkdir(parents=True)
    (base / "tmp").mkdir()
    return base


@pytest.fixture
def image(root: Path) -> Iterator[Tree]:
    with Tree(str(root)) as tree:
        yield tree


def write(root: Path, guest: str, text: str = "export A=1\n") -> Path:
    path = root / guest.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def never(_path: str) -> bool:
    return False


def test_env_scripts_in_name_order_through_links(root: Path, image: Tree) -> None:
    write(root, f"{ENV_DIR}/90-environment.sh")
    write(root, f"{ENV_DIR}/01-base.sh")
    write(root, "/opt/env/real.sh")
    os.symlink("/opt/env/real.sh", root / ENV_DIR.lstrip("/") / "50-linked.sh")
    write(root, f"{ENV_DIR}/README")  # not *.sh: not an env script
    found = find_scripts(image, covered=never, runscript=None)
    assert found == ImageScripts(env=(f"{ENV_DIR}/01-base.sh", "/opt/env/real.sh", f"{ENV_DIR}/90-environment.sh"))


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling", "loop"])
def test_env_scripts_that_are_not_files_are_skipped(root: Path, image: Tree, kind: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = root / ENV_DIR.lstrip("/") / "10-odd.sh"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling":
        os.symlink("/dev/zero", path)  # the image has no /dev/zero: nothing to source, as `[ -f ]` says
    else:
        os.symlink("10-odd.sh", path)
    assert find_scripts(image, covered=never, runscript=None).env == ()
    said = capsys.readouterr().err
    assert ("10-odd.sh" in said) is (kind != "dangling")


def test_env_script_leading_to_a_covered_path_is_skipped(root: Path, image: Tree,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    write(root, "/tmp/x.sh")  # in the image, but the container's /tmp is the host's
    os.symlink("/tmp/x.sh", root / ENV_DIR.lstrip("/") / "90-x.sh")
    found = find_scripts(image, covered=lambda path: path == "/tmp" or path.startswith("/tmp/"), runscript=None)
    assert found.env == ()
    assert "leads to /tmp/x.sh, which the container does not take from the image" in capsys.readouterr().err


def test_env_script_with_a_name_a_shell_would_split_is_skipped(root: Path, image: Tree) -> None:
    write(root, f"{ENV_DIR}/90 two words.sh")
    write(root, f"{ENV_DIR}/91-glob*.sh")
    assert find_scripts(image, covered=never, runscript=None).env == ()


def test_huge_env_script_is_refused(root: Path, image: Tree) -> None:
    path = write(root, f"{ENV_DIR}/90-huge.sh", "")
    os.truncate(path, (16 << 20) + 1)  # sparse: no disk used
    with pytest.raises(ImageError, match="too large"):
        find_scripts(image, covered=never, runscript=None)


def test_runscript_found_through_a_link_inside_the_image(root: Path, image: Tree) -> None:
    write(root, "/opt/run.sh", "#!/bin/sh\n")
    os.symlink("../opt/run.sh", root / RUNSCRIPT.lstrip("/"))
    assert find_scripts(image, covered=never, runscript=RUNSCRIPT).runscript == "/opt/run.sh"
    assert find_scripts(image, covered=never, runscript=None).runscript is None


def test_no_runscript(image: Tree) -> None:
    assert find_scripts(image, covered=never, runscript=RUNSCRIPT).runscript is None


@pytest.mark.parametrize(("kind", "message"), [
    ("dangling", "is a link to /etc/shadow, which is not in the image"),
    ("fifo", "is a FIFO, not a regular file"),
    ("covered", "leads to /tmp/run.sh, which the container does not take from the image"),
])
def test_runscript_out_of_the_image_is_refused(root: Path, image: Tree, kind: str, message: str) -> None:
    path = root / RUNSCRIPT.lstrip("/")
    if kind == "dangling":
        os.symlink("/etc/shadow", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        write(root, "/tmp/run.sh")
        os.symlink("/tmp/run.sh", path)
    with pytest.raises(ImageError, match=message):
        find_scripts(image, covered=lambda path: path.startswith("/tmp/"), runscript=RUNSCRIPT)


def test_an_app_has_its_own_runscript(tmp_path: Path) -> None:
    from singpy.image.scripts import runscript_path

    script = tmp_path / "scif/apps/tool/scif/runscript"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    with Tree(str(tmp_path)) as image:
        assert find_scripts(image, covered=never, runscript=runscript_path("tool")).runscript == (
            "/scif/apps/tool/scif/runscript")
        assert find_scripts(image, covered=never, runscript=runscript_path("other")).runscript is None
    assert runscript_path("") == RUNSCRIPT

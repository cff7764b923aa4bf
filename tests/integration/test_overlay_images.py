"""`singpy overlay create` and ext3 overlay images used with --overlay / --writable, as root and as the user.

As root an image is mounted with the kernel's ext3 on a loop device; as the
user (and as root with --fakeroot) with fuse2fs, which needs /dev/fuse open
to users (simulated by tests.support.hostsim where the host differs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.swapping import run_swapping


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A directory of this test owned by the profile's user (the images it creates go there)."""
    path = workdir / "overlay-images" / f"{singpy.profile}-{request.node.name}"
    path.mkdir(parents=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _owner(image: Path, path: str) -> tuple[int, int, str]:
    """(uid, gid, mode) of `path` inside the ext3 `image`, read by debugfs (no mount)."""
    out = subprocess.run(["debugfs", "-R", f"stat {path}", str(image)], capture_output=True, text=True,
                         check=True).stdout
    fields = out.split()
    uid = int(fields[fields.index("User:") + 1])
    gid = int(fields[fields.index("Group:") + 1])
    mode = fields[fields.index("Mode:") + 1]
    return uid, gid, mode


def _sif_copy(singpy: Singpy, workdir: Path, place: Path, name: str = "image.sif") -> Path:
    target = place / name
    shutil.copyfile(sifs.siftool_sif(workdir), target)
    os.chown(target, singpy.uid, singpy.gid)
    return target


def test_create_makes_an_ext3_layout_owned_by_the_user(singpy: Singpy, place: Path) -> None:
    image = place / "overlay.img"
    singpy.ok("overlay", "create", "--create-dir", "/usr/local/data", str(image))
    header = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True).stdout
    assert "has_journal" in header  # ext3
    assert image.stat().st_size == 64 << 20
    assert (image.stat().st_uid, image.stat().st_mode & 0o777) == (singpy.uid, 0o600)
    for path in ("/upper", "/work", "/upper/usr/local/data"):
        uid, gid, _ = _owner(image, path)
        assert (uid, gid) == (singpy.uid, singpy.gid), path


def test_fakeroot_layout_belongs_to_root(singpy: Singpy, place: Path) -> None:
    image = place / "fakeroot.img"
    singpy.ok("overlay", "create", "--fakeroot", str(image))
    assert image.stat().st_uid == singpy.uid
    assert _owner(image, "/upper")[:2] == (0, 0)
    assert _owner(image, "/work")[:2] == (0, 0)


def test_size_and_sparse(singpy: Singpy, place: Path) -> None:
    full, sparse = place / "full.img", place / "sparse.img"
    singpy.ok("overlay", "create", "--size", "96", str(full))
    singpy.ok("overlay", "create", "--size", "128", "--sparse", str(sparse))
    assert full.stat().st_size == 96 << 20 and sparse.stat().st_size == 128 << 20
    assert full.stat().st_blocks * 512 >= 96 << 20  # every block allocated
    assert sparse.stat().st_blocks * 512 < 32 << 20  # only what mkfs wrote


def test_refusals_leave_nothing(singpy: Singpy, place: Path) -> None:
    image = place / "overlay.img"
    assert_one_fatal(singpy.run("overlay", "create", "--size", "1", str(image)), "64 MiB")
    singpy.ok("overlay", "create", str(image))
    before = image.read_bytes()
    assert_one_fatal(singpy.run("overlay", "create", str(image)), "already exists")
    assert image.read_bytes() == before
    other = place / "notes.txt"
    other.write_text("keep me\n")
    assert_one_fatal(singpy.run("overlay", "create", str(other)), "not a SIF image")
    assert other.read_text() == "keep me\n"
    assert_one_fatal(singpy.run("overlay", "create", "--create-dir", "../escape", str(place / "x.img")),
                     "outside of overlay layout")
    assert sorted(p.name for p in place.iterdir()) == ["notes.txt", "overlay.img"]  # no temporary file left


@pytest.mark.parametrize("sparse", [(), ("--sparse",)])
def test_size_past_a_file_offset_is_one_fatal(singpy: Singpy, place: Path, sparse: tuple[str, ...]) -> None:
    """2**63 bytes and more: no file can be that large (no traceback from the size's arithmetic)."""
    image = place / "huge.img"
    assert_one_fatal(singpy.run("overlay", "create", *sparse, "--size", "10000000000000", str(image)),
                     "image size of 10000000000000 MiB is too large")
    assert_one_fatal(singpy.run("overlay", "create", *sparse, "--size", str(1 << 43), str(image)),
                     "is too large")
    assert list(place.iterdir()) == []


def test_sif_gets_one_overlay_partition(singpy: Singpy, workdir: Path, place: Path) -> None:
    image = _sif_copy(singpy, workdir, place)
    size = image.stat().st_size
    singpy.ok("overlay", "create", str(image))
    listing = subprocess.run(["siftool", "list", str(image)], capture_output=True, text=True, check=True).stdout
    assert "FS (Ext3/Overlay/amd64)" in listing
    assert "FS (Squashfs/*System/amd64)" in listing
    grown = image.read_bytes()
    assert len(grown) >= size + (64 << 20)
    assert_one_fatal(singpy.run("overlay", "create", str(image)), "already exists")
    assert image.read_bytes() == grown
    assert sorted(p.name for p in place.iterdir()) == ["image.sif"]


def _persist(singpy: Singpy, image: str, overlay: str, *flags: str) -> None:
    singpy.ok("exec", *flags, "--overlay", overlay, image, "/bin/sh", "-c", "echo kept > /kept; mkdir -p /new/dir")
    out = singpy.ok("exec", *flags, "--overlay", f"{overlay}:ro", image, "/bin/sh", "-c",
                    "cat /kept; ls -d /new/dir; touch /nope 2>/dev/null || echo read-only")
    assert out.split() == ["kept", "/new/dir", "read-only"]


def test_overlay_image_persists(singpy: Singpy, workdir: Path, place: Path, fuse_open: str) -> None:
    """Root: kernel ext3 on a loop device; the user: fuse2fs."""
    image = place / "overlay.img"
    singpy.ok("overlay", "create", str(image))
    _persist(singpy, str(_sif_copy(singpy, workdir, place)), str(image))
    check = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout  # fuse2fs was stopped cleanly: the image is consistent


def test_fakeroot_overlay_persists(singpy: Singpy, workdir: Path, place: Path, fuse_open: str) -> None:
    image = place / "fakeroot.img"
    singpy.ok("overlay", "create", "--fakeroot", str(image))
    _persist(singpy, str(_sif_copy(singpy, workdir, place)), str(image), "--fakeroot")


def test_writable_sif_partition(singpy: Singpy, workdir: Path, place: Path, fuse_open: str) -> None:
    image = _sif_copy(singpy, workdir, place)
    singpy.ok("overlay", "create", str(image))
    singpy.ok("exec", "--writable", str(image), "/bin/sh", "-c", "echo in-sif > /in-sif")
    assert singpy.ok("exec", str(image), "cat", "/in-sif") == "in-sif\n"


def test_every_launch_of_a_job_array_keeps_its_write(singpy: Singpy, workdir: Path, place: Path,
                                                     fuse_open: str) -> None:
    """Launch after launch (a job array's tasks, one at a time) appends to the SIF's overlay: every line is
    there at the end."""
    image = _sif_copy(singpy, workdir, place)
    singpy.ok("overlay", "create", str(image))
    for number in range(8):
        singpy.ok("exec", "--writable", str(image), "/bin/sh", "-c", f"echo {number} >> /lines")
    assert singpy.ok("exec", str(image), "cat", "/lines").split() == [str(number) for number in range(8)]


def test_user_without_fuse_gets_one_fatal(as_user: Singpy, workdir: Path, fuse_closed: str) -> None:
    place = workdir / "overlay-images" / "user-fuse-closed"
    place.mkdir(parents=True)
    os.chown(place, as_user.uid, as_user.gid)
    image = place / "overlay.img"
    as_user.ok("overlay", "create", str(image))
    result = as_user.run("exec", "--overlay", str(image), str(sifs.siftool_sif(workdir)), "true")
    assert_one_fatal(result, "FUSE is not usable")


def test_not_ext3_is_one_fatal(singpy: Singpy, workdir: Path, place: Path) -> None:
    bogus = place / "bogus.img"
    bogus.write_bytes(b"\0" * (2 << 20))
    os.chown(bogus, singpy.uid, singpy.gid)
    result = singpy.run("exec", "--overlay", str(bogus), str(sifs.siftool_sif(workdir)), "true")
    assert result.returncode == 255 and "Traceback" not in result.stderr
    assert result.stderr.startswith("FATAL:") and "ext3" in result.stderr.splitlines()[0]


def test_image_in_use_for_writing_is_refused(singpy: Singpy, workdir: Path, place: Path, fuse_open: str) -> None:
    image = place / "overlay.img"
    singpy.ok("overlay", "create", str(image))
    sif = str(_sif_copy(singpy, workdir, place))
    first = singpy.popen(["exec", "--overlay", str(image), sif, "/bin/sh", "-c", "echo up; read line"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert first.stdout is not None and first.stdout.readline() == "up\n"
    assert_one_fatal(singpy.run("exec", "--overlay", str(image), sif, "true"), "in use")
    out, _ = first.communicate("\n", timeout=30)
    assert first.returncode == 0
    singpy.ok("exec", "--overlay", str(image), sif, "true")  # free again once the first has ended


# A file swapped in at the image's path after singpy checked it, before it is mounted (a race its owner could
# run against root's launch), made deterministic: a wrapper runs singpy's own main with the module's `attach`
# wrapped to do the rename first. What this shows: the mounted file is the one checked (and locked); what it
# can't show: the window between the path's detection (image.detect, the ECL) and `choose`'s open.
def _cat(image: Path, path: str) -> str:
    return subprocess.run(["debugfs", "-R", f"cat {path}", str(image)], capture_output=True, text=True).stdout


def test_overlay_image_swapped_after_the_check_is_not_mounted(singpy: Singpy, workdir: Path, place: Path,
                                                               fuse_open: str) -> None:
    """Root (loop device) and the user (fuse2fs): the container writes into the image checked, not the one
    renamed over its path before the mount."""
    image, other, kept = place / "ov.img", place / "other.img", place / "ov.keep"
    singpy.ok("overlay", "create", str(image))
    singpy.ok("overlay", "create", str(other))
    os.link(image, kept)  # the checked file, under a second name
    sif = str(_sif_copy(singpy, workdir, place))
    result = run_swapping(singpy, place, "extfs", other, image,
                           "exec", "--overlay", str(image), sif, "/bin/sh", "-c", "echo mine > /written")
    assert result.returncode == 0, result.stderr
    assert _cat(kept, "/upper/written") == "mine\n"
    assert _cat(image, "/upper/written") == ""  # the file swapped in is untouched


def test_sif_swapped_after_the_check_is_not_mounted(singpy: Singpy, workdir: Path, place: Path,
                                                     fuse_open: str) -> None:
    """Root (loop device) and the user (squashfuse): the SIF checked is mounted, not junk renamed over it."""
    sif = _sif_copy(singpy, workdir, place)
    junk = place / "junk"
    junk.write_bytes(b"\0" * sif.stat().st_size)
    os.chown(junk, singpy.uid, singpy.gid)
    result = run_swapping(singpy, place, "squashfs", junk, sif, "exec", str(sif), "echo", "ran")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr

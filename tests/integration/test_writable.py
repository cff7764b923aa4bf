"""--writable: the image itself is written (a sandbox), or refused where it can't be (SIF without partition)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.images import build_busybox_rootfs, tree_digest
from tests.support.leftovers import traces


def own_sandbox(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A fresh busybox sandbox owned by the profile's user, with their home in it (a sandbox they built)."""
    root = workdir / f"{name}-{singpy.profile}"
    subprocess.run(["rm", "-rf", str(root)], check=True)
    build_busybox_rootfs(root)
    (root / singpy.home.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "srv").mkdir()
    (root / "srv" / "kept").write_text("image file\n")
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(root)], check=True)
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_writes_persist_in_the_sandbox(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable")
    before = traces(image)
    out = singpy.ok("exec", "--writable", str(image), "sh", "-c",
                    "echo persisted > /opt/new && mkdir /srv/made && rm /srv/kept && cat /opt/new")
    assert out == "persisted\n"
    assert (image / "opt" / "new").read_text() == "persisted\n"
    assert (image / "srv" / "made").is_dir()
    assert not (image / "srv" / "kept").exists()
    assert (image / "opt" / "new").stat().st_uid == singpy.uid
    # A later run, read-only this time, sees the change: it is in the image.
    assert singpy.ok("exec", str(image), "cat", "/opt/new") == "persisted\n"
    assert traces(image) == before


def test_short_flag_and_environment(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable-env")
    singpy.ok("exec", "-w", str(image), "touch", "/opt/short")
    for prefix in ("SINGULARITY", "APPTAINER", "SINGPY"):
        singpy.ok("exec", str(image), "touch", f"/opt/{prefix}", env=singpy.env(**{f"{prefix}_WRITABLE": "1"}))
    assert sorted(os.listdir(image / "opt")) == ["APPTAINER", "SINGPY", "SINGULARITY", "short"]


def test_identity_files_are_bound_never_written(singpy: Singpy, workdir: Path) -> None:
    """The user's passwd entry is bound over the image's file; root writing its image gets none (as Apptainer)."""
    image = own_sandbox(singpy, workdir, "writable-passwd")
    passwd, group = (image / "etc" / "passwd").read_bytes(), (image / "etc" / "group").read_bytes()
    inside = singpy.ok("exec", "-w", str(image), "cat", "/etc/passwd")
    if singpy.uid == 0:
        assert inside.encode() == passwd
    else:
        assert f"{singpy.user}:x:{singpy.uid}:{singpy.gid}:" in inside
        result = singpy.run("exec", "-w", str(image), "sh", "-c", "echo intruder >> /etc/passwd")
        assert result.returncode != 0
    assert (image / "etc" / "passwd").read_bytes() == passwd
    assert (image / "etc" / "group").read_bytes() == group


def test_missing_bind_destination_is_one_fatal(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable-missing")
    source = workdir / "writable-bind-source"
    source.mkdir(exist_ok=True)
    before = tree_digest(image)
    result = singpy.run("exec", "-w", "-B", f"{source}:/not/there", str(image), "true")
    assert_one_fatal(result, "/not/there does not exist in the image")
    assert tree_digest(image) == before
    assert not (image / "not").exists()


def test_missing_optional_mount_point_is_skipped(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable-optional")
    (image / "etc" / "hosts").unlink()  # the host's /etc/hosts is bound only where the image has one
    before = tree_digest(image)
    result = singpy.run("exec", "-w", str(image), "sh", "-c", "test ! -e /etc/hosts && echo skipped")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "skipped\n"
    # A warning, as Apptainer's "Skipping mount /etc/hosts [binds]: /etc/hosts doesn't exist in container".
    assert "WARNING: can't bind /etc/hosts on /etc/hosts, left out: /etc/hosts does not exist in the image" \
        in result.stderr
    assert tree_digest(image) == before


def test_writable_tmpfs_is_ignored_with_a_warning(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable-tmpfs")
    result = singpy.run("exec", "-w", "--writable-tmpfs", str(image), "touch", "/opt/kept")
    assert result.returncode == 0, result.stderr
    assert "WARNING: --writable-tmpfs is ignored" in result.stderr
    assert (image / "opt" / "kept").exists()


def test_image_the_user_cannot_write(as_user: Singpy, workdir: Path) -> None:
    """A sandbox whose top directory the user may not write (its own, mode 0555, when the suite runs as a user)."""
    image = own_sandbox(as_user, workdir, "writable-denied")
    image.chmod(0o555)
    try:
        before = tree_digest(image)
        result = as_user.run("exec", "-w", str(image), "true")
        assert_one_fatal(result, f"--writable: can't write {image} (permission denied)")
        assert tree_digest(image) == before
    finally:
        image.chmod(0o755)  # removable again by the next run's own_sandbox, whoever runs the suite


def test_sif_without_overlay_partition(singpy: Singpy, workdir: Path) -> None:
    sif = sifs.singpy_sif(workdir)
    digest = sha256(sif)
    before = traces(workdir)
    result = singpy.run("exec", "--writable", str(sif), "true")
    assert_one_fatal(result, f"--writable: {sif} has no writable overlay partition")
    assert sha256(sif) == digest
    assert traces(workdir) == before


def test_bare_squashfs_cannot_be_written(singpy: Singpy, workdir: Path) -> None:
    squashfs = sifs.bare_squashfs(workdir)
    digest = sha256(squashfs)
    result = singpy.run("exec", "--writable", str(squashfs), "true")
    assert_one_fatal(result, "is a squashfs image, which can't be written")
    assert sha256(squashfs) == digest


def test_overlay_and_writable_exclude_each_other(singpy: Singpy, workdir: Path) -> None:
    image = own_sandbox(singpy, workdir, "writable-overlay")
    overlay = workdir / f"writable-overlay-dir-{singpy.profile}"
    overlay.mkdir(exist_ok=True)
    result = singpy.run("exec", "-w", "--overlay", str(overlay), str(image), "true")
    assert_one_fatal(result, "--overlay can't be used with --writable")
    assert os.listdir(overlay) == []


@pytest.fixture
def sif_with_overlay(singpy: Singpy, workdir: Path) -> Path:
    """A SIF of the profile's user with an overlay partition added by `singpy overlay create` (helper B's side)."""
    home = workdir / f"with-overlay-{singpy.profile}"  # the user's own directory: the SIF is rewritten in place
    subprocess.run(["rm", "-rf", str(home)], check=True)
    home.mkdir()
    os.chown(home, singpy.uid, singpy.gid)
    sif = home / "image.sif"
    sif.write_bytes(sifs.singpy_sif(workdir).read_bytes())
    os.chown(sif, singpy.uid, singpy.gid)
    singpy.ok("overlay", "create", "--size", "64", str(sif), env=singpy.env(PATH="/usr/sbin:/usr/bin:/sbin:/bin"))
    return sif


def test_sif_overlay_partition_is_written(singpy: Singpy, workdir: Path, sif_with_overlay: Path,
                                          fuse_open: str) -> None:
    sif = sif_with_overlay
    before = traces(workdir)
    # A new top directory: a user can't copy up the image's own, owned by root (unmapped in their namespace).
    result = singpy.run("-v", "exec", "--writable", str(sif), "sh", "-c",
                        "mkdir /data && echo in-partition > /data/part")
    assert result.returncode == 0, result.stderr
    # A user's partition is served by fuse2fs (FUSE), which the kernel's overlayfs can't take as upper layer.
    driver = "the kernel's overlayfs" if singpy.uid == 0 else "fuse-overlayfs"
    assert f"root overlay: {driver}" in result.stderr
    # Without --writable the partition is a read-only layer of every run, as in Apptainer.
    assert singpy.ok("exec", str(sif), "cat", "/data/part") == "in-partition\n"
    result = singpy.run("exec", str(sif), "touch", "/data/other")
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    assert traces(workdir) == before

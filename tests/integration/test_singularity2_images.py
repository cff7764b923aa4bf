"""Singularity 2.x ext3 images (`.img`), bare or after a `run-singularity` launch line, as root and as the user.

As Apptainer still runs them: as the container's root filesystem, read-only
(--writable writes them in place). Root mounts one with the kernel's ext3 on
a loop device, a user with fuse2fs (which needs /dev/fuse open to users,
simulated by tests.support.hostsim where the host differs). Each run must
leave nothing behind: no mount, loop device or fuse2fs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.configs import readable_config
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import descendants, wait_for_descendants, wait_until_gone
from tests.support.sifs import assert_restored, snapshot

MARKER = "singularity2-ext3"
LAUNCH_LINE = b"#!/usr/bin/env run-singularity\n"
NOTE = {"root": "mounting it with the kernel's ext3 on a loop device", "user": "fuse2fs (FUSE)"}


def _ext3(path: Path, root: Path, *, launch_line: bool, options: tuple[str, ...] = ()) -> Path:
    """An ext3 filesystem of `root` (at its top, as Singularity 2.x made them), after the launch line if asked."""
    filesystem = path.with_suffix(".fs")
    subprocess.run(["mkfs.ext3", "-q", *options, "-d", str(root), str(filesystem), "8M"], check=True,
                   capture_output=True)
    with path.open("wb") as image:
        if launch_line:
            image.write(LAUNCH_LINE)
        with filesystem.open("rb") as source:
            shutil.copyfileobj(source, image)
    filesystem.unlink()
    path.chmod(0o755)  # as Singularity 2.x left them: executable, through the launch line
    return path


@pytest.fixture(scope="session")
def rootfs(workdir: Path) -> Path:
    root = build_busybox_rootfs(workdir / "singularity2-rootfs",
                                env_scripts={"90-environment.sh": "export FROM_IMAGE=ext3-env\n"})
    (root / "etc" / "marker").write_text(MARKER + "\n")
    return root


@pytest.fixture(scope="session")
def ext3_images(workdir: Path, rootfs: Path) -> dict[str, Path]:
    place = workdir / "singularity2"
    place.mkdir(mode=0o755)
    return {"bare": _ext3(place / "bare.img", rootfs, launch_line=False),
            "launch-line": _ext3(place / "launch.img", rootfs, launch_line=True)}


@pytest.mark.parametrize("variant", ["bare", "launch-line"])
def test_image_runs_read_only(singpy: Singpy, ext3_images: dict[str, Path], workdir: Path, fuse_open: str,
                              variant: str) -> None:
    """Binds, --pid, --contain, --writable-tmpfs and the env scripts, as with a squashfs; the image is not written."""
    image = ext3_images[variant]
    before, content = snapshot(workdir), image.read_bytes()
    script = ("cat /etc/marker; id -u; echo $FROM_IMAGE; test $$ -lt 10 && echo pidns; echo x > /new && cat /new; "
              "ls /data/singularity2-rootfs/etc/marker; test -z \"$(ls -A /tmp)\" && echo empty-tmp")
    result = singpy.run("-v", "exec", "--pid", "--contain", "--writable-tmpfs", "-B", f"{workdir}:/data:ro",
                        str(image), "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [MARKER, str(singpy.uid), "ext3-env", "pidns", "x",
                                     "/data/singularity2-rootfs/etc/marker", "empty-tmp"]
    assert NOTE[singpy.profile] in result.stderr
    assert "Singularity 2.x ext3 image" in result.stderr
    assert_restored(before, workdir)
    assert image.read_bytes() == content


def test_run_and_read_only_root(singpy: Singpy, ext3_images: dict[str, Path], workdir: Path, fuse_open: str) -> None:
    image = str(ext3_images["launch-line"])
    before = snapshot(workdir)
    assert "Hello from a singpy container" in singpy.ok("run", image)
    result = singpy.run("exec", image, "sh", "-c", "touch /etc/new-file")
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    assert_restored(before, workdir)


def test_user_without_fuse_gets_one_fatal(as_user: Singpy, ext3_images: dict[str, Path], workdir: Path,
                                          fuse_closed: str) -> None:
    before = snapshot(workdir)
    image = ext3_images["launch-line"]
    result = as_user.run("exec", "--unsquash", str(image), "true")
    assert_one_fatal(result, f"can't run {image}: without root, singpy mounts an ext3 image (Singularity 2.x) with "
                             "fuse2fs, and FUSE is not usable: /dev/fuse is not readable and writable by you")
    assert "or run it as root (--unsquash extracts squashfs images only)" in result.stderr
    assert_restored(before, workdir)
    verbose = as_user.run("-v", "exec", str(image), "true")
    assert f"'{image}?offset={len(LAUNCH_LINE)}'" in verbose.stderr  # the conversion its hint spells out


def test_writable_writes_the_image(singpy: Singpy, rootfs: Path, workdir: Path, fuse_open: str,
                                   request: pytest.FixtureRequest) -> None:
    """--writable: the image itself, in place (as Apptainer does); a second run sees what the first wrote.

    The image's root directory belongs to the profile's user (a user writes only where the image lets them).
    """
    place = workdir / "singularity2" / f"{singpy.profile}-{request.node.name}"
    place.mkdir(mode=0o755)
    image = str(_ext3(place / "writable.img", rootfs, launch_line=True,
                      options=("-E", f"root_owner={singpy.uid}:{singpy.gid}")))
    os.chown(image, singpy.uid, singpy.gid)
    before = snapshot(workdir)
    singpy.ok("exec", "--writable", "--no-home", image, "sh", "-c", "echo written > /file")  # no mount point made
    assert singpy.ok("exec", image, "cat", "/file") == "written\n"
    assert_restored(before, workdir)
    fsck = subprocess.run(["e2fsck", "-fn", f"{image}?offset={len(LAUNCH_LINE)}"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_allow_container_extfs(singpy: Singpy, ext3_images: dict[str, Path], workdir: Path, fuse_open: str) -> None:
    conf = readable_config(workdir, "singularity2-no-extfs", "allow container extfs = no\n")
    image = ext3_images["bare"]
    result = singpy.run("--config", str(conf), "exec", str(image), "true")
    if singpy.uid == 0:  # the directive does not apply to root (Apptainer's apptainer.conf)
        assert result.returncode == 0, result.stderr
    else:
        assert_one_fatal(result, "ext3 images are not allowed by the system administrator (allow container extfs "
                                 f"= no): can't run {image}")


def test_allow_kernel_extfs_no_means_fuse2fs_for_root_too(as_root: Singpy, ext3_images: dict[str, Path],
                                                          workdir: Path, fuse_open: str) -> None:
    """SingularityCE's `allow kernel extfs = no`: root mounts the image with fuse2fs, as a user does."""
    conf = readable_config(workdir, "singularity2-no-kernel-extfs", "allow kernel extfs = no\n")
    result = as_root.run("--config", str(conf), "-v", "exec", str(ext3_images["bare"]), "cat", "/etc/marker")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == MARKER
    assert NOTE["user"] in result.stderr and NOTE["root"] not in result.stderr


def test_ext4_is_one_fatal(singpy: Singpy, workdir: Path, rootfs: Path) -> None:
    place = workdir / "singularity2-ext4"
    place.mkdir(mode=0o755, exist_ok=True)
    image = place / f"{singpy.profile}.img"
    subprocess.run(["mkfs.ext4", "-q", "-d", str(rootfs), str(image), "8M"], check=True, capture_output=True)
    image.chmod(0o644)
    assert_one_fatal(singpy.run("exec", str(image), "true"), "is not a valid ext3 image (an ext2 or ext4 filesystem)")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killed_launcher_leaves_nothing(as_user: Singpy, ext3_images: dict[str, Path], workdir: Path, fuse_open: str,
                                        how: str) -> None:
    """Whatever way the supervisor ends, fuse2fs and the payload end with it."""
    before = snapshot(workdir)
    process = as_user.popen(["exec", str(ext3_images["bare"]), "sleep", "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    payload = wait_for_descendants(process.pid, "sleep 300")
    assert payload
    helpers = {pid: line for pid, line in descendants(process.pid).items() if "fuse2fs" in line}
    assert len(helpers) == 1, helpers
    process.send_signal(getattr(signal, how))
    process.communicate(timeout=20)
    assert process.returncode == (-9 if how == "SIGKILL" else -15)  # SIGTERM forwarded, the payload's death re-raised
    assert wait_until_gone(payload, "sleep 300") == []
    assert [wait_until_gone([pid], line) for pid, line in helpers.items()] == [[]]
    assert_restored(before, workdir)


def test_build_from_a_simg_and_a_clear_refusal_for_ext3(singpy: Singpy, ext3_images: dict[str, Path],
                                                       workdir: Path) -> None:
    """A .simg's squashfs (after its launch line) builds into a SIF; an ext3 image is refused with how to do it."""
    from tests.support.sifs import singularity2_simg

    out = workdir / f"from-simg-{singpy.profile}"
    out.mkdir(exist_ok=True)
    os.chown(out, singpy.uid, singpy.gid)
    singpy.ok("build", str(out / "new.sif"), str(singularity2_simg(workdir)))
    assert singpy.ok("exec", str(out / "new.sif"), "cat", "/etc/marker") == "made-for-singpy-sif-tests\n"
    image = next(iter(ext3_images.values()))
    result = singpy.run("build", str(out / "from-ext3.sif"), str(image))
    assert_one_fatal(result, f"can't build from {image}: singpy runs Singularity 2.x ext3 images but does not unpack")
    assert not (out / "from-ext3.sif").exists()

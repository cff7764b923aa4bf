"""The underlay (issue 15): the mount points an image lacks, added without an overlay.

Forced through the configuration (`enable underlay = preferred`), or the
--underlay flag, the launch builds the container's root as tmpfs levels
holding binds of the image's entries; the same acceptance as the overlay
path, as root and as the test user: the home directory and binds to missing
destinations (deep ones, a file onto a missing file), --contain, the working
directory, a sandbox and a SIF, an image that stays read-only, hostile links
that must not lead anything to the host, and nothing left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, readable_by_all
from tests.support import sifs
from tests.support.configs import readable_config
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces

NOTE = "in an underlay"


def config(workdir: Path, name: str, text: str) -> Path:
    return readable_config(workdir, "underlay-" + name, text)


@pytest.fixture(scope="module")
def preferred(workdir: Path) -> Path:
    return config(workdir, "preferred", "enable underlay = preferred\n")


@pytest.fixture(scope="module")
def host_data(workdir: Path) -> Path:
    """A directory and a file to bind, readable by everyone."""
    data = workdir / "underlay-data"
    data.mkdir(mode=0o755, exist_ok=True)
    (data / "inside").write_text("data\n")
    (workdir / "underlay-file").write_text("a device-like file\n")
    readable_by_all(data)
    (workdir / "underlay-file").chmod(0o644)
    return data


@pytest.fixture(scope="module")
def hostile(workdir: Path) -> Path:
    """An image whose /home is a link to /etc, with `/x -> ../../..` and `/opt/evil -> /etc`."""
    root = workdir / "underlay-hostile"
    if root.exists():  # made already: a module's fixtures may be set up once per profile
        return root
    build_busybox_rootfs(root)
    shutil.rmtree(root / "home")
    (root / "home").symlink_to("/etc")
    (root / "x").symlink_to("../../..")
    (root / "opt").mkdir(exist_ok=True)
    (root / "opt" / "evil").symlink_to("/etc")
    return root


def test_missing_points_home_and_binds(singpy: Singpy, image: Path, preferred: Path, host_data: Path,
                                       workdir: Path) -> None:
    file = workdir / "underlay-file"
    out = singpy.run("--verbose", "--config", str(preferred), "exec",
                     "-B", f"{host_data}:/data/x/y", "-B", f"{host_data}:/opt", "-B", f"{file}:/usr/lib/gpu-file",
                     "-B", f"{host_data}:/home/alice-{singpy.profile}",
                     str(image), "sh", "-c",
                     "cat /data/x/y/inside /opt/inside /usr/lib/gpu-file /home/alice-*/inside; echo $HOME;"
                     " ls -d $HOME; pwd; ls /; ls /usr/lib | grep -c gpu-file", cwd=host_data)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:4] == ["data", "data", "a device-like file", "data"]
    assert lines[4] == singpy.home and lines[5] == singpy.home  # the home directory, missing in the image for a user
    assert lines[6] == str(host_data)  # the working directory
    assert {"bin", "etc", "usr", "data", "home", "tmp"} <= set(lines[7:-1])
    assert lines[-1] == "1"
    assert NOTE in out.stderr


@pytest.mark.parametrize("flags", [["--contain"], ["--containall"]], ids=["contain", "containall"])
def test_contain(singpy: Singpy, image: Path, preferred: Path, host_data: Path, flags: list[str]) -> None:
    out = singpy.ok("--config", str(preferred), "exec", *flags, "-B", f"{host_data}:/new/place", str(image), "sh",
                    "-c", "cat /new/place/inside; echo $HOME; ls -A $HOME | wc -l; pwd")
    assert out.split() == ["data", singpy.home, "0", singpy.home]


def test_image_stays_read_only(singpy: Singpy, image: Path, preferred: Path, host_data: Path) -> None:
    out = singpy.ok("--config", str(preferred), "exec", "-B", f"{host_data}:/home/ro-{singpy.profile}/deep",
                    str(image), "sh", "-c",
                    f"for p in /new /usr/new /home/new /home/ro-{singpy.profile}/new /etc/new; do"
                    " touch $p 2>&1 || true; done")
    assert out.count("Read-only file system") == 5, out


def test_flag_and_environment(singpy: Singpy, image: Path, host_data: Path) -> None:
    for args, env in (((("--underlay",)), singpy.env()), ((), singpy.env(SINGPY_UNDERLAY="1"))):
        out = singpy.run("--verbose", "exec", *args, "-B", f"{host_data}:/flag/dest", str(image), "cat",
                         "/flag/dest/inside", env=env)
        assert (out.returncode, out.stdout) == (0, "data\n"), out.stderr
        assert NOTE in out.stderr


def test_sif(singpy: Singpy, workdir: Path, preferred: Path, host_data: Path, fuse_open: str) -> None:
    sif = sifs.siftool_sif(workdir)
    out = singpy.run("--verbose", "--config", str(preferred), "exec", "-B", f"{host_data}:/sif/dest", str(sif),
                     "sh", "-c", "cat /sif/dest/inside /etc/marker; touch /etc/x 2>&1 || true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["data", sifs.MARKER]
    assert "Read-only file system" in out.stdout
    assert NOTE in out.stderr


def test_hostile_links_lead_nowhere_on_the_host(singpy: Singpy, hostile: Path, preferred: Path,
                                                host_data: Path) -> None:
    tag = uuid.uuid4().hex[:12]
    probes = [Path(f"/etc/probe-home-{tag}"), Path(f"/probe-x-{tag}"), Path(f"/etc/probe-opt-{tag}")]
    etc_before = sorted(os.listdir("/etc"))
    out = singpy.run("--config", str(preferred), "exec", "-B", f"{host_data}:/home/probe-home-{tag}",
                     "-B", f"{host_data}:/x/probe-x-{tag}", "-B", f"{host_data}:/opt/evil/probe-opt-{tag}",
                     str(hostile), "sh", "-c",
                     f"cat /home/probe-home-{tag}/inside /probe-x-{tag}/inside /etc/probe-opt-{tag}/inside;"
                     " for link in /home /x /opt/evil; do readlink $link; done")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["data", "data", "data", "/etc", "../../..", "/etc"]
    assert [path for path in probes if os.path.lexists(path)] == []
    assert sorted(os.listdir("/etc")) == etc_before
    assert (hostile / "home").is_symlink() and not list((hostile / "etc").glob("probe-*"))


def test_nothing_left(singpy: Singpy, image: Path, preferred: Path, host_data: Path, workdir: Path) -> None:
    before = traces(image, host_data, workdir / "underlay-file")
    singpy.ok("--config", str(preferred), "exec", "-B", f"{host_data}:/left/over", "-B",
              f"{workdir / 'underlay-file'}:/etc/left-file", str(image), "true")
    assert settled(before, image, host_data, workdir / "underlay-file") == before
    assert not (image / "left").exists() and not (image / "etc" / "left-file").exists()


def test_overlay_disabled_uses_the_underlay(singpy: Singpy, image: Path, workdir: Path, host_data: Path) -> None:
    conf = config(workdir, "overlay-no", "enable overlay = no\n")
    out = singpy.run("--verbose", "--config", str(conf), "exec", "-B", f"{host_data}:/brand/new", str(image),
                     "cat", "/brand/new/inside")
    assert (out.returncode, out.stdout) == (0, "data\n"), out.stderr
    assert NOTE in out.stderr


def test_no_overlay_and_no_underlay_is_one_fatal(singpy: Singpy, image: Path, workdir: Path,
                                                 host_data: Path) -> None:
    conf = config(workdir, "neither", "enable overlay = no\nenable underlay = no\n")
    result = singpy.run("--config", str(conf), "exec", "--no-home", "-B", f"{host_data}:/brand/new", str(image),
                        "true")
    assert_one_fatal(result, "/brand/new does not exist in the image (`enable overlay = no` and "
                     "`enable underlay = no`")


def test_underlay_flag_refused_when_disabled(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = config(workdir, "underlay-no", "enable underlay = no\n")
    assert_one_fatal(singpy.run("--config", str(conf), "exec", "--underlay", str(image), "true"),
                     "--underlay needs the underlay, but `enable underlay = no`")


def test_writable_tmpfs_keeps_the_overlay(singpy: Singpy, image: Path, preferred: Path, host_data: Path) -> None:
    out = singpy.run("--verbose", "--config", str(preferred), "exec", "--writable-tmpfs", "-B",
                     f"{host_data}:/wt/dest", str(image), "sh", "-c",
                     "echo x > /new-file && cat /new-file /wt/dest/inside")
    assert (out.returncode, out.stdout) == (0, "x\ndata\n"), out.stderr
    assert NOTE not in out.stderr


@pytest.fixture(scope="module")
def stacked(workdir: Path) -> Path:
    """Layers for an image two overlays deep, where the kernel refuses a third overlay (its stacking limit)."""
    base = workdir / "underlay-stacked"
    for name in ("lower", "upper1", "work1", "mid", "upper2", "work2", "top"):
        (base / name).mkdir(parents=True, exist_ok=True)
        (base / name).chmod(0o755)
    if not (base / "lower" / "image").exists():
        build_busybox_rootfs(base / "lower" / "image")
    return base


def _in_stacked_namespace(singpy: Singpy, stacked: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """singpy, as the profile's user, in a private mount namespace where the image is on an overlay of an overlay.

    A real refusal of the kernel: overlayfs mounts nothing more than two filesystems deep
    (EINVAL), so the overlay of mount points over that image fails, as it does in a user
    namespace before Linux 5.11.
    """
    if os.geteuid() != 0:
        pytest.skip("making the stacked overlays needs root")
    mounts = (f"mount -t overlay stack1 -o lowerdir={stacked}/lower,upperdir={stacked}/upper1,"
              f"workdir={stacked}/work1 {stacked}/mid && mount -t overlay stack2 -o lowerdir={stacked}/mid,"
              f"upperdir={stacked}/upper2,workdir={stacked}/work2 {stacked}/top")
    user = "" if singpy.uid == 0 else f"setpriv --reuid={singpy.uid} --regid={singpy.gid} --clear-groups "
    command = " ".join(f"'{arg}'" for arg in (SINGPY, *args))
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"{mounts} && exec {user}{command}"], env=singpy.env(), cwd="/", capture_output=True,
                          text=True, timeout=60, check=False)


def test_kernel_refusal_falls_back_to_the_underlay(singpy: Singpy, stacked: Path, host_data: Path) -> None:
    out = _in_stacked_namespace(singpy, stacked, "--verbose", "exec", "-B", f"{host_data}:/refused/dest",
                                f"{stacked}/top/image", "sh", "-c", "cat /refused/dest/inside; touch /x 2>&1 || true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["data", "touch: /x: Read-only file system"]
    assert "the kernel refused the overlay of mount points" in out.stderr and NOTE in out.stderr


def test_kernel_refusal_without_underlay_is_one_fatal(singpy: Singpy, stacked: Path, host_data: Path,
                                                      workdir: Path) -> None:
    conf = config(workdir, "underlay-no", "enable underlay = no\n")
    result = _in_stacked_namespace(singpy, stacked, "--config", str(conf), "exec", "-B",
                                   f"{host_data}:/refused/dest", f"{stacked}/top/image", "true")
    assert_one_fatal(result, "can't add the mount points the image lacks: the kernel refuses the overlay "
                     "(Invalid argument) and `enable underlay = no`")

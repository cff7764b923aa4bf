"""Older kernels (issue 15): each interface newer than RHEL 8's 4.18 has a fallback, run here by configuration.

`avoid kernel features` (singpy.conf, docs/kernels.md) makes singpy take the
path an older kernel would force, on this kernel: each case asserts what the
fallback gives (read-only libraries after a remount per mount, a SIF mounted
through LOOP_SET_FD, the underlay or fuse-overlayfs instead of overlayfs in a
user namespace) and that it was the fallback that ran (a --debug or --verbose
line). openat2 needs no case: singpy never calls it (singpy.mounts.rootpath
walks every path one component at a time on every kernel).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.gpu import simhost
from tests.support import sifs
from tests.support.configs import readable_config
from tests.support.leftovers import settled, traces
from tests.support.simhost_runs import SimHostRun, sim_host, sim_run

_HOSTS: dict[str, simhost.SimHost] = {}


def config(workdir: Path, name: str, text: str) -> Path:
    return readable_config(workdir, "old-kernel-" + name, text)


@pytest.fixture(scope="module")
def data(workdir: Path) -> Path:
    directory = workdir / "old-kernel-data"
    directory.mkdir(mode=0o755, exist_ok=True)
    (directory / "inside").write_text("data\n")
    (directory / "inside").chmod(0o644)
    return directory


def test_userns_overlay_avoided_uses_the_underlay(singpy: Singpy, image: Path, workdir: Path, data: Path) -> None:
    conf = config(workdir, "no-userns-overlay", "avoid kernel features = userns_overlay\n")
    before = traces(image, data)
    out = singpy.run("--verbose", "--config", str(conf), "exec", "-B", f"{data}:/new/dest", str(image), "sh", "-c",
                     "cat /new/dest/inside; touch /usr/x 2>&1 || true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["data", "touch: /usr/x: Read-only file system"]
    # Root makes no user namespace: its overlay is not the avoided interface.
    assert ("in an underlay" in out.stderr) == (singpy.profile == "user"), out.stderr
    assert settled(before, image, data) == before


def test_userns_overlay_avoided_writable_tmpfs_uses_fuse_overlayfs(as_user: Singpy, image: Path, workdir: Path,
                                                                   fuse_open: str) -> None:
    conf = config(workdir, "no-userns-overlay-wt", "avoid kernel features = userns_overlay\n")
    out = as_user.run("--verbose", "--config", str(conf), "exec", "--writable-tmpfs", str(image), "sh", "-c",
                      "echo written > /new-file; cat /new-file")
    assert (out.returncode, out.stdout) == (0, "written\n"), out.stderr
    assert "root overlay: fuse-overlayfs" in out.stderr
    assert "avoid kernel features = userns_overlay" in out.stderr


def test_loop_configure_avoided(as_root: Singpy, workdir: Path) -> None:
    sif = sifs.siftool_sif(workdir)
    conf = config(workdir, "no-loop-configure", "avoid kernel features = loop_configure\n")
    before = traces(sif)
    out = as_root.run("--debug", "--config", str(conf), "exec", str(sif), "cat", "/etc/marker")
    assert (out.returncode, out.stdout) == (0, sifs.MARKER + "\n"), out.stderr
    assert "LOOP_SET_FD + LOOP_SET_STATUS64 (avoid kernel features = loop_configure)" in out.stderr
    assert settled(before, sif) == before  # the autoclear device went with the namespace, as with LOOP_CONFIGURE


@pytest.fixture(scope="module")
def nv_host(workdir: Path) -> simhost.SimHost:
    if os.getuid() != 0:
        pytest.skip("the simulated GPU host needs root (mknod)")
    if "nv" not in _HOSTS:  # a module's fixtures may be set up once per profile: the host is built once
        _HOSTS["nv"] = sim_host(workdir, f"sim-nvidia-old-kernels-{os.getpid()}", simhost.build_nvidia_host)
    return _HOSTS["nv"]


@pytest.fixture
def nv(singpy: Singpy, nv_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, nv_host, workdir / f"conf-old-kernels-{singpy.profile}", "nvliblist.conf")


@pytest.mark.parametrize("avoid", [False, True], ids=["mount_setattr", "remounts"])
def test_mount_setattr_avoided_seals_with_remounts(nv: SimHostRun, image: Path, avoid: bool) -> None:
    conf = "avoid kernel features = mount_setattr\n" if avoid else ""
    result = nv.run("--debug", "exec", "--nv", str(image), "sh", "-c",
                    "cat /.singularity.d/libs/libcuda.so.1 > /dev/null && echo readable;"
                    " touch /.singularity.d/libs/libcuda.so.1 /.singularity.d/libs/new 2>&1 || true", conf=conf)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "readable"
    assert result.stdout.count("Read-only file system") == 2, result.stdout
    fallback = "read-only: a remount per mount" in result.stderr
    assert fallback == avoid, result.stderr


def test_unknown_feature_is_one_fatal(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = config(workdir, "bad-feature", "avoid kernel features = mount_setattr, openat3\n")
    assert_one_fatal(singpy.run("--config", str(conf), "exec", str(image), "true"),
                     f"{conf}:1: avoid kernel features: unknown feature 'openat3'")


def test_nv_through_the_underlay(nv: SimHostRun, image: Path) -> None:
    """The GPU binds (device nodes, libraries, binaries) on a root built as an underlay, as on Linux < 5.11."""
    result = nv.run("--verbose", "exec", "--nv", str(image), "sh", "-c",
                    "cat /.singularity.d/libs/libcuda.so.1 > /dev/null && echo readable; ls /dev | grep -c '^nvidia';"
                    " touch /.singularity.d/libs/new / 2>&1 | grep -c 'Read-only file system'",
                    conf="enable underlay = preferred\n")
    assert result.returncode == 0, result.stderr
    readable, devices, refused = result.stdout.split()
    assert readable == "readable" and int(devices) >= 3 and refused == "2", result.stdout
    assert "in an underlay" in result.stderr, result.stderr

"""`--compat32` (issue 28, Apptainer main's 4074793d7) end to end, on a simulated GPU host, as root and as a user.

The simulated host (tests/gpu/simhost.py) has gcc-built driver libraries of
both classes under the same names: x86-64 in usr/lib/x86_64-linux-gnu and
i386 (`gcc -m32`, needing libc.so.6, so that ldconfig lists them as "libc6")
in usr/lib/i386-linux-gnu, both in one real ld.so.cache. What a user sees is
asserted inside the container: the 32-bit file in /.singularity.d/libs32 (its
ELF class byte, its content the host file's), the 64-bit one still in
/.singularity.d/libs, and LD_LIBRARY_PATH naming both, libs32 last.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.gpu import simhost
from tests.support.images import build_busybox_rootfs
from tests.support.simhost_runs import SimHostRun, sim_host, sim_run

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")

LIBS, LIBS32 = "/.singularity.d/libs", "/.singularity.d/libs32"
IGNORED = "WARNING: ignoring --compat32, it requires a GPU option such as --nv or --rocm"
LIBLIST = "use nvidia-container-cli = no\n"  # Apptainer's legacy lookup: nvliblist.conf and the ld cache
# Each library's first bytes as od prints them: the fifth, EI_CLASS, is 01 for 32-bit and 02 for 64-bit.
SHOW = (f"for d in {LIBS} {LIBS32}; do echo \"== $d\"; for f in $d/*; do"
        " echo \"$(basename $f) $(head -c 5 $f | od -An -tx1 | tr -d ' ') $(md5sum < $f | cut -c1-32)\"; done; done;"
        " echo \"== LD_LIBRARY_PATH $LD_LIBRARY_PATH\"")


@pytest.fixture(scope="session")
def c32_host(workdir: Path) -> simhost.SimHost:
    host = sim_host(workdir, "sim-nvidia-compat32", simhost.build_nvidia_host)
    if host.lib32_dir is None:
        pytest.skip("gcc -m32 cannot link here: no i386 library to simulate")
    return host


@pytest.fixture(scope="session")
def c32_rocm_host(workdir: Path) -> simhost.SimHost:
    host = sim_host(workdir, "sim-rocm-compat32", simhost.build_rocm_host)
    if host.lib32_dir is None:
        pytest.skip("gcc -m32 cannot link here: no i386 library to simulate")
    return host


@pytest.fixture(scope="session")
def ld_path_image(workdir: Path) -> Path:
    """An image whose env script sets LD_LIBRARY_PATH: the action script's path, not final_env's."""
    return build_busybox_rootfs(workdir / "busybox-ldpath",
                                env_scripts={"90-environment.sh": "export LD_LIBRARY_PATH=/opt/lib\n"})


@pytest.fixture
def nv(singpy: Singpy, c32_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, c32_host, workdir / f"conf-c32-{singpy.profile}", "nvliblist.conf")


@pytest.fixture
def rocm(singpy: Singpy, c32_rocm_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, c32_rocm_host, workdir / f"conf-c32rocm-{singpy.profile}", "rocmliblist.conf")


def _seen(out: str) -> tuple[dict[str, dict[str, tuple[str, str]]], str]:
    """SHOW's output -> ({directory: {name: (first bytes, md5)}}, LD_LIBRARY_PATH)."""
    dirs: dict[str, dict[str, tuple[str, str]]] = {}
    current: dict[str, tuple[str, str]] = {}
    ld_path = ""
    for line in out.splitlines():
        if line.startswith("== LD_LIBRARY_PATH "):
            ld_path = line.split(" ", 2)[2]
        elif line.startswith("== "):
            current = dirs.setdefault(line[3:], {})
        elif len(line.split()) == 3:
            name, head, digest = line.split()
            current[name] = (head, digest)
    return dirs, ld_path


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("conf", [LIBLIST, ""], ids=["nvliblist", "container-cli"])
def test_compat32_binds_the_32bit_build_beside_the_64bit_one(nv: SimHostRun, c32_host: simhost.SimHost, image: Path,
                                                            conf: str) -> None:
    dirs, ld_path = _seen(nv.ok("exec", "--nv", "--compat32", "--contain", str(image), "sh", "-c", SHOW, conf=conf))
    assert dirs[LIBS32]["libcuda.so.1"] == ("7f454c4601", _md5(c32_host.lib32["libcuda.so.1"]))  # ELFCLASS32
    assert dirs[LIBS]["libcuda.so.1"] == ("7f454c4602", _md5(c32_host.libs["libcuda.so.1"]))  # unchanged
    assert all(head.endswith("01") for head, _ in dirs[LIBS32].values())
    assert all(head.endswith("02") for head, _ in dirs[LIBS].values())
    assert ld_path == f"{LIBS}:{LIBS32}"


def test_libs32_follows_libs_after_the_image_path(nv: SimHostRun, ld_path_image: Path) -> None:
    _, ld_path = _seen(nv.ok("exec", "--nv", "--compat32", str(ld_path_image), "sh", "-c", SHOW, conf=LIBLIST))
    assert ld_path == f"/opt/lib:{LIBS}:{LIBS32}"


def test_without_compat32_nothing_32bit(nv: SimHostRun, image: Path) -> None:
    dirs, ld_path = _seen(nv.ok("exec", "--nv", str(image), "sh", "-c", SHOW, conf=LIBLIST))
    assert dirs[LIBS32] == {}  # the glob stayed unexpanded: no such directory
    assert ld_path == LIBS


def test_compat32_alone_is_ignored_with_a_warning(nv: SimHostRun, image: Path) -> None:
    result = nv.run("exec", "--compat32", str(image), "sh", "-c", SHOW)
    assert result.returncode == 0, result.stderr
    assert IGNORED in result.stderr
    dirs, ld_path = _seen(result.stdout)
    assert dirs[LIBS32] == {} and ld_path == LIBS


@pytest.mark.parametrize("prefix", ["SINGULARITY_", "APPTAINER_", "SINGPY_"])
def test_compat32_from_the_environment(nv: SimHostRun, image: Path, prefix: str) -> None:
    dirs, _ = _seen(nv.ok("exec", "--nv", str(image), "sh", "-c", SHOW, conf=LIBLIST, **{f"{prefix}COMPAT32": "1"}))
    assert "libcuda.so.1" in dirs[LIBS32]


def test_driver_capability_implies_compat32(nv: SimHostRun, image: Path) -> None:
    dirs, ld_path = _seen(nv.ok("exec", "--nv", str(image), "sh", "-c", SHOW, conf=LIBLIST,
                                NVIDIA_DRIVER_CAPABILITIES="compute,utility,compat32"))
    assert dirs[LIBS32]["libcuda.so.1"][0] == "7f454c4601"
    assert ld_path == f"{LIBS}:{LIBS32}"
    without = nv.run("exec", str(image), "true", NVIDIA_DRIVER_CAPABILITIES="compute,compat32")
    assert without.returncode == 0 and IGNORED in without.stderr  # implied, then ignored without --nv: Apptainer's


def test_capabilities_still_select_the_32bit_libraries(nv: SimHostRun, image: Path) -> None:
    """`utility,compat32`: no compute, so no libcuda, in either directory."""
    dirs, _ = _seen(nv.ok("exec", "--nv", str(image), "sh", "-c", SHOW, conf=LIBLIST,
                          NVIDIA_DRIVER_CAPABILITIES="utility,compat32"))
    assert "libcuda.so.1" not in dirs[LIBS32] and "libcuda.so.1" not in dirs[LIBS]


def test_nvccli_lists_the_32bit_libraries(nv: SimHostRun, c32_host: simhost.SimHost, image: Path) -> None:
    result = nv.run("-v", "exec", "--nvccli", "--compat32", str(image), "sh", "-c", SHOW)
    assert result.returncode == 0, result.stderr
    assert f"32-bit libraries listed by {c32_host.container_cli} --compat32" in result.stderr
    dirs, ld_path = _seen(result.stdout)
    assert dirs[LIBS32]["libcuda.so.1"] == ("7f454c4601", _md5(c32_host.lib32["libcuda.so.1"]))
    assert ld_path == f"{LIBS}:{LIBS32}"


def test_rocm_compat32(rocm: SimHostRun, c32_rocm_host: simhost.SimHost, image: Path) -> None:
    name = "libCXLActivityLogger.so"
    dirs, ld_path = _seen(rocm.ok("exec", "--rocm", "--compat32", "--contain", str(image), "sh", "-c", SHOW))
    assert dirs[LIBS32][name] == ("7f454c4601", _md5(c32_rocm_host.lib32[name]))
    assert dirs[LIBS][name] == ("7f454c4602", _md5(c32_rocm_host.libs[name]))
    assert ld_path == f"{LIBS}:{LIBS32}"


def test_no_32bit_library_found_warns(singpy: Singpy, c32_rocm_host: simhost.SimHost, image: Path,
                                      workdir: Path) -> None:
    """A liblist whose libraries have no 32-bit build: Apptainer's warning, and the run goes on."""
    confdir = workdir / f"conf-c32rocm64-{singpy.profile}"
    confdir.mkdir(exist_ok=True)
    (confdir / "rocmliblist.conf").write_text("libamdocl64.so\n")
    result = SimHostRun(singpy, c32_rocm_host, confdir).run("exec", "--rocm", "--compat32", str(image), "sh", "-c",
                                                           SHOW)
    assert result.returncode == 0, result.stderr
    assert "could not find any 32-bit rocm libraries on this host" in result.stderr
    dirs, ld_path = _seen(result.stdout)
    assert "libamdocl64.so" in dirs[LIBS] and dirs[LIBS32] == {}
    assert ld_path == LIBS


def test_dry_run_shows_the_32bit_binds(nv: SimHostRun, c32_host: simhost.SimHost, image: Path) -> None:
    report = json.loads(nv.ok("exec", "--nv", "--compat32", "--dry-run", str(image), "true", conf=LIBLIST))
    assert report["gpu"]["libraries32"] == [str(c32_host.lib32["libcuda.so.1"])]
    assert str(c32_host.lib32["libcuda.so.1"]) not in report["gpu"]["libraries"]
    planned = {(mount["op"], mount["dest"]) for mount in report["plan"]["mounts"]}
    assert ("tmpfs", LIBS32) in planned and ("bind", f"{LIBS32}/libcuda.so.1") in planned
    plain = json.loads(nv.ok("exec", "--nv", "--dry-run", str(image), "true", conf=LIBLIST))
    assert plain["gpu"]["libraries32"] == []
    assert not any(mount["dest"].startswith(LIBS32) for mount in plain["plan"]["mounts"])


def test_instance_start_with_compat32(nv: SimHostRun, c32_host: simhost.SimHost, image: Path) -> None:
    """An instance started with --nv --compat32 holds both directories; a command joining it sees them."""
    name = f"c32-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # the homes are shared with other copies of the suite
    started = nv.run("instance", "start", "--nv", "--compat32", str(image), name, conf=LIBLIST)
    try:
        assert started.returncode == 0, started.stderr
        dirs, ld_path = _seen(nv.ok("exec", f"instance://{name}", "sh", "-c", SHOW, conf=LIBLIST))
    finally:
        nv.run("instance", "stop", "--force", name)
    assert dirs[LIBS32]["libcuda.so.1"] == ("7f454c4601", _md5(c32_host.lib32["libcuda.so.1"]))
    assert dirs[LIBS]["libcuda.so.1"][0] == "7f454c4602"
    assert ld_path.split(":")[-2:] == [LIBS, LIBS32]


def test_writable_image_without_the_mount_point_is_one_fatal_line(nv: SimHostRun, workdir: Path) -> None:
    """--writable makes no mount point in the image (as for /.singularity.d/libs): one FATAL line, image as it was."""
    sandbox = build_busybox_rootfs(workdir / f"c32-writable-{nv.runner.profile}-{uuid.uuid4().hex[:6]}")
    for path in [sandbox, *sandbox.rglob("*")]:
        os.lchown(path, nv.runner.uid, nv.runner.gid)
    before = sorted(str(path) for path in sandbox.rglob("*"))
    result = nv.run("exec", "--nv", "--compat32", "--writable", "--contain", str(sandbox), "true", conf=LIBLIST)
    assert_one_fatal(result, f"can't mount tmpfs on {LIBS32}: {LIBS32} does not exist in the image")
    assert sorted(str(path) for path in sandbox.rglob("*")) == before

"""nvidia.discover / rocm.discover against a simulated GPU host (see simhost.py).

The host is real: mknod'ed device nodes, gcc-built ELF libraries, an ld cache
written by ldconfig, shell stubs for nvidia-smi / nvidia-container-cli.  The
assertions are on what discover returns: the binds (source -> destination),
the warnings and notes.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from singpy.gpu import GpuContribution, GpuHost, ImageHints, merge, nvidia, rocm
from singpy.gpu.elf import elf_identity
from singpy.plan import Missing, MountOp, Stage

from .simhost import (
    DRIVER,
    SimHost,
    build_elf_library,
    build_nvidia_host,
    build_rocm_host,
    container_cli_script,
    proc_version_text,
    write_file,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED_NV = REPO / "etc/nvliblist.conf"
SHIPPED_ROCM = REPO / "etc/rocmliblist.conf"
LIBS = "/.singularity.d/libs"
CONTROL_NODES = {
    "/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps",
}  # fmt: skip

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the simulated host needs mknod (root)"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="the simulated host needs gcc"),
]


@pytest.fixture
def nv_host(tmp_path: Path) -> SimHost:
    return build_nvidia_host(tmp_path)


@pytest.fixture
def rocm_host(tmp_path: Path) -> SimHost:
    return build_rocm_host(tmp_path)


def sim_gpu_host(host: SimHost, **fields: Any) -> GpuHost:
    """The simulated host as the GPU modules see it; keyword fields win."""
    values: dict[str, Any] = {
        "env": {},
        "path_env": host.path_env,
        "nvliblist": str(host.liblist),
        "rocmliblist": str(host.liblist),
        "dev_dir": str(host.dev_dir),
        "ldconfig": host.ldconfig,
        "ld_cache_file": str(host.ld_cache),
        "persistenced_socket": str(host.persistenced_socket),
        "proc_driver_version": str(host.proc_version),
        "inherited_libs_dir": str(host.root / "no-parent-container"),
    }
    return GpuHost(**{**values, **fields})


def discover_nv(host: SimHost, *, contain: bool = False, image: ImageHints | None = None,
                **fields: Any) -> GpuContribution:
    """nvidia.discover pointed at the simulated host."""
    return nvidia.discover(sim_gpu_host(host, **fields), contain=contain, image=image)


def discover_rocm(host: SimHost, *, contain: bool = True, **fields: Any) -> GpuContribution:
    return rocm.discover(sim_gpu_host(host, **fields), contain=contain)


def binds(contrib: GpuContribution) -> dict[str, str]:
    """Destination -> host source of every bind."""
    return {m.dest: m.source or "" for m in contrib.mounts if m.op == MountOp.BIND}


def dev_dests(contrib: GpuContribution) -> set[str]:
    return {m.dest for m in contrib.mounts if m.dev}


def lib_binds(contrib: GpuContribution) -> dict[str, str]:
    """What each name in /.singularity.d/libs is inside the container: name -> the host file it leads to.

    The container's view, worked out from the mounts as the kernel would: a
    bind shows its source file, a link in the tmpfs leads (relative: to
    another entry of the directory, absolute: to a path bound in the
    container) to what is there. The host files compared against are real
    paths (os.path.realpath), so a name leading to the wrong file, or to
    nothing, fails.
    """
    seen: dict[str, str] = {}
    for name in {spec.dest.removeprefix(LIBS + "/") for spec in contrib.mounts if spec.dest.startswith(LIBS + "/")}:
        seen[name] = container_file(contrib, f"{LIBS}/{name}")
    return seen


def container_file(contrib: GpuContribution, path: str, depth: int = 0) -> str:
    """The host file (real path) that container path `path` shows; "" for nothing (a dangling link)."""
    spec = next((m for m in contrib.mounts if m.dest == path and m.op in (MountOp.BIND, MountOp.SYMLINK)), None)
    if spec is None or spec.source is None or depth > 8:
        return ""
    if spec.op == MountOp.BIND:
        return os.path.realpath(spec.source)
    assert spec.op == MountOp.SYMLINK and path.startswith(LIBS + "/")  # links are made only in the tmpfs
    return container_file(contrib, os.path.normpath(os.path.join(LIBS, spec.source)), depth + 1)


def real(path: Path | str) -> str:
    return os.path.realpath(path)


def bound_files(contrib: GpuContribution) -> list[str]:
    """Host files bound into /.singularity.d/libs, in order (one bind each, the other names are links)."""
    return [os.path.realpath(m.source or "") for m in contrib.mounts
            if m.op == MountOp.BIND and m.dest.startswith(LIBS + "/")]


# --- the simulated host itself ------------------------------------------------------------


def test_simhost_devices_are_char_devices_with_nvidia_numbers(nv_host: SimHost) -> None:
    numbers = {}
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"):
        info = os.stat(nv_host.dev_dir / name)
        assert stat.S_ISCHR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666
        numbers[name] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    assert numbers["nvidiactl"] == (195, 255) and numbers["nvidia1"] == (195, 1)
    assert numbers["nvidia-modeset"] == (195, 254) and numbers["nvidia-uvm-tools"] == (511, 1)
    assert (nv_host.dev_dir / "nvidia-caps").is_dir()


def test_simhost_libcuda_is_a_loadable_elf(nv_host: SimHost) -> None:
    libcuda = ctypes.CDLL(str(nv_host.lib_dir / "libcuda.so.1"))
    version = ctypes.c_int(0)
    assert libcuda.cuInit(0) == 0
    assert libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 12040
    assert os.readlink(nv_host.lib_dir / "libcuda.so.1") == f"libcuda.so.{DRIVER}"
    for lib32 in nv_host.lib32.values():
        identity = elf_identity(lib32)
        assert identity is not None and identity.elf_class == 1 and identity.machine == 3


# --- devices ------------------------------------------------------------------------------


def test_every_nvidia_node_is_a_dev_bind(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host)
    assert dev_dests(contrib) == CONTROL_NODES | {"/dev/nvidia0", "/dev/nvidia1"}
    for spec in (m for m in contrib.mounts if m.dev):
        assert spec.op == MountOp.BIND and spec.missing == Missing.REQUIRED and spec.stage == Stage.GPU
        assert spec.source == str(nv_host.dev_dir / spec.dest.removeprefix("/dev/"))
    assert f"binding {nv_host.dev_dir}/nvidia0 -> /dev/nvidia0" in contrib.notes
    assert not contrib.warnings


@pytest.mark.parametrize(
    ("value", "gpus"),
    [
        pytest.param(None, {0, 1, 2}, id="unset-all"),
        pytest.param("", {0, 1, 2}, id="empty-all"),
        pytest.param("all", {0, 1, 2}, id="all"),
        pytest.param("none", set(), id="none"),
        pytest.param("void", set(), id="void"),
        pytest.param("1", {1}, id="one-index"),
        pytest.param("0,2", {0, 2}, id="two-indices"),
        pytest.param(" 2 , 0 ", {0, 2}, id="spaces"),
    ],
)
def test_contain_selects_gpu_nodes(tmp_path: Path, value: str | None, gpus: set[int]) -> None:
    host = build_nvidia_host(tmp_path, gpus=3)
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    contrib = discover_nv(host, contain=True, env=env)
    assert dev_dests(contrib) == CONTROL_NODES | {f"/dev/nvidia{i}" for i in gpus}
    assert not contrib.warnings


def test_contain_selects_gpus_by_uuid_through_nvidia_smi(nv_host: SimHost) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": nv_host.uuids[1]}
    contrib = discover_nv(nv_host, contain=True, env=env)
    assert dev_dests(contrib) == CONTROL_NODES | {"/dev/nvidia1"}
    mixed = discover_nv(nv_host, contain=True, env={"NVIDIA_VISIBLE_DEVICES": f"0,{nv_host.uuids[1]}"})
    assert dev_dests(mixed) == CONTROL_NODES | {"/dev/nvidia0", "/dev/nvidia1"}


def test_uuid_without_nvidia_smi_warns_and_binds_no_gpu(nv_host: SimHost, tmp_path: Path) -> None:
    empty_path = tmp_path / "empty-bin"
    empty_path.mkdir()
    env = {"NVIDIA_VISIBLE_DEVICES": nv_host.uuids[0]}
    contrib = discover_nv(nv_host, contain=True, env=env, path_env=str(empty_path))
    assert dev_dests(contrib) == CONTROL_NODES
    assert any("nvidia-smi is not on PATH" in w for w in contrib.warnings)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("7", "no GPU device node for '7'", id="absent-index"),
        pytest.param("GPU-ffffffff-0000-0000-0000-000000000000", "no GPU device node for 'GPU-ffff", id="unknown-uuid"),
        pytest.param("MIG-4f6c1d2e-0000-0000-0000-000000000000", "no MIG device 'MIG-4f6c1d2e", id="mig"),
    ],
)
def test_unusable_selection_entries_warn(nv_host: SimHost, value: str, expected: str) -> None:
    contrib = discover_nv(nv_host, contain=True, env={"NVIDIA_VISIBLE_DEVICES": value})
    assert dev_dests(contrib) == CONTROL_NODES
    assert any(expected in w for w in contrib.warnings)


def test_selection_needs_contain(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host, contain=False, env={"NVIDIA_VISIBLE_DEVICES": "1"})
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= dev_dests(contrib)
    assert any("only with --contain" in note for note in contrib.notes)


def test_no_devices_warning(tmp_path: Path) -> None:
    host = build_nvidia_host(tmp_path, devices=False)
    contrib = discover_nv(host)
    assert nvidia.NO_DEVICES in contrib.warnings
    assert nvidia.NO_DEVICES == (
        "no NVIDIA GPU devices found on this host (no /dev/nvidia*): the container will run without GPU access"
    )
    assert not dev_dests(contrib)
    assert "libcuda.so.1" in lib_binds(contrib)  # libraries are still offered, as Apptainer does


def test_missing_uvm_warning(tmp_path: Path) -> None:
    host = build_nvidia_host(tmp_path, uvm=False)
    contrib = discover_nv(host)
    (warning,) = [w for w in contrib.warnings if "nvidia-uvm" in w]
    assert f"{host.dev_dir}/nvidia-uvm is missing" in warning
    assert "modprobe nvidia_uvm" in warning and "CUDA_ERROR_UNKNOWN" in warning
    assert "/dev/nvidia-uvm" not in dev_dests(contrib)


# --- libraries, binaries, files through the ld cache ---------------------------------------


def test_libraries_resolved_through_the_ldconfig_cache(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host)
    libs = lib_binds(contrib)
    libcuda = real(nv_host.lib_dir / "libcuda.so.1")
    assert libcuda.endswith(f"/libcuda.so.{DRIVER}")
    assert libs == {
        "libcuda.so.1": libcuda,
        "libcuda.so": libcuda,
        "libnvidia-ml.so.1": real(nv_host.lib_dir / "libnvidia-ml.so.1"),
        f"libnvidia-glcore.so.{DRIVER}": real(nv_host.lib_dir / f"libnvidia-glcore.so.{DRIVER}"),
    }
    assert contrib.libs_dir_used
    # libcuda.so and libcuda.so.1 are one file: bound once (under its most specific name), the other a link.
    assert sorted(bound_files(contrib)) == sorted(set(libs.values()))
    assert f"binding {libcuda} -> {LIBS}/libcuda.so.1" in contrib.notes
    assert f"linking {LIBS}/libcuda.so -> libcuda.so.1" in contrib.notes


def test_library_binds_follow_one_tmpfs_and_are_read_only(nv_host: SimHost) -> None:
    mounts = discover_nv(nv_host).mounts
    tmpfs = [i for i, m in enumerate(mounts) if m.op == MountOp.TMPFS]
    assert len(tmpfs) == 1 and mounts[tmpfs[0]].dest == LIBS and mounts[tmpfs[0]].stage == Stage.GPU
    lib_indices = [i for i, m in enumerate(mounts) if m.dest.startswith(LIBS + "/")]
    assert lib_indices and min(lib_indices) > tmpfs[0]
    (seal,) = [i for i, m in enumerate(mounts) if m.op == MountOp.SEAL]
    assert mounts[seal].dest == LIBS and max(lib_indices) < seal  # links too are made before the tmpfs is sealed
    assert all(mounts[i].missing == Missing.REQUIRED for i in lib_indices)
    assert all(mounts[i].readonly for i in lib_indices if mounts[i].op == MountOp.BIND)
    links = [mounts[i] for i in lib_indices if mounts[i].op == MountOp.SYMLINK]
    assert links and all(link.source and "/" not in link.source for link in links)  # relative, to an entry beside


def test_32bit_and_foreign_libraries_are_skipped(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host)
    sources = set(binds(contrib).values())
    assert not any(str(path) in sources for path in nv_host.lib32.values())
    assert nv_host.lib32_dir is None or not any(s.startswith(str(nv_host.lib32_dir)) for s in sources)
    assert str(nv_host.foreign_lib) not in sources
    assert any(str(nv_host.foreign_lib) in note and "architecture" in note for note in contrib.notes)
    assert not any("architecture" in w for w in contrib.warnings)  # silent, as in Apptainer


def test_32bit_absolute_library_is_not_bound(nv_host: SimHost) -> None:
    if nv_host.lib32_dir is None:
        pytest.skip("gcc -m32 cannot link on this host")
    liblist = write_file(nv_host.root / "lib32.conf", f"{nv_host.lib32['libcuda.so.1']}\n")
    contrib = discover_nv(nv_host, nvliblist=str(liblist))
    assert not lib_binds(contrib)
    assert "could not find any nv libraries on this host" in contrib.warnings


def test_binaries_files_and_persistenced_socket(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host)
    bound = binds(contrib)
    assert bound["/usr/bin/nvidia-smi"] == str(nv_host.bin_dir / "nvidia-smi")
    icd = str(nv_host.files[0])
    assert bound[icd] == icd
    socket = str(nv_host.persistenced_socket)
    assert bound[socket] == socket
    assert all(m.readonly for m in contrib.mounts if m.dest in {"/usr/bin/nvidia-smi", icd, socket})
    absent = f"{nv_host.root}/usr/share/glvnd/egl_vendor.d/10_nvidia.json"
    assert absent not in bound and f"nv file {absent} not found" in contrib.notes
    assert "nv binary nvidia-persistenced not found on PATH" in contrib.notes


def test_missing_persistenced_socket_is_a_note(nv_host: SimHost) -> None:
    nv_host.persistenced_socket.unlink()
    contrib = discover_nv(nv_host)
    assert str(nv_host.persistenced_socket) not in binds(contrib)
    assert f"persistenced socket {nv_host.persistenced_socket} not found" in contrib.notes


def test_per_library_miss_is_a_note_not_a_warning(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host)
    assert "nv library libnvidia-opencl.so not found on this host" in contrib.notes
    assert not contrib.warnings


def test_no_library_found_warning(nv_host: SimHost) -> None:
    liblist = write_file(nv_host.root / "absent.conf", "libnvidia-does-not-exist.so\nlibnvfake.so\n")
    contrib = discover_nv(nv_host, nvliblist=str(liblist))
    assert contrib.warnings == ("could not find any nv libraries on this host",)
    assert not contrib.libs_dir_used and not any(m.op == MountOp.TMPFS for m in contrib.mounts)


def test_unreadable_liblist_is_a_warning(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host, nvliblist=str(nv_host.root / "missing.conf"))
    (warning,) = contrib.warnings
    assert warning.startswith("while finding nv bind points: could not read ") and "missing.conf" in warning
    assert dev_dests(contrib)  # devices are still bound


def test_broken_ldconfig_is_a_warning(nv_host: SimHost, tmp_path: Path) -> None:
    unknown_format = tmp_path / "ld.so.cache"
    unknown_format.write_bytes(b"ld.so-1.7.0")  # not read directly: ldconfig -p must print it, and is missing
    contrib = discover_nv(nv_host, ldconfig=str(nv_host.root / "no-ldconfig"), ld_cache_file=str(unknown_format))
    assert any(w.startswith("while finding nv bind points: could not retrieve ld cache") for w in contrib.warnings)
    assert "could not find any nv libraries on this host" in contrib.warnings


def test_shipped_nvliblist_finds_the_simulated_driver(nv_host: SimHost) -> None:
    libs = lib_binds(discover_nv(nv_host, nvliblist=str(SHIPPED_NV)))
    assert libs["libcuda.so.1"] == real(nv_host.lib_dir / "libcuda.so.1")
    assert libs["libnvidia-ml.so.1"] == real(nv_host.lib_dir / "libnvidia-ml.so.1")


def test_parent_container_libraries_win(nv_host: SimHost) -> None:
    parent = nv_host.root / "parent-libs"
    parent.mkdir()
    inherited = build_elf_library(parent, "libcuda.so.1")
    contrib = discover_nv(nv_host, inherited_libs_dir=str(parent))
    assert lib_binds(contrib)["libcuda.so.1"] == real(inherited)


# --- glibc check ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image_glibc", "skipped"),
    [
        pytest.param("2.31", True, id="older-image"),
        pytest.param("2.34", False, id="same"),
        pytest.param("2.39", False, id="newer-image"),
        pytest.param(None, False, id="unknown"),
    ],
)
def test_library_needing_newer_glibc_is_skipped(nv_host: SimHost, image_glibc: str | None, skipped: bool) -> None:
    contrib = discover_nv(nv_host, image=ImageHints(glibc=image_glibc))
    glcore = f"libnvidia-glcore.so.{DRIVER}"
    assert (glcore not in lib_binds(contrib)) is skipped
    assert "libcuda.so.1" in lib_binds(contrib)
    glibc_warnings = [w for w in contrib.warnings if "GLIBC_" in w]
    if skipped:
        assert glibc_warnings == [
            f"skipping host file {nv_host.lib_dir / glcore}: it needs GLIBC_2.34 but the image has glibc 2.31 "
            "(inside the container it would fail with 'GLIBC_2.34 not found')"
        ]
    else:
        assert not glibc_warnings


# --- nvidia-container-cli ---------------------------------------------------------------------


def test_container_cli_paths_and_their_symlinks(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host, nvidia_container_cli=str(nv_host.container_cli))
    libs = lib_binds(contrib)
    libcuda = str(nv_host.lib_dir / f"libcuda.so.{DRIVER}")
    assert libs[f"libcuda.so.{DRIVER}"] == libs["libcuda.so.1"] == libs["libcuda.so"] == real(libcuda)
    assert libs["libnvidia-ml.so.1"] == real(nv_host.lib_dir / f"libnvidia-ml.so.{DRIVER}")
    assert libs[f"libnvidia-glcore.so.{DRIVER}"] == real(nv_host.lib_dir / f"libnvidia-glcore.so.{DRIVER}")
    # Each listed file bound once under its own name; its soname links are links to it.
    assert sorted(bound_files(contrib)) == sorted(set(libs.values())) and len(bound_files(contrib)) == 3
    mounts = {m.dest: m for m in contrib.mounts}
    assert (mounts[f"{LIBS}/libcuda.so.1"].op, mounts[f"{LIBS}/libcuda.so.1"].source) == (
        MountOp.SYMLINK, f"libcuda.so.{DRIVER}")
    assert binds(contrib)["/usr/bin/nvidia-smi"] == str(nv_host.bin_dir / "nvidia-smi")
    assert str(nv_host.files[0]) not in binds(contrib)  # the liblist was not used
    assert any(str(nv_host.container_cli) in note for note in contrib.notes)
    assert not contrib.warnings


def test_container_cli_output_is_elf_filtered(nv_host: SimHost) -> None:
    listed = [str(nv_host.lib_dir / f"libnvidia-ml.so.{DRIVER}"), str(nv_host.foreign_lib)]
    listed += [str(path) for path in nv_host.lib32.values()]
    cli = write_file(nv_host.root / "cli", container_cli_script(listed))
    cli.chmod(0o755)
    libs = lib_binds(discover_nv(nv_host, nvidia_container_cli=str(cli)))
    assert set(libs) == {f"libnvidia-ml.so.{DRIVER}", "libnvidia-ml.so.1"}
    assert set(libs.values()) == {real(nv_host.lib_dir / f"libnvidia-ml.so.{DRIVER}")}


def test_failing_container_cli_falls_back_to_liblist(nv_host: SimHost) -> None:
    cli = write_file(nv_host.root / "cli-broken", "#!/bin/sh\necho 'nvml error: driver not loaded' >&2\nexit 1\n")
    cli.chmod(0o755)
    contrib = discover_nv(nv_host, nvidia_container_cli=str(cli))
    assert contrib.warnings == (
        f"nvidia-container-cli list failed (nvml error: driver not loaded); using {nv_host.liblist} instead",
    )
    assert lib_binds(contrib)["libcuda.so.1"] == real(nv_host.lib_dir / "libcuda.so.1")


def test_absent_container_cli_uses_liblist_silently(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host, nvidia_container_cli=str(nv_host.root / "no-such-cli"))
    assert "libcuda.so.1" in lib_binds(contrib) and not contrib.warnings


# --- CUDA version against the driver ------------------------------------------------------------


@pytest.mark.parametrize(
    ("image_env", "driver", "warns"),
    [
        pytest.param({"CUDA_VERSION": "12.4.1"}, "550.54.14", False, id="12.4-on-550.54.14"),
        pytest.param({"CUDA_VERSION": "12.6.3"}, "550.54.14", True, id="12.6-on-550"),
        pytest.param({"CUDA_VERSION": "12.4.1"}, "550.40.07", True, id="12.4-on-550.40"),
        pytest.param({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=470,driver<471"}, "560.35.03", True,
                     id="require-12.8-on-560"),
        pytest.param({"NVIDIA_REQUIRE_CUDA": "cuda>=11.8", "CUDA_VERSION": "12.9.0"}, "525.60.13", False,
                     id="require-wins-over-version"),
        pytest.param({"CUDA_VERSION": "13.0.0"}, "575.57.08", True, id="13.0-on-575"),
        pytest.param({"CUDA_VERSION": "13.0.0"}, "580.65.06", False, id="13.0-on-580"),
        pytest.param({"CUDA_VERSION": "13.2.0"}, "590.44.01", False, id="newer-than-table"),
        pytest.param({"CUDA_VERSION": "12.0.0"}, "470.82.01", True, id="12.0-on-470"),
        pytest.param({"CUDA_VERSION": "11.0.3"}, "390.157", True, id="older-than-table"),
        pytest.param({"CUDA_VERSION": "12.9.0", "NVIDIA_DISABLE_REQUIRE": "1"}, "535.54.03", False,
                     id="disable-require"),
        pytest.param({}, "535.54.03", False, id="no-cuda-image"),
    ],
)  # fmt: skip
def test_cuda_newer_than_driver(nv_host: SimHost, image_env: Mapping[str, str], driver: str, warns: bool) -> None:
    write_file(nv_host.proc_version, proc_version_text(driver))
    contrib = discover_nv(nv_host, image=ImageHints(env=image_env))
    cuda = [w for w in contrib.warnings if w.startswith("the image needs CUDA")]
    assert bool(cuda) is warns
    if warns:
        assert f"host NVIDIA driver {driver} supports" in cuda[0]
        assert "CUDA driver version is insufficient for CUDA runtime version" in cuda[0]


def test_cuda_warning_text(nv_host: SimHost) -> None:
    contrib = discover_nv(nv_host, image=ImageHints(env={"CUDA_VERSION": "12.6.3"}))
    assert contrib.warnings == (
        f"the image needs CUDA 12.6 but the host NVIDIA driver {DRIVER} supports CUDA up to 12.4: "
        "CUDA programs may fail with 'CUDA driver version is insufficient for CUDA runtime version' "
        "(update the host driver, or use an image built for an older CUDA)",
    )


@pytest.mark.parametrize(
    ("text", "version"),
    [
        pytest.param(proc_version_text("550.54.14"), (550, 54, 14), id="proprietary"),
        pytest.param(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 23:14:16 UTC 2025\nGCC version:  gcc version 13.3.0\n",
            (570, 86, 15),
            id="open-module",
        ),
        pytest.param(
            "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104.05  Sat Aug 19 01:04:32 UTC 2023\n",
            (535, 104, 5),
            id="aarch64",
        ),
        pytest.param("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n",
                     (390, 157), id="two-part"),
        pytest.param("garbage\n", None, id="garbage"),
    ],
)  # fmt: skip
def test_driver_version_parsing(tmp_path: Path, text: str, version: tuple[int, ...] | None) -> None:
    path = write_file(tmp_path / "version", text)
    assert nvidia.driver_version(str(path)) == version


def test_no_proc_driver_file_means_no_cuda_check(nv_host: SimHost) -> None:
    nv_host.proc_version.unlink()
    contrib = discover_nv(nv_host, image=ImageHints(env={"CUDA_VERSION": "13.0.0"}))
    assert not contrib.warnings


# --- environment -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host_env", "kept"),
    [
        pytest.param({}, (), id="none"),
        pytest.param({"CUDA_VISIBLE_DEVICES": "0"}, ("CUDA_VISIBLE_DEVICES",), id="cuda"),
        pytest.param({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": ""},
                     ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"), id="both"),
        pytest.param({"HOME": "/root"}, (), id="unrelated"),
    ],
)  # fmt: skip
def test_keep_host_env(nv_host: SimHost, host_env: dict[str, str], kept: tuple[str, ...]) -> None:
    contrib = discover_nv(nv_host, env=host_env)
    assert contrib.keep_host_env == kept
    assert contrib.env == ()


# --- ROCm ----------------------------------------------------------------------------------------


def test_rocm_devices_libraries_and_binaries(rocm_host: SimHost) -> None:
    contrib = discover_rocm(rocm_host)
    assert dev_dests(contrib) == {"/dev/kfd", "/dev/dri"}
    assert binds(contrib)["/dev/dri"] == str(rocm_host.dev_dir / "dri")
    assert all(m.missing == Missing.REQUIRED and m.stage == Stage.GPU for m in contrib.mounts)
    assert lib_binds(contrib) == {
        "libamdocl64.so": real(rocm_host.lib_dir / "libamdocl64.so"),
        "librocr_debug_agent64.so.2": real(rocm_host.lib_dir / "librocr_debug_agent64.so.2"),
        "libCXLActivityLogger.so": real(rocm_host.lib_dir / "libCXLActivityLogger.so"),
    }
    assert binds(contrib)["/usr/bin/rocminfo"] == str(rocm_host.bin_dir / "rocminfo")
    assert binds(contrib)["/usr/bin/rocm-smi"] == str(rocm_host.bin_dir / "rocm-smi")
    assert "rocm library libhc_am.so not found on this host" in contrib.notes
    assert contrib.libs_dir_used and not contrib.warnings


def test_rocm_shipped_liblist_finds_the_simulated_libraries(rocm_host: SimHost) -> None:
    libs = lib_binds(discover_rocm(rocm_host, rocmliblist=str(SHIPPED_ROCM)))
    assert libs["libamdocl64.so"] == real(rocm_host.lib_dir / "libamdocl64.so")
    assert libs["librocr_debug_agent64.so.2"] == real(rocm_host.lib_dir / "librocr_debug_agent64.so.2")


def test_rocm_no_devices_warning(tmp_path: Path) -> None:
    host = build_rocm_host(tmp_path, kfd=False, dri=False)
    contrib = discover_rocm(host)
    assert rocm.NO_DEVICES in contrib.warnings
    assert rocm.NO_DEVICES.startswith("no AMD GPU devices found (no /dev/kfd or /dev/dri)")
    assert not dev_dests(contrib)


def test_rocm_dri_without_kfd_warns(tmp_path: Path) -> None:
    host = build_rocm_host(tmp_path, kfd=False)
    contrib = discover_rocm(host)
    assert dev_dests(contrib) == {"/dev/dri"}
    assert any(f"{host.dev_dir}/kfd is missing" in w for w in contrib.warnings)


def test_rocm_no_libraries_warning(rocm_host: SimHost) -> None:
    liblist = write_file(rocm_host.root / "absent.conf", "rocminfo\nlibhsa-nothing.so\n")
    contrib = discover_rocm(rocm_host, rocmliblist=str(liblist))
    assert contrib.warnings == ("could not find any rocm libraries on this host",)
    assert binds(contrib)["/usr/bin/rocminfo"] == str(rocm_host.bin_dir / "rocminfo")


def test_rocm_foreign_library_skipped(rocm_host: SimHost) -> None:
    liblist = write_file(rocm_host.root / "foreign.conf", f"{rocm_host.foreign_lib}\nlibamdocl64.so\n")
    libs = lib_binds(discover_rocm(rocm_host, rocmliblist=str(liblist)))
    assert libs == {"libamdocl64.so": real(rocm_host.lib_dir / "libamdocl64.so")}


def test_rocm_keep_host_env(rocm_host: SimHost) -> None:
    env = {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0", "PATH": "/bin"}
    assert discover_rocm(rocm_host, env=env).keep_host_env == ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


# --- merge ----------------------------------------------------------------------------------------


def test_merge_nv_and_rocm(tmp_path: Path) -> None:
    nv_host = build_nvidia_host(tmp_path / "nv")
    rocm_host = build_rocm_host(tmp_path / "rocm")
    nv = discover_nv(nv_host, env={"CUDA_VISIBLE_DEVICES": "0"})
    amd = discover_rocm(rocm_host, env={"ROCR_VISIBLE_DEVICES": "0"}, contain=False)
    both = merge(nv, amd)
    tmpfs = [i for i, m in enumerate(both.mounts) if m.op == MountOp.TMPFS]
    assert len(tmpfs) == 1
    assert all(i > tmpfs[0] for i, m in enumerate(both.mounts) if m.dest.startswith(LIBS + "/"))
    assert [m.dest for m in both.mounts if m.op == MountOp.SEAL] == [LIBS]
    seal = next(i for i, m in enumerate(both.mounts) if m.op == MountOp.SEAL)
    inside = [i for i, m in enumerate(both.mounts) if m.dest == LIBS or m.dest.startswith(LIBS + "/")]
    assert inside == list(range(seal + 1))  # the tmpfs, every vendor's libraries, the seal: one block
    dests = [m.dest for m in both.mounts if m.op != MountOp.SEAL]
    assert len(dests) == len(set(dests))
    assert {"libcuda.so.1", "libamdocl64.so"} <= set(lib_binds(both))
    assert {"/dev/nvidia0", "/dev/kfd", "/dev/dri"} <= dev_dests(both)
    assert both.keep_host_env == ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    assert both.libs_dir_used


def test_merge_keeps_first_of_a_duplicate_destination(nv_host: SimHost) -> None:
    first = discover_nv(nv_host)
    liblist = write_file(nv_host.root / "other.conf", f"{nv_host.lib_dir / 'libcuda.so.1'}\n")
    second = discover_nv(nv_host, nvliblist=str(liblist), contain=True)
    both = merge(first, second)
    assert lib_binds(both)["libcuda.so.1"] == lib_binds(first)["libcuda.so.1"]
    assert merge() == GpuContribution()

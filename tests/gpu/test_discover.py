"""nvidia.discover / rocm.discover against a simulated GPU host (see simhost.py): the host itself, device
nodes, libraries and binaries through the ld cache, the glibc check. nvidia-container-cli, the CUDA version,
the environment, ROCm and merge are in test_discover_tools.py.

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
from pathlib import Path

import pytest

from singpy.gpu import ImageHints, nvidia
from singpy.gpu.elf import elf_identity
from singpy.plan import Missing, MountOp, Stage

from .discovering import (
    CONTROL_NODES,
    LIBS,
    SHIPPED_NV,
    binds,
    bound_files,
    dev_dests,
    discover_nv,
    lib_binds,
    real,
)
from .simhost import (
    DRIVER,
    SimHost,
    build_elf_library,
    build_nvidia_host,
    build_rocm_host,
    write_file,
)

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

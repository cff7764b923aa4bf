"""nvidia.discover / rocm.discover against a simulated GPU host (see simhost.py): nvidia-container-cli, the CUDA
version against the driver, the environment, ROCm, and merge; as test_discover.py, the assertions are on what
discover returns (binds, warnings, notes).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from singpy.gpu import GpuContribution, ImageHints, merge, nvidia, rocm
from singpy.plan import Missing, MountOp, Stage

from .discovering import (
    LIBS,
    SHIPPED_ROCM,
    binds,
    bound_files,
    dev_dests,
    discover_nv,
    discover_rocm,
    lib_binds,
    real,
)
from .simhost import (
    DRIVER,
    SimHost,
    build_nvidia_host,
    build_rocm_host,
    container_cli_script,
    proc_version_text,
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

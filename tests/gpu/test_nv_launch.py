"""`--nv` and `--rocm` end to end, on a simulated GPU host, as root and as a user.

The host is simulated with real things (tests/gpu/simhost.py: mknod device
nodes, gcc-built ELF libraries in a real ld.so.cache, stub tools), put in
place of the real one in a private mount namespace by tests/gpu/simrun.py.
A real C program inside an image without CUDA dlopen()s libcuda.so.1 and
calls into it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.gpu import simhost
from tests.support.simhost_runs import SimHostRun, sim_host, sim_run

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")


@pytest.fixture(scope="session")
def nv_host(workdir: Path) -> simhost.SimHost:
    return sim_host(workdir, "sim-nvidia", simhost.build_nvidia_host)


@pytest.fixture(scope="session")
def bare_host(workdir: Path) -> simhost.SimHost:
    """A host with the driver's libraries but neither GPU nodes nor UVM."""
    return sim_host(workdir, "sim-nodevices", simhost.build_nvidia_host, devices=False)


@pytest.fixture(scope="session")
def no_uvm_host(workdir: Path) -> simhost.SimHost:
    """GPUs and nvidiactl, but the nvidia_uvm module is not loaded."""
    return sim_host(workdir, "sim-nouvm", simhost.build_nvidia_host, uvm=False)


@pytest.fixture(scope="session")
def rocm_host(workdir: Path) -> simhost.SimHost:
    return sim_host(workdir, "sim-rocm", simhost.build_rocm_host)


@pytest.fixture
def nv(singpy: Singpy, nv_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, nv_host, workdir / f"conf-nv-{singpy.profile}", "nvliblist.conf")


@pytest.fixture
def rocm(singpy: Singpy, rocm_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, rocm_host, workdir / f"conf-rocm-{singpy.profile}", "rocmliblist.conf")


NV_NODES = {"nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps"}


@pytest.mark.parametrize("flags", [[], ["--contain"], ["--containall"]], ids=["default", "contain", "containall"])
def test_nv_devices_inside(nv: SimHostRun, image: Path, flags: list[str]) -> None:
    devices = set(nv.ok("exec", "--nv", *flags, str(image), "ls", "/dev").split())
    assert devices >= NV_NODES


def test_without_nv_contain_hides_gpu_nodes(nv: SimHostRun, image: Path) -> None:
    devices = set(nv.ok("exec", "--contain", str(image), "ls", "/dev").split())
    assert not NV_NODES & devices


def test_nv_libraries_bound_read_only_64_bit_only(nv: SimHostRun, image: Path) -> None:
    out = nv.ok("exec", "--nv", str(image), "sh", "-c",
                "ls /.singularity.d/libs; echo ---; head -c 5 /.singularity.d/libs/libcuda.so.1 | od -An -tx1;"
                " echo ---; echo $LD_LIBRARY_PATH; touch /.singularity.d/libs/libcuda.so.1 2>&1 || true")
    names, elf_head, rest = out.split("---")
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= set(names.split())
    assert elf_head.split() == ["7f", "45", "4c", "46", "02"]  # ELFCLASS64: the i386 copy was skipped
    assert "/.singularity.d/libs" in rest
    assert "Read-only file system" in rest


def test_program_without_cuda_calls_into_host_libcuda(nv: SimHostRun, cuda_check_image: Path) -> None:
    assert nv.ok("exec", "--nv", str(cuda_check_image), "cuda-check") == "cuInit=0 driver=12040\n"
    without = nv.run("exec", str(cuda_check_image), "cuda-check")
    assert without.returncode == 1 and "dlopen failed" in without.stdout


def test_nvidia_smi_runs_inside(nv: SimHostRun, image: Path) -> None:
    out = nv.ok("exec", "--nv", str(image), "nvidia-smi")
    assert "Driver Version: 550.54.14" in out
    assert nv.ok("exec", "--nv", str(image), "which", "nvidia-smi") == "/usr/bin/nvidia-smi\n"


def test_cuda_visible_devices_rules(nv: SimHostRun, image: Path) -> None:
    show = ["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES"]
    assert nv.ok("exec", "--nv", str(image), *show, SINGULARITYENV_CUDA_VISIBLE_DEVICES="1") == "cvd=1\n"
    assert nv.ok("exec", "--nv", str(image), *show, APPTAINERENV_CUDA_VISIBLE_DEVICES="0") == "cvd=0\n"
    # A batch system's allocation survives --cleanenv/--containall when --nv is given...
    assert nv.ok("exec", "--nv", "--cleanenv", str(image), *show, CUDA_VISIBLE_DEVICES="1") == "cvd=1\n"
    assert nv.ok("exec", "--nv", "--containall", str(image), *show, CUDA_VISIBLE_DEVICES="1") == "cvd=1\n"
    # ...and is cleaned as any variable without --nv.
    assert nv.ok("exec", "--cleanenv", str(image), *show, CUDA_VISIBLE_DEVICES="1") == "cvd=\n"


@pytest.mark.parametrize("selection, expected", [("1", {"nvidia1"}), ("0,1", {"nvidia0", "nvidia1"}),
                                                 ("none", set()), ("all", {"nvidia0", "nvidia1"})])
def test_nvidia_visible_devices_selects_nodes_with_contain(nv: SimHostRun, image: Path, selection: str,
                                                           expected: set[str]) -> None:
    devices = set(nv.ok("exec", "--nv", "--contain", str(image), "ls", "/dev",
                        NVIDIA_VISIBLE_DEVICES=selection).split())
    assert {name for name in devices if name[6:].isdigit() and name.startswith("nvidia")} == expected
    assert "nvidiactl" in devices


def test_nvidia_visible_devices_by_uuid(nv: SimHostRun, nv_host: simhost.SimHost, image: Path) -> None:
    devices = nv.ok("exec", "--nv", "--contain", str(image), "ls", "/dev", NVIDIA_VISIBLE_DEVICES=nv_host.uuids[1])
    assert "nvidia1" in devices.split() and "nvidia0" not in devices.split()


def test_no_devices_warns_and_still_runs(singpy: Singpy, bare_host: simhost.SimHost, workdir: Path,
                                         image: Path) -> None:
    bare = sim_run(singpy, bare_host, workdir / f"conf-bare-{singpy.profile}", "nvliblist.conf")
    result = bare.run("exec", "--nv", str(image), "echo", "payload ran")
    assert result.returncode == 0 and result.stdout == "payload ran\n"
    assert "WARNING: no NVIDIA GPU devices found" in result.stderr


def test_missing_uvm_warns_with_hint(singpy: Singpy, no_uvm_host: simhost.SimHost, workdir: Path,
                                     image: Path) -> None:
    sim = sim_run(singpy, no_uvm_host, workdir / f"conf-nouvm-{singpy.profile}", "nvliblist.conf")
    result = sim.run("exec", "--nv", str(image), "true")
    assert result.returncode == 0
    assert "nvidia-uvm is missing" in result.stderr and "modprobe nvidia_uvm" in result.stderr


def test_nvidia_container_cli_or_liblist(nv: SimHostRun, nv_host: simhost.SimHost, image: Path) -> None:
    icd = str(nv_host.files[0])  # listed in nvliblist.conf only: nvidia-container-cli lists no plain files
    show = ["sh", "-c", f"ls /.singularity.d/libs; ls {icd} 2>/dev/null || echo no-icd"]
    # --contain: the simulated host lives under /tmp, which would otherwise be visible as a whole.
    with_cli = nv.ok("exec", "--nv", "--contain", str(image), *show).split()  # the stub is on PATH: used
    assert {"libcuda.so.1", "libnvidia-ml.so.1", "no-icd"} <= set(with_cli)
    liblist = nv.ok("exec", "--nv", "--contain", str(image), *show, conf="use nvidia-container-cli = no\n").split()
    assert {"libcuda.so.1", "libnvidia-ml.so.1", icd} <= set(liblist)


def test_always_use_nv(nv: SimHostRun, image: Path) -> None:
    devices = nv.ok("exec", "--contain", str(image), "ls", "/dev", conf="always use nv = yes\n")
    assert "nvidia0" in devices.split()


def test_dry_run_reports_without_starting(nv: SimHostRun, image: Path) -> None:
    never = nv.runner.tmpdir / f"never-{nv.runner.profile}"  # sticky and world-writable, seen inside through /tmp
    report = json.loads(nv.ok("exec", "--nv", "--dry-run", str(image), "touch", str(never)))
    assert "/dev/nvidia0" in report["gpu"]["devices"]
    assert any(path.endswith("libcuda.so.550.54.14") or path.endswith("libcuda.so.1")
               for path in report["gpu"]["libraries"])
    assert any(path.endswith("/nvidia-smi") for path in report["gpu"]["binaries"])
    assert not never.exists()


def test_verbose_names_each_bind(nv: SimHostRun, image: Path) -> None:
    result = nv.run("-v", "exec", "--nv", str(image), "true")
    assert "binding" in result.stderr and "/.singularity.d/libs/libcuda.so.1" in result.stderr
    # without --contain the nodes come with the host's /dev (test_nv_devices_inside): no bind of their own
    assert "binding /dev/nvidia0 -> /dev/nvidia0" not in result.stderr
    assert "GPU device node(s) come with the host's /dev" in result.stderr
    contained = nv.run("-v", "exec", "--nv", "--contain", str(image), "true")
    assert "binding /dev/nvidia0 -> /dev/nvidia0" in contained.stderr


@pytest.mark.parametrize("flags", [[], ["--contain"]], ids=["default", "contain"])
def test_rocm_devices_and_libraries(rocm: SimHostRun, image: Path, flags: list[str]) -> None:
    out = rocm.ok("exec", "--rocm", *flags, str(image), "sh", "-c",
                  "ls /dev; ls /dev/dri; echo ---; ls /.singularity.d/libs; which rocminfo")
    devices, libs = out.split("---")
    assert {"kfd", "dri", "card0", "renderD128"} <= set(devices.split())
    assert {"libamdocl64.so", "/usr/bin/rocminfo"} <= set(libs.split())


def test_opencl_vendors_through_bind(nv: SimHostRun, image: Path, workdir: Path) -> None:
    vendors = workdir / "OpenCL" / "vendors"
    vendors.mkdir(parents=True, exist_ok=True)
    (vendors / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    out = nv.ok("exec", "--nv", "--bind", f"{workdir / 'OpenCL'}:/etc/OpenCL", str(image), "cat",
                "/etc/OpenCL/vendors/nvidia.icd")
    assert out == "libnvidia-opencl.so.1\n"


def test_every_library_mount_is_read_only_nosuid_nodev(nv: SimHostRun, image: Path) -> None:
    info = nv.ok("exec", "--nv", str(image), "cat", "/proc/self/mountinfo")
    mounts = [line.split() for line in info.splitlines() if " /.singularity.d/libs" in line]
    assert len(mounts) > 3  # the tmpfs and the library files bound into it
    for fields in mounts:
        options = fields[5].split(",")
        assert {"ro", "nosuid", "nodev"} <= set(options), fields[4]


@pytest.mark.parametrize("conf", ["", "use nvidia-container-cli = no\n"], ids=["container-cli", "nvliblist"])
def test_each_library_name_is_its_host_file_bound_once(nv: SimHostRun, nv_host: simhost.SimHost, image: Path,
                                                       conf: str) -> None:
    """Every name in /.singularity.d/libs holds the host file it names; each file is one mount, the rest links."""
    libs = "/.singularity.d/libs"
    out = nv.ok("exec", "--nv", "--contain", str(image), "sh", "-c",
                f"cd {libs} && for f in *; do echo \"$f $(md5sum < $f | cut -c1-32) $(readlink $f)\"; done; echo ---;"
                f" grep -c ' {libs}/' /proc/self/mountinfo", conf=conf)
    listing, mounts = out.split("---")
    seen = {name: (digest, target) for name, digest, *target in (line.split() for line in listing.splitlines())}
    assert {"libcuda.so", "libcuda.so.1", "libnvidia-ml.so.1"} <= set(seen)
    for name, (digest, _) in seen.items():
        host_file = os.path.realpath(nv_host.lib_dir / name)
        assert digest == hashlib.md5(Path(host_file).read_bytes()).hexdigest(), name
    links = {name: target[0] for name, (_, target) in seen.items() if target}
    assert links and all("/" not in target and target in seen for target in links.values())  # relative, beside
    files = {os.path.realpath(nv_host.lib_dir / name) for name in seen}
    assert int(mounts) == len(files) == len(seen) - len(links)  # one bind per distinct host file
    assert "libcuda.so" in links

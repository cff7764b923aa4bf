"""The image's NVIDIA_* variables drive --nv, on the simulated GPU host, as root and as a user.

NVIDIA_DRIVER_CAPABILITIES picks the driver's libraries and tools,
NVIDIA_VISIBLE_DEVICES the GPU nodes, NVIDIA_REQUIRE_* (and a legacy image's
CUDA_VERSION) are checked against the driver. The simulated host
(tests/gpu/simhost.py, put in place by tests/gpu/simrun.py) also gets its
/proc/driver/nvidia here: a tmpfs over the host's /proc/driver, in the run's
own mount namespace, holds a copy of the simulated driver's version file and
MIG capability files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.gpu import ImageHints
from singpy.gpu.request import squashfs_hints
from singpy.image.detect import detect
from tests.conftest import Singpy, assert_one_fatal
from tests.gpu import simhost
from tests.gpu.discovering import discover_nv
from tests.support.images import build_busybox_rootfs
from tests.support.mpi import build_sif
from tests.support.simhost_runs import DriverRun, sim_host, sim_run

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")

LIBS = "/.singularity.d/libs"
SHOW = ["sh", "-c", f"ls {LIBS}; ls /usr/bin/nvidia-smi 2>/dev/null || echo no-smi"]


@pytest.fixture(scope="session")
def caps_host(workdir: Path) -> simhost.SimHost:
    return sim_host(workdir, "sim-nvidia-caps", simhost.build_nvidia_host)


@pytest.fixture
def nv(singpy: Singpy, caps_host: simhost.SimHost, workdir: Path) -> DriverRun:
    sim = sim_run(singpy, caps_host, workdir / f"conf-caps-{singpy.profile}", "nvliblist.conf")
    return DriverRun(sim.runner, sim.host, sim.confdir)


_IMAGES: dict[str, Path] = {}


def env_image(workdir: Path, **env: str) -> Path:
    """A busybox sandbox whose 10-docker2singularity.sh exports `env` as an OCI conversion writes it."""
    key = ",".join(f"{name}={value}" for name, value in sorted(env.items()))
    if key not in _IMAGES:
        script = "".join(f'export {name}="${{{name}:-"{value}"}}"\n' for name, value in env.items())
        root = workdir / f"nv-env-{len(_IMAGES)}"
        _IMAGES[key] = build_busybox_rootfs(root, env_scripts={"10-docker2singularity.sh": script})
    return _IMAGES[key]


def listed(out: str) -> set[str]:
    return set(out.split())


@pytest.mark.parametrize("flags", [[], ["--contain"]], ids=["default", "contain"])
def test_compute_only_image_has_libcuda_but_no_nvidia_smi(nv: DriverRun, workdir: Path, flags: list[str]) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES="compute")
    names = listed(nv.ok("exec", "--nv", *flags, str(image), *SHOW))
    assert "libcuda.so.1" in names and "no-smi" in names
    assert not any(name.startswith(("libnvidia-ml", "libnvidia-glcore")) for name in names)


def test_utility_only_image_has_nvidia_smi_but_no_libcuda(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES="utility")
    names = listed(nv.ok("exec", "--nv", str(image), *SHOW))
    assert "libnvidia-ml.so.1" in names and "/usr/bin/nvidia-smi" in names
    assert not any(name.startswith("libcuda") for name in names)
    assert "Driver Version: 550.54.14" in nv.ok("exec", "--nv", str(image), "nvidia-smi")


@pytest.mark.parametrize("capabilities", ["all", "compute,utility,graphics"])
def test_all_binds_everything(nv: DriverRun, workdir: Path, capabilities: str) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES=capabilities)
    names = listed(nv.ok("exec", "--nv", str(image), *SHOW))
    assert {"libcuda.so.1", "libnvidia-ml.so.1", "/usr/bin/nvidia-smi"} <= names
    assert any(name.startswith("libnvidia-glcore") for name in names)


def test_default_for_a_toolkit_image_is_utility_and_compute(nv: DriverRun, workdir: Path, image: Path) -> None:
    toolkit = env_image(workdir, NVIDIA_VISIBLE_DEVICES="all")
    names = listed(nv.ok("exec", "--nv", str(toolkit), *SHOW))
    assert {"libcuda.so.1", "libnvidia-ml.so.1", "/usr/bin/nvidia-smi"} <= names
    assert not any(name.startswith("libnvidia-glcore") for name in names)
    plain = listed(nv.ok("exec", "--nv", str(image), *SHOW))  # no NVIDIA_ variable: Apptainer's whole list
    assert any(name.startswith("libnvidia-glcore") for name in plain)


def test_host_variable_overrides_the_image(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES="compute")
    names = listed(nv.ok("exec", "--nv", str(image), *SHOW, SINGULARITYENV_NVIDIA_DRIVER_CAPABILITIES="utility"))
    assert "/usr/bin/nvidia-smi" in names and not any(name.startswith("libcuda") for name in names)


def test_unknown_capability_warns_and_is_ignored(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES="compute,warp-drive")
    result = nv.run("exec", "--nv", str(image), *SHOW)
    assert result.returncode == 0, result.stderr
    assert "libcuda.so.1" in listed(result.stdout)
    assert "WARNING: NVIDIA_DRIVER_CAPABILITIES: unknown capability 'warp-drive' ignored" in result.stderr


@pytest.mark.parametrize(("image_value", "host_value", "expected"), [
    ("1", None, {"nvidia1"}), ("none", None, set()), ("0", "1", {"nvidia1"}), ("void", "all", {"nvidia0", "nvidia1"}),
])  # fmt: skip
def test_image_visible_devices_select_nodes(nv: DriverRun, workdir: Path, caps_host: simhost.SimHost,
                                            image_value: str, host_value: str | None, expected: set[str]) -> None:
    image = env_image(workdir, NVIDIA_VISIBLE_DEVICES=image_value)
    env = {} if host_value is None else {"NVIDIA_VISIBLE_DEVICES": host_value}
    devices = listed(nv.ok("exec", "--nv", "--contain", str(image), "ls", "/dev", **env))
    assert {name for name in devices if name.startswith("nvidia") and name[6:].isdigit()} == expected
    assert "nvidiactl" in devices


def test_image_visible_devices_by_uuid(nv: DriverRun, workdir: Path, caps_host: simhost.SimHost) -> None:
    image = env_image(workdir, NVIDIA_VISIBLE_DEVICES=caps_host.uuids[0])
    devices = listed(nv.ok("exec", "--nv", "--contain", str(image), "ls", "/dev"))
    assert "nvidia0" in devices and "nvidia1" not in devices


@pytest.mark.parametrize(("name", "value", "warning"), [
    ("NVIDIA_REQUIRE_CUDA", "cuda>=².0", "NVIDIA_REQUIRE_CUDA: 'cuda>=².0': '².0' is not a version; this requirement"
                                         " is not checked"),
    ("NVIDIA_REQUIRE_CUDA", "cuda>=1" + "0" * 5000, "is not a version; this requirement is not checked"),
    ("CUDA_VERSION", "².0", None),
    ("CUDA_VERSION", "12." + "4" * 5000, None),
    ("NVIDIA_VISIBLE_DEVICES", "²", "NVIDIA_VISIBLE_DEVICES: no GPU device node for '²'; ignored"),
    ("NVIDIA_VISIBLE_DEVICES", "0:²:0", "NVIDIA_VISIBLE_DEVICES: '0:²:0' is not GPU:GI:CI (three numbers); ignored"),
])  # fmt: skip
def test_odd_digits_in_the_image_are_ignored_as_unparsable(nv: DriverRun, workdir: Path, name: str, value: str,
                                                           warning: str | None) -> None:
    """'²' passes str.isdigit() and int() refuses it (and 4300 digits): as any value --nv can't parse, a warning or
    nothing (CUDA_VERSION: no requirement), never a traceback."""
    result = nv.run("exec", "--nv", "--contain", str(env_image(workdir, **{name: value})), "echo", "payload ran")
    assert result.returncode == 0 and result.stdout == "payload ran\n", result.stderr
    assert "Traceback" not in result.stderr
    if warning:
        assert warning in result.stderr


# --- NVIDIA_REQUIRE_* -------------------------------------------------------------------------------------


def test_unmet_require_cuda_is_one_fatal(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=99.0")
    result = nv.run("exec", "--nv", str(image), "echo", "payload ran")
    assert_one_fatal(result, "the image requires 'cuda>=99.0' (NVIDIA_REQUIRE_CUDA) but this host has CUDA 12.4")
    assert "NVIDIA_DISABLE_REQUIRE" in result.stderr  # the HINT


@pytest.mark.parametrize("where", ["image", "host"])
def test_disable_require_lets_it_run(nv: DriverRun, workdir: Path, where: str) -> None:
    if where == "image":
        image, env = env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=99.0", NVIDIA_DISABLE_REQUIRE="true"), {}
    else:
        image = env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=99.0")
        env = {"SINGULARITYENV_NVIDIA_DISABLE_REQUIRE": "1"}
    assert nv.ok("exec", "--nv", str(image), "echo", "payload ran", **env) == "payload ran\n"


def test_met_requirement_runs(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=tesla,driver>=470,driver<471")
    result = nv.run("exec", "--nv", str(image), "echo", "payload ran")
    assert result.returncode == 0 and result.stdout == "payload ran\n", result.stderr
    assert "the image needs CUDA" not in result.stderr


def test_legacy_cuda_version_above_the_driver_is_fatal(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, CUDA_VERSION="12.6.3")
    result = nv.run("exec", "--nv", str(image), "true")
    assert_one_fatal(result, "the image requires 'cuda>=12.6' (CUDA_VERSION) but this host has CUDA 12.4")
    assert nv.ok("exec", "--nv", str(env_image(workdir, CUDA_VERSION="12.4.1")), "echo", "ok") == "ok\n"


@pytest.mark.parametrize(("requirement", "met"), [
    ("cuda>=12.6 brand=nvidia,driver>=550,driver<551", True),  # forward compatibility branch
    ("cuda>=12.6 brand=geforce,driver>=550,driver<551", False),
    ("cuda>=12.0,arch>=9.0", True),
    ("cuda>=12.0,arch>=10.0", False),
    ("driver>=555", False),
])  # fmt: skip
def test_brand_driver_and_arch_constraints(nv: DriverRun, workdir: Path, requirement: str, met: bool) -> None:
    image = env_image(workdir, NVIDIA_REQUIRE_CUDA=requirement)
    result = nv.run("exec", "--nv", str(image), "echo", "payload ran")
    if met:
        assert result.returncode == 0 and result.stdout == "payload ran\n", result.stderr
    else:
        assert_one_fatal(result, f"the image requires '{requirement}' (NVIDIA_REQUIRE_CUDA)")
    if requirement.startswith("cuda>=12.6") and met:
        assert "WARNING: the image needs CUDA 12.6 but the host NVIDIA driver 550.54.14" in result.stderr


def test_other_require_variables_are_checked(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_REQUIRE_ARCH="arch>=10.0")
    result = nv.run("exec", "--nv", str(image), "true")
    assert_one_fatal(result, "(NVIDIA_REQUIRE_ARCH) but this host has GPU architecture 9.0, 9.0")


def test_without_nv_nothing_is_checked(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=99.0")
    assert nv.ok("exec", str(image), "echo", "payload ran") == "payload ran\n"


# --- a SIF image that is mounted, not extracted -----------------------------------------------------------


@pytest.fixture(scope="session")
def cuda_sif(workdir: Path) -> Path:
    out = workdir / "nv-env-cuda.sif"
    sandbox = env_image(workdir, CUDA_VERSION="12.6.3", NVIDIA_REQUIRE_CUDA=
                        "cuda>=12.6 brand=nvidia,driver>=550,driver<551", NVIDIA_DRIVER_CAPABILITIES="compute")
    build_sif(out, sandbox)
    return out


def test_sif_env_read_without_mounting(cuda_sif: Path) -> None:
    hints = squashfs_hints(detect(str(cuda_sif)), {"PATH": "/usr/bin:/bin:/usr/sbin"})
    assert hints.env == {"CUDA_VERSION": "12.6.3", "NVIDIA_DRIVER_CAPABILITIES": "compute",
                         "NVIDIA_REQUIRE_CUDA": "cuda>=12.6 brand=nvidia,driver>=550,driver<551"}


def test_sif_env_hints_never_unpack_what_they_do_not_read(workdir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 MB image whose env/00-junk is 300 MB of one byte: all of env/ was unpacked into TMPDIR (here, with
    files bounded to 32 MiB, the unpacking died before the scripts and the image's CUDA_VERSION was lost)."""
    import resource
    import subprocess

    root = env_image(workdir, CUDA_VERSION="12.6.3")
    squashfs = tmp_path / "bomb.squashfs"
    junk = "/.singularity.d/env/00-junk f 644 0 0 head -c 300000000 /dev/zero"
    subprocess.run(["mksquashfs", str(root), str(squashfs), "-noappend", "-all-root", "-quiet", "-no-progress",
                    "-p", junk], check=True, stdout=subprocess.DEVNULL)
    assert squashfs.stat().st_size < 4 << 20
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 20, hard))
    try:
        hints = squashfs_hints(detect(str(squashfs)), {"PATH": "/usr/bin:/bin:/usr/sbin"})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert hints.env == {"CUDA_VERSION": "12.6.3"}


def test_unmet_requirement_of_a_sif_is_one_fatal(nv: DriverRun, workdir: Path) -> None:
    out = workdir / f"nv-require-{nv.runner.profile}.sif"
    if not out.exists():
        build_sif(out, env_image(workdir, NVIDIA_REQUIRE_CUDA="cuda>=99.0"))
    result = nv.run("exec", "--nv", str(out), "echo", "payload ran")
    assert_one_fatal(result, "the image requires 'cuda>=99.0' (NVIDIA_REQUIRE_CUDA) but this host has CUDA 12.4")


def test_sif_hints_are_kept_in_the_cache(cuda_sif: Path, tmp_path: Path) -> None:
    """The first read unpacks the env scripts; the next one needs no unsquashfs (none on its PATH)."""
    env = {"PATH": "/usr/bin:/bin:/usr/sbin", "SINGPY_CACHEDIR": str(tmp_path / "cache")}
    first = squashfs_hints(detect(str(cuda_sif)), env)
    assert first.env is not None and first.env["CUDA_VERSION"] == "12.6.3"
    again = squashfs_hints(detect(str(cuda_sif)), {**env, "PATH": str(tmp_path)})
    assert again.env == first.env
    assert len(list((tmp_path / "cache" / "nv-hints").iterdir())) == 1


def test_older_driver_warning_for_a_sif_image(cuda_sif: Path, caps_host: simhost.SimHost) -> None:
    hints = squashfs_hints(detect(str(cuda_sif)), {"PATH": "/usr/bin:/bin:/usr/sbin"})
    contrib = discover_nv(caps_host, image=ImageHints(env=hints.env))
    assert any(w.startswith("the image needs CUDA 12.6 but the host NVIDIA driver 550.54.14") for w in contrib.warnings)


# --- MIG instances ----------------------------------------------------------------------------------------


def test_mig_instance_binds_its_gpu_and_capability_nodes(caps_host: simhost.SimHost) -> None:
    contrib = discover_nv(caps_host, contain=True, env={"NVIDIA_VISIBLE_DEVICES": "0:1:0"})
    devices = {spec.dest for spec in contrib.mounts if spec.dev}
    assert {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"} <= devices
    assert not {"/dev/nvidia1", "/dev/nvidia-caps", "/dev/nvidia-caps/nvidia-cap21"} & devices
    assert not contrib.warnings


@pytest.mark.parametrize(("item", "why"), [("0:9:0", "no MIG instance '0:9:0'"), ("0:x:0", "is not GPU:GI:CI"),
                                           ("MIG-4f1b0c5e-1f0a-5e3c-9d2b-000000000001", "no MIG device 'MIG-4f1b"),
                                           ("1:5", "no MIG device '1:5'")])
def test_unknown_mig_instance_warns(caps_host: simhost.SimHost, item: str, why: str) -> None:
    contrib = discover_nv(caps_host, contain=True, env={"NVIDIA_VISIBLE_DEVICES": item})
    assert any(why in warning for warning in contrib.warnings), contrib.warnings
    assert not any(spec.dest.startswith("/dev/nvidia-caps/") for spec in contrib.mounts)


def test_image_selects_a_mig_instance(nv: DriverRun, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_VISIBLE_DEVICES="1:2:0")
    out = nv.ok("exec", "--nv", "--contain", str(image), "sh", "-c", "ls /dev; echo ---; ls /dev/nvidia-caps")
    devices, caps = out.split("---")
    assert {name for name in devices.split() if name.startswith("nvidia") and name[6:].isdigit()} == {"nvidia1"}
    assert set(caps.split()) == {"nvidia-cap21", "nvidia-cap22"}


@pytest.mark.parametrize(("instance", "spelling"), [("0:2:1", "uuid"), ("1:2:0", "uuid"), ("0:2:1", "UUID"),
                                                    ("0:2:1", "gpu:mig")])
def test_mig_device_by_uuid_or_index(caps_host: simhost.SimHost, instance: str, spelling: str) -> None:
    """nvidia-container-cli's names for a MIG device: its UUID (any case) or GPU:MIG, resolved through nvidia-smi."""
    uuid = caps_host.mig_uuids[instance]
    item = {"uuid": uuid, "UUID": uuid.upper().replace("MIG-", "mig-"), "gpu:mig": f"0:{simhost.mig_index(instance)}"}
    contrib = discover_nv(caps_host, contain=True, env={"NVIDIA_VISIBLE_DEVICES": item[spelling]})
    gi_minor, ci_minor = simhost.MIG_INSTANCES[instance]
    gpu = instance.split(":")[0]
    devices = {spec.dest for spec in contrib.mounts if spec.dev}
    caps = {name for name in devices if name.startswith("/dev/nvidia-caps")}
    assert caps == {f"/dev/nvidia-caps/nvidia-cap{gi_minor}", f"/dev/nvidia-caps/nvidia-cap{ci_minor}"}
    assert {name for name in devices if name[len("/dev/nvidia"):].isdigit()} == {f"/dev/nvidia{gpu}"}
    assert f"NVIDIA_VISIBLE_DEVICES: MIG device {item[spelling]} is GPU:GI:CI {instance}" in contrib.notes
    assert not contrib.warnings


def test_mig_uuid_without_nvidia_smi_warns(caps_host: simhost.SimHost, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    contrib = discover_nv(caps_host, contain=True, path_env=str(empty),
                          env={"NVIDIA_VISIBLE_DEVICES": caps_host.mig_uuids["0:1:0"]})
    assert any("nvidia-smi is not on PATH" in warning for warning in contrib.warnings)
    assert not any(spec.dest.startswith("/dev/nvidia-caps/") or spec.dest == "/dev/nvidia0" for spec in contrib.mounts)


def test_mig_uuid_selects_inside_the_container(nv: DriverRun, caps_host: simhost.SimHost, workdir: Path) -> None:
    image = env_image(workdir, NVIDIA_VISIBLE_DEVICES=caps_host.mig_uuids["0:2:1"])
    out = nv.ok("exec", "--nv", "--contain", str(image), "sh", "-c", "ls /dev; echo ---; ls /dev/nvidia-caps")
    devices, caps = out.split("---")
    assert {name for name in devices.split() if name.startswith("nvidia") and name[6:].isdigit()} == {"nvidia0"}
    assert set(caps.split()) == {"nvidia-cap15", "nvidia-cap16"}


# --- device nodes by capability ---------------------------------------------------------------------------

ALWAYS = {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-caps"}
UVM = {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}


@pytest.mark.parametrize(
    ("image_env", "host_env", "expected"),
    [
        pytest.param({}, {}, ALWAYS | UVM | {"/dev/nvidia-modeset"}, id="no-nvidia-vars-everything"),
        pytest.param({"NVIDIA_VISIBLE_DEVICES": "all"}, {}, ALWAYS | UVM | {"/dev/nvidia-modeset"},
                     id="capabilities-unset-everything"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, {}, ALWAYS, id="utility"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}, {}, ALWAYS | UVM, id="compute"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "video"}, {}, ALWAYS | UVM, id="video-brings-compute"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "graphics"}, {}, ALWAYS, id="graphics"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "display"}, {}, ALWAYS | {"/dev/nvidia-modeset"}, id="display"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "all"}, {}, ALWAYS | UVM | {"/dev/nvidia-modeset"}, id="all"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "none"}, {}, ALWAYS, id="none"),
        pytest.param({}, {"SINGULARITYENV_NVIDIA_DRIVER_CAPABILITIES": "utility"}, ALWAYS, id="host-sets-it"),
        pytest.param({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, {"NVIDIA_DRIVER_CAPABILITIES": "compute"},
                     ALWAYS | UVM, id="host-wins"),
    ],
)  # fmt: skip
def test_device_nodes_follow_capabilities(caps_host: simhost.SimHost, image_env: dict[str, str],
                                          host_env: dict[str, str], expected: set[str]) -> None:
    contrib = discover_nv(caps_host, contain=True, image=ImageHints(env=image_env), env=host_env)
    assert {spec.dest for spec in contrib.mounts if spec.dev} == expected
    left = sorted((ALWAYS | UVM | {"/dev/nvidia-modeset"}) - expected)
    notes = [note for note in contrib.notes if note.startswith("NVIDIA_DRIVER_CAPABILITIES=") and "/dev/" in note]
    assert len(notes) == (1 if left else 0)
    assert all(node in notes[0] for node in left)  # the -v note names every node left out...
    assert not any(note.endswith(f"-> {node}") for note in contrib.notes for node in left)  # ...and none is "bound"


def test_missing_uvm_is_no_warning_without_compute(tmp_path: Path) -> None:
    host = simhost.build_nvidia_host(tmp_path, uvm=False)
    utility = discover_nv(host, image=ImageHints(env={"NVIDIA_DRIVER_CAPABILITIES": "utility"}))
    assert not any("nvidia-uvm is missing" in warning for warning in utility.warnings)
    compute = discover_nv(host, image=ImageHints(env={"NVIDIA_DRIVER_CAPABILITIES": "compute"}))
    assert any("nvidia-uvm is missing" in warning for warning in compute.warnings)


@pytest.mark.parametrize(("capabilities", "present", "absent"), [
    ("utility", set(), {"nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}),
    ("compute", {"nvidia-uvm", "nvidia-uvm-tools"}, {"nvidia-modeset"}),
    ("display", {"nvidia-modeset"}, {"nvidia-uvm", "nvidia-uvm-tools"}),
])
def test_image_capabilities_pick_nodes_inside(nv: DriverRun, workdir: Path, capabilities: str, present: set[str],
                                              absent: set[str]) -> None:
    image = env_image(workdir, NVIDIA_DRIVER_CAPABILITIES=capabilities)
    devices = set(nv.ok("exec", "--nv", "--contain", str(image), "ls", "/dev").split())
    assert {"nvidiactl", "nvidia0", "nvidia1", "nvidia-caps"} | present <= devices
    assert not absent & devices

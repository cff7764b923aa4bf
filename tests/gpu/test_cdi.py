"""--device (CDI specs) end to end, on the simulated GPU host, as root and as a user.

The specs are written the way `nvidia-ctk cdi generate` writes them for the
simulated host (tests/gpu/simhost.py): common edits with the control nodes,
the driver's libraries and nvidia-smi mounted at their usual paths, the
create-symlinks and update-ldcache hooks and two variables; devices named
0, 1, GPU-<uuid> and all. A real C program inside an image without CUDA
dlopen()s libcuda.so.1 through what the hooks would have made.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.gpu import simhost
from tests.support.cdi_specs import cdi_spec_dir
from tests.support.simhost_runs import SimHostRun, sim_host, sim_run

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated GPU host needs root (mknod)")

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
OPTIONS = ["ro", "nosuid", "nodev", "bind"]


def nvidia_spec(host: simhost.SimHost, *, version: str = "0.5.0") -> dict[str, object]:
    """The spec `nvidia-ctk cdi generate --driver-root=HOST` would write for the simulated host."""
    def gpu(index: int) -> dict[str, object]:
        return {"deviceNodes": [{"path": f"/dev/nvidia{index}", "major": simhost.NVIDIA_MAJOR, "minor": index}]}

    devices: list[dict[str, object]] = []
    for index in range(host.gpus):
        devices.append({"name": str(index), "containerEdits": gpu(index)})
        devices.append({"name": host.uuids[index], "containerEdits": gpu(index)})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [
        node for index in range(host.gpus) for node in gpu(index)["deviceNodes"]]}})  # type: ignore[attr-defined]
    mounts = [{"hostPath": str(path), "containerPath": f"{LIB_DIR}/{path.name}", "options": OPTIONS}
              for path in host.libs.values()]
    mounts.append({"hostPath": str(host.bin_dir / "nvidia-smi"), "containerPath": "/usr/bin/nvidia-smi",
                   "options": OPTIONS})
    hook = "/usr/bin/nvidia-cdi-hook"
    return {
        "cdiVersion": version,
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}"],
            "deviceNodes": [{"path": f"/dev/{name}"} for name in
                            ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")],
            "hooks": [
                {"hookName": "createContainer", "path": hook,
                 "args": ["nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.1::{LIB_DIR}/libcuda.so"]},
                {"hookName": "createContainer", "path": hook,
                 "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR]},
            ],
            "mounts": mounts,
        },
    }


def to_yaml(value: object, indent: int = 0) -> str:
    """YAML as Go's yaml writes a CDI spec: block style, sequences at their key's column, quoted numbers."""
    pad = " " * indent
    if isinstance(value, dict):
        out = ""
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out += f"{pad}{key}:\n" + to_yaml(item, indent + (2 if isinstance(item, dict) else 0))
            else:
                out += f"{pad}{key}: {_yaml_scalar(item)}\n"
        return out
    assert isinstance(value, list)
    out = ""
    for item in value:
        if isinstance(item, (dict, list)):
            body = to_yaml(item, indent + 2)
            out += f"{pad}- {body[indent + 2:]}"
        else:
            out += f"{pad}- {_yaml_scalar(item)}\n"
    return out


def _yaml_scalar(value: object) -> str:
    if isinstance(value, list):
        return "[]"
    if isinstance(value, str) and (value.isdigit() or value in ("true", "false", "null")):
        return f'"{value}"'
    return str(value)


@pytest.fixture(scope="session")
def cdi_host(workdir: Path) -> simhost.SimHost:
    return sim_host(workdir, "sim-cdi", simhost.build_nvidia_host)


@pytest.fixture(scope="session")
def spec_dirs(workdir: Path, cdi_host: simhost.SimHost) -> dict[str, Path]:
    """One directory per format holding the simulated host's spec."""
    spec = nvidia_spec(cdi_host)
    dirs = {"yaml": workdir / "cdi-yaml", "json": workdir / "cdi-json"}
    for path in dirs.values():
        path.mkdir()
    (dirs["yaml"] / "nvidia.yaml").write_text("---\n# generated for the simulated host\n" + to_yaml(spec))
    (dirs["json"] / "nvidia.json").write_text(json.dumps(spec, indent=2))
    for path in dirs.values():
        path.chmod(0o755)
    return dirs


@pytest.fixture
def sim(singpy: Singpy, cdi_host: simhost.SimHost, workdir: Path) -> SimHostRun:
    return sim_run(singpy, cdi_host, workdir / f"conf-cdi-{singpy.profile}", "nvliblist.conf")


def _fatal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 255, f"exit {result.returncode}: {result.stderr}"
    lines = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


NODES = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_all_devices_libraries_links_and_env(sim: SimHostRun, cuda_check_image: Path,
                                             spec_dirs: dict[str, Path], fmt: str) -> None:
    out = sim.ok("exec", "--contain", "--device", "nvidia.com/gpu=all", "--cdi-dirs", str(spec_dirs[fmt]),
                 str(cuda_check_image), "sh", "-c",
                 "ls /dev; echo ---; cuda-check; echo ---; readlink /.singularity.d/libs/libcuda.so.1;"
                 f" readlink /.singularity.d/libs/libcuda.so; cmp {LIB_DIR}/libcuda.so"
                 f" {LIB_DIR}/libcuda.so.{simhost.DRIVER} && echo same; nvidia-smi | grep -o 'Driver Version';"
                 " echo ---;"
                 " echo $NVIDIA_VISIBLE_DEVICES $NVIDIA_CTK_LIBCUDA_DIR")
    devices, check, links, env = out.split("---")
    assert {"nvidia0", "nvidia1"} | NODES <= set(devices.split())
    assert check.strip() == "cuInit=0 driver=12040"
    assert links.split() == [f"{LIB_DIR}/libcuda.so.{simhost.DRIVER}"] * 2 + ["same", "Driver", "Version"]
    assert env.split() == ["void", LIB_DIR]


@pytest.mark.parametrize("which, present, absent", [("0", "nvidia0", "nvidia1"), ("uuid1", "nvidia1", "nvidia0")])
def test_one_gpu_only_its_node(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path], cdi_host: simhost.SimHost,
                               which: str, present: str, absent: str) -> None:
    name = cdi_host.uuids[1] if which == "uuid1" else which
    devices = set(sim.ok("exec", "--contain", "--device", f"nvidia.com/gpu={name}", "--cdi-dirs",
                         str(spec_dirs["yaml"]), str(image), "ls", "/dev").split())
    assert present in devices and absent not in devices and devices >= NODES


def test_env_survives_cleanenv_and_env_flag_wins(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path]) -> None:
    show = ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES $NVIDIA_CTK_LIBCUDA_DIR"]
    common = ["exec", "--cleanenv", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(spec_dirs["json"])]
    assert sim.ok(*common, str(image), *show).split() == ["void", LIB_DIR]
    assert sim.ok(*common, "--env", "NVIDIA_VISIBLE_DEVICES=mine", str(image), *show).split() == ["mine", LIB_DIR]


def test_nv_and_device_both_apply(sim: SimHostRun, cuda_check_image: Path, spec_dirs: dict[str, Path]) -> None:
    out = sim.ok("exec", "--nv", "--contain", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(spec_dirs["yaml"]),
                 str(cuda_check_image), "sh", "-c",
                 f"cuda-check; echo $NVIDIA_VISIBLE_DEVICES; ls {LIB_DIR}/libcuda.so")
    assert out.split() == ["cuInit=0", "driver=12040", "void", f"{LIB_DIR}/libcuda.so"]


def test_without_contain_all_host_nodes_stay(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path]) -> None:
    """As with --nv: without --contain the host's /dev is there whole, so selection is by --contain only."""
    devices = set(sim.ok("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(spec_dirs["yaml"]), str(image),
                         "ls", "/dev").split())
    assert {"nvidia0", "nvidia1"} <= devices


def test_later_directory_wins(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path]) -> None:
    override = json.loads((spec_dirs["json"] / "nvidia.json").read_text())
    override["containerEdits"]["env"] = ["NVIDIA_VISIBLE_DEVICES=override"]
    later = cdi_spec_dir(sim.runner, "later", json.dumps(override), "json")
    show = ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]
    dirs = f"{spec_dirs['yaml']},{later}"
    assert sim.ok("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", dirs, str(image), *show) == "override\n"
    dirs = f"{later},{spec_dirs['yaml']}"
    assert sim.ok("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", dirs, str(image), *show) == "void\n"


def test_dry_run_shows_what_cdi_adds(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path]) -> None:
    never = sim.runner.tmpdir / f"never-cdi-{sim.runner.profile}"
    report = json.loads(sim.ok("exec", "--dry-run", "--device", "nvidia.com/gpu=1", "--cdi-dirs",
                               str(spec_dirs["yaml"]), str(image), "touch", str(never)))
    gpu = report["gpu"]
    assert gpu["cdi_devices"] == ["nvidia.com/gpu=1"]
    assert "/dev/nvidia1" in gpu["devices"] and "/dev/nvidia0" not in gpu["devices"]
    assert gpu["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert f"/.singularity.d/libs/libcuda.so.1 -> {LIB_DIR}/libcuda.so.550.54.14" in gpu["links"]
    assert any(bind.endswith(f"-> {LIB_DIR}/libcuda.so") for bind in gpu["other_binds"])
    assert not never.exists()


def test_unknown_device_lists_names(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path],
                                    cdi_host: simhost.SimHost) -> None:
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=7", "--cdi-dirs", str(spec_dirs["yaml"]), str(image),
                          "true"))
    assert "no device '7'" in line and f"0, 1, {cdi_host.uuids[0]}" in line and "all" in line


def test_unknown_kind_and_bad_syntax(sim: SimHostRun, image: Path, spec_dirs: dict[str, Path]) -> None:
    line = _fatal(sim.run("exec", "--device", "amd.com/gpu=0", "--cdi-dirs", str(spec_dirs["yaml"]), str(image),
                          "true"))
    assert "no CDI spec for kind amd.com/gpu" in line and "nvidia.com/gpu" in line
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu", str(image), "true"))
    assert "bad --device 'nvidia.com/gpu'" in line


def test_malformed_yaml_names_file_and_line(sim: SimHostRun, image: Path) -> None:
    directory = cdi_spec_dir(sim.runner, "malformed", "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: &x\n")
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(directory), str(image), "true"))
    assert f"{directory}/spec.yaml:3" in line


def test_spec_in_flow_style_yaml(sim: SimHostRun, image: Path) -> None:
    """The CDI project's examples write options as flow sequences (`[ro, nosuid, nodev, bind]`): read as YAML is."""
    host = sim.runner.workdir / f"cdi-flow-{sim.runner.profile}"
    host.mkdir(exist_ok=True)
    host.chmod(0o755)
    (host / "tool.txt").write_text("from a flow-style spec\n")
    text = ('cdiVersion: "0.6.0"\nkind: example.com/flow\ndevices:\n'
            f'  - {{name: x, containerEdits: {{mounts: [{{hostPath: {host}/tool.txt, containerPath: /opt/tool.txt,'
            ' options: [ro, nosuid, nodev, bind]}], env: [FLOW=yes]}}\n')
    directory = cdi_spec_dir(sim.runner, "flow", text)
    out = sim.ok("exec", "--device", "example.com/flow=x", "--cdi-dirs", str(directory), str(image), "sh", "-c",
                 "cat /opt/tool.txt; echo $FLOW; echo x >> /opt/tool.txt || echo read-only")
    assert out.split("\n")[:3] == ["from a flow-style spec", "yes", "read-only"]


def test_missing_or_mismatched_node(sim: SimHostRun, image: Path, cdi_host: simhost.SimHost) -> None:
    spec = nvidia_spec(cdi_host)
    spec["devices"] = [{"name": "7", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia7"}]}},
                       {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "minor": 3}]}}]
    directory = cdi_spec_dir(sim.runner, "stale", json.dumps(spec), "json")
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=7", "--cdi-dirs", str(directory), str(image), "true"))
    assert "/dev/nvidia7 does not exist" in line
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(directory), str(image), "true"))
    assert "/dev/nvidia0 is 195:0" in line and "minor 3" in line


def test_newer_version_and_unknown_hook(sim: SimHostRun, image: Path, cdi_host: simhost.SimHost) -> None:
    directory = cdi_spec_dir(sim.runner, "newer", json.dumps(nvidia_spec(cdi_host, version="0.9.0")), "json")
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(directory), str(image), "true"))
    assert "cdiVersion 0.9.0 is newer than 0.8.0" in line
    spec = nvidia_spec(cdi_host)
    spec["containerEdits"]["hooks"].append(  # type: ignore[index]
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "args": ["nvidia-cdi-hook", "chmod",
                                                                                      "--mode", "755"]})
    directory = cdi_spec_dir(sim.runner, "hook", json.dumps(spec), "json")
    line = _fatal(sim.run("exec", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(directory), str(image), "true"))
    assert "hook `/usr/bin/nvidia-cdi-hook chmod --mode 755`" in line


def test_update_ldcache_links_to_the_spec_mounts(sim: SimHostRun, cuda_check_image: Path,
                                                 spec_dirs: dict[str, Path], cdi_host: simhost.SimHost) -> None:
    """Each library is bound once, where the spec mounts it; /.singularity.d/libs holds only links to it, under
    the names ldconfig would enter in its cache: sonames and the create-symlinks links, not the files' own names."""
    libs = "/.singularity.d/libs"
    real = f"libcuda.so.{simhost.DRIVER}"
    out = sim.ok("exec", "--contain", "--device", "nvidia.com/gpu=0", "--cdi-dirs", str(spec_dirs["json"]),
                 str(cuda_check_image), "sh", "-c",
                 f"readlink {libs}/libcuda.so.1; readlink -f {libs}/libcuda.so;"
                 f" cmp {libs}/libcuda.so.1 {LIB_DIR}/{real}"
                 f" && echo same; grep -c ' {libs}/' /proc/self/mountinfo; grep -c ' {LIB_DIR}/' /proc/self/mountinfo;"
                 f" echo ---; ls {libs}")
    found, names = out.split("---")
    target, resolved, same, in_libs, in_lib_dir = found.split()
    assert target == resolved == f"{LIB_DIR}/{real}" and same == "same"
    # the simulated libraries by soname (libnvidia-glcore's is its own name, as NVIDIA's), and libcuda.so
    assert sorted(names.split()) == sorted([*cdi_host.libs, "libcuda.so"])
    assert in_libs == "0"  # links only: no bind below /.singularity.d/libs
    assert int(in_lib_dir) == len(cdi_host.libs) + 1  # the spec's libraries, and create-symlinks' libcuda.so


@pytest.mark.parametrize("conf", ["", "avoid kernel features = mount_setattr\n"], ids=["view", "remount-each"])
def test_mounts_get_the_spec_read_only_flag(sim: SimHostRun, image: Path, conf: str) -> None:
    """Files of one host directory, read-only (`ro`) and writable as the spec says, whichever way singpy makes
    them read-only (through one read-only view of the directory, or a remount per file without mount_setattr)."""
    host = sim.runner.workdir / f"cdi-flags-{sim.runner.profile}"
    host.mkdir(exist_ok=True)
    host.chmod(0o755)
    for name in ("a.so", "b.so", "c.so"):
        (host / name).write_text(name)
        (host / name).chmod(0o666)
    mounts = [{"hostPath": str(host / name), "containerPath": f"/opt/cdi-flags/{name}", "options": options}
              for name, options in (("a.so", OPTIONS), ("b.so", ["ro", "bind"]), ("c.so", ["rw", "bind"]))]
    spec = {"cdiVersion": "0.5.0", "kind": "example.com/flags",
            "devices": [{"name": "x", "containerEdits": {"mounts": mounts}}]}
    directory = cdi_spec_dir(sim.runner, "flags", json.dumps(spec), "json")
    out = sim.ok("exec", "--device", "example.com/flags=x", "--cdi-dirs", str(directory), str(image), "sh", "-c",
                 "grep ' /opt/cdi-flags/' /proc/self/mountinfo; echo ---; cat /opt/cdi-flags/*; echo;"
                 " echo more >> /opt/cdi-flags/c.so && echo c-written; echo more >> /opt/cdi-flags/a.so || true",
                 conf=conf)
    info, rest = out.split("---")
    flags = {fields[4]: set(fields[5].split(",")) for fields in (line.split() for line in info.splitlines())}
    assert set(flags) == {f"/opt/cdi-flags/{name}" for name in ("a.so", "b.so", "c.so")}
    for name in ("a.so", "b.so"):
        assert {"ro", "nosuid", "nodev"} <= flags[f"/opt/cdi-flags/{name}"]
    assert "rw" in flags["/opt/cdi-flags/c.so"]
    assert rest.split() == ["a.sob.soc.so", "c-written"]
    assert (host / "a.so").read_text() == "a.so" and (host / "c.so").read_text() == "c.somore\n"


def test_kept_edits_follow_the_specs_and_the_host(sim: SimHostRun, image: Path) -> None:
    """The second launch of a request reads its edits from the cache; an edited spec, a library replaced by
    another, a device node made anew with other numbers and a missing source are seen as they are."""
    host = sim.runner.workdir / f"cdi-kept-{sim.runner.profile}"
    host.mkdir()
    host.chmod(0o755)
    library = simhost.build_elf_library(host, "libkept.so.1")
    library.chmod(0o644)
    node = host / "node"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    spec = {"cdiVersion": "0.6.0", "kind": "example.com/kept", "devices": [{"name": "x", "containerEdits": {
        "env": ["KEPT=one"],
        "deviceNodes": [{"path": "/dev/kept", "hostPath": str(node), "type": "c", "major": 1, "minor": 3}],
        "mounts": [{"hostPath": str(library), "containerPath": "/opt/kept/libkept.so.7.1", "options": OPTIONS}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                   "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/opt/kept"]}]}}]}
    directory = cdi_spec_dir(sim.runner, "kept", json.dumps(spec), "json")
    args = ("-v", "exec", "--contain", "--device", "example.com/kept=x", "--cdi-dirs", str(directory), str(image),
            "sh", "-c", "echo $KEPT; ls /.singularity.d/libs; ls /dev/kept")

    def launch() -> tuple[list[str], bool]:
        result = sim.run(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout.split(), "CDI edits read from the cache" in result.stderr

    assert launch() == (["one", "libkept.so.1", "/dev/kept"], False)
    assert launch() == (["one", "libkept.so.1", "/dev/kept"], True)
    spec["devices"][0]["containerEdits"]["env"] = ["KEPT=two"]  # type: ignore[index]
    (directory / "spec.json").write_text(json.dumps(spec))
    assert launch() == (["two", "libkept.so.1", "/dev/kept"], False)
    os.replace(simhost.build_elf_library(sim.runner.workdir / f"cdi-new-{sim.runner.profile}", "libkept.so.2"), library)
    assert launch() == (["two", "libkept.so.2", "/dev/kept"], False)
    assert launch()[1]
    node.unlink()
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers: the spec is stale now
    assert "the spec says minor 3" in _fatal(sim.run(*args))
    node.unlink()
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert launch()[0][0] == "two"
    library.unlink()
    assert f"mount source {library} does not exist" in _fatal(sim.run(*args))

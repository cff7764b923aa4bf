"""--intel-hpu end to end on a simulated Intel Gaudi host (tests/gpu/simhpu.py), as root and as a user.

What a user of Apptainer 1.5's e2e `testIntelHpu` sees: with --contain, the
accelerators HABANA_VISIBLE_DEVICES names (as given to the container: --env,
APPTAINERENV_) and their RDMA verbs nodes in the minimal /dev, all of them
when it is not given, none for a value naming none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.gpu.simhpu import build_hpu_host

REPO = Path(__file__).resolve().parents[2]
SHOW = "ls /dev/accel /dev/infiniband 2>/dev/null; ls /dev | grep -c -e '^accel$' -e '^infiniband$' || true"

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the simulated Gaudi host needs root (mknod)")


@pytest.fixture(scope="session")
def hpu_hosts(workdir: Path) -> dict[str, Path]:
    hosts = {"two": build_hpu_host(workdir / "sim-hpu", accelerators=2),
             "legacy": build_hpu_host(workdir / "sim-hpu-legacy", accelerators=3, legacy=True),
             "none": build_hpu_host(workdir / "sim-hpu-none", accelerators=0),
             "broken": build_hpu_host(workdir / "sim-hpu-broken", accelerators=1)}
    (hosts["broken"] / "sys/class/infiniband/hbl_0/device/infiniband_verbs/uverbs0").rmdir()
    (hosts["broken"] / "sys/class/infiniband/hbl_0/device/infiniband_verbs").rmdir()
    return hosts


def _run(singpy: Singpy, host: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.gpu.simrun", str(host), str(singpy.uid), str(singpy.gid), "--",
               SINGPY, *args]
    return subprocess.run(command, env=singpy.env(PYTHONPATH=str(REPO), **env), cwd=singpy.workdir,
                          capture_output=True, text=True, timeout=60)


def _seen(singpy: Singpy, host: Path, image: Path, *flags: str, **env: str) -> tuple[list[str], str]:
    """(the HPU nodes the container's /dev holds, stderr)."""
    result = _run(singpy, host, "exec", *flags, str(image), "sh", "-c", SHOW, **env)
    assert result.returncode == 0, result
    *names, directories = result.stdout.split()
    nodes = [name for name in names if not name.endswith(":")]
    assert int(directories) == (2 if any(n.startswith("uverbs") for n in nodes) else 1 if nodes else 0), result
    return nodes, result.stderr


@pytest.mark.parametrize(("flags", "env", "expected"), [
    (["--intel-hpu"], {}, ["accel0", "accel1", "uverbs0", "uverbs1"]),
    (["--intel-hpu", "--env", "HABANA_VISIBLE_DEVICES=all"], {}, ["accel0", "accel1", "uverbs0", "uverbs1"]),
    (["--intel-hpu", "--env", "HABANA_VISIBLE_DEVICES=1"], {}, ["accel1", "uverbs0"]),  # port 1 names uverbs0
    (["--intel-hpu"], {"APPTAINERENV_HABANA_VISIBLE_DEVICES": "0"}, ["accel0", "uverbs1"]),
    (["--intel-hpu", "--env", "HABANA_VISIBLE_DEVICES=''"], {}, []),  # Apptainer's e2e: no AIPs available
    (["--intel-hpu"], {"HABANA_VISIBLE_DEVICES": "0"}, ["accel0", "accel1", "uverbs0", "uverbs1"]),  # host's: not read
    ([], {"APPTAINER_INTEL_HPU": "1"}, ["accel0", "accel1", "uverbs0", "uverbs1"]),
    ([], {}, []),
], ids=["all-implicit", "all-explicit", "one", "injected", "none", "host-variable", "env-flag", "no-flag"])
def test_contained_dev_holds_the_selected_accelerators(singpy: Singpy, hpu_hosts: dict[str, Path], image: Path,
                                                       flags: list[str], env: dict[str, str],
                                                       expected: list[str]) -> None:
    nodes, stderr = _seen(singpy, hpu_hosts["two"], image, "--contain", *flags, **env)
    assert nodes == expected and "WARNING" not in stderr, stderr


def test_nodes_are_the_hosts_devices(singpy: Singpy, hpu_hosts: dict[str, Path], image: Path) -> None:
    result = _run(singpy, hpu_hosts["two"], "exec", "--contain", "--intel-hpu", str(image),
                  "stat", "-c", "%n %F %t:%T", "/dev/accel/accel1", "/dev/infiniband/uverbs1")
    assert result.stdout.splitlines() == ["/dev/accel/accel1 character special file 105:1",
                                          "/dev/infiniband/uverbs1 character special file e7:c1"], result


def test_legacy_ports_and_a_whole_dev(singpy: Singpy, hpu_hosts: dict[str, Path], image: Path) -> None:
    """hlib_N, the older driver's ports; without --contain the host's whole /dev shows, unfiltered (as Apptainer)."""
    nodes, _ = _seen(singpy, hpu_hosts["legacy"], image, "--contain", "--intel-hpu", "--env",
                     "HABANA_VISIBLE_DEVICES=0, 2")
    assert nodes == ["accel0", "accel2", "uverbs0", "uverbs2"]
    nodes, _ = _seen(singpy, hpu_hosts["legacy"], image, "--intel-hpu", "--env", "HABANA_VISIBLE_DEVICES=1")
    assert nodes == ["accel0", "accel1", "accel2", "uverbs0", "uverbs1", "uverbs2"]


def test_a_host_without_accelerators_warns_and_runs(singpy: Singpy, hpu_hosts: dict[str, Path],
                                                    image: Path) -> None:
    nodes, stderr = _seen(singpy, hpu_hosts["none"], image, "--contain", "--intel-hpu")
    assert nodes == [] and stderr == ("WARNING: no Intel Gaudi accelerators found (no /dev/accel/accel*): "
                                      "the container will run without HPU access\n"), stderr


def test_an_unreadable_port_is_one_fatal(singpy: Singpy, hpu_hosts: dict[str, Path], image: Path) -> None:
    result = _run(singpy, hpu_hosts["broken"], "exec", "--contain", "--intel-hpu", str(image), "true")
    lines = result.stderr.splitlines()
    assert result.returncode == 255 and len(lines) == 1, result
    assert lines[0].startswith("FATAL:   failed to get hpu devices: could not list uverb devices for HPU "
                               "accelerators: unable to read /sys/class/infiniband/hbl_0/device/infiniband_verbs:")

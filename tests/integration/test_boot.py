"""`instance start|run --boot` (Apptainer's, root only): the image's /sbin/init is the instance's PID 1, in a
contained container with its own PID, UTS and network namespaces, named after the instance, without CAP_SYS_BOOT
and CAP_SYS_RAWIO; `instance stop` signals it and leaves nothing behind. A user is refused; an image without
/sbin/init fails the start.

The image's init is a shell script that logs what it sees and ends on SIGTERM. Root's default network is a bridge:
singpy runs in a network namespace of the test (tests.support.netns), where its bridge and veth live.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, instance_logs
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces
from tests.support.netns import NetNs, made_netns

INIT = """#!/bin/sh
echo "init: pid $$, $(hostname), $(cat /proc/1/comm)"
trap 'echo "init: got TERM"; exit 0' TERM
while :; do sleep 1 & wait $!; done
"""
CAP_SYS_RAWIO, CAP_SYS_BOOT = 17, 22


@pytest.fixture(scope="module")
def images(workdir: Path) -> dict[str, Path]:
    booting = build_busybox_rootfs(workdir / "boot-sandbox")
    (booting / "sbin").mkdir(exist_ok=True)
    (booting / "sbin" / "init").write_text(INIT)
    (booting / "sbin" / "init").chmod(0o755)
    return {"init": booting, "none": build_busybox_rootfs(workdir / "boot-none")}


@pytest.fixture
def netns(as_root: Singpy, workdir: Path) -> Iterator[NetNs]:
    yield from made_netns(SINGPY, workdir, as_root.env())


@pytest.fixture
def name(as_root: Singpy, netns: NetNs) -> Iterator[str]:
    made = f"boot-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield made
    netns.run("instance", "stop", "--force", made)
    for suffix in ("out", "err"):
        (instance_logs(as_root) / f"{made}.{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("command", ["start", "run"])
def test_the_images_init_is_the_instances_pid_1(as_root: Singpy, netns: NetNs, images: dict[str, Path], name: str,
                                               command: str) -> None:
    before = traces(images["init"], as_root.workdir)
    started = netns.run("instance", command, "--boot", str(images["init"]), name)
    assert started.returncode == 0, started.stderr
    inside = netns.run("exec", f"instance://{name}", "sh", "-c",
                       "cat /proc/1/comm; hostname; for n in pid net uts; do readlink /proc/self/ns/$n; done; "
                       "grep CapBnd /proc/1/status; sed -n '3,$s/:.*//p' /proc/net/dev; ls -A /tmp")
    assert inside.returncode == 0, inside.stderr
    comm, hostname, pid_ns, net_ns, uts_ns, bounding, *rest = inside.stdout.split("\n")
    assert (comm, hostname) == ("init", name)
    for link, namespace in ((pid_ns, "pid"), (net_ns, "net"), (uts_ns, "uts")):
        assert link != os.readlink(f"/proc/self/ns/{namespace}"), namespace
    capabilities = int(bounding.split()[1], 16)
    assert not capabilities & (1 << CAP_SYS_BOOT | 1 << CAP_SYS_RAWIO) and capabilities & 1  # CAP_CHOWN kept
    assert sorted(link.strip() for link in rest if link) == ["eth0", "lo"]  # root's bridge; --contain: /tmp empty
    log = instance_logs(as_root) / f"{name}.out"
    assert log.read_text().startswith(f"init: pid 1, {name}, init\n")
    stopped = netns.run("instance", "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    assert log.read_text().endswith("init: got TERM\n")  # what the image's init does on SIGTERM: its own
    assert netns.run("instance", "list", name).stdout.count("\n") <= 1
    assert settled(before, images["init"], as_root.workdir) == before


def test_keep_privs_keeps_boot_capabilities_and_hostname_may_be_given(as_root: Singpy, netns: NetNs,
                                                                       images: dict[str, Path], name: str) -> None:
    started = netns.run("instance", "start", "--boot", "--keep-privs", "--hostname", "node7", "--network", "none",
                        str(images["init"]), name)
    assert started.returncode == 0, started.stderr
    inside = netns.run("exec", f"instance://{name}", "sh", "-c", "hostname; grep CapBnd /proc/1/status")
    hostname, bounding = inside.stdout.split("\n")[:2]
    assert hostname == "node7"
    assert int(bounding.split()[1], 16) & (1 << CAP_SYS_BOOT | 1 << CAP_SYS_RAWIO) == 1 << CAP_SYS_BOOT | 1 << 17


def test_a_user_is_refused(as_user: Singpy, images: dict[str, Path]) -> None:
    before = traces(images["init"], as_user.workdir)
    name = f"boot-{uuid.uuid4().hex[:6]}"
    assert_one_fatal(as_user.run("instance", "start", "--boot", str(images["init"]), name),
                     "--boot requires root privileges")
    assert_one_fatal(as_user.run("instance", "start", str(images["init"]), name,
                                 env=as_user.env(APPTAINER_BOOT="1")), "--boot requires root privileges")
    assert settled(before, images["init"], as_user.workdir) == before


def test_an_image_without_init_fails_the_start(as_root: Singpy, netns: NetNs, images: dict[str, Path],
                                               name: str) -> None:
    before = traces(images["none"], as_root.workdir)
    result = netns.run("instance", "start", "--boot", "--network", "none", str(images["none"]), name)
    assert result.returncode == 255
    assert "FATAL:" in result.stderr and "--boot: the image has no executable /sbin/init" in result.stderr
    assert netns.run("instance", "list", name).stdout.count("\n") <= 1
    assert settled(before, images["none"], as_root.workdir) == before


def test_exec_has_no_boot_flag(as_root: Singpy, images: dict[str, Path]) -> None:
    """Apptainer's flag of `instance start|run` alone: elsewhere an unknown flag."""
    result = as_root.run("exec", "--boot", str(images["init"]), "true")
    assert result.returncode == 1 and "unknown flag: --boot" in result.stderr

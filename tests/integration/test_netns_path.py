"""--netns-path: joining a network namespace the test made (`ip netns add`, a per-run name), as Apptainer 1.5.

Root joins any; a user needs the path in `allow netns paths` and their name or
group in `allow net users` / `allow net groups` (Apptainer's checks, in its
order), and then meets the kernel, which lets no unprivileged process join a
namespace it does not own: one FATAL line, since singpy is never setuid.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.netns import NetNs, made_netns

pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("ip") is None,
                                reason="the test's network namespace is made by root, with iproute2")


@pytest.fixture
def netns(as_root: Singpy, workdir: Path) -> Iterator[NetNs]:
    yield from made_netns(SINGPY, workdir, as_root.env())


def _path(ns: NetNs) -> str:
    return f"/run/netns/{ns.name}"


def _conf(workdir: Path, name: str, text: str) -> Path:
    path = workdir / f"netns-path-{name}.conf"
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_root_joins_the_namespace(as_root: Singpy, image: Path, netns: NetNs) -> None:
    netns.ip("link", "add", "spt-a", "type", "veth", "peer", "name", "spt-b")  # only that namespace has them
    out = as_root.ok("exec", "--netns-path", _path(netns), str(image),
                     "sh", "-c", "stat -L -c %i /proc/self/ns/net; cat /proc/net/dev")
    inode, devices = out.split("\n", 1)
    assert inode == str(os.stat(_path(netns)).st_ino)
    assert "spt-a:" in devices and "spt-b:" in devices


def test_root_joins_from_the_environment_and_with_pid(as_root: Singpy, image: Path, netns: NetNs) -> None:
    env = as_root.env(APPTAINER_NETNS_PATH=_path(netns))
    out = as_root.ok("exec", "--pid", str(image), "stat", "-L", "-c", "%i", "/proc/self/ns/net", env=env)
    assert out.strip() == str(os.stat(_path(netns)).st_ino)


def test_net_beside_it_warns_and_the_path_wins(as_root: Singpy, image: Path, netns: NetNs) -> None:
    result = as_root.run("exec", "--net", "--network", "none", "--netns-path", _path(netns), str(image),
                         "stat", "-L", "-c", "%i", "/proc/self/ns/net")
    assert (result.returncode, result.stdout.strip()) == (0, str(os.stat(_path(netns)).st_ino)), result.stderr
    assert result.stderr == ("WARNING: cannot join existing --netns-path and create a new network namespace "
                             "with --net/-n\n")


def test_dry_run_names_the_path(as_root: Singpy, image: Path, netns: NetNs) -> None:
    plan = json.loads(as_root.ok("exec", "--dry-run", "--netns-path", _path(netns), str(image), "true"))["plan"]
    assert plan["netns_path"] == _path(netns)
    assert plan["namespaces"]["net"] is False and plan["network"] is None


def test_user_needs_the_path_allowed(as_user: Singpy, image: Path, netns: NetNs, workdir: Path) -> None:
    result = as_user.run("exec", "--netns-path", _path(netns), str(image), "true")
    assert_one_fatal(result, f"'{_path(netns)}' is not an allowed netns path in singpy.conf")
    only_user = _conf(workdir, "user-only", f"allow net users = {as_user.user}\n")
    result = as_user.run("--config", str(only_user), "exec", "--netns-path", _path(netns), str(image), "true")
    assert_one_fatal(result, "is not an allowed netns path in singpy.conf")


def test_user_needs_to_be_allowed(as_user: Singpy, image: Path, netns: NetNs, workdir: Path) -> None:
    only_path = _conf(workdir, "path-only", f"allow netns paths = {_path(netns)}\n")
    result = as_user.run("--config", str(only_path), "exec", "--netns-path", _path(netns), str(image), "true")
    assert_one_fatal(result, "you are not permitted to join network namespaces in singpy.conf")


@pytest.mark.parametrize("who", ["user", "group"])
def test_allowed_user_meets_the_kernel(as_user: Singpy, image: Path, netns: NetNs, workdir: Path, who: str) -> None:
    """Allowed by the configuration, the join is the kernel's to refuse: CAP_SYS_ADMIN over the namespace."""
    import grp

    allowed = f"allow net users = {as_user.user}" if who == "user" else \
        f"allow net groups = {grp.getgrgid(as_user.gid).gr_name}"
    conf = _conf(workdir, f"allowed-{who}", f"{allowed}\nallow netns paths = /run/netns/other, {_path(netns)}\n")
    result = as_user.run("--config", str(conf), "exec", "--netns-path", _path(netns), str(image), "true")
    assert_one_fatal(result, f"can't join the network namespace {_path(netns)}: the kernel lets only a process with "
                             "CAP_SYS_ADMIN over it join it, and singpy is never setuid")


def test_missing_path(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--netns-path", "/run/netns/singpy-no-such-namespace", str(image), "true")
    assert_one_fatal(result, "while checking netns path: /run/netns/singpy-no-such-namespace does not exist")


def test_not_a_network_namespace(as_root: Singpy, image: Path, workdir: Path) -> None:
    other = workdir / "not-a-namespace"
    other.write_text("")
    result = as_root.run("exec", "--netns-path", str(other), str(image), "true")
    assert_one_fatal(result, f"--netns-path {other} is not a network namespace")
    mount_ns = "/proc/self/ns/mnt"  # a namespace, of another type
    result = as_root.run("exec", "--netns-path", mount_ns, str(image), "true")
    assert_one_fatal(result, f"--netns-path {mount_ns} is not a network namespace")


def test_allow_netns_paths_alone_changes_nothing_for_a_plain_run(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _conf(workdir, "site", "allow netns paths = /var/run/netns/site\n")
    result = singpy.run("--verbose", "--config", str(conf), "exec", str(image), "echo", "ran")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert "allow netns paths" not in result.stderr and "WARNING" not in result.stderr

"""--net, --network, --network-args, --dns, --hostname: real namespaces, real traffic, nothing left behind.

Root cases run inside a network namespace made for the test (tests.support.netns),
so the bridge, the veths and the test's servers never touch the host's interfaces;
the fixture checks that only the loopback is left when a test ends. Bridge name
and subnets are this run's own (netns.BRIDGE, netns.BRIDGE_NET, netns.PTP_NET).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.support.leftovers import settled, traces, wait_for_descendants, wait_until_gone
from tests.support.netns import BRIDGE, BRIDGE_NET, PTP_NET, NetNs

pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("ip") is None,
                                reason="network tests run as root, with iproute2")

BRIDGE_GW, PTP_GW = f"{BRIDGE_NET}.1", f"{PTP_NET}.1"
PORT = 9000
# Retries while a server in another namespace starts: up to 10 s.
FETCH = "(for i in $(seq 100); do wget -q -O - {url} && exit 0; sleep 0.1; done; exit 1)"


@pytest.fixture
def netns(as_root: Singpy, workdir: Path) -> Iterator[NetNs]:
    ns = NetNs(SINGPY, workdir, as_root.env())
    try:
        yield ns
        assert ns.wait_for_link("singpy-", present=False) == []
        assert ns.wait_for_link(BRIDGE, present=False) == []
        assert ns.links() == ["lo"], "a link was left behind"
        assert ns.addresses() == [], "an address was left behind"  # lo is down in a fresh netns: no address
    finally:
        ns.delete()


@pytest.fixture
def server(netns: NetNs, workdir: Path) -> Iterator[str]:
    """An HTTP server in the test namespace (the 'host' side), on every address it has; yields the file's text."""
    root = workdir / "www"
    root.mkdir(exist_ok=True)
    (root / "hello.txt").write_text("hello from the host side\n")
    process = netns.spawn(sys.executable, "-m", "http.server", str(PORT), "--bind", "0.0.0.0", "--directory",
                          str(root))
    try:
        yield "hello from the host side"
    finally:
        process.terminate()
        process.wait(timeout=10)


def running(netns: NetNs, *args: str, conf: Path | None = None) -> subprocess.Popen[str]:
    """`singpy ARGS... sh -c 'echo up; exec CMD'`, returned once CMD runs: the network set-up is complete.

    (The host end of the veth appears before the bridge exists: its name alone says the set-up has begun.)
    """
    *flags, image, command = args
    process = netns.popen(*flags, image, "sh", "-c", f"echo up; exec {command}", conf=conf)
    assert process.stdout is not None
    line = process.stdout.readline()
    if line != "up\n":
        process.kill()
        out, err = process.communicate(timeout=30)
        raise AssertionError(f"the container never started: {line}{out}\n{err}")
    return process


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """End a long-running container the way a user would (SIGTERM to singpy) and collect its output."""
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=30)


def test_bridge_containers_reach_each_other_and_the_host(netns: NetNs, image: Path, server: str) -> None:
    first = running(netns, "exec", "--net", "--network-args", f"IP={BRIDGE_NET}.10", str(image),
                    "httpd -f -p 8000 -h /.singularity.d")
    try:
        assert netns.wait_for_link("singpy-"), "the first container's veth never appeared"
        assert BRIDGE in netns.links()
        assert f"{BRIDGE} {BRIDGE_GW}/24" in netns.addresses()
        out = netns.run("exec", "--net", str(image), "sh", "-c",
                        "ip -o -4 addr show eth0; ip route; " + FETCH.format(url=f"http://{BRIDGE_NET}.10:8000/runscript")
                        + " && " + FETCH.format(url=f"http://{BRIDGE_GW}:{PORT}/hello.txt"))
        assert out.returncode == 0, out.stderr
        assert f"inet {BRIDGE_NET}.2/24" in out.stdout  # the first free address: .1 is the bridge, .10 is taken
        assert f"default via {BRIDGE_GW} dev eth0" in out.stdout
        assert "Hello from a singpy container" in out.stdout  # container to container
        assert server in out.stdout  # container to a server on the bridge address
        assert len([name for name in netns.links() if name.startswith("singpy-")]) == 1  # the second's is gone
    finally:
        stop(first)
    assert first.returncode == -signal.SIGTERM  # the payload's death, re-raised by the supervisor


def test_ptp_reaches_the_host_end(netns: NetNs, image: Path, server: str) -> None:
    out = netns.run("exec", "--network", "ptp", str(image), "sh", "-c",
                    "ip -o -4 addr show eth0; ip route; " + FETCH.format(url=f"http://{PTP_GW}:{PORT}/hello.txt"))
    assert out.returncode == 0, out.stderr
    assert f"inet {PTP_NET}.2/32" in out.stdout and f"default via {PTP_GW} dev eth0" in out.stdout
    assert server in out.stdout


@pytest.mark.parametrize("profile", ["root", "user"])
def test_loopback_only_reaches_nothing_else(netns: NetNs, image: Path, server: str, as_user: Singpy,
                                            profile: str) -> None:
    holder = running(netns, "exec", "--net", str(image), "sleep 60")  # the bridge and its address exist meanwhile
    try:
        assert netns.wait_for_link("singpy-")
        user = (as_user.uid, as_user.gid) if profile == "user" else None
        env = as_user.env() if profile == "user" else None
        script = ("ip -o addr; httpd -f -p 127.0.0.1:8080 -h /.singularity.d & httpd -f -p [::1]:8081 "
                  "-h /.singularity.d & "
                  + FETCH.format(url="http://127.0.0.1:8080/runscript") + " >/dev/null && echo v4-ok; "
                  + FETCH.format(url="http://[::1]:8081/runscript") + " >/dev/null && echo v6-ok; "
                  f"echo | nc -w 2 {BRIDGE_GW} {PORT} || echo bridge-unreachable; kill %1 %2")
        out = netns.run("exec", "--net", "--network", "none", str(image), "sh", "-c", script, user=user, env=env)
        assert out.returncode == 0, out.stderr
        interfaces = {line.split()[1] for line in out.stdout.splitlines() if line[:1].isdigit()}
        assert interfaces == {"lo"}
        assert "inet 127.0.0.1/8" in out.stdout and "inet6 ::1/128" in out.stdout
        assert "v4-ok" in out.stdout and "v6-ok" in out.stdout
        assert "bridge-unreachable" in out.stdout and "Network is unreachable" in out.stderr
    finally:
        stop(holder)


def test_unprivileged_net_defaults_to_loopback(as_user: Singpy, image: Path) -> None:
    out = as_user.ok("exec", "--net", str(image), "sh", "-c", "ip -o link; readlink /proc/self/ns/net")
    assert [line.split(":")[1].strip() for line in out.splitlines()[:-1]] == ["lo"]
    assert out.splitlines()[-1] != os.readlink("/proc/self/ns/net")


def test_hostname_and_dns(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", "--net", "--network", "none", "--hostname", "netbox", "--dns", "10.0.0.53,fd00::53",
                    str(image), "sh", "-c", "hostname; cat /etc/resolv.conf")
    assert out == "netbox\nnameserver 10.0.0.53\nnameserver fd00::53\n"
    assert singpy.ok("exec", "--dns", "192.0.2.53", str(image), "cat", "/etc/resolv.conf") == \
        "nameserver 192.0.2.53\n"


def test_network_env_variables(netns: NetNs, image: Path, as_root: Singpy) -> None:
    env = as_root.env(APPTAINER_NETWORK="ptp", SINGULARITY_NET="1", APPTAINER_DNS="10.1.1.1")
    out = netns.run("exec", str(image), "sh", "-c", "ip -o -4 addr show eth0; cat /etc/resolv.conf", env=env)
    assert out.returncode == 0, out.stderr
    assert f"{PTP_NET}.2/32" in out.stdout and "nameserver 10.1.1.1" in out.stdout


def test_killed_launcher_leaves_nothing(netns: NetNs, image: Path) -> None:
    """SIGKILL to the supervisor: the container dies with it (PDEATHSIG), the kernel drops its veth, the
    next run removes the empty bridge and a veth whose launcher is dead (as left by a crash mid-set-up)."""
    launcher = running(netns, "exec", "--net", str(image), "sleep 300")  # set up: killed while running
    assert netns.wait_for_link("singpy-")
    launcher.kill()
    launcher.communicate(timeout=30)
    assert netns.wait_for_link("singpy-", present=False) == []
    assert BRIDGE in netns.links()  # an empty bridge: the next run's business
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"singpy-{dead.pid}"
    netns.ip("link", "add", stale, "type", "veth", "peer", "name", "stale-peer")
    netns.ip("link", "set", stale, "alias", f"singpy {BRIDGE_NET}.2")
    out = netns.run("exec", "--net", str(image), "ip", "-o", "-4", "addr", "show", "eth0")
    assert out.returncode == 0, out.stderr
    assert f"{BRIDGE_NET}.2/24" in out.stdout  # the stale veth's address was free again
    assert stale not in netns.links() and "stale-peer" not in netns.links()


def test_bridge_of_a_launcher_killed_before_marking_it_is_removed(netns: NetNs, image: Path) -> None:
    """A bridge is made as singpyb-PID, then marked as singpy's, then renamed: one left unmarked by a
    launcher killed in between has a name the next run recognizes (its pid is dead), never a stray."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    unmarked = f"singpyb-{dead.pid}"
    netns.ip("link", "add", unmarked, "type", "bridge")
    out = netns.run("exec", "--net", str(image), "true")
    assert out.returncode == 0, out.stderr
    assert unmarked not in netns.links()


def test_sleeping_container_is_killed_with_its_launcher(netns: NetNs, image: Path) -> None:
    launcher = netns.popen("exec", "--net", str(image), "sh", "-c", "echo started; exec sleep 300")
    assert launcher.stdout is not None and launcher.stdout.readline() == "started\n"
    sleepers = wait_for_descendants(launcher.pid, "sleep 300")  # this launcher's payload, no other sleep
    assert sleepers
    launcher.kill()
    launcher.communicate(timeout=30)
    assert wait_until_gone(sleepers, "sleep 300") == [], "the payload outlived its launcher"
    assert netns.run("exec", "--net", str(image), "true").returncode == 0  # removes the bridge left empty


# --- bad input: one FATAL line, exit 255, nothing created -----------------------------------------------------

ROOT_ERRORS = {
    "unknown type": ((), ["--network", "macvlan"], "unknown network type 'macvlan'"),
    "malformed subnet": ((f"network bridge subnet = {BRIDGE_NET}.0/33",), ["--net"],
                         f"bad network bridge subnet '{BRIDGE_NET}.0/33'"),
    "too small subnet": ((f"network ptp subnet = {PTP_NET}.0/31",), ["--network", "ptp"],
                         f"network ptp subnet {PTP_NET}.0/31 is full"),
    "bad network args": ((), ["--net", "--network-args", "portmap=80:80/tcp"], "unsupported --network-args"),
    "address outside": ((), ["--net", "--network-args", "IP=10.99.0.2"], "is not a container address"),
    "bad dns": ((), ["--dns", "resolver.example"], "bad --dns server 'resolver.example'"),
}
USER_ERRORS = {  # {user}: the test user's name
    "bridge": ([], ["--network", "bridge"], "network bridge is not allowed for user {user}"),
    "ptp allowed but impossible": (["allow net users = {user}", "allow net networks = ptp"],
                                   ["--network", "ptp"], "network ptp needs root"),
    "args with none": ([], ["--net", "--network-args", f"IP={BRIDGE_NET}.5"], "--network-args needs a bridge or ptp"),
}


def _check_failure(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 255, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("HINT:")]
    assert len(lines) == 1 and lines[0].startswith("FATAL:") and message in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", list(ROOT_ERRORS))
def test_root_errors(netns: NetNs, image: Path, workdir: Path, case: str) -> None:
    conf_lines, args, message = ROOT_ERRORS[case]
    conf = workdir / "bad-net.conf"
    conf.write_text("".join(line + "\n" for line in conf_lines) + netns.conf.read_text())  # first: first wins
    before = traces(image, workdir)  # what names our paths: never the host's whole mount table
    _check_failure(netns.run("exec", *args, str(image), "true", conf=conf), message)
    assert netns.exists() and settled(before, image, workdir) == before
    assert netns.links() == ["lo"] and netns.addresses() == []


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_user_errors(netns: NetNs, image: Path, workdir: Path, as_user: Singpy, case: str) -> None:
    conf_lines, args, message = USER_ERRORS[case]
    conf = workdir / "user-net.conf"
    conf.write_text("".join(line.format(user=as_user.user) + "\n" for line in conf_lines) + netns.conf.read_text())
    conf.chmod(0o644)
    before = traces(image, workdir)  # what names our paths: never the host's whole mount table
    result = netns.run("exec", *args, str(image), "true", conf=conf, user=(as_user.uid, as_user.gid),
                       env=as_user.env())
    _check_failure(result, message.format(user=as_user.user))
    assert netns.exists() and settled(before, image, workdir) == before
    assert netns.links() == ["lo"] and netns.addresses() == []


def test_full_subnet(netns: NetNs, image: Path, workdir: Path) -> None:
    conf = workdir / "tiny-net.conf"
    conf.write_text(f"network bridge name = {BRIDGE}\nnetwork bridge subnet = {BRIDGE_NET}.0/30\n")
    holder = running(netns, "exec", "--net", str(image), "sleep 60", conf=conf)  # takes .2, the only one
    try:
        assert netns.wait_for_link("singpy-")
        links, addresses = netns.links(), netns.addresses("-4")
        _check_failure(netns.run("exec", "--net", str(image), "true", conf=conf),
                       f"network bridge subnet {BRIDGE_NET}.0/30 is full")
        assert netns.links() == links and netns.addresses("-4") == addresses
        _check_failure(netns.run("exec", "--net", "--network-args", f"IP={BRIDGE_NET}.2", str(image), "true",
                                 conf=conf), f"address {BRIDGE_NET}.2 is held by a running container")
        assert netns.links() == links and netns.addresses("-4") == addresses
    finally:
        stop(holder)

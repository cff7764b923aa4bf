"""--net, --network, --network-args, --dns, --hostname: real namespaces, real traffic, nothing left behind.

Root cases run inside a network namespace made for the test (tests.support.netns),
so the bridge, the veths and the test's servers never touch the host's interfaces;
the fixture checks that only the loopback is left when a test ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, host_state
from tests.support.netns import NetNs, namespaces

pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("ip") is None,
                                reason="network tests run as root, with iproute2")

BRIDGE_GW, PTP_GW = "10.231.0.1", "10.232.0.1"
PORT = 9000
# Retries while a server in another namespace starts: up to 10 s.
FETCH = "(for i in $(seq 100); do wget -q -O - {url} && exit 0; sleep 0.1; done; exit 1)"


@pytest.fixture
def netns(as_root: Singpy, workdir: Path) -> Iterator[NetNs]:
    ns = NetNs(SINGPY, workdir, as_root.env())
    try:
        yield ns
        assert ns.wait_for_link("singpy-", present=False) == []
        assert ns.wait_for_link("sptest0", present=False) == []
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


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """End a long-running container the way a user would (SIGTERM to singpy) and collect its output."""
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=30)


def test_bridge_containers_reach_each_other_and_the_host(netns: NetNs, image: Path, server: str) -> None:
    first = netns.popen("exec", "--net", "--network-args", "IP=10.231.0.10", str(image),
                        "httpd", "-f", "-p", "8000", "-h", "/.singularity.d")
    try:
        assert netns.wait_for_link("singpy-"), "the first container's veth never appeared"
        assert "sptest0" in netns.links()
        assert f"sptest0 {BRIDGE_GW}/24" in netns.addresses()
        out = netns.run("exec", "--net", str(image), "sh", "-c",
                        "ip -o -4 addr show eth0; ip route; " + FETCH.format(url="http://10.231.0.10:8000/runscript")
                        + " && " + FETCH.format(url=f"http://{BRIDGE_GW}:{PORT}/hello.txt"))
        assert out.returncode == 0, out.stderr
        assert "inet 10.231.0.2/24" in out.stdout  # the first free address: .1 is the bridge, .10 is taken
        assert f"default via {BRIDGE_GW} dev eth0" in out.stdout
        assert "Hello from a singpy container" in out.stdout  # container to container
        assert server in out.stdout  # container to a server on the bridge address
        assert len([name for name in netns.links() if name.startswith("singpy-")]) == 1  # the second's is gone
    finally:
        stop(first)
    assert first.returncode == 128 + signal.SIGTERM  # the payload's death, passed on by the supervisor


def test_ptp_reaches_the_host_end(netns: NetNs, image: Path, server: str) -> None:
    out = netns.run("exec", "--network", "ptp", str(image), "sh", "-c",
                    "ip -o -4 addr show eth0; ip route; " + FETCH.format(url=f"http://{PTP_GW}:{PORT}/hello.txt"))
    assert out.returncode == 0, out.stderr
    assert "inet 10.232.0.2/32" in out.stdout and f"default via {PTP_GW} dev eth0" in out.stdout
    assert server in out.stdout


@pytest.mark.parametrize("profile", ["root", "user"])
def test_loopback_only_reaches_nothing_else(netns: NetNs, image: Path, server: str, as_user: Singpy,
                                            profile: str) -> None:
    holder = netns.popen("exec", "--net", str(image), "sleep", "60")  # the bridge and its address exist meanwhile
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
    assert "10.232.0.2/32" in out.stdout and "nameserver 10.1.1.1" in out.stdout


def test_killed_launcher_leaves_nothing(netns: NetNs, image: Path) -> None:
    """SIGKILL to the supervisor: the container dies with it (PDEATHSIG), the kernel drops its veth, the
    next run removes the empty bridge and a veth whose launcher is dead (as left by a crash mid-set-up)."""
    launcher = netns.popen("exec", "--net", str(image), "sleep", "300")
    assert netns.wait_for_link("singpy-")
    launcher.kill()
    launcher.communicate(timeout=30)
    assert netns.wait_for_link("singpy-", present=False) == []
    assert "sptest0" in netns.links()  # an empty bridge: the next run's business
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"singpy-{dead.pid}"
    netns.ip("link", "add", stale, "type", "veth", "peer", "name", "stale-peer")
    netns.ip("link", "set", stale, "alias", "singpy 10.231.0.2")
    out = netns.run("exec", "--net", str(image), "ip", "-o", "-4", "addr", "show", "eth0")
    assert out.returncode == 0, out.stderr
    assert "10.231.0.2/24" in out.stdout  # the stale veth's address was free again
    assert stale not in netns.links() and "stale-peer" not in netns.links()


def test_sleeping_container_is_killed_with_its_launcher(netns: NetNs, image: Path) -> None:
    launcher = netns.popen("exec", "--net", str(image), "sh", "-c", "echo started; exec sleep 300")
    assert launcher.stdout is not None and launcher.stdout.readline() == "started\n"
    sleepers = _pids_of("sleep 300")
    assert sleepers
    launcher.kill()
    launcher.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while set(sleepers) & set(_pids_of("sleep 300")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(sleepers) & set(_pids_of("sleep 300")), "the payload outlived its launcher"
    assert netns.run("exec", "--net", str(image), "true").returncode == 0  # removes the bridge left empty


def _pids_of(command: str) -> list[int]:
    listed = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in listed.splitlines() if line.split(None, 1)[1:] == [command]]


# --- bad input: one FATAL line, exit 255, nothing created -----------------------------------------------------

ROOT_ERRORS = {
    "unknown type": ((), ["--network", "macvlan"], "unknown network type 'macvlan'"),
    "malformed subnet": (("network bridge subnet = 10.231.0.0/33",), ["--net"],
                         "bad network bridge subnet '10.231.0.0/33'"),
    "too small subnet": (("network ptp subnet = 10.232.0.0/31",), ["--network", "ptp"],
                         "network ptp subnet 10.232.0.0/31 is full"),
    "bad network args": ((), ["--net", "--network-args", "portmap=80:80/tcp"], "unsupported --network-args"),
    "address outside": ((), ["--net", "--network-args", "IP=10.99.0.2"], "is not a container address"),
    "bad dns": ((), ["--dns", "resolver.example"], "bad --dns server 'resolver.example'"),
}
USER_ERRORS = {
    "bridge": ([], ["--network", "bridge"], "network bridge is not allowed for user singpy-test"),
    "ptp allowed but impossible": (["allow net users = singpy-test", "allow net networks = ptp"],
                                   ["--network", "ptp"], "network ptp needs root"),
    "args with none": ([], ["--net", "--network-args", "IP=10.231.0.5"], "--network-args needs a bridge or ptp"),
}


def _untouched() -> tuple[str, list[str]]:
    """Host mounts and network namespaces: what a failed launch must leave as it found them.

    (Not conftest's whole host_state: other suites' processes and /tmp entries may come and go meanwhile.)
    """
    return host_state()[0], namespaces()


def _check_failure(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 255, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("HINT:")]
    assert len(lines) == 1 and lines[0].startswith("FATAL:") and message in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", list(ROOT_ERRORS))
def test_root_errors(netns: NetNs, image: Path, workdir: Path, case: str) -> None:
    conf_lines, args, message = ROOT_ERRORS[case]
    conf = workdir / "bad-net.conf"
    conf.write_text(netns.conf.read_text() + "".join(line + "\n" for line in conf_lines))
    before = _untouched()
    _check_failure(netns.run("exec", *args, str(image), "true", conf=conf), message)
    assert _untouched() == before
    assert netns.links() == ["lo"] and netns.addresses() == []


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_user_errors(netns: NetNs, image: Path, workdir: Path, as_user: Singpy, case: str) -> None:
    conf_lines, args, message = USER_ERRORS[case]
    conf = workdir / "user-net.conf"
    conf.write_text(netns.conf.read_text() + "".join(line + "\n" for line in conf_lines))
    conf.chmod(0o644)
    before = _untouched()
    result = netns.run("exec", *args, str(image), "true", conf=conf, user=(as_user.uid, as_user.gid),
                       env=as_user.env())
    _check_failure(result, message)
    assert _untouched() == before
    assert netns.links() == ["lo"] and netns.addresses() == []


def test_full_subnet(netns: NetNs, image: Path, workdir: Path) -> None:
    conf = workdir / "tiny-net.conf"
    conf.write_text("network bridge name = sptest0\nnetwork bridge subnet = 10.231.0.0/30\n")
    holder = netns.popen("exec", "--net", str(image), "sleep", "60", conf=conf)  # takes .2, the only one
    try:
        assert netns.wait_for_link("singpy-")
        links, addresses = netns.links(), netns.addresses("-4")
        _check_failure(netns.run("exec", "--net", str(image), "true", conf=conf),
                       "network bridge subnet 10.231.0.0/30 is full")
        assert netns.links() == links and netns.addresses("-4") == addresses
        _check_failure(netns.run("exec", "--net", "--network-args", "IP=10.231.0.2", str(image), "true", conf=conf),
                       "address 10.231.0.2 is held by a running container")
        assert netns.links() == links and netns.addresses("-4") == addresses
    finally:
        stop(holder)

"""A dedicated network namespace for root network tests, so the host's own interfaces are never touched.

Every root launch that creates interfaces runs as `ip netns exec NS singpy ...`;
its bridge, veths and addresses live in NS, which the fixture deletes at the end.
Names are this run's own (the namespace, the bridge and the subnets carry the
pid of the test process), so another copy of the suite on the same machine
can neither meet ours nor be mistaken for it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_names = itertools.count()
_RUN = os.getpid()

NS_PREFIX = f"singpy-test-{_RUN}-"
BRIDGE = f"spt{_RUN}"  # at most 10 characters (pids end at 4194304): within IFNAMSIZ (15)
BRIDGE_NET = f"10.231.{_RUN % 256}"  # .0/24: .1 is the bridge, containers from .2
PTP_NET = f"10.232.{_RUN % 256}"
NET_CONF = f"""\
network bridge name = {BRIDGE}
network bridge subnet = {BRIDGE_NET}.0/24
network ptp subnet = {PTP_NET}.0/24
"""


class NetNs:
    """One `ip netns` namespace, and singpy run inside it as root or as the test user."""

    def __init__(self, singpy: str, workdir: Path, env: dict[str, str]) -> None:
        self.name = f"{NS_PREFIX}{next(_names)}"
        self.singpy = singpy
        self.workdir = workdir
        self.env = env
        self.conf = workdir / f"{self.name}.conf"
        self.conf.write_text(NET_CONF)
        self.conf.chmod(0o644)
        subprocess.run(["ip", "netns", "add", self.name], check=True)

    def exists(self) -> bool:
        return os.path.exists(f"/run/netns/{self.name}")

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)
        self.conf.unlink(missing_ok=True)

    def command(self, args: tuple[str, ...], *, conf: Path | None = None, user: tuple[int, int] | None = None,
                ) -> list[str]:
        prefix = ["ip", "netns", "exec", self.name]
        if user is not None:
            prefix += ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"]
        return [*prefix, self.singpy, "--config", str(conf or self.conf), *args]

    def popen(self, *args: str, conf: Path | None = None, user: tuple[int, int] | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(args, conf=conf, user=user), env=env or self.env, cwd=self.workdir,
                                text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def run(self, *args: str, conf: Path | None = None, user: tuple[int, int] | None = None,
            env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        process = self.popen(*args, conf=conf, user=user, env=env)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def ip(self, *args: str) -> str:
        return subprocess.run(["ip", "-n", self.name, *args], capture_output=True, text=True, check=True).stdout

    def links(self) -> list[str]:
        """Interface names, without the @peer suffix."""
        return [line.split(":")[1].strip().split("@")[0] for line in self.ip("-o", "link", "show").splitlines()]

    def addresses(self, *family: str) -> list[str]:
        """`IFNAME ADDRESS/PREFIX` for every address (of `family`: "-4", "-6"), loopback included."""
        listed = self.ip(*family, "-o", "addr", "show")
        return [f"{line.split()[1]} {line.split()[3]}" for line in listed.splitlines()]

    def wait_for_link(self, prefix: str, *, present: bool = True, timeout: float = 20) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = [name for name in self.links() if name.startswith(prefix)]
            if bool(found) == present or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def spawn(self, *argv: str) -> subprocess.Popen[bytes]:
        """A host-side program (a test server) inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)


def made_netns(singpy: str, workdir: Path, env: dict[str, str]) -> Iterator[NetNs]:
    """A fixture's body: a network namespace for one test, deleted after it (skipped but as root, with iproute2)."""
    if os.getuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces wired from the host: root, with iproute2")
    ns = NetNs(singpy, workdir, env)
    try:
        yield ns
    finally:
        ns.delete()

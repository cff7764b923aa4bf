"""A test's instances: what singpy keeps of one, removed at the end whatever happened; and what the
`singpy instance` tests share (tests/integration/test_instances*.py): a startscript that reports itself, its
images, `Instance` (one name of a test, its logs and record), unique names per session, and the processes
of an instance that run, or have gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.conftest import SINGPY, Singpy, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import wait_until_gone
from tests.support.waiting import wait_for_text

# Reports itself, then waits: TERM (unless its first argument is "stubborn") and HUP end it, USR1 is reported only.
STARTSCRIPT = """#!/bin/sh
echo "startscript pid=$$ mnt=$(readlink /proc/self/ns/mnt) user=$(readlink /proc/self/ns/user) args=$*"
echo "startscript's stderr" >&2
if [ "$1" = stubborn ]; then trap 'echo ignored TERM' TERM; else trap 'echo got TERM; exit 0' TERM; fi
trap 'echo got HUP; exit 0' HUP
trap 'echo got USR1' USR1
while :; do sleep 0.05; done
"""
STARTED = re.compile(r"^startscript pid=(\d+) mnt=(\S+) user=(\S+) args=(.*)$", re.MULTILINE)
NS = "readlink /proc/self/ns/mnt; readlink /proc/self/ns/user"
SESSION = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"  # in every instance name: the homes are shared


def forget_instance(singpy: Singpy, name: str) -> None:
    """Instance `name` stopped (SIGKILL, if it still runs) and its record and logs removed."""
    singpy.run("instance", "stop", "--force", name)
    base = Path(singpy.home, ".singpy", "instances")
    for path in (base / "logs" / os.uname().nodename / singpy.user / f"{name}.out",
                 base / "logs" / os.uname().nodename / singpy.user / f"{name}.err",
                 base / "app" / os.uname().nodename / singpy.user / f"{name}.json"):
        path.unlink(missing_ok=True)


def instance_images(workdir: Path) -> dict[str, Path]:
    """A sandbox with the startscript above, and a SIF made of it by `singpy build`."""
    sandbox = build_busybox_rootfs(workdir / "instance-sandbox")
    script = sandbox / ".singularity.d" / "startscript"
    script.write_text(STARTSCRIPT)
    script.chmod(0o755)
    readable_by_all(sandbox)
    sif = workdir / "instance.sif"
    if not sif.exists():  # (pytest may set a module's fixtures up again, once per profile)
        subprocess.run([SINGPY, "-q", "build", str(sif), str(sandbox)], check=True)
        sif.chmod(0o644)
    return {"sandbox": sandbox, "sif": sif}


class Instance:
    """One instance name of a test, and where singpy keeps what it knows of it."""

    def __init__(self, singpy: Singpy, name: str) -> None:
        self.singpy, self.name = singpy, name
        self.logs = Path(singpy.home, ".singpy", "instances", "logs", os.uname().nodename, singpy.user)
        self.records = Path(singpy.home, ".singpy", "instances", "app", os.uname().nodename, singpy.user)

    @property
    def out(self) -> Path:
        return self.logs / f"{self.name}.out"

    @property
    def err(self) -> Path:
        return self.logs / f"{self.name}.err"

    @property
    def record(self) -> Path:
        return self.records / f"{self.name}.json"

    def start(self, image: Path, *args: str, flags: tuple[str, ...] = ()) -> None:
        result = self.singpy.run("instance", "start", *flags, str(image), self.name, *args)
        assert result.returncode == 0, result.stderr
        assert result.stderr == "INFO:    instance started successfully\n"
        assert result.stdout == ""

    def wait_for_log(self, text: str, log: Path | None = None, timeout: float = 10.0) -> str:
        """The log once it holds `text` (the startscript runs in the background)."""
        return wait_for_text(log or self.out, text, timeout)

    def startscript(self) -> tuple[int, str, str, str]:
        """The startscript's pid, mount and user namespaces and arguments, as it wrote them."""
        found = STARTED.search(self.wait_for_log("startscript pid="))
        assert found is not None
        return int(found[1]), found[2], found[3], found[4]

    def listed(self) -> dict[str, object]:
        out = self.singpy.ok("instance", "list", "--json", self.name)
        entries = json.loads(out)["instances"]
        assert len(entries) == 1, out
        return dict(entries[0])


def named_instances(singpy: Singpy) -> Iterator[Callable[[str], Instance]]:
    """Unique instances for this test; stopped (SIGKILL) and their logs removed at the end, whatever happened."""
    made: list[Instance] = []

    def make(label: str = "i") -> Instance:
        made.append(Instance(singpy, f"{SESSION}-{label}-{uuid.uuid4().hex[:6]}"))
        return made[-1]

    yield make
    for instance in made:
        if instance.record.exists():
            singpy.run("instance", "stop", "--force", instance.name)
        for path in (instance.out, instance.err, instance.record):
            path.unlink(missing_ok=True)


def command_line(pid: int) -> str:
    """The process's command line; "" while it is in execve, or once it has gone (listed, then ended)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().rstrip(b"\0").replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def running(*pids: object) -> dict[int, str]:
    """The command lines of `pids`, processes of an instance that run now (asserted)."""
    found = {}
    for pid in pids:
        assert isinstance(pid, int)
        found[pid] = command_line(pid)
        assert found[pid], f"{pid} does not run"
    return found


def assert_gone(processes: dict[int, str]) -> None:
    """Each of `processes` (from `running`) has ended: exited, a zombie, or its pid now runs something else."""
    for pid, command in processes.items():
        assert wait_until_gone([pid], command) == [], f"{pid} {command} still runs"

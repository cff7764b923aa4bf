"""Instances and PID namespaces: a record's pid is of the namespace of the `instance start` that wrote it.

* started inside a PID namespace of its own (`unshare --pid`), an instance
  is listed, with its pid here, and stopped from the host's;
* started on the host, it is out of sight from inside another PID
  namespace: `list` there neither shows nor removes it, `stop` there
  refuses (one FATAL line) and signals nothing.

As root: a user's PID namespace needs a user namespace of its own, where
root's directories (/home) belong to nobody and singpy rightly refuses the
instance directory below them; the code is the same for both.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.instances import forget_instance

SESSION = f"p{os.getpid()}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def image(workdir: Path) -> Path:
    """A sandbox without a startscript: its holder forks nothing."""
    sandbox = workdir / "pidns-bare"
    if not sandbox.exists():
        build_busybox_rootfs(sandbox)
        (sandbox / ".singularity.d" / "startscript").unlink(missing_ok=True)
        readable_by_all(sandbox)
    return sandbox


@pytest.fixture
def name(singpy: Singpy) -> Iterator[str]:
    """An instance name of this test (root's: see above); stopped from the host and its files removed at the end."""
    if singpy.profile != "root":
        pytest.skip("a user's PID namespace comes with a user namespace, where /home belongs to nobody")
    made = f"{SESSION}-{uuid.uuid4().hex[:6]}"
    yield made
    forget_instance(singpy, made)


def _unshare() -> list[str]:
    """A PID namespace of its own with its own /proc, ended with unshare (--kill-child: its PID 1 is killed)."""
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def _inside(singpy: Singpy, script: str, *args: str) -> subprocess.Popen[str]:
    """`sh -c script singpy ARGS...` in a new PID namespace (root: see above)."""
    return subprocess.Popen([*_unshare(), "sh", "-c", script, SINGPY, *args], env=singpy.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_inside(singpy: Singpy, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    process = _inside(singpy, script, *args)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _host_pid(inner: int, namespace: str) -> int:
    """Our pid of the holder that is `inner` in the PID namespace `namespace` (its /proc/PID/ns/pid link)."""
    for entry in os.listdir("/proc"):
        try:
            if not entry.isdigit() or os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
        if nspid[-1] == str(inner) and Path(f"/proc/{entry}/comm").read_text() == "singpy-instance\n":
            return int(entry)
    return 0


def test_an_instance_started_in_a_pid_namespace_is_seen_and_stopped_from_the_host(singpy: Singpy, image: Path,
                                                                                  name: str) -> None:
    """The old code took the record's pid (one of that namespace) for an ended instance and removed the record."""
    script = ('"$0" instance start "$1" "$2" >&2 || exit 1; "$0" instance list --json "$2"; '
              'readlink /proc/self/ns/pid; echo ready; exec sleep 300')
    inside = _inside(singpy, script, str(image), name)
    try:
        assert inside.stdout is not None
        lines: list[str] = []
        while not lines or lines[-1] != "ready\n":
            line = inside.stdout.readline()
            assert line, inside.communicate(timeout=30)[1]
            lines.append(line)
        inner = json.loads("".join(lines[:-2]))["instances"][0]["pid"]
        holder = _host_pid(inner, lines[-2].strip())
        assert holder > 0, "no holder found in the namespace"
        listed = json.loads(singpy.ok("instance", "list", "--json", name))["instances"]
        assert [entry["pid"] for entry in listed] == [holder], listed  # its pid here, not the namespace's
        assert name in singpy.ok("instance", "list")
        handle = os.pidfd_open(holder)
        try:
            stopped = singpy.run("instance", "stop", name)
            assert stopped.returncode == 0, stopped.stderr
            assert select.select([handle], [], [], 10)[0] == [handle], "the holder still runs"
        finally:
            os.close(handle)
        assert name not in singpy.ok("instance", "list")
    finally:
        inside.kill()  # PID 1 of the namespace: everything in it goes
        inside.communicate(timeout=30)


def test_an_instance_of_the_host_is_out_of_sight_in_another_pid_namespace(singpy: Singpy, image: Path,
                                                                          name: str) -> None:
    """Inside: `list` shows nothing and removes nothing (the old code removed the record, and the host's `list`
    then lost the instance), `stop` refuses in one line. The instance runs on, listed on the host."""
    started = singpy.run("instance", "start", str(image), name)
    assert started.returncode == 0, started.stderr
    pid = json.loads(singpy.ok("instance", "list", "--json", name))["instances"][0]["pid"]
    listed_inside = _run_inside(singpy, '"$0" instance list')
    assert listed_inside.returncode == 0, listed_inside.stderr
    assert name not in listed_inside.stdout
    assert_one_fatal(_run_inside(singpy, '"$0" instance stop "$1"', name), "another PID namespace")
    listed = json.loads(singpy.ok("instance", "list", "--json", name))["instances"]
    assert [entry["pid"] for entry in listed] == [pid], listed

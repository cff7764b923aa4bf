"""`singpy instance` errors (a name started once, unknown instances and names, failed starts leaving nothing,
another user's instance not found) and instances with a PID namespace of their own, as test_instances.py:
real instances as root and as a user, names unique to this session (tests/support/instances.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.instances import (
    SESSION,
    Instance,
    assert_gone,
    command_line,
    instance_images,
    named_instances,
    running,
)
from tests.support.leftovers import (
    in_pid_namespace,
    pinned_pid_namespace,
    settled,
    traces,
    wait_for_empty_pid_namespace,
)
from tests.support.users import is_root


@pytest.fixture(scope="module")
def images(workdir: Path) -> dict[str, Path]:
    return instance_images(workdir)


@pytest.fixture(params=["sandbox", "sif"])
def image_of_kind(request: pytest.FixtureRequest, images: dict[str, Path]) -> Path:
    return images[request.param]


@pytest.fixture
def names(singpy: Singpy) -> Iterator[Callable[[str], Instance]]:
    yield from named_instances(singpy)


# --- errors ----------------------------------------------------------------------------------------------------------


def test_a_name_is_started_once(singpy: Singpy, images: dict[str, Path], names: Callable[[str], Instance]) -> None:
    instance = names("twice")
    instance.start(images["sandbox"])
    holder = instance.listed()["pid"]
    assert_one_fatal(singpy.run("instance", "start", str(images["sif"]), instance.name), "already exists")
    assert instance.listed()["pid"] == holder  # the running one is untouched
    assert singpy.ok("exec", f"instance://{instance.name}", "echo", "still") == "still\n"


def test_a_name_being_started_is_taken(singpy: Singpy, images: dict[str, Path],
                                       names: Callable[[str], Instance]) -> None:
    """Two starts of one name at once: the second finds the first's lock on the log, and starts nothing."""
    import fcntl

    instance = names("racing")
    singpy.ok("instance", "list")  # the directories
    with open(instance.out, "a") as log:
        os.chown(instance.out, singpy.uid, singpy.gid)
        fcntl.flock(log, fcntl.LOCK_EX)  # as the first start holds it
        result = singpy.run("instance", "start", str(images["sandbox"]), instance.name)
    assert_one_fatal(result, f"instance {instance.name} already exists (it is being started)")
    assert not instance.record.exists()
    instance.start(images["sandbox"])  # once the lock is gone


def test_the_socket_name_is_not_the_instance_name(singpy: Singpy, images: dict[str, Path],
                                                  names: Callable[[str], Instance]) -> None:
    """Anyone can bind an abstract name: one derived from the instance's could be taken first (see
    test_instance_owner.py); it is random, and kept in the record, which only its user can write."""
    first, second = names("sock"), names("sock")
    first.start(images["sandbox"])
    second.start(images["sandbox"])
    sockets = [json.loads(instance.record.read_text())["socket"] for instance in (first, second)]
    for socket_name, instance in zip(sockets, (first, second), strict=True):
        assert re.fullmatch(rf"singpy-instance/{singpy.uid}/[0-9a-f]{{32}}", socket_name), socket_name
        assert instance.name not in socket_name
    assert sockets[0] != sockets[1]
    assert instance.record.stat().st_mode & 0o777 == 0o600 and instance.record.parent.stat().st_mode & 0o777 == 0o700
    assert not [entry for entry in os.listdir(first.records) if entry.endswith(".partial")
                and entry.startswith((f".{first.name}.", f".{second.name}."))]


@pytest.mark.parametrize("action", ["exec", "run", "shell"])
def test_joining_an_unknown_instance_fails(singpy: Singpy, action: str) -> None:
    name = f"{SESSION}-unknown"
    args = ["true"] if action == "exec" else []
    assert_one_fatal(singpy.run(action, f"instance://{name}", *args), f"no instance found with name {name}")


def test_stopping_an_unknown_instance_fails(singpy: Singpy) -> None:
    name = f"{SESSION}-unknown"
    assert_one_fatal(singpy.run("instance", "stop", name), f"no instance found with name {name}")


@pytest.mark.parametrize("name", ["bad/name", ".hidden", "x" * 129])
def test_a_bad_name_is_a_usage_error(singpy: Singpy, images: dict[str, Path], name: str) -> None:
    assert_one_fatal(singpy.run("instance", "start", str(images["sandbox"]), name), "bad instance name", code=1)
    assert_one_fatal(singpy.run("exec", f"instance://{name}", "true"), "bad instance name", code=1)


def test_start_needs_an_image_and_a_name(singpy: Singpy, images: dict[str, Path]) -> None:
    assert_one_fatal(singpy.run("instance", "start", str(images["sandbox"])), "IMAGE and a NAME", code=1)


def test_a_failed_start_leaves_nothing(singpy: Singpy, images: dict[str, Path],
                                       names: Callable[[str], Instance]) -> None:
    """The holder fails in building the container (the SIF: its loop device or squashfuse must go too)."""
    before = traces(images["sif"])
    instance = names("fails")
    result = singpy.run("instance", "start", "-B", "/etc:/bin/busybox/x", str(images["sif"]), instance.name)
    assert_one_fatal(result, "/bin/busybox is not a directory")
    assert not instance.record.exists()
    assert instance.name not in singpy.ok("instance", "list")
    assert settled(before, images["sif"]) == before


def test_a_missing_image_fails(singpy: Singpy, workdir: Path, names: Callable[[str], Instance]) -> None:
    instance = names("missing")
    assert_one_fatal(singpy.run("instance", "start", str(workdir / "no-such-image"), instance.name),
                     "does not exist")
    assert not instance.record.exists()


def test_another_users_instance_is_not_found(as_root: Singpy, as_user: Singpy, images: dict[str, Path]) -> None:
    if not is_root():
        pytest.skip("needs root: two users")
    instance = Instance(as_user, f"{SESSION}-other-{uuid.uuid4().hex[:6]}")
    try:
        instance.start(images["sandbox"])
        assert_one_fatal(as_root.run("exec", f"instance://{instance.name}", "true"), "no instance found with name")
        stopped = as_root.run("instance", "stop", instance.name)
        assert stopped.returncode != 0 and "no instance found with name" in stopped.stderr
        assert instance.listed()["pid"]  # still running
    finally:
        as_user.run("instance", "stop", "--force", instance.name)
        for path in (instance.out, instance.err, instance.record):
            path.unlink(missing_ok=True)


# The namespace, its PID 1's name and how many startscripts it holds (the pattern does not match itself).
# The startscripts running, seen from a joiner: its loop's fork, before the fork execs `sleep`, has the startscript's
# command line too, so a process whose parent is a startscript is not counted.
PID_NS = ("readlink /proc/self/ns/pid; cat /proc/1/comm; n=0; for p in /proc/[0-9]*; do "
          "grep -q 'singularity.d/[s]tartscript' $p/cmdline 2>/dev/null || continue; pp=; "
          "while read -r key value; do [ \"$key\" = PPid: ] && pp=$value; done < $p/status 2>/dev/null; "
          "[ -n \"$pp\" ] || continue; "
          "grep -q 'singularity.d/[s]tartscript' /proc/$pp/cmdline 2>/dev/null || n=$((n+1)); done; echo $n")


@pytest.mark.parametrize("flag", ["--pid", "--containall"])
def test_instance_with_its_own_pid_namespace(singpy: Singpy, images: dict[str, Path], flag: str,
                                             names: Callable[[str], Instance]) -> None:
    """--pid, --containall (issue 26): the instance has a PID namespace, which every joiner enters; its PID 1
    is singpy's init; `instance stop` ends everything in it, orphans that nobody waits for included."""
    image = images["sandbox"]
    before = traces(image)
    instance = names("pid")
    instance.start(image, flags=(flag,))
    instance.startscript()
    holder = instance.listed()["pid"]
    assert isinstance(holder, int)
    first = singpy.ok("exec", f"instance://{instance.name}", "sh", "-c", PID_NS).split()
    namespace, init, startscripts = first
    assert namespace != os.readlink("/proc/self/ns/pid")
    assert (init, startscripts) == ("singpy-init", "1")  # the startscript runs in it, seen from a joiner
    assert "Hello from a singpy container" in singpy.ok("run", f"instance://{instance.name}")  # run joins too
    assert singpy.ok("exec", f"instance://{instance.name}", "readlink", "/proc/self/ns/pid") == namespace + "\n"
    # An orphan of a joiner (reparented to the namespace's PID 1) still runs once the joiner has gone...
    singpy.ok("exec", f"instance://{instance.name}", "sh", "-c", "sleep 300 >/dev/null 2>&1 &")
    # init, the startscript, the orphan; a joiner's process still ending when listed is not counted (a race
    # under load: it had gone before its command line was read)
    members = {pid: command for pid in in_pid_namespace(namespace) if (command := command_line(pid))}
    assert len(members) >= 3, members
    processes = {**running(holder), **members}
    # ...and nothing of the namespace outlives `instance stop` (held open, its number names no other copy's).
    with pinned_pid_namespace(min(members)) as pinned:
        assert pinned == namespace
        singpy.ok("instance", "stop", instance.name)
        assert instance.wait_for_log("got TERM\n").endswith("got TERM\n")
        assert_gone(processes)
        assert wait_for_empty_pid_namespace(namespace) == []
    assert not instance.record.exists()
    assert settled(before, image) == before


def test_pid_instance_joiner_gets_signals_and_status(singpy: Singpy, images: dict[str, Path],
                                                     names: Callable[[str], Instance]) -> None:
    """A joiner of a PID namespace supervises its payload (forked into it): exit status and signals pass."""
    instance = names("pidsig")
    instance.start(images["sandbox"], flags=("--pid",))
    assert singpy.run("exec", f"instance://{instance.name}", "sh", "-c", "exit 7").returncode == 7
    joined = singpy.popen(["exec", f"instance://{instance.name}", "sh", "-c",
                           "trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.05; done"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert joined.stdout is not None
    assert joined.stdout.readline() == "ready\n"
    joined.send_signal(signal.SIGTERM)
    out, _ = joined.communicate(timeout=10)
    assert (joined.returncode, out) == (3, "got TERM\n")
    singpy.ok("instance", "stop", instance.name)

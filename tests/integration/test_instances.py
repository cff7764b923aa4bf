"""`singpy instance start|list|stop` and `exec|run|shell instance://NAME`, as root and as a user.

An instance's startscript (below) writes its pid, namespaces and arguments
to the instance's log, and reports the signals it gets; what a test checks
is what a user would see: the logs, `instance list`, the namespaces a joined
process is in, and that after `instance stop` neither the holder (its pid
from `instance list`) nor the startscript (its pid from the log) runs, and
nothing names the image any more.

The records and logs live in the profile's home (~/.singpy/instances), which
another copy of this suite shares: every name is unique to this session
(`names`), `instance stop --all` is never run, and each test stops what it
started and removes its logs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import in_pid_namespace, settled, traces, wait_until_gone
from tests.support.users import is_root
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


@pytest.fixture(scope="module")
def images(workdir: Path) -> dict[str, Path]:
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


@pytest.fixture(params=["sandbox", "sif"])
def image_of_kind(request: pytest.FixtureRequest, images: dict[str, Path]) -> Path:
    return images[request.param]


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


@pytest.fixture
def names(singpy: Singpy) -> Iterator[Callable[[str], Instance]]:
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


# --- start, list, join, stop ----------------------------------------------------------------------------------------


def test_instance_runs_its_startscript_until_stopped(singpy: Singpy, image_of_kind: Path, workdir: Path,
                                                     names: Callable[[str], Instance]) -> None:
    before = traces(image_of_kind)
    instance = names("life")
    instance.start(image_of_kind, "a", "b c")
    pid, mnt, user, args = instance.startscript()
    assert args == "a b c"
    instance.wait_for_log("startscript's stderr\n", instance.err)

    entry = instance.listed()
    holder = entry["pid"]
    assert isinstance(holder, int)
    assert entry == {"instance": instance.name, "pid": holder, "img": str(image_of_kind), "ip": "",
                     "logErrPath": str(instance.err), "logOutPath": str(instance.out)}
    assert Path(f"/proc/{holder}/comm").read_text() == "singpy-instance\n"
    assert os.getsid(holder) != os.getsid(0)  # detached: a hangup of the starting terminal does not reach it
    assert instance.record.exists()
    processes = running(holder, pid)

    joined = singpy.ok("exec", f"instance://{instance.name}", "sh", "-c", NS).split()
    assert joined == [mnt, user]
    assert mnt != os.readlink("/proc/self/ns/mnt")
    if singpy.profile == "user":
        assert user != os.readlink("/proc/self/ns/user")

    result = singpy.run("instance", "stop", instance.name)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"INFO:    stopping {instance.name} instance of {image_of_kind} (PID={holder})\n"
    assert instance.wait_for_log("got TERM\n").endswith("got TERM\n")
    assert_gone(processes)
    assert not instance.record.exists()
    assert json.loads(singpy.ok("instance", "list", "--json", instance.name)) == {"instances": []}
    assert instance.name not in singpy.ok("instance", "list")
    assert settled(before, image_of_kind) == before


def test_stop_ends_the_processes_that_joined(singpy: Singpy, image_of_kind: Path,
                                             names: Callable[[str], Instance]) -> None:
    before = traces(image_of_kind)
    instance = names("joined")
    instance.start(image_of_kind)
    joined = singpy.popen(["exec", f"instance://{instance.name}", "sh", "-c", "echo $$; exec sleep 300"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert joined.stdout is not None
    pid = int(joined.stdout.readline())
    deadline = time.monotonic() + 10
    while command_line(pid) != "sleep 300":  # (empty while the shell is in execve)
        assert time.monotonic() < deadline, command_line(pid)
        time.sleep(0.01)
    processes = running(pid)
    singpy.ok("instance", "stop", instance.name)
    assert joined.wait(timeout=20) == -signal.SIGTERM  # the payload itself: singpy exec'd it in place
    assert_gone(processes)
    assert settled(before, image_of_kind) == before


def test_a_forced_stop_removes_the_record(singpy: Singpy, images: dict[str, Path],
                                          names: Callable[[str], Instance]) -> None:
    instance = names("forced")
    instance.start(images["sandbox"])
    assert instance.record.exists()
    singpy.ok("instance", "stop", "--force", instance.name)
    assert not instance.record.exists()  # the holder, killed, could not remove it: `stop` does


def test_list_shows_a_table_filtered_by_a_glob(singpy: Singpy, images: dict[str, Path],
                                               names: Callable[[str], Instance]) -> None:
    first, second = names("list"), names("list")
    for instance in (first, second):
        instance.start(images["sandbox"])
    pattern = f"{SESSION}-list-*"
    lines = singpy.ok("instance", "list", pattern).splitlines()
    assert lines[0].split() == ["INSTANCE", "NAME", "PID", "IP", "IMAGE"]
    pids = {instance.name: instance.listed()["pid"] for instance in (first, second)}
    rows = sorted(line.split() for line in lines[1:])
    assert rows == sorted([name, str(pid), str(images["sandbox"])] for name, pid in pids.items())
    assert [line.split()[0] for line in singpy.ok("instance", "list", first.name).splitlines()[1:]] == [first.name]
    assert singpy.ok("instance", "list", f"{SESSION}-none-*").splitlines()[1:] == []

    stopped = singpy.run("instance", "stop", pattern)
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(stopped.stderr.splitlines()) == sorted(
        f"INFO:    stopping {name} instance of {images['sandbox']} (PID={pid})" for name, pid in pids.items())
    assert singpy.ok("instance", "list", pattern).splitlines()[1:] == []


def test_run_and_shell_join_the_instance(singpy: Singpy, images: dict[str, Path],
                                         names: Callable[[str], Instance]) -> None:
    instance = names("actions")
    instance.start(images["sandbox"])
    _, mnt, user, _ = instance.startscript()
    out = singpy.ok("run", f"instance://{instance.name}", "x", "y")
    assert "Hello from a singpy container" in out and "args:     x y" in out
    assert singpy.ok("shell", f"instance://{instance.name}", input=NS + "\n").split() == [mnt, user]


def test_joined_processes_share_the_writable_tmpfs(singpy: Singpy, images: dict[str, Path],
                                                   names: Callable[[str], Instance]) -> None:
    instance = names("tmpfs")
    instance.start(images["sandbox"], flags=("--writable-tmpfs",))
    target = f"instance://{instance.name}"
    singpy.ok("exec", target, "sh", "-c", "echo written by a joiner > /note")
    assert singpy.ok("exec", target, "cat", "/note") == "written by a joiner\n"
    assert not (images["sandbox"] / "note").exists()


@pytest.mark.parametrize("kind", ["directory", "image"])
def test_an_instance_with_an_overlay(singpy: Singpy, images: dict[str, Path], names: Callable[[str], Instance],
                                     workdir: Path, kind: str) -> None:
    """The holder builds its container as a launch does: it needed layers.overlayfs imported before entering it
    (an ImportError, 'internal error in the shared container', for any --overlay)."""
    if kind == "image" and singpy.uid != 0:
        pytest.skip("an ext3 overlay image as a user needs fuse2fs and /dev/fuse open (tests/integration/"
                    "test_overlay_images.py); the holder's import is the same for both")
    overlay = workdir / f"instance-overlay-{kind}-{singpy.profile}-{uuid.uuid4().hex[:6]}"
    if kind == "directory":
        overlay.mkdir()
        os.chown(overlay, singpy.uid, singpy.gid)
    else:
        singpy.ok("overlay", "create", "--size", "64", str(overlay))
    instance = names("overlay")
    instance.start(images["sandbox"], flags=("--overlay", str(overlay)))
    singpy.ok("exec", f"instance://{instance.name}", "sh", "-c", "echo kept > /note")
    singpy.ok("instance", "stop", instance.name)
    assert singpy.ok("exec", "--overlay", str(overlay), str(images["sandbox"]), "cat", "/note") == "kept\n"
    assert not (images["sandbox"] / "note").exists()


def test_joined_processes_see_the_instance_hostname(singpy: Singpy, images: dict[str, Path],
                                                    names: Callable[[str], Instance]) -> None:
    instance = names("uts")
    instance.start(images["sandbox"], flags=("--hostname", "inst-host"))
    assert singpy.ok("exec", f"instance://{instance.name}", "hostname") == "inst-host\n"


def test_joined_processes_have_their_own_environment_and_directory(singpy: Singpy, images: dict[str, Path],
                                                                   names: Callable[[str], Instance]) -> None:
    instance = names("env")
    instance.start(images["sandbox"], flags=("--env", "WHO=instance"))
    out = singpy.ok("exec", "--env", "WHO=joiner", "--pwd", "/opt", f"instance://{instance.name}",
                    "sh", "-c", 'echo "$WHO"; pwd')
    assert out == "joiner\n/opt\n"


# --- stopping -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["SIGHUP", str(int(signal.SIGHUP))])
def test_stop_sends_the_chosen_signal(singpy: Singpy, images: dict[str, Path], names: Callable[[str], Instance],
                                      given: str) -> None:
    instance = names("signal")
    instance.start(images["sandbox"])
    pid, *_ = instance.startscript()
    holder = instance.listed()["pid"]
    assert isinstance(holder, int)
    processes = running(holder, pid)
    singpy.ok("instance", "stop", "--signal", given, instance.name)
    log = instance.wait_for_log("got HUP\n")
    assert "TERM" not in log
    assert_gone(processes)


def test_a_signal_that_does_not_stop_the_startscript_is_followed_by_sigkill(
        singpy: Singpy, images: dict[str, Path], names: Callable[[str], Instance]) -> None:
    instance = names("usr1")
    instance.start(images["sandbox"])
    pid, *_ = instance.startscript()
    holder = instance.listed()["pid"]
    assert isinstance(holder, int)
    processes = running(holder, pid)
    started = time.monotonic()
    singpy.ok("instance", "stop", "--signal", "USR1", "--timeout", "1", instance.name)
    assert time.monotonic() - started < 8
    instance.wait_for_log("got USR1\n")
    assert_gone(processes)
    assert instance.name not in singpy.ok("instance", "list")


@pytest.mark.parametrize("flags", [["--timeout", "1"], ["--force"]], ids=["timeout", "force"])
def test_a_startscript_ignoring_the_signal_is_killed(singpy: Singpy, images: dict[str, Path],
                                                     names: Callable[[str], Instance], flags: list[str]) -> None:
    before = traces(images["sandbox"])
    instance = names("stubborn")
    instance.start(images["sandbox"], "stubborn")
    pid, *_ = instance.startscript()
    holder = instance.listed()["pid"]
    assert isinstance(holder, int)
    processes = running(holder, pid)
    started = time.monotonic()
    singpy.ok("instance", "stop", *flags, instance.name)
    assert time.monotonic() - started < 8
    if flags == ["--force"]:
        assert "TERM" not in instance.out.read_text()
    else:
        instance.wait_for_log("ignored TERM\n")
    assert_gone(processes)
    assert instance.name not in singpy.ok("instance", "list")
    assert settled(before, images["sandbox"]) == before


def test_a_killed_instance_is_gone_with_its_startscript(singpy: Singpy, image_of_kind: Path,
                                                        names: Callable[[str], Instance]) -> None:
    before = traces(image_of_kind)
    instance = names("killed")
    instance.start(image_of_kind)
    pid, *_ = instance.startscript()
    holder = instance.listed()["pid"]
    assert isinstance(holder, int)
    processes = running(holder, pid)
    os.kill(holder, signal.SIGKILL)
    assert_gone(processes)
    assert instance.name not in singpy.ok("instance", "list")
    assert not instance.record.exists()  # `list` removed the record of a holder that no longer listens
    assert_one_fatal(singpy.run("exec", f"instance://{instance.name}", "true"), "no instance found with name")
    assert settled(before, image_of_kind) == before


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
    # ...and nothing of the namespace outlives `instance stop`.
    singpy.ok("instance", "stop", instance.name)
    assert instance.wait_for_log("got TERM\n").endswith("got TERM\n")
    assert_gone(processes)
    assert in_pid_namespace(namespace) == []
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

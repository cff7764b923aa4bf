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
started and removes its logs. The errors and instances with a PID namespace of their own are in
test_instances_errors.py; the helpers in tests/support/instances.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.instances import (
    NS,
    SESSION,
    Instance,
    assert_gone,
    command_line,
    instance_images,
    named_instances,
    running,
)
from tests.support.leftovers import settled, traces


@pytest.fixture(scope="module")
def images(workdir: Path) -> dict[str, Path]:
    return instance_images(workdir)


@pytest.fixture(params=["sandbox", "sif"])
def image_of_kind(request: pytest.FixtureRequest, images: dict[str, Path]) -> Path:
    return images[request.param]


@pytest.fixture
def names(singpy: Singpy) -> Iterator[Callable[[str], Instance]]:
    yield from named_instances(singpy)


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

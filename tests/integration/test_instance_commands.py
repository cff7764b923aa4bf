"""`instance run`, `instance stats`, `--pid-file`, and root's `instance list|stop --user`, as root and as a user.

The records and logs live in the profile's home, which other copies of the
suite share: every name here is unique to this session and each test stops
what it started (SIGKILL at the end, whatever happened) and removes its logs.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, instance_logs, readable_by_all
from tests.support.cgroup_host import needs_v1
from tests.support.images import build_busybox_rootfs
from tests.support.waiting import wait_for_text

LOOP = 'echo "{what} pid=$$ args=$*"\nwhile :; do sleep 0.1; done\n'


@pytest.fixture(scope="module")
def scripted(workdir: Path) -> Path:
    """A sandbox whose startscript and runscript each say which they are, then wait."""
    root = build_busybox_rootfs(workdir / "instance-commands")
    for name in ("startscript", "runscript"):
        script = root / ".singularity.d" / name
        script.write_text("#!/bin/sh\n" + LOOP.format(what=name))
        script.chmod(0o755)
    readable_by_all(root)
    return root


def _record(singpy: Singpy, name: str) -> dict[str, object]:
    path = Path(singpy.home, ".singpy", "instances", "app", os.uname().nodename, singpy.user, f"{name}.json")
    return dict(json.loads(path.read_text()))


def _runs(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie waiting for its reaper has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _listed_pid(singpy: Singpy, name: str, *user: str) -> int:
    entries = json.loads(singpy.ok("instance", "list", *user, "--json", name))["instances"]
    assert len(entries) == 1, entries
    return int(entries[0]["pid"])


def test_instance_run_starts_the_runscript(singpy: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(singpy)
    singpy.ok("instance", "run", str(scripted), name, "one", "two")
    log = wait_for_text(instance_logs(singpy) / f"{name}.out", "runscript pid=")
    assert "args=one two" in log
    assert "startscript" not in log
    start = named(singpy)
    singpy.ok("instance", "start", str(scripted), start)
    assert "startscript pid=" in wait_for_text(instance_logs(singpy) / f"{start}.out", "pid=")
    # Apptainer's `instance list --all` adds its hidden --sharens instances; singpy has none: the same list
    assert singpy.ok("instance", "list", "--all", "--json", start) == singpy.ok("instance", "list", "--json", start)
    assert _listed_pid(singpy, start, "-a") == _listed_pid(singpy, start)


def test_pid_file_holds_the_instance_pid(singpy: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    pid_dir = singpy.workdir / f"pidfiles-{singpy.profile}"
    pid_dir.mkdir(exist_ok=True)
    os.chown(pid_dir, singpy.uid, singpy.gid)
    by_flag, by_variable = pid_dir / f"{uuid.uuid4().hex}.pid", pid_dir / f"{uuid.uuid4().hex}.pid"
    first, second = named(singpy), named(singpy)
    singpy.ok("instance", "start", "--pid-file", str(by_flag), str(scripted), first)
    singpy.ok("instance", "run", str(scripted), second, env=singpy.env(APPTAINER_PID_FILE=str(by_variable)))
    assert by_flag.read_text() == f"{_listed_pid(singpy, first)}\n"
    assert by_variable.read_text() == f"{_listed_pid(singpy, second)}\n"
    assert by_flag.stat().st_uid == singpy.uid


def test_pid_file_after_the_image_is_an_argument(singpy: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(singpy)
    singpy.ok("instance", "run", str(scripted), name, "--pid-file", "x")
    assert "args=--pid-file x" in wait_for_text(instance_logs(singpy) / f"{name}.out", "runscript pid=")


def test_stats_from_proc_without_a_cgroup(singpy: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(singpy)
    singpy.ok("instance", "start", str(scripted), name)
    wait_for_text(instance_logs(singpy) / f"{name}.out", "startscript pid=")
    data = json.loads(singpy.ok("instance", "stats", "--json", "--no-stream", name))
    assert data["source"] == "proc"
    assert data["pids_stats"]["current"] >= 2  # the holder and the startscript (and its sleep)
    assert data["memory_stats"]["usage"]["usage"] > 0
    assert isinstance(data["cpu_stats"]["cpu_usage"]["total_usage"], int)  # in ticks of 10ms: 0 for an idle one
    result = singpy.run("instance", "stats", "--no-stream", name)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split()[:2] == ["INSTANCE", "NAME"] and "MEM USAGE / LIMIT" in header
    assert row.startswith(name) and row.split()[-1].isdigit()
    assert f"Stats for {name} instance of {scripted}" in result.stderr


@needs_v1
def test_stats_from_the_cgroup_and_its_removal(as_root: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(as_root)
    as_root.ok("instance", "start", "--pids-limit", "40", "--memory", "64M", str(scripted), name)
    wait_for_text(instance_logs(as_root) / f"{name}.out", "startscript pid=")
    data = json.loads(as_root.ok("instance", "stats", "--json", "--no-stream", name))
    assert data["source"] == "cgroup"
    assert data["pids_stats"]["limit"] == 40
    assert data["pids_stats"]["current"] >= 2
    assert data["memory_stats"]["usage"]["limit"] == 64 << 20
    cgroup = _record(as_root, name)["cgroup"]
    assert isinstance(cgroup, list) and cgroup and all(os.path.isdir(path) for path in cgroup)
    joined = as_root.ok("exec", f"instance://{name}", "cat", "/proc/self/cgroup")  # joins its cgroup, as Apptainer
    assert f":pids:/{os.path.basename(cgroup[0])}" in joined
    result = as_root.run("exec", "--memory", "1G", f"instance://{name}", "true")
    assert_one_fatal(result, "resource limits are set when an instance starts", code=1)
    as_root.ok("instance", "stop", name)
    assert [path for path in cgroup if os.path.exists(path)] == []
    assert glob.glob(f"/sys/fs/cgroup/*/{os.path.basename(cgroup[0])}") == []


@needs_v1
def test_instance_limits_as_a_user_on_v1(as_user: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(as_user)
    result = as_user.run("instance", "start", "--pids-limit", "40", str(scripted), name)
    assert_one_fatal(result, "need cgroup v2 with a subtree delegated to you")
    assert json.loads(as_user.ok("instance", "list", "--json", name))["instances"] == []


def test_root_lists_and_stops_a_users_instance(as_root: Singpy, as_user: Singpy, scripted: Path,
                                               named: Callable[..., str]) -> None:
    name = named(as_user)
    as_user.ok("instance", "start", str(scripted), name)
    pid = _listed_pid(as_user, name)
    assert _listed_pid(as_root, name, "--user", as_user.user) == pid
    assert json.loads(as_root.ok("instance", "list", "--json", name))["instances"] == []  # not root's own
    table = as_root.ok("instance", "list", "--user", as_user.user)
    assert any(line.startswith(name) and str(pid) in line for line in table.splitlines())
    stats = json.loads(as_root.ok("instance", "stats", "--user", as_user.user, "--json", "--no-stream", name))
    assert stats["pids_stats"]["current"] >= 1
    as_root.ok("instance", "stop", "--user", as_user.user, name)
    assert not _runs(pid)
    assert json.loads(as_user.ok("instance", "list", "--json", name))["instances"] == []


@pytest.mark.parametrize("command", [["list"], ["stop", "x"], ["stats", "x"]])
def test_user_flag_is_for_root_only(as_user: Singpy, command: list[str]) -> None:
    result = as_user.run("instance", command[0], "--user", "root", *command[1:])
    assert_one_fatal(result, "Only")
    assert "root" in result.stderr


def test_stats_of_no_instance(singpy: Singpy) -> None:
    never_started = f"never-started-{uuid.uuid4().hex}"
    assert_one_fatal(singpy.run("instance", "stats", "--no-stream", never_started), "no instance found")


def test_root_with_an_unknown_user(as_root: Singpy) -> None:
    assert_one_fatal(as_root.run("instance", "list", "--user", f"nobody-{uuid.uuid4().hex[:8]}"), "no such user")


def test_stats_stream_until_interrupted(singpy: Singpy, scripted: Path, named: Callable[..., str]) -> None:
    name = named(singpy)
    singpy.ok("instance", "start", str(scripted), name)
    viewer = singpy.popen(["instance", "stats", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert viewer.stdout is not None
    lines: list[str] = []
    while len([line for line in lines if line.startswith(name)]) < 2:  # a fresh screen, header and row, each second
        lines.append(viewer.stdout.readline())
        assert lines[-1], viewer.stderr.read() if viewer.stderr else ""
    assert sum("\033[2J" in line for line in lines) == 2
    viewer.send_signal(signal.SIGINT)
    _, err = viewer.communicate(timeout=30)
    assert "Traceback" not in err
    assert viewer.returncode == 130  # interrupted, as a shell reports Ctrl-C

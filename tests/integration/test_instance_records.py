"""An instance's record is its writer's: nothing in it is trusted, by root's `instance list|stop|stats --user` least.

A user writes anything they like in their own records (here the test writes them, as the user's files), and
can make a process that looks like a holder (a copy of `sleep` named `singpy-instance`: `fake_holder`). With
those, root's commands must never kill the processes of a cgroup singpy did not make or remove it, remove a
file other than a record, or print a record's control characters; and nobody's `instance stop` may take a pid
reused since the record was written for the instance's holder. `instance stop --signal` takes only a signal.

Root's commands on planted records run under a hostname of their own (a UTS namespace: the state directories
are per host), so that `stop --all` sees this test's records alone, never those of another copy of the suite.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.cgroup_host import needs_v1
from tests.support.users import is_root

PIDS = "/sys/fs/cgroup/pids"  # the cgroup v1 hierarchy the cgroup tests make their cgroups in


def _start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat (the fields after the name's last ')' start at field 3)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rpartition(b")")[2].split()[19])


def _runs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def _records(owner: Singpy, hostname: str | None = None) -> Path:
    return Path(owner.home, ".singpy", "instances", "app", hostname or os.uname().nodename, owner.user)


def _write(path: Path, record: dict[str, object], owner: Singpy) -> None:
    """`record` at `path` as `owner`'s file, replaced at once (a `list` reading it meanwhile sees all or none)."""
    partial = path.parent / f".{uuid.uuid4().hex}.partial"
    partial.write_text(json.dumps(record))
    os.chown(partial, owner.uid, owner.gid)
    partial.chmod(0o600)
    os.replace(partial, path)


class OwnHost:
    """singpy run by root or by the user under a hostname of this test's: their records there are its alone."""

    def __init__(self) -> None:
        self.hostname = f"singpy-r-{uuid.uuid4().hex[:10]}"
        self.made: list[Path] = []

    def run(self, who: Singpy, *args: str) -> subprocess.CompletedProcess[str]:
        base = Path(who.home, ".singpy", "instances")
        self.made += [base / "app" / self.hostname, base / "logs" / self.hostname]
        ids = [] if who.uid == 0 else ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}", "--clear-groups"]
        return subprocess.run(["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname,
                               *ids, SINGPY, *args], env=who.env(), cwd=who.workdir, capture_output=True, text=True,
                              timeout=60)

    def records(self, who: Singpy) -> Path:
        """`who`'s records directory on this host, made by their singpy."""
        assert self.run(who, "instance", "list").returncode == 0
        return _records(who, self.hostname)


@pytest.fixture
def own_host() -> Iterator[OwnHost]:
    if not is_root():
        pytest.skip("a hostname of its own and another user's records need root")
    host = OwnHost()
    yield host
    for path in host.made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_holder(workdir: Path) -> Iterator[Callable[[Singpy], subprocess.Popen[bytes]]]:
    """Processes of a profile's user named as a holder (`singpy-instance`), as anyone can start one; killed at the
    end."""
    tool = workdir / f"fake-holder-{uuid.uuid4().hex[:8]}" / "singpy-instance"  # the name the kernel shows
    tool.parent.mkdir(mode=0o755)
    shutil.copy("/bin/sleep", tool)
    tool.chmod(0o755)
    started: list[subprocess.Popen[bytes]] = []

    def start(owner: Singpy) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([str(tool), "300"], **owner.switch()))  # type: ignore[call-overload]
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()
    shutil.rmtree(tool.parent)


def _record_of(holder: subprocess.Popen[bytes], name: str, **fields: object) -> dict[str, object]:
    """A record as singpy writes one, of a holder that runs."""
    return {"name": name, "pid": holder.pid, "image": "/planted.sif", "socket": f"planted-{uuid.uuid4().hex}",
            "log_out": "/planted.out", "log_err": "/planted.err", "started": time.time(),
            "holder_start": _start_time(holder.pid), **fields}


# --- 1. the cgroup a record names ------------------------------------------------------------------------------------


def _cgroup_named(layout: str) -> tuple[str, str]:
    """(the cgroup to make, the directory of the test's to remove after it: "" if none) for a layout."""
    ours = f"singpy-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # singpy's naming, of a pid that runs: never swept
    if layout == "plain":
        return f"{PIDS}/victim-{uuid.uuid4().hex[:8]}", ""
    if layout == "singpy-named":
        return f"{PIDS}/{ours}", ""
    parent = f"{PIDS}/t-{uuid.uuid4().hex[:8]}"
    return f"{parent}/{ours}", parent  # named as singpy's, but not where singpy makes its cgroups


def _move(pid: int, cgroup: str) -> None:
    Path(cgroup, "cgroup.procs").write_text(str(pid))


def _rmdir(path: str) -> None:
    deadline = time.monotonic() + 5
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as error:  # EBUSY: the processes killed not quite gone yet
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@needs_v1
@pytest.mark.parametrize(("owner", "layout"), [("user", "plain"), ("user", "singpy-named"), ("root", "plain"),
                                               ("root", "nested")])
def test_stop_never_kills_in_a_cgroup_singpy_did_not_make(as_root: Singpy, as_user: Singpy, own_host: OwnHost,
                                                          fake_holder: Callable[[Singpy], subprocess.Popen[bytes]],
                                                          owner: str, layout: str) -> None:
    """A record naming a cgroup its (fake) holder is in, with another process of the host in it too: the user's
    (on cgroup v1 a user gets no cgroup from singpy: none of theirs is), or root's own not named or placed as
    singpy's. `stats` does not read it, and `stop` stops the holder alone and leaves the cgroup."""
    who = as_user if owner == "user" else as_root
    cgroup, parent = _cgroup_named(layout)
    records = own_host.records(who)
    victim = subprocess.Popen(["sleep", "300"])
    holder = fake_holder(who)
    try:
        os.makedirs(cgroup)
        for pid in (victim.pid, holder.pid):
            _move(pid, cgroup)
        name = f"cg-{uuid.uuid4().hex[:8]}"
        _write(records / f"{name}.json", _record_of(holder, name, cgroup=[cgroup], cgroup_version=1), who)
        user = ["--user", who.user] if owner == "user" else []
        stats = own_host.run(as_root, "instance", "stats", *user, "--json", "--no-stream", name)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["source"] == "proc"
        result = own_host.run(as_root, "instance", "stop", *user, name)
        assert result.returncode == 0, result.stderr
        assert holder.wait(timeout=10) == -signal.SIGTERM  # the instance's holder, as the record says, stopped
        assert victim.poll() is None, "a process of the cgroup the record named was killed"
        assert os.path.isdir(cgroup)
        assert not (records / f"{name}.json").exists()
    finally:
        victim.kill()
        victim.wait()
        holder.kill()
        holder.wait()
        for path in (cgroup, parent):
            if path:
                _rmdir(path)


# --- 2. the name a record holds --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["outside", "escapes", "another-file"])
def test_a_record_not_named_as_its_file_is_no_instance(as_root: Singpy, as_user: Singpy, own_host: OwnHost,
                                                       workdir: Path, kind: str,
                                                       fake_holder: Callable[[Singpy], subprocess.Popen[bytes]]
                                                       ) -> None:
    """Only NAME.json naming NAME, a valid name: root's `list --user` shows a valid record beside it alone, and its
    `stop --all` removes that record only; nothing else (root's file outside, another file of the user's)."""
    records = own_host.records(as_user)
    holder = fake_holder(as_user)
    token = uuid.uuid4().hex[:8]
    kept = workdir / f"roots-{token}.json"  # root's file, that a name going up would reach
    kept.write_text("root's\n")
    stem, name = {"outside": (f"up-{token}", os.path.relpath(kept, records).removesuffix(".json")),
                  "escapes": (f"\x1b]0;pwned\x07\x1b[2Jesc-{token}", f"\x1b]0;pwned\x07\x1b[2Jesc-{token}"),
                  "another-file": (f"a-{token}", f"b-{token}")}[kind]
    if kind == "another-file":
        kept = records / f"b-{token}.json"  # the user's file, not a record
        kept.write_text("not a record\n")
    _write(records / f"{stem}.json", _record_of(holder, name), as_user)
    _write(records / f"ok-{token}.json", _record_of(holder, f"ok-{token}"), as_user)
    try:
        listed = own_host.run(as_root, "instance", "list", "--user", as_user.user)
        assert listed.returncode == 0, listed.stderr
        assert "\x1b" not in listed.stdout + listed.stderr
        assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [f"ok-{token}"]
        stopped = own_host.run(as_root, "instance", "stop", "--user", as_user.user, "--all")
        assert stopped.returncode == 0, stopped.stderr
        assert "\x1b" not in stopped.stdout + stopped.stderr
        assert stopped.stderr.count("INFO:    stopping ") == 1, stopped.stderr
        assert kept.exists()
        assert (records / f"{stem}.json").exists()  # root only reads another user's records
        assert not (records / f"ok-{token}.json").exists()
    finally:
        kept.unlink(missing_ok=True)


# --- 3. a pid reused since -------------------------------------------------------------------------------------------


def test_a_holder_started_at_another_time_is_not_the_instance(singpy: Singpy, image: Path,
                                                              named: Callable[[Singpy], str]) -> None:
    """The record holds its holder's start time; a process of that pid that started at another time (a pid reused:
    here the same holder, the record telling another time) is not the instance: not stopped, not listed."""
    name = named(singpy)
    singpy.ok("instance", "start", str(image), name)
    path = _records(singpy) / f"{name}.json"
    record = json.loads(path.read_text())
    pid = record["pid"]
    assert record["holder_start"] == _start_time(pid)
    _write(path, {**record, "holder_start": record["holder_start"] + 1}, singpy)
    assert_one_fatal(singpy.run("instance", "stop", name), f"no instance found with name {name}")
    assert_one_fatal(singpy.run("exec", f"instance://{name}", "true"), f"no instance found with name {name}")
    assert _runs(pid)
    assert json.loads(singpy.ok("instance", "list", "--json", name))["instances"] == []
    assert not path.exists()  # (`list` removes the records of the instances that have ended)
    _write(path, record, singpy)  # the true record back: the instance is found again
    singpy.ok("instance", "stop", name)
    deadline = time.monotonic() + 10
    while _runs(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _runs(pid)


def test_a_record_of_an_older_singpy_still_names_its_instance(singpy: Singpy, image: Path,
                                                             named: Callable[[Singpy], str]) -> None:
    """No start time in the record (written by a singpy before it kept one): the instance is still found and
    stopped, not orphaned by an upgrade."""
    name = named(singpy)
    singpy.ok("instance", "start", str(image), name)
    path = _records(singpy) / f"{name}.json"
    record = json.loads(path.read_text())
    pid = record["pid"]
    _write(path, {key: value for key, value in record.items() if key != "holder_start"}, singpy)
    assert [found["instance"] for found in json.loads(singpy.ok("instance", "list", "--json", name))["instances"]] \
        == [name]
    singpy.ok("instance", "stop", name)
    deadline = time.monotonic() + 10
    while _runs(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _runs(pid)


# --- 4. --signal -----------------------------------------------------------------------------------------------------


def test_stop_takes_only_a_signal_and_a_timeout(singpy: Singpy, image: Path, named: Callable[[Singpy], str]) -> None:
    """One FATAL line, and the instance untouched: a number that is no signal, and a timeout never reached."""
    name = named(singpy)
    singpy.ok("instance", "start", str(image), name)
    for number in ("0", str(signal.NSIG), "99", "99999999999999999999", "9" * 5000, "\N{SUPERSCRIPT TWO}"):
        result = singpy.run("instance", "stop", "--signal", number, name)
        assert_one_fatal(result, f"unknown signal {number!r}"[:40], code=1)
    for timeout in ("nan", "inf", "-1"):
        result = singpy.run("instance", "stop", "--signal", "USR1", f"--timeout={timeout}", name)
        assert_one_fatal(result, f"--timeout {timeout}: a number of seconds, 0 or more", code=1)
    assert len(json.loads(singpy.ok("instance", "list", "--json", name))["instances"]) == 1  # still runs
    singpy.ok("instance", "stop", "--signal", "SIGTERM", name)
    assert json.loads(singpy.ok("instance", "list", "--json", name))["instances"] == []

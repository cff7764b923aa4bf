"""Instances belong to their owner alone: another user can neither take a name first nor plant state.

The attacker is the second test user (`other_user`, root only). It binds the abstract socket names an
instance could have used, or plants files and links where the owner's singpy keeps records and logs. The
owner's `instance start` must still work; where the owner's own directory lets others write (the one way
they could plant anything there), singpy refuses it with one FATAL line naming it; a log or record that is
a link is never followed.

The records live in the profile's home, shared with other copies of the suite: names are unique to the
test, and the tests that must loosen a directory's mode run singpy under a hostname of their own (a UTS
namespace: the state directories are per host), so that no other run ever sees that directory.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.instances import SESSION, Instance
from tests.support.users import is_root

# Binds every name given, then says so and waits (the attacker's squatting process). A name already bound is
# squatted all the same (another copy of the suite's squatter holds the uid-wide one at times): skipped.
SQUAT = """
import errno, socket, sys, time
held = []
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.bind(b"\\0" + name.encode())
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        continue
    s.listen(1)
    held.append(s)
print("bound", flush=True)
time.sleep(120)
"""


@pytest.fixture
def instance(singpy: Singpy) -> Iterator[Instance]:
    made = Instance(singpy, f"{SESSION}-own-{uuid.uuid4().hex[:6]}")
    yield made
    if made.record.exists() or made.record.is_symlink():
        singpy.run("instance", "stop", "--force", made.name)
    for path in (made.out, made.err, made.record):
        path.unlink(missing_ok=True)


def squatter(entry: pwd.struct_passwd, names: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(["/usr/bin/python3", "-c", SQUAT, *names], user=entry.pw_uid, group=entry.pw_gid,
                               extra_groups=[], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "bound\n"
    return process


def test_a_squatted_socket_name_does_not_stop_the_owner(singpy: Singpy, other_user: pwd.struct_passwd,
                                                        image: Path, instance: Instance) -> None:
    # Every name derived from the owner's uid and the instance's name that a launcher could choose.
    base = f"singpy-instance/{singpy.uid}/{instance.name}"
    attacker = squatter(other_user, [base, f"{base}/0", f"singpy-instance/{singpy.uid}/"])
    try:
        instance.start(image)
        assert singpy.ok("exec", f"instance://{instance.name}", "echo", "joined") == "joined\n"
        assert singpy.run("instance", "stop", instance.name).returncode == 0
    finally:
        attacker.kill()
        attacker.wait()


def test_another_users_process_gets_nothing_from_the_holder(singpy: Singpy, other_user: pwd.struct_passwd,
                                                            image: Path, instance: Instance) -> None:
    """The socket's name is visible to all (/proc/net/unix); connecting to it gives no namespace."""
    instance.start(image)
    socket_name = next(line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()
                       if line.split()[-1].startswith(f"@singpy-instance/{singpy.uid}/")
                       and _holder_has(line, instance))
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
             "s.connect(b'\\0' + sys.argv[1].encode())\nmsg, fds, _, _ = socket.recv_fds(s, 65536, 8)\n"
             "print(len(msg), len(fds))")
    result = subprocess.run(["/usr/bin/python3", "-c", probe, socket_name[1:]], user=other_user.pw_uid,
                            group=other_user.pw_gid, extra_groups=[], capture_output=True, text=True, timeout=30)
    assert result.stdout == "0 0\n", result.stderr  # closed at once: no message, no descriptor
    assert singpy.ok("exec", f"instance://{instance.name}", "echo", "still") == "still\n"


def _holder_has(line: str, instance: Instance) -> bool:
    """Whether the holder of `instance` (its pid in `instance list`) holds the socket of this /proc/net/unix line."""
    inode = line.split()[6]
    holder = instance.listed()["pid"]
    try:
        return any(os.readlink(f"/proc/{holder}/fd/{fd}") == f"socket:[{inode}]"
                   for fd in os.listdir(f"/proc/{holder}/fd"))
    except OSError:
        return False


def test_a_log_that_is_a_link_is_one_fatal_line(singpy: Singpy, workdir: Path, image: Path,
                                                instance: Instance) -> None:
    target = workdir / f"log-target-{uuid.uuid4().hex[:6]}"
    target.write_text("untouched\n")
    singpy.ok("instance", "list")  # makes the directories
    instance.out.symlink_to(target)
    try:
        result = singpy.run("instance", "start", str(image), instance.name)
        assert_one_fatal(result, f"instance {instance.name}: can't use its log /")  # (a long one is shortened)
        assert re.search(r"\.out( \(\d+ bytes\))?: it is a symbolic link\n\Z", result.stderr), result.stderr
        assert target.read_text() == "untouched\n"
        assert not instance.record.exists()
    finally:
        target.unlink()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_log_that_is_not_a_regular_file_is_one_fatal_line(singpy: Singpy, image: Path,
                                                            instance: Instance, kind: str) -> None:
    singpy.ok("instance", "list")
    if kind == "fifo":
        os.mkfifo(instance.err)  # an open for writing would wait for a reader for ever
    else:
        instance.err.mkdir()
    os.chown(instance.err, singpy.uid, singpy.gid)
    try:
        result = singpy.run("instance", "start", str(image), instance.name, timeout=30)
        assert_one_fatal(result, f"instance {instance.name}: can't use its log /")
        why = "it is not a regular file" if kind == "fifo" else "it is a directory"
        assert re.search(rf"\.err( \(\d+ bytes\))?: {why}\n\Z", result.stderr), result.stderr
        assert not instance.record.exists()
    finally:
        instance.err.rmdir() if kind == "directory" else instance.err.unlink()


def test_a_record_that_is_a_link_is_not_followed(singpy: Singpy, other_user: pwd.struct_passwd, workdir: Path,
                                                 image: Path, instance: Instance) -> None:
    """A record pointing at another user's file (naming a process of theirs) is no instance; starting the name
    replaces the link, and never writes through it."""
    planted = workdir / f"planted-{uuid.uuid4().hex[:6]}.json"
    attacker = squatter(other_user, [f"planted-{uuid.uuid4().hex}"])
    try:
        planted.write_text(f'{{"name": "{instance.name}", "pid": {attacker.pid}, "image": "/x", '
                           f'"socket": "planted", "log_out": "/x", "log_err": "/x", "started": 1}}')
        os.chown(planted, other_user.pw_uid, other_user.pw_gid)
        singpy.ok("instance", "list")
        instance.record.symlink_to(planted)
        assert_one_fatal(singpy.run("exec", f"instance://{instance.name}", "true"), "no instance found with name")
        instance.start(image)
        assert not instance.record.is_symlink()
        assert '"socket": "planted"' in planted.read_text()
        assert singpy.ok("exec", f"instance://{instance.name}", "echo", "mine") == "mine\n"
    finally:
        attacker.kill()
        attacker.wait()
        planted.unlink()


# --- a directory others can write: refused ---------------------------------------------------------------------------


class OwnHost:
    """singpy run under a hostname of its own: its instance directories are this test's alone."""

    def __init__(self, singpy: Singpy) -> None:
        self.singpy, self.hostname = singpy, f"singpy-t-{uuid.uuid4().hex[:10]}"
        base = Path(singpy.home, ".singpy", "instances")
        self.hosts = (base / "app" / self.hostname, base / "logs" / self.hostname)
        self.records, self.logs = (path / singpy.user for path in self.hosts)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        ids = [] if self.singpy.uid == 0 else ["setpriv", f"--reuid={self.singpy.uid}",
                                                f"--regid={self.singpy.gid}", "--clear-groups"]
        return subprocess.run(["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname,
                               *ids, SINGPY, *args], env=self.singpy.env(), cwd=self.singpy.workdir,
                              capture_output=True, text=True, timeout=60)

    def remove(self) -> None:
        for path in self.hosts:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def own_host(singpy: Singpy) -> Iterator[OwnHost]:
    if not is_root():
        pytest.skip("a hostname of its own needs root")
    host = OwnHost(singpy)
    yield host
    result = host.run("instance", "stop", "--all", "--force")
    assert result.returncode in (0, 255), result.stderr
    host.remove()


@pytest.mark.parametrize("plant", ["record", "symlink", "nothing"])
def test_a_directory_others_can_write_is_refused(singpy: Singpy, other_user: pwd.struct_passwd, workdir: Path,
                                                 image: Path, own_host: OwnHost, plant: str) -> None:
    assert own_host.run("instance", "list").returncode == 0
    assert own_host.records.stat().st_mode & 0o777 == 0o700
    assert own_host.logs.stat().st_mode & 0o777 == 0o700
    own_host.records.chmod(0o777)  # the owner's mistake: now anyone can write there
    name = f"{SESSION}-planted"
    if plant == "record":
        (own_host.records / f"{name}.json").write_text("{}")
        os.chown(own_host.records / f"{name}.json", other_user.pw_uid, other_user.pw_gid)
    elif plant == "symlink":
        os.symlink(workdir, own_host.records / f"{name}.json")
        os.lchown(own_host.records / f"{name}.json", other_user.pw_uid, other_user.pw_gid)
    for args in (["instance", "start", str(image), name], ["instance", "list"],
                 ["exec", f"instance://{name}", "true"], ["instance", "stop", name]):
        result = own_host.run(*args)
        assert_one_fatal(result, f"refusing the instance directory {own_host.records}: it is writable by others")
    assert not (own_host.logs / f"{name}.out").exists()


def test_a_directory_of_another_user_is_refused(singpy: Singpy, other_user: pwd.struct_passwd,
                                                image: Path, own_host: OwnHost) -> None:
    """Made first by someone else (here: handed to them), even private to them: not the owner's."""
    assert own_host.run("instance", "list").returncode == 0
    os.chown(own_host.logs, other_user.pw_uid, other_user.pw_gid)
    result = own_host.run("instance", "start", str(image), f"{SESSION}-theirs")
    assert_one_fatal(result, f"refusing the instance directory {own_host.logs}: it belongs to uid "
                             f"{other_user.pw_uid}")


def test_state_directories_are_made_private_whatever_the_umask(singpy: Singpy, image: Path,
                                                               own_host: OwnHost) -> None:
    # (a umask of 0 would make os.makedirs' parents world-writable)
    old = os.umask(0)
    try:
        start = own_host.run("instance", "start", str(image), f"{SESSION}-umask")
    finally:
        os.umask(old)
    assert start.returncode == 0, start.stderr
    for path in (*own_host.hosts, own_host.records, own_host.logs):
        assert path.stat().st_mode & 0o777 == 0o700, path
        assert path.stat().st_uid == singpy.uid
    for log in own_host.logs.iterdir():
        assert log.stat().st_mode & 0o777 == 0o600
    deadline = time.monotonic() + 5
    while own_host.run("instance", "stop", f"{SESSION}-umask").returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def test_stop_all_with_no_instance_says_so(own_host: OwnHost) -> None:
    """`instance stop --all` with nothing running: one line, not "no instance found with name" and nothing."""
    assert_one_fatal(own_host.run("instance", "stop", "--all"), "no instance found")
    assert own_host.run("instance", "stop", "--all").stderr.rstrip() == "FATAL:   no instance found"

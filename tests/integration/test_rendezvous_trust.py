"""Who may answer at a shared container's socket: a job's ranks meet at an abstract name anyone can bind.

The names are computable (and listed in /proc/net/unix), so another process may hold one first: a squatter
written here binds it before the launch (the name from `--dry-run`), as the test's own user (code confined
in an earlier container: same uid, the host's network namespace) or as a second user (`singpy-test2`).

- The same user's squatter never gets a host script run, nor its namespaces joined: whatever it sends is one
  FATAL line (sent namespaces checked against the plan, their types, their user namespace, the sender).
- Another user's name is no reason to fail or hang: the rank runs in a container of its own, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal

# argv: NAME MODE NAMES SCRIPT. Prints "listening" once the name is bound (and listened on, but in mode bound).
SQUATTER = r'''
import ctypes, os, socket, sys, time
name, mode, names, script = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
NEWUSER, NEWNS, NEWPID = 0x10000000, 0x00020000, 0x20000000

def unshare(flags):
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")

def own_maps(uid, gid):
    for file, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{file}", "w") as out:
            out.write(text)

def serve(pid, listed, fds):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(b"\0" + name.encode())
    if mode != "bound":
        s.listen(8)
    print("listening", flush=True)
    if mode in ("bound", "listen"):
        time.sleep(60)
        return
    c, _ = s.accept()
    body = "\0".join([pid, listed, "", script]).encode()
    socket.send_fds(c, [b"ready\0" + body], fds)
    time.sleep(5)

if mode == "host-script":  # the reviewer's: a user namespace of its own, and a host script as the env script
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        unshare(NEWUSER)
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)
    serve(str(os.getpid()), "user", [os.open(f"/proc/{child}/ns/user", os.O_RDONLY)])
elif mode == "own":  # confined code: namespaces of its own, from a PID namespace of its own, exactly those planned
    uid, gid = os.getuid(), os.getgid()
    unshare(NEWUSER | NEWNS | NEWPID)
    own_maps(uid, gid)
    if os.fork() == 0:
        fds = [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY) for ns in names.split(",")]
        serve(str(os.getpid()), names, fds)
        os._exit(0)
    os.wait()
else:
    fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    pipe = os.pipe()[0]
    serve(*{"bad-count": (str(os.getpid()), "user,mnt", [fd]),
            "bad-pid": ("x", "mnt", [fd]),
            "bad-name": (str(os.getpid()), "bogus", [fd]),
            "not-a-namespace": (str(os.getpid()), names, [pipe] * len(names.split(","))),
            "bound": ("", "", []), "listen": ("", "", [])}[mode])
'''


def job_env(singpy: Singpy) -> dict[str, str]:
    """The environment of a rank of a two-rank mpirun job of this test's own."""
    return singpy.env(PMIX_NAMESPACE=f"trust-{uuid.uuid4().hex}", PMIX_RANK="0", OMPI_COMM_WORLD_SIZE="2")


def where(singpy: Singpy, image: Path, env: dict[str, str]) -> tuple[str, str]:
    """The socket's name of this launch, and the namespaces its holder must send."""
    plan = json.loads(singpy.ok("exec", "--dry-run", str(image), "echo", "ran", env=env))["plan"]
    planned = plan["namespaces"]
    names = ["user"] if planned["user"] else []
    names += ["mnt", *(ns for ns in ("ipc", "uts", "net", "pid") if planned[ns])]
    return plan["share"]["socket"], ",".join(names)


def squat(ids: dict[str, object], name: str, mode: str, names: str, script: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", SQUATTER, name, mode, names, str(script)]
    squatter: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
        argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **ids)
    assert squatter.stdout is not None
    line = squatter.stdout.readline()
    if line != "listening\n":
        pytest.fail(f"the squatter did not start: {line}{end(squatter)}")
    return squatter


def end(squatter: subprocess.Popen[str]) -> str:
    """The squatter and its children killed (its session); what it wrote on stderr."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(squatter.pid, signal.SIGKILL)
    return squatter.communicate()[1]


@pytest.fixture
def marker(workdir: Path) -> tuple[Path, Path]:
    """A host script that leaves a file when run, and that file's path."""
    directory = workdir / f"trust-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    script = directory / "evil.sh"
    script.write_text(f"echo ran on the host > {directory}/pwned\n")
    script.chmod(0o755)
    return script, directory / "pwned"


@pytest.mark.parametrize(("mode", "message"), [
    ("host-script", "no holder of ours: it sent the namespaces user"),
    ("own", "no holder of ours"),
    ("bad-count", "malformed answer"),
    ("bad-pid", "malformed answer"),
    ("bad-name", "malformed answer"),
    ("not-a-namespace", "is not one"),
])
def test_the_same_users_squatter_gets_nothing_run(singpy: Singpy, image: Path, marker: tuple[Path, Path],
                                                  mode: str, message: str) -> None:
    script, pwned = marker
    env = job_env(singpy)
    name, names = where(singpy, image, env)
    squatter = squat(singpy.switch(), name, mode, names, script)
    try:
        result = singpy.run("exec", str(image), "echo", "ran", env=env, timeout=60)
    finally:
        end(squatter)
    assert_one_fatal(result, message)
    assert "PMIx namespace trust-" in result.stderr
    assert not pwned.exists()


@pytest.mark.parametrize("mode", ["listen", "bound"])
def test_another_users_name_runs_the_rank_alone(singpy: Singpy, image: Path, other_user: pwd.struct_passwd,
                                                marker: tuple[Path, Path], mode: str) -> None:
    script, _ = marker
    env = job_env(singpy)
    name, names = where(singpy, image, env)
    ids = {"user": other_user.pw_uid, "group": other_user.pw_gid, "extra_groups": []}
    squatter = squat(ids, name, mode, names, script)
    try:
        started = time.monotonic()
        result = singpy.run("exec", str(image), "sh", "-c", "echo ran $OMPI_MCA_btl_vader_single_copy_mechanism",
                            env=env, timeout=40)
        took = time.monotonic() - started
    finally:
        end(squatter)
    assert (result.returncode, result.stdout) == (0, "ran none\n"), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING:") and "container of its own" in lines[0], lines
    assert took < 20

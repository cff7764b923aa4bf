"""The unprivileged test user.

As root, the suite creates TEST_USER (`singpy-test`, with a home directory)
the first time it needs it, and keeps it. Two suites may start at once: the
creation is serialized by a lock under /run/lock, and the user database is
read again after a failed `useradd` (the other suite may have won).

As anyone else, the invoking user is the test user: nobody else can be
switched to without privilege.

For attacks between users (one user plants files or names that another's
singpy must refuse), root also creates OTHER_USER (`singpy-test2`) the same
way; as anyone else those tests are skipped, since no second user can be had.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import subprocess
import time

TEST_USER = "singpy-test"
OTHER_USER = "singpy-test2"
LOCK = "/run/lock/singpy-test-user.lock"


def ensure_test_user() -> pwd.struct_passwd:
    """The user of the "user" profile: TEST_USER (created if needed) as root, else the invoking user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid())
    return _ensure(TEST_USER)


def ensure_other_user() -> pwd.struct_passwd | None:
    """A second unprivileged user, the attacker of cross-user tests: OTHER_USER as root, else None."""
    if os.geteuid() != 0:
        return None
    return _ensure(OTHER_USER)


def _ensure(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _create(name)
    finally:
        os.close(fd)  # releases the lock; the empty file stays in /run/lock (a tmpfs)


def _create(name: str) -> pwd.struct_passwd:
    """useradd, retried: another program may hold /etc/passwd's lock for a moment."""
    error = ""
    for _ in range(20):
        try:
            return pwd.getpwnam(name)  # created meanwhile (by the other suite, before our lock)
        except KeyError:
            pass
        done = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], capture_output=True,
                              text=True)
        if done.returncode == 0:
            return pwd.getpwnam(name)
        error = done.stderr.strip()
        time.sleep(0.25)
    raise RuntimeError(f"can't create the test user {name}: {error}")


def run_as(entry: pwd.struct_passwd, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command as another user (the attacker of a cross-user test), its output captured as text."""
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        argv, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": entry.pw_dir}, **kwargs)
    return done


def is_root() -> bool:
    return os.geteuid() == 0


def can_reach(entry: pwd.struct_passwd, path: str) -> bool:
    """Whether the user can execute/read `path` (every parent directory searchable)."""
    if entry.pw_uid == os.geteuid():
        return os.access(path, os.R_OK)
    probe = subprocess.run(["test", "-r", path], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                           env={"PATH": os.defpath})
    return probe.returncode == 0

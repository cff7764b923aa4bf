"""The unprivileged test user.

As root, the suite creates TEST_USER (`singpy-test`, with a home directory)
the first time it needs it, and keeps it. Two suites may start at once: the
creation is serialized by a lock under /run/lock, and the user database is
read again after a failed `useradd` (the other suite may have won).

As anyone else, the invoking user is the test user: nobody else can be
switched to without privilege.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import subprocess
import time

TEST_USER = "singpy-test"
LOCK = "/run/lock/singpy-test-user.lock"


def ensure_test_user() -> pwd.struct_passwd:
    """The user of the "user" profile: TEST_USER (created if needed) as root, else the invoking user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid())
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _create()
    finally:
        os.close(fd)  # releases the lock; the empty file stays in /run/lock (a tmpfs)


def _create() -> pwd.struct_passwd:
    """useradd, retried: another program may hold /etc/passwd's lock for a moment."""
    error = ""
    for _ in range(20):
        try:
            return pwd.getpwnam(TEST_USER)  # created meanwhile (by the other suite, before our lock)
        except KeyError:
            pass
        done = subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", TEST_USER], capture_output=True,
                              text=True)
        if done.returncode == 0:
            return pwd.getpwnam(TEST_USER)
        error = done.stderr.strip()
        time.sleep(0.25)
    raise RuntimeError(f"can't create the test user {TEST_USER}: {error}")


def is_root() -> bool:
    return os.geteuid() == 0


def can_reach(entry: pwd.struct_passwd, path: str) -> bool:
    """Whether the user can execute/read `path` (every parent directory searchable)."""
    if entry.pw_uid == os.geteuid():
        return os.access(path, os.R_OK)
    probe = subprocess.run(["test", "-r", path], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                           env={"PATH": os.defpath})
    return probe.returncode == 0

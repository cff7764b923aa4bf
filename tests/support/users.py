"""The unprivileged test user, created by the test set-up (root only)."""

from __future__ import annotations

import os
import pwd
import subprocess

TEST_USER = "singpy-test"


def ensure_test_user() -> pwd.struct_passwd:
    """Create TEST_USER with a home directory if it does not exist yet."""
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", TEST_USER], check=True)
        return pwd.getpwnam(TEST_USER)


def can_reach(entry: pwd.struct_passwd, path: str) -> bool:
    """Whether the user can execute/read `path` (every parent directory searchable)."""
    probe = subprocess.run(["test", "-r", path], user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                           env={"PATH": os.defpath})
    return probe.returncode == 0

"""`singpy capability avail|list|add|drop`: Apptainer's commands over capability.json, the file beside the
configuration in use (here a test's own, named by SINGPY_CONFIG: no host file is touched). What root grants root
there is what a launch with `root default capabilities = file` keeps; only root edits the file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.conftest import Singpy, assert_one_fatal

NET_RAW = 1 << 13


def _confdir(workdir: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A directory holding a singpy.conf that keeps root's capabilities of capability.json, and the variable
    naming it."""
    confdir = workdir / name
    confdir.mkdir()
    (confdir / "singpy.conf").write_text("root default capabilities = file\n")
    return confdir, {"SINGPY_CONFIG": str(confdir / "singpy.conf")}


def _effective(text: str) -> int:
    return next(int(line.split()[1], 16) for line in text.splitlines() if line.startswith("CapEff:"))


def test_root_grants_root_what_a_launch_keeps(as_root: Singpy, image: Path, workdir: Path) -> None:
    confdir, variables = _confdir(workdir, "capability-command")
    env = as_root.env(**variables)
    assert_one_fatal(as_root.run("capability", "list", env=env), "can't read capability file")
    added = as_root.run("capability", "add", "--user", "root", "net_raw,teleport", env=env)
    assert added.returncode == 0 and added.stderr.splitlines() == [
        "WARNING: Ignoring unknown capabilities: teleport",
        "WARNING: Adding 'CAP_NET_RAW' capability will likely allow user root to escalate privilege on the host",
        "WARNING: Use 'singpy capability drop --user root CAP_NET_RAW' to reverse this action if necessary"], added
    written = confdir / "capability.json"
    assert json.loads(written.read_text()) == {"users": {"root": ["CAP_NET_RAW"]}}
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert as_root.ok("capability", "list", "root", env=env) == "root [user]: CAP_NET_RAW\n"
    status = as_root.ok("exec", str(image), "cat", "/proc/self/status", env=env)
    assert _effective(status) == NET_RAW  # the grant is what root keeps
    assert_one_fatal(as_root.run("capability", "add", "--group", "no-such-group-of-singpy", "chown", env=env),
                     "while setting capabilities for group no-such-group-of-singpy: group does not exist")
    assert_one_fatal(as_root.run("capability", "add", "chown", env=env), "no user or group specified", code=1)
    as_root.ok("capability", "drop", "--user", "root", "CAP_NET_RAW", env=env)
    assert json.loads(written.read_text()) == {}
    assert_one_fatal(as_root.run("capability", "list", env=env), "no capability set for users or groups")
    assert_one_fatal(as_root.run("capability", "drop", "--user", "root", "net_raw", env=env),
                     "user 'root' doesn't have any capability assigned")
    assert _effective(as_root.ok("exec", str(image), "cat", "/proc/self/status", env=env)) == 0


def test_a_user_reads_but_never_edits(as_root: Singpy, as_user: Singpy, workdir: Path) -> None:
    confdir, variables = _confdir(workdir, "capability-command-user")
    confdir.chmod(0o755)
    (confdir / "singpy.conf").chmod(0o644)
    granted = as_root.run("capability", "add", "--user", as_user.user, "net_raw", env=as_root.env(**variables))
    assert granted.returncode == 0 and "singpy grants capabilities to root alone" in granted.stderr, granted
    before = (confdir / "capability.json").read_text()
    refused = as_user.run("capability", "drop", "--user", as_user.user, "net_raw", env=as_user.env(**variables))
    assert_one_fatal(refused, "only root user can manage capabilities")
    assert (confdir / "capability.json").read_text() == before
    assert as_user.ok("capability", "list", env=as_user.env(**variables)) == f"{as_user.user} [user]: CAP_NET_RAW\n"
    shown = as_user.ok("capability", "avail", env=as_user.env(**variables)).split("\n\n")
    assert len([entry for entry in shown if entry]) == 41 and shown[0].startswith("CAP_CHOWN:")
    assert_one_fatal(as_user.run("capability", "avail", "fly", env=as_user.env(**variables)),
                     "unknown capabilities found in: fly", code=1)
    assert sorted(os.listdir(confdir)) == ["capability.json", "singpy.conf"]  # written whole: no temporary file

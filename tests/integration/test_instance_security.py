"""`exec|run|shell instance://NAME` inherit the instance's --security, as Apptainer's joins do
(prepareInstanceJoinConfig): its seccomp filter, and as root its uid:/gid:; a feature the joining command
gives itself wins. The instance's record keeps the values (the profile's path made absolute), so the plan of
the joining command shows them (--dry-run). As root and as the test user; each test stops what it started.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.seccomp_profiles import deny, profile_file

MKDIR = "mkdir /tmp/sec-$$ && echo made; rmdir /tmp/sec-$$ 2>/dev/null; true"


@pytest.fixture(scope="module")
def image(workdir: Path) -> Path:
    """busybox whose runscript runs its arguments (so that `run` runs the check too)."""
    root = build_busybox_rootfs(workdir / "instance-security", runscript='#!/bin/sh\nexec "$@"\n')
    readable_by_all(root)
    return root


@pytest.fixture(scope="module")
def no_mkdir(workdir: Path) -> Path:
    return profile_file(workdir, "instance-no-mkdir", deny(["mkdir", "mkdirat"], errnoRet=13))  # EACCES


@pytest.mark.parametrize("action", ["exec", "run", "shell"])
def test_joins_get_the_instances_seccomp_filter(singpy: Singpy, image: Path, workdir: Path, no_mkdir: Path,
                                                named: Callable[[Singpy], str], action: str) -> None:
    """Started with a relative profile path, joined from elsewhere: the join is filtered all the same."""
    name = named(singpy)
    singpy.ok("instance", "start", "--contain", "--security", f"seccomp:{no_mkdir.name}", str(image), name,
              cwd=no_mkdir.parent)
    command = {"exec": ["sh", "-c", MKDIR], "run": ["sh", "-c", MKDIR], "shell": []}[action]
    result = singpy.run(action, f"instance://{name}", *command, cwd=workdir,
                        input=MKDIR + "\n" if action == "shell" else None)
    assert result.returncode == 0, result.stderr
    assert "made" not in result.stdout
    assert "Permission denied" in result.stderr  # the profile's errnoRet: its filter, not another failure
    # the instance itself is unchanged for a plain container of the same image
    assert singpy.ok("exec", "--contain", str(image), "sh", "-c", MKDIR) == "made\n"


def test_the_joining_plan_shows_the_instances_filter(singpy: Singpy, image: Path, workdir: Path,
                                                     no_mkdir: Path, named: Callable[[Singpy], str]) -> None:
    name = named(singpy)
    singpy.ok("instance", "start", "--security", f"seccomp:{no_mkdir}", str(image), name)
    plan = json.loads(singpy.ok("exec", "--dry-run", f"instance://{name}", "true", cwd=workdir))["plan"]
    seccomp = plan["process"]["security"]["seccomp"]
    assert (seccomp["profile"], seccomp["rules"][0]["names"]) == (str(no_mkdir), ["mkdir", "mkdirat"])
    plain = named(singpy)
    singpy.ok("instance", "start", str(image), plain)
    plan = json.loads(singpy.ok("exec", "--dry-run", f"instance://{plain}", "true"))["plan"]
    assert plan["process"]["security"] is None


def test_a_joiners_own_seccomp_profile_wins(singpy: Singpy, image: Path, workdir: Path, no_mkdir: Path,
                                            named: Callable[[Singpy], str]) -> None:
    """Apptainer: `restore seccomp filter or apply a new one if provided`."""
    other = profile_file(workdir, "instance-no-chroot", deny(["chroot"]))
    name = named(singpy)
    singpy.ok("instance", "start", "--contain", "--security", f"seccomp:{no_mkdir}", str(image), name)
    out = singpy.ok("exec", "--security", f"seccomp:{other}", f"instance://{name}", "sh", "-c", MKDIR)
    assert out == "made\n"


def test_joins_run_with_the_instances_ids(as_root: Singpy, image: Path, named: Callable[[Singpy], str]) -> None:
    name = named(as_root)
    as_root.ok("instance", "start", "--security", "uid:1234,gid:2345:27", str(image), name)
    ids = 'echo "$(id -u) $(id -g) $(id -G)"; grep CapEff /proc/self/status'
    for action, args, stdin in (("exec", ["sh", "-c", ids], None), ("run", ["sh", "-c", ids], None),
                                ("shell", [], ids + "\n")):
        out = as_root.ok(action, f"instance://{name}", *args, input=stdin)
        who, caps = out.splitlines()
        assert who == "1234 2345 2345 27", action
        assert caps.split()[1] == "0000000000000000", action  # no longer root: no capability, as a plain launch
    joined = as_root.run("exec", f"instance://{name}", "true")  # its files were written at start: no word of them
    assert (joined.returncode, joined.stderr) == (0, ""), joined.stderr
    plan = json.loads(as_root.ok("exec", "--dry-run", f"instance://{name}", "true"))["plan"]
    assert (plan["process"]["security"]["uid"], plan["process"]["security"]["gids"]) == (1234, [2345, 27])
    # the joiner's own uid: wins, the instance's gid: still applies
    assert as_root.ok("exec", "--security", "uid:4321", f"instance://{name}", "sh", "-c", "id -u; id -g") == \
        "4321\n2345\n"


def test_a_user_cannot_start_an_instance_with_ids(as_user: Singpy, image: Path,
                                                  named: Callable[[Singpy], str]) -> None:
    name = named(as_user)
    assert_one_fatal(as_user.run("instance", "start", "--security", "uid:0", str(image), name), "needs root")
    assert_one_fatal(as_user.run("exec", f"instance://{name}", "true"), "no instance found")  # none started

"""`singpy check` / `singpy doctor`: what works here, for each profile, and for emulated restricted hosts."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from singpy.host import hostcheck
from tests.conftest import SINGPY, Singpy
from tests.support import hostsim, seccomp

STATUSES = {"ok", "warn", "fail", "info"}
ALWAYS = {"kernel", "user namespaces", "overlay", "FUSE", "SIF images", "squashfuse", "unsquashfs", "mksquashfs",
          "fuse-overlayfs", "loop devices", "--fakeroot subuid", "--fakeroot subgid",
          "--fakeroot newuidmap", "--fakeroot newgidmap", "NVIDIA GPU", "AMD GPU", "Slurm/MPI", "confinement"}


def checks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    data = json.loads(result.stdout)
    assert isinstance(data, list)
    for row in data:
        assert set(row) == {"check", "status", "detail", "fix"}, row
        assert row["status"] in STATUSES and row["detail"], row
        assert all(isinstance(value, str) for value in row.values())
    return {row["check"]: row for row in data}


def test_json_shape(singpy: Singpy) -> None:
    result = singpy.run("check", "--json")
    assert result.returncode == 0, result.stderr  # this suite's host runs singpy: nothing it needs fails
    found = checks(result)
    assert set(found) == ALWAYS
    assert found["user namespaces"]["status"] == "ok"
    assert found["kernel"]["detail"] == f"Linux {os.uname().release}"
    loop = found["loop devices"]["status"]
    assert loop == "info" if singpy.profile == "user" else loop in ("ok", "warn")
    assert not [row for row in found.values() if row["status"] in ("warn", "fail") and not row["fix"]]


def test_plain_text_and_doctor(singpy: Singpy) -> None:
    """Not a terminal: one line per check (a `fix:` line under those that have one); `doctor` says the same."""
    text = singpy.ok("check")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("fix:")]
    assert len(lines) == len(ALWAYS)
    assert all(line.split()[0] in STATUSES for line in lines)
    assert singpy.run("doctor", "--json").stdout.count('"check"') == len(ALWAYS)


def test_slurm_job(singpy: Singpy) -> None:
    found = checks(singpy.run("check", "--json", env=singpy.env(SLURM_JOB_ID="4242")))
    assert "in Slurm job 4242" in found["Slurm/MPI"]["detail"]
    assert "not in a Slurm job" in checks(singpy.run("check", "--json"))["Slurm/MPI"]["detail"]


def test_tool_missing_names_package(singpy: Singpy, workdir: Path) -> None:
    empty = workdir / "path-empty"
    empty.mkdir(exist_ok=True)
    found = checks(singpy.run("check", "--json", env=singpy.env(PATH=str(empty))))
    assert found["unsquashfs"]["status"] == "warn"
    assert found["unsquashfs"]["fix"] == "install package squashfs-tools (Debian, Ubuntu, RHEL, Fedora)"
    assert found["fuse-overlayfs"]["fix"].startswith("install package fuse-overlayfs")


# --- emulated hosts (tests/support/seccomp.py) -------------------------------------------------------------------


def emulated(runner: Singpy, workdir: Path, **host: dict[str, str] | str) -> subprocess.CompletedProcess[str]:
    problem = seccomp.available()
    if problem:
        pytest.skip(problem)
    if os.geteuid() != 0:
        pytest.skip("simulating host settings needs root (the suite is not running as root)")
    scratch = workdir / f".seccomp-{uuid.uuid4().hex[:12]}"
    scratch.mkdir(mode=0o755)
    try:
        prefix = seccomp.wrapper(runner.uid, runner.gid, str(scratch), **host)  # type: ignore[arg-type]
        return subprocess.run([*prefix, SINGPY, "check", "--json"], env=runner.env(), cwd=str(workdir),
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        scratch.rmdir()


def test_no_user_namespaces(singpy: Singpy, workdir: Path) -> None:
    """The userns check fails with the diagnosis; for a user that is fatal to exec (exit 1), for root a warning."""
    result = emulated(singpy, workdir, deny={"unshare": "ENOSPC"}, sysctls={"user.max_user_namespaces": "0"})
    found = checks(result)
    row = found["user namespaces"]
    assert "user namespaces are disabled on this host (user.max_user_namespaces = 0)" in row["detail"]
    assert row["fix"] == "an administrator can enable them: `sysctl -w user.max_user_namespaces=15000`, kept in a " \
        "file of /etc/sysctl.d"
    assert "a seccomp filter applies" in found["confinement"]["detail"]
    if singpy.profile == "user":
        assert (row["status"], result.returncode) == ("fail", 1)
        assert found["overlay"]["status"] == "warn"  # no user namespace, no overlay in one
    else:
        assert (row["status"], result.returncode) == ("warn", 0)


def test_apparmor_restriction(as_user: Singpy, workdir: Path) -> None:
    result = emulated(as_user, workdir, deny={"mount": "EPERM"},
                      sysctls={"kernel.apparmor_restrict_unprivileged_userns": "1"})
    row = checks(result)["user namespaces"]
    assert row["status"] == "fail" and result.returncode == 1
    assert "AppArmor restricts unprivileged user namespaces" in row["detail"]
    assert hostcheck.python_binary() in row["fix"]


def test_fuse_absent(singpy: Singpy, workdir: Path) -> None:
    found = checks(emulated(singpy, workdir, fuse="absent"))
    assert found["FUSE"]["status"] == "warn"
    assert found["FUSE"]["detail"].startswith("/dev/fuse does not exist")
    assert found["FUSE"]["fix"]


def test_fuse_closed_for_a_user(as_user: Singpy, workdir: Path) -> None:
    found = checks(emulated(as_user, workdir, fuse="600"))
    assert found["FUSE"]["detail"].startswith("/dev/fuse is not readable and writable by you (its mode is 600)")
    assert found["SIF images"]["status"] == "ok"  # unsquashfs is there: images are extracted


def test_fuse_open_for_a_user(as_user: Singpy, workdir: Path) -> None:
    found = checks(emulated(as_user, workdir, fuse="666"))
    assert found["FUSE"]["status"] == "ok"


def test_missing_subordinate_ids(as_user: Singpy, workdir: Path) -> None:
    """No line for the user in /etc/subuid (and /etc/subgid): each file is named, with the line to add."""
    if os.geteuid() != 0:
        pytest.skip("binding files over /etc/subuid needs root")
    subuid, subgid = hostsim.subid_copies(as_user.user, as_user.uid, None, str(workdir / f"check-{uuid.uuid4().hex}"))
    with hostsim.subid_files(subuid, subgid):
        found = checks(as_user.run("check", "--json"))
    for name in ("subuid", "subgid"):
        row = found[f"--fakeroot {name}"]
        assert row["status"] == "warn"
        assert f"/etc/{name} has no range for {as_user.user}" in row["detail"]
        assert f"{as_user.user}:100000:65536" in row["fix"]

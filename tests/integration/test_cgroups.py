"""Resource limits (--pids-limit, --memory, --cpus..., --apply-cgroups): the container's cgroup, seen from inside.

cgroup v1 is tested as root where the host runs it (a fork bomb stopped at
the pids limit, the limits read back from the container's own cgroup files).
cgroup v2 is tested on the host's unified hierarchy (/sys/fs/cgroup/unified on
a hybrid host, /sys/fs/cgroup on a v2 one), bound on /sys/fs/cgroup in a
private mount namespace for singpy alone: as a user below a cgroup the test
delegates to them the way systemd delegates user@UID.service (the directory
and its cgroup.procs theirs), and refused without one. Every cgroup a test
looks for is named after its own launcher's pid; none is left once it ends.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.cgroup_host import mounts, needs_v1, v1_host


def _unified() -> str | None:
    """Where the host's cgroup v2 hierarchy is mounted, if anywhere."""
    for point in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if (point, "cgroup2") in mounts():
            return point
    return None


def _own_cgroups(pid: int) -> list[str]:
    """The cgroup directories made by the launcher of this pid (singpy-PID-RANDOM), in every hierarchy."""
    return glob.glob(f"/sys/fs/cgroup/*/singpy-{pid}-*") + glob.glob(f"/sys/fs/cgroup/singpy-{pid}-*")


def _run(singpy: Singpy, *args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run singpy, returning the result and the launcher's pid (to find its cgroups)."""
    process = singpy.popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), process.pid


_SHOW = "d=$(grep ':{controller}:' /proc/self/cgroup | cut -d: -f3); cat /sys/fs/cgroup/{controller}$d/{file}"


@needs_v1
def test_pids_limit_stops_a_fork_bomb(as_root: Singpy, image: Path) -> None:
    script = _SHOW.format(controller="pids", file="pids.max") + "; for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait"
    result, pid = _run(as_root, "exec", "--pids-limit", "5", str(image), "sh", "-c", script)
    assert result.stdout == "5\n"
    assert "can't fork" in result.stderr  # the 6th process was refused: the shell gives up
    assert result.returncode != 0
    assert _own_cgroups(pid) == []  # and the sleeps it left were killed with the cgroup, which is gone


@needs_v1
def test_the_payload_starts_in_the_cgroup(as_root: Singpy, image: Path) -> None:
    for isolation in ([], ["--pid"]):
        result, pid = _run(as_root, "exec", *isolation, "--memory", "64M", str(image), "cat", "/proc/self/cgroup")
        assert result.returncode == 0, result.stderr
        memory = next(line for line in result.stdout.splitlines() if ":memory:" in line)
        assert memory.split(":")[2].startswith(f"/singpy-{pid}-"), result.stdout
        assert _own_cgroups(pid) == []


@needs_v1
def test_flags_become_the_cgroup_files(as_root: Singpy, image: Path) -> None:
    shown = [("memory", "memory.limit_in_bytes"), ("memory", "memory.soft_limit_in_bytes"),
             ("memory", "memory.oom_control"), ("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.cfs_period_us"),
             ("cpu", "cpu.shares"), ("cpuset", "cpuset.cpus")]
    script = "; ".join(_SHOW.format(controller=controller, file=file) for controller, file in shown)
    out = as_root.ok("exec", "--memory", "64M", "--memory-reservation", "32m", "--oom-kill-disable", "--cpus", "0.5",
                     "--cpu-shares", "512", "--cpuset-cpus", "0", str(image), "sh", "-c", script)
    lines = out.splitlines()
    assert lines[:2] == [str(64 << 20), str(32 << 20)]
    assert "oom_kill_disable 1" in lines
    assert lines[-4:] == ["50000", "100000", "512", "0"]


@needs_v1
def test_memory_limit_kills_what_exceeds_it(as_root: Singpy, image: Path) -> None:
    # 16 MiB of memory, without swap: a shell holding 64 MiB in a variable is killed by the OOM killer
    result = as_root.run("exec", "--memory", "16M", "--memory-swap", "16M", str(image), "sh", "-c",
                         "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived")
    assert "survived" not in result.stdout
    assert result.returncode != 0


@needs_v1
def test_apply_cgroups_reads_apptainers_toml(as_root: Singpy, image: Path, tmp_path: Path) -> None:
    config = tmp_path / "limits.toml"
    config.write_text("# Apptainer's layout\n[pids]\n  limit = 7\n[memory]\n  limit = 67108864\n"
                      "[[devices]]\n  access = \"rwm\"\n  allow = true\n  major = 0\n  minor = 0\n  type = \"a\"\n")
    script = _SHOW.format(controller="pids", file="pids.max") + "; " + _SHOW.format(
        controller="memory", file="memory.limit_in_bytes")
    assert as_root.ok("exec", "--apply-cgroups", str(config), str(image), "sh", "-c", script) == "7\n67108864\n"
    env = as_root.env(APPTAINER_APPLY_CGROUPS=str(config))
    assert as_root.ok("exec", str(image), "sh", "-c", script, env=env) == "7\n67108864\n"


@needs_v1
def test_device_rules_deny_a_device(as_root: Singpy, image: Path, tmp_path: Path) -> None:
    config = tmp_path / "deny.toml"
    config.write_text('[[devices]]\n  access = "rw"\n  allow = false\n  major = 1\n  minor = 3\n  type = "c"\n')
    result = as_root.run("exec", "--apply-cgroups", str(config), str(image), "sh", "-c", "echo x > /dev/null")
    assert result.returncode != 0
    assert "Operation not permitted" in result.stderr


@pytest.mark.parametrize(("content", "message"), [
    ("[pids]\nlimit = 'many'\n", "pids.limit must be an integer"),
    ("[memory]\nlimt = 5\n", "unknown key 'memory.limt'"),
    ("[pids\n", "cgroups file"),
    ("[[hugepageLimits]]\npageSize = '../../x'\nlimit = 1\n", "bad value"),
    ("[unified]\n'../cgroup.procs' = '1'\n", "bad name"),
])
def test_bad_toml_is_one_fatal_line(singpy: Singpy, image: Path, workdir: Path, content: str, message: str) -> None:
    config = workdir / f"bad-{uuid.uuid4().hex}.toml"
    config.write_text(content)
    config.chmod(0o644)
    try:
        assert_one_fatal(singpy.run("exec", "--apply-cgroups", str(config), str(image), "true"), message)
    finally:
        config.unlink()


@pytest.mark.parametrize(("flags", "message"), [
    (["--cpus", "0"], "cpus value must be in range 0.01"),
    (["--cpus", "lots"], "invalid cpus value"),
    (["--memory", "12X"], "invalid memory value"),
    (["--pids-limit", "-2"], "invalid pids-limit"),
    (["--blkio-weight", "5"], "blkio-weight must be in range 10-1000"),
    (["--blkio-weight-device", "/etc/passwd:100"], "is not a device"),
    (["--blkio-weight-device", "nocolon"], "<device>:<weight>"),
    (["--cpuset-cpus", "0;rm"], "invalid --cpuset-cpus value"),
    (["--memory", "1G", "--apply-cgroups", "/etc/passwd"], "cannot apply a cgroups TOML file while using limit flags"),
    (["--sharens", "--pids-limit", "3"], "add --no-sharens"),
])
def test_bad_limit_flags_are_one_fatal_line(singpy: Singpy, image: Path, flags: list[str], message: str) -> None:
    assert_one_fatal(singpy.run("exec", *flags, str(image), "true"), message, code=1)


@needs_v1
def test_a_user_on_cgroup_v1_is_told_why(as_user: Singpy, image: Path) -> None:
    result, pid = _run(as_user, "exec", "--pids-limit", "10", str(image), "true")
    assert_one_fatal(result, "need cgroup v2 with a subtree delegated to you, and this host runs cgroup v1")
    assert _own_cgroups(pid) == []


@needs_v1
def test_a_refused_limit_leaves_no_cgroup(as_root: Singpy, image: Path) -> None:
    # a write the kernel refuses, after the cgroup was made: 1 CPU-µs of quota is below the minimum
    config = as_root.workdir / f"quota-{uuid.uuid4().hex}.toml"
    config.write_text("[cpu]\nquota = 1\nperiod = 100000\n")
    try:
        result, pid = _run(as_root, "exec", "--apply-cgroups", str(config), str(image), "true")
    finally:
        config.unlink()
    assert_one_fatal(result, "the kernel refused cpu.cfs_quota_us = 1")
    assert _own_cgroups(pid) == []


def test_dry_run_shows_the_cgroup(as_root: Singpy, image: Path) -> None:
    plan = json.loads(as_root.ok("exec", "--dry-run", "--pids-limit", "9", str(image), "true"))["plan"]
    cgroup = plan["cgroup"]
    assert any(path.endswith("/pids.max") and value == "9" for path, value in cgroup["writes"])
    assert all(os.path.basename(path).startswith("singpy-") for path in cgroup["dirs"])
    assert json.loads(as_root.ok("exec", "--dry-run", str(image), "true"))["plan"]["cgroup"] is None


def test_two_containers_get_two_cgroups(as_root: Singpy, image: Path) -> None:
    show = "grep ':pids:' /proc/self/cgroup" if v1_host() else "grep '^0::' /proc/self/cgroup"
    first = as_root.popen(["exec", "--pids-limit", "50", str(image), "sh", "-c", f"{show}; sleep 1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    second = as_root.ok("exec", "--pids-limit", "50", str(image), "sh", "-c", show)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert out != second and "singpy-" in out and "singpy-" in second


# cgroup v2, on the unified hierarchy bound on /sys/fs/cgroup for singpy alone

@pytest.fixture
def delegated(as_user: Singpy) -> Iterator[Path]:
    """A cgroup v2 directory delegated to the test user (theirs, with its cgroup.procs), with a `leaf` for them."""
    root = _unified()
    if root is None:
        pytest.skip("this host has no cgroup v2 hierarchy")
    if os.geteuid() != 0:
        pytest.skip("delegating a cgroup needs root")
    top = Path(root) / f"singpy-test-{uuid.uuid4().hex[:12]}"
    top.mkdir()
    (top / "leaf").mkdir()
    for path in (top, top / "cgroup.procs", top / "cgroup.subtree_control", top / "cgroup.threads", top / "leaf",
                 top / "leaf" / "cgroup.procs", top / "leaf" / "cgroup.threads"):
        os.chown(path, as_user.uid, as_user.gid)
    try:
        yield top
    finally:
        for directory in sorted(top.rglob("*"), key=lambda path: -len(path.parts)):
            if directory.is_dir():
                for pid in (directory / "cgroup.procs").read_text().split():
                    subprocess.run(["kill", "-9", pid], check=False)
                directory.rmdir()
        top.rmdir()


def _in_v2(delegated: Path, user: Singpy, *args: str, leaf: str = "leaf") -> subprocess.CompletedProcess[str]:
    """singpy as the user, started in `leaf` below `delegated`, the unified hierarchy on /sys/fs/cgroup."""
    root = _unified()
    script = (f"echo $$ > {shlex.quote(str(delegated / leaf))}/cgroup.procs && "
              f"mount --bind {root} /sys/fs/cgroup && "
              f"exec setpriv --reuid {user.uid} --regid {user.gid} --clear-groups "
              f"{shlex.quote(SINGPY)} {' '.join(shlex.quote(arg) for arg in args)}")
    return subprocess.run([shutil.which("unshare") or "unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          env=user.env(), capture_output=True, text=True, timeout=60, cwd="/")


def test_v2_user_with_a_delegated_cgroup(as_user: Singpy, image: Path, delegated: Path) -> None:
    script = "grep '^0::' /proc/self/cgroup; cat /sys/fs/cgroup$(grep '^0::' /proc/self/cgroup | cut -d: -f3)/" \
             "cgroup.max.descendants"
    config = as_user.workdir / f"unified-{uuid.uuid4().hex}.toml"
    config.write_text("[unified]\n'cgroup.max.descendants' = '3'\n")
    config.chmod(0o644)
    try:
        result = _in_v2(delegated, as_user, "exec", "--apply-cgroups", str(config), str(image), "sh", "-c", script)
    finally:
        config.unlink()
    assert result.returncode == 0, result.stderr
    line, limit = result.stdout.splitlines()
    assert line.startswith(f"0::/{delegated.name}/singpy-"), result.stdout
    assert limit == "3"
    assert [path.name for path in delegated.iterdir() if path.is_dir()] == ["leaf"]  # removed at the end


def test_v2_user_missing_controller_is_named(as_user: Singpy, image: Path, delegated: Path) -> None:
    result = _in_v2(delegated, as_user, "exec", "--pids-limit", "10", str(image), "true")
    enabled = (delegated / "cgroup.subtree_control").read_text().split()
    if "pids" in enabled:
        pytest.skip("pids is delegated here")
    assert_one_fatal(result, "the pids controller(s) are not enabled for the cgroups below your delegated cgroup")


def test_v2_user_without_a_delegated_cgroup(as_user: Singpy, image: Path, delegated: Path) -> None:
    (delegated / "rootleaf").mkdir()  # root's, as the cgroups of a login session are
    result = _in_v2(delegated, as_user, "exec", "--pids-limit", "10", str(image), "true", leaf="rootleaf")
    assert_one_fatal(result, "need a cgroup v2 subtree delegated to you, and your cgroup")
    assert "systemd-run --user --scope" in result.stderr


def test_v2_root(as_root: Singpy, image: Path, delegated: Path) -> None:
    # root's cgroup goes at the top of the hierarchy, wherever root started from
    config = as_root.workdir / f"unified-{uuid.uuid4().hex}.toml"
    config.write_text("[unified]\n'cgroup.max.depth' = '2'\n")
    script = "p=$(grep '^0::' /proc/self/cgroup | cut -d: -f3); echo $p; cat /sys/fs/cgroup$p/cgroup.max.depth"
    try:
        result = _in_v2(delegated, as_root, "exec", "--apply-cgroups", str(config), str(image), "sh", "-c", script)
    finally:
        config.unlink()
    assert result.returncode == 0, result.stderr
    path, depth = result.stdout.splitlines()
    assert path.startswith("/singpy-") and path.count("/") == 1
    assert depth == "2"
    assert not os.path.exists(f"{_unified()}{path}")


def test_v2_user_instance_in_a_delegated_cgroup(as_user: Singpy, image: Path, delegated: Path) -> None:
    name = f"cg-{uuid.uuid4().hex[:10]}"
    config = as_user.workdir / f"unified-{uuid.uuid4().hex}.toml"
    config.write_text("[unified]\n'cgroup.max.descendants' = '4'\n")
    config.chmod(0o644)
    try:
        started = _in_v2(delegated, as_user, "instance", "start", "--apply-cgroups", str(config), str(image), name)
        assert started.returncode == 0, started.stderr
        made = [path for path in delegated.iterdir() if path.is_dir() and path.name.startswith("singpy-")]
        assert len(made) == 1 and (made[0] / "cgroup.max.descendants").read_text() == "4\n"
        assert (made[0] / "cgroup.procs").read_text().split()  # the holder is in it
        assert (delegated / "leaf" / "cgroup.procs").read_text() == ""  # the starter went back, and ended
        shown = _in_v2(delegated, as_user, "instance", "stats", "--json", "--no-stream", name)
        assert json.loads(shown.stdout)["source"] == "cgroup", shown.stderr
    finally:
        config.unlink()
        stopped = _in_v2(delegated, as_user, "instance", "stop", name)
    assert stopped.returncode == 0, stopped.stderr
    assert [path.name for path in delegated.iterdir() if path.is_dir()] == ["leaf"]
    logs = Path(as_user.home, ".singpy", "instances", "logs", os.uname().nodename, as_user.user)
    for suffix in ("out", "err"):
        (logs / f"{name}.{suffix}").unlink(missing_ok=True)


@needs_v1
def test_a_killed_launchers_cgroup_is_swept_by_the_next_launch(as_root: Singpy, image: Path) -> None:
    launcher = as_root.popen(["exec", "--pids-limit", "20", str(image), "sleep", "30"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not any(Path(path, "cgroup.procs").read_text().split() for path in _own_cgroups(launcher.pid)):
        assert time.monotonic() < deadline, "the container never started"
        time.sleep(0.02)
    left = _own_cgroups(launcher.pid)
    launcher.kill()  # no time to remove anything: its child (the payload) dies with it, the cgroup stays
    launcher.communicate(timeout=30)
    as_root.ok("exec", "--pids-limit", "20", str(image), "true")
    assert [path for path in left if os.path.exists(path)] == []

"""tests.support.leftovers: it must see what names our paths, and nothing that merely resembles them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import leftovers
from tests.support.leftovers import (
    Traces,
    boot_ticks,
    descendants,
    in_pid_namespace,
    pinned_pid_namespace,
    settled,
    traces,
    wait_until_gone,
)


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A shell whose command line names tmp_path/marker, with a `sleep 60` child."""
    child: list[int] = []
    process = subprocess.Popen(["sh", "-c", "sleep 60; :", str(tmp_path / "marker")])
    try:
        # Until the child has exec'd `sleep`, it is a copy of the shell, with the same command line.
        child = leftovers.wait_for_descendants(process.pid, "sleep 60")
        assert child
        yield process
    finally:
        for pid in leftovers.alive(child, "sleep 60"):
            os.kill(pid, 9)
        process.kill()
        process.wait()


def test_nothing_names_a_fresh_directory(tmp_path: Path) -> None:
    assert traces(tmp_path) == Traces()
    assert repr(traces(tmp_path)) == "Traces(nothing)"


def test_a_process_naming_the_path_is_seen(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    found = traces(tmp_path).processes
    assert found == (f"{sleeper.pid} sh -c sleep 60; : {tmp_path}/marker",)
    assert f"{sleeper.pid} sh -c" in repr(traces(tmp_path))
    sleeper.kill()
    sleeper.wait()
    assert settled(Traces(), tmp_path) == Traces()


def test_a_longer_name_is_not_ours(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    assert traces(tmp_path / "mark").processes == ()  # ".../marker" starts with ".../mark": not the same path
    assert traces(tmp_path / "marker").processes != ()


def test_the_test_process_and_its_ancestors_are_not_leftovers(tmp_path: Path) -> None:
    assert os.getpid() not in [int(line.split()[0]) for line in traces(*map(str, Path.cwd().parents)).processes]


def test_entries_of_the_watched_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leftovers, "_TMPDIRS", [])
    leftovers.watch_tmpdir(tmp_path)
    before = traces(tmp_path / "elsewhere")
    (tmp_path / "singpy-inspect-x").mkdir()
    after = traces(tmp_path / "elsewhere")
    assert after != before and after.tmp == (str(tmp_path / "singpy-inspect-x"),)


def test_descendants_and_their_end(sleeper: subprocess.Popen[bytes]) -> None:
    children = leftovers.wait_for_descendants(sleeper.pid, "sleep 60")
    assert len(children) == 1 and descendants(sleeper.pid) == {children[0]: "sleep 60"}
    os.kill(children[0], 9)
    assert wait_until_gone(children, "sleep 60") == []


def test_processes_of_a_pid_namespace() -> None:
    assert os.getpid() in in_pid_namespace(os.readlink("/proc/self/ns/pid"))
    assert in_pid_namespace("pid:[1]") == []


def test_a_pid_namespace_pinned_and_its_later_processes(sleeper: subprocess.Popen[bytes]) -> None:
    """A process started after `started_by` is not counted (another namespace may have the number by then)."""
    with pinned_pid_namespace(sleeper.pid) as link:
        assert link == os.readlink("/proc/self/ns/pid")
        assert sleeper.pid in in_pid_namespace(link, started_by=boot_ticks())
        assert sleeper.pid not in in_pid_namespace(link, started_by=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_mount_naming_the_path_is_seen(tmp_path: Path) -> None:
    target = tmp_path / "with space"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "leftovers-test", str(target)], check=True)
    try:
        mounts = traces(target).mounts
        assert len(mounts) == 1 and "with\\040space" in mounts[0]  # mountinfo's escape, decoded to match
        assert traces(tmp_path / "with").mounts == ()
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert traces(target).mounts == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="loop devices need root")
def test_a_loop_device_backed_by_a_file_under_the_path_is_seen(tmp_path: Path) -> None:
    backing = tmp_path / "disk.img"
    backing.write_bytes(b"\0" * 65536)
    attached = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if attached.returncode != 0:
        pytest.skip(f"no loop device here: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    try:
        assert traces(tmp_path).loops == (f"{device} -> {backing}",)
    finally:
        subprocess.run(["losetup", "-d", device], check=True)
    assert settled(Traces(), tmp_path) == Traces()

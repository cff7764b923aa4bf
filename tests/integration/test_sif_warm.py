"""`unsquash in background` (singpy.image.warm): a user's first FUSE run of a SIF unpacks it behind itself,
later runs start from the unpacked tree; a burst unpacks once; nothing tampered, foreign or half-made is used.

Every run here has /dev/fuse open to users (the `fuse_open` fixture), the only case the directive changes, and
singpy's default configuration, in which the directive is on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from singpy.image.warm import START_DELAY
from tests.conftest import Singpy
from tests.support import sifs
from tests.support.leftovers import settled, traces
from tests.support.sifs import MARKER
from tests.support.warming import (
    STALLING,
    STARTED_NOTE,
    UNPACKED_NOTE,
    WARM_WAIT_LEAST,
    busy,
    calls,
    run,
    trees,
    unpacker_dir,
    wait_file,
    wait_unpacked,
)
from tests.support.warming import fixture_conf as fixture_conf  # noqa: F401


@pytest.fixture(scope="session")
def images(workdir: Path) -> dict[str, Path]:
    return sifs.all_images(workdir)


def test_second_run_starts_from_the_unpacked_tree(singpy: Singpy, images: dict[str, Path], workdir: Path,
                                                  conf: Path, fuse_open: str) -> None:
    """A user: FUSE and an unpacking behind the first run, the tree after; root: the loop device, nothing unpacked."""
    cache = sifs.new_cache(singpy, workdir, "warm-second-run")
    image = str(images["singpy"])
    planned = json.loads(singpy.ok("--config", str(conf), "exec", "--dry-run", image, "true",
                                   env=singpy.env(SINGPY_CACHEDIR=str(cache))))["plan"]
    first = run(singpy, conf, cache, image, "cat", "/etc/marker")
    assert first.returncode == 0 and first.stdout.split() == [MARKER], first.stderr
    if singpy.uid == 0:
        assert planned["image"]["strategy"] == "loop" and planned["image"]["warm"] == ""
        assert "loop device" in first.stderr and STARTED_NOTE not in first.stderr
        assert trees(cache) == []
        return
    assert planned["image"]["strategy"] == "fuse" and planned["image"]["warm"] == "background-or-wait"
    assert "squashfuse" in first.stderr and STARTED_NOTE in first.stderr
    wait_unpacked(cache)
    second = run(singpy, conf, cache, image, "sh", "-c",
                 "cat /etc/marker; grep -c fuse.squashfuse /proc/mounts || true")
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == [MARKER, "0"]  # the image's content, and no FUSE mount under it
    assert UNPACKED_NOTE in second.stderr and "squashfuse" not in second.stderr
    planned = json.loads(singpy.ok("--config", str(conf), "exec", "--dry-run", image, "true",
                                   env=singpy.env(SINGPY_CACHEDIR=str(cache))))["plan"]
    assert planned["image"]["warm"] == "cached" and planned["image"]["rootfs"].startswith(str(cache))
    # `cache clean` removes it: the next run mounts the image again
    singpy.ok("cache", "clean", "--force", env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    assert trees(cache) == [] and not busy(cache)
    third = run(singpy, conf, cache, image, "true")
    assert third.returncode == 0 and STARTED_NOTE in third.stderr, third.stderr
    wait_unpacked(cache)


def test_fakeroot_runs_never_use_or_start_an_unpacking(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                       conf: Path, fuse_open: str) -> None:
    """--fakeroot: through FUSE the image's owners show (a file of uid 1000 stays 1000's); a tree is the user's,
    so root's inside: a --fakeroot run neither unpacks nor takes a tree another run left."""
    cache = sifs.new_cache(as_user, workdir, "warm-fakeroot")
    image = str(images["singpy"])
    first = run(as_user, conf, cache, "--fakeroot", image, "cat", "/etc/marker")
    assert first.returncode == 0 and first.stdout.split() == [MARKER], first.stderr
    assert "squashfuse" in first.stderr and STARTED_NOTE not in first.stderr
    assert trees(cache) == [] and not busy(cache)
    plain = run(as_user, conf, cache, image, "true")  # a plain run unpacks it
    assert plain.returncode == 0 and STARTED_NOTE in plain.stderr, plain.stderr
    wait_unpacked(cache)
    again = run(as_user, conf, cache, "--fakeroot", image, "cat", "/etc/marker")
    assert again.returncode == 0 and again.stdout.split() == [MARKER], again.stderr
    assert "squashfuse" in again.stderr and UNPACKED_NOTE not in again.stderr


def test_burst_after_a_clean_unpacks_once(as_user: Singpy, images: dict[str, Path], workdir: Path, conf: Path,
                                          fuse_open: str) -> None:
    """16 runs at once after `cache clean`: all succeed, one unpacking (its lock: no second one starts)."""
    cache = sifs.new_cache(as_user, workdir, "warm-burst")
    tools = unpacker_dir(workdir, "warm-burst-tools", 'exec /usr/bin/unsquashfs "$@"')
    as_user.ok("cache", "clean", "--force", env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    env = as_user.env(SINGPY_CACHEDIR=str(cache), PATH=f"{tools}:/usr/bin:/bin")
    runs = [as_user.popen(["--config", str(conf), "exec", str(images["siftool"]), "cat", "/etc/marker"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(16)]
    results = [process.communicate(timeout=120) for process in runs]
    assert [process.returncode for process in runs] == [0] * 16, [err for _, err in results]
    assert all(out.split() == [MARKER] for out, _ in results)
    wait_unpacked(cache)
    assert calls(tools) == 1
    assert len(trees(cache)) == 1


def test_tampered_index_or_shared_cache_is_not_used(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                    conf: Path, fuse_open: str) -> None:
    """An index link of another form, or a cache others could write, is never followed: FUSE, as before."""
    cache = sifs.new_cache(as_user, workdir, "warm-tampered")
    image = str(images["singpy"])
    assert run(as_user, conf, cache, image, "true").returncode == 0
    wait_unpacked(cache)
    fake = workdir / "warm-fake-tree"
    shutil.copytree(cache / "rootfs" / trees(cache)[0], fake, symlinks=True)
    (fake / "etc" / "marker").write_text("planted\n")
    link = next(path for path in (cache / "index").iterdir() if path.is_symlink())
    link.unlink()
    link.symlink_to(fake)  # absolute: not a link singpy writes
    result = run(as_user, conf, cache, image, "cat", "/etc/marker")
    assert result.returncode == 0 and result.stdout.split() == [MARKER], result.stderr
    assert UNPACKED_NOTE not in result.stderr
    wait_unpacked(cache)
    (cache / "rootfs").chmod(0o777)  # writable by others: refused, and the run goes on with FUSE
    try:
        result = run(as_user, conf, cache, image, "cat", "/etc/marker")
        assert result.returncode == 0 and result.stdout.split() == [MARKER], result.stderr
        assert "not using the cache for this image" in result.stderr and "squashfuse" in result.stderr
    finally:
        (cache / "rootfs").chmod(0o700)


def test_another_users_cache_is_not_used(as_user: Singpy, other_user: object, images: dict[str, Path],
                                         workdir: Path, conf: Path, fuse_open: str) -> None:
    """A cache owned by another user, holding this image's tree, is neither read nor written."""
    cache = sifs.new_cache(as_user, workdir, "warm-theirs")
    image = str(images["singpy"])
    assert run(as_user, conf, cache, image, "true").returncode == 0
    wait_unpacked(cache)
    uid, gid = other_user.pw_uid, other_user.pw_gid  # type: ignore[attr-defined]
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(cache)], check=True)
    before = sorted(str(path) for path in cache.rglob("*"))
    result = run(as_user, conf, cache, image, "cat", "/etc/marker")
    assert result.returncode == 0 and result.stdout.split() == [MARKER], result.stderr
    assert UNPACKED_NOTE not in result.stderr and "squashfuse" in result.stderr
    assert "not using the cache" in result.stderr
    time.sleep(0.5)
    assert sorted(str(path) for path in cache.rglob("*")) == before


def kill_midway(singpy: Singpy, conf: Path, cache: Path, image: str, tools: Path) -> None:
    """A first run whose background unpacking is killed (SIGKILL) once unsquashfs has written its tree."""
    first = run(singpy, conf, cache, image, "true", path=f"{tools}:/usr/bin:/bin")
    assert first.returncode == 0 and STARTED_NOTE in first.stderr, first.stderr
    stalled = wait_file(tools / "calls")
    unpacker = wait_file(tools / "unpacker")
    deadline = time.monotonic() + 30
    while not any(name.startswith(".") and "tmp-" in name for name in sifs.entries(cache)):
        assert time.monotonic() < deadline, "no temporary tree"
        time.sleep(0.05)
    for pid in (unpacker, stalled):  # the detached singpy and its unsquashfs wrapper (now `sleep`)
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert trees(cache) == []  # the half-made tree is hidden and never renamed into place


def test_killed_unpacking_leaves_nothing_trusted(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                 conf: Path, fuse_open: str) -> None:
    """SIGKILL of the background unpacking midway: its half tree is never used; the next unpacking replaces it."""
    cache = sifs.new_cache(as_user, workdir, "warm-killed")
    image = str(images["siftool"])
    kill_midway(as_user, conf, cache, image, unpacker_dir(workdir, "warm-killed-tools", STALLING))
    second = run(as_user, conf, cache, image, "cat", "/etc/marker")
    assert second.returncode == 0 and second.stdout.split() == [MARKER], second.stderr
    assert UNPACKED_NOTE not in second.stderr and STARTED_NOTE in second.stderr
    wait_unpacked(cache)
    assert not [name for name in sifs.entries(cache) if "tmp-" in name]  # removed by the next unpacking
    third = run(as_user, conf, cache, image, "cat", "/etc/marker")
    assert third.returncode == 0 and third.stdout.split() == [MARKER] and UNPACKED_NOTE in third.stderr


def test_a_stalled_unpacking_is_waited_for_a_bounded_time(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                          conf: Path, fuse_open: str) -> None:
    """An unpacking that never ends (stopped with its job, a hung disk) holds its lock: a later run of the image
    (small enough to wait for) waits a bounded time, then mounts the image with FUSE (before: waited for ever)."""
    cache = sifs.new_cache(as_user, workdir, "warm-stalled")
    image = str(images["squashfs"])
    tools = unpacker_dir(workdir, "warm-stalled-tools", STALLING)
    first = run(as_user, conf, cache, image, "true", path=f"{tools}:/usr/bin:/bin")
    assert first.returncode == 0 and STARTED_NOTE in first.stderr, first.stderr
    stalled, unpacker = wait_file(tools / "calls"), wait_file(tools / "unpacker")
    try:
        started = time.monotonic()
        second = as_user.run("--config", str(conf), "-v", "exec", image, "cat", "/etc/marker",
                             env=as_user.env(SINGPY_CACHEDIR=str(cache)), timeout=WARM_WAIT_LEAST + 25)
        took = time.monotonic() - started
        assert second.returncode == 0 and second.stdout.split() == [MARKER], second.stderr
        assert "took over 5 s: mounting the image with FUSE" in second.stderr and "squashfuse" in second.stderr
        assert WARM_WAIT_LEAST <= took < WARM_WAIT_LEAST + 20
    finally:
        for pid in (unpacker, stalled):
            os.kill(pid, signal.SIGKILL)


def test_cache_clean_removes_a_killed_unpacking(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                conf: Path, fuse_open: str) -> None:
    """What a killed unpacking left (its temporary tree, its lock) goes with `singpy cache clean`."""
    cache = sifs.new_cache(as_user, workdir, "warm-killed-clean")
    kill_midway(as_user, conf, cache, str(images["singpy"]), unpacker_dir(workdir, "warm-clean-tools", STALLING))
    assert busy(cache)  # its lock file stayed (no one holds it)
    as_user.ok("cache", "clean", "--force", env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    assert sifs.entries(cache) == [] and not busy(cache)


# A run that fails after the unpacking was started (its go never sent): user errors of each launch stage.
FAILURES = {
    "missing bind source": (["--bind", "/no/such/singpy-source:/mnt"], "true"),  # refused while planning
    "missing command": ([], "/nonexistent"),  # refused in the container, just before the execve
    "missing --pwd": (["--pwd", "/no/such/singpy-dir"], "true"),
}


@pytest.mark.parametrize("failure", FAILURES)
def test_failed_run_leaves_no_unpacking(singpy: Singpy, images: dict[str, Path], workdir: Path, conf: Path,
                                        fuse_open: str, failure: str) -> None:
    """A run that fails after the unpacking was started: the unpacking ends with it, having written nothing (no
    process, no lock, no unsquashfs, no tree); the next good run starts it and leaves the tree."""
    slug = failure.replace(" ", "-").replace("--", "")
    cache = sifs.new_cache(singpy, workdir, f"warm-failed-{slug}")
    tools = unpacker_dir(workdir, f"warm-failed-tools-{singpy.profile}-{slug}", 'exec /usr/bin/unsquashfs "$@"')
    image = str(images["singpy"])
    flags, command = FAILURES[failure]
    before = traces(image, cache)
    result = run(singpy, conf, cache, *flags, image, command, path=f"{tools}:/usr/bin:/bin")
    assert result.returncode == 255, result.stderr
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and "Traceback" not in result.stderr and result.stdout == "", result.stderr
    assert (STARTED_NOTE in result.stderr) == (singpy.uid != 0), result.stderr  # a user's run started it
    assert settled(before, image, cache) == before  # no process (the unpacker is a fork of singpy), no mount
    time.sleep(START_DELAY + 0.3)  # what a go would have started by now
    assert calls(tools) == 0 and trees(cache) == [] and not busy(cache), sifs.entries(cache)
    assert not [name for name in sifs.entries(cache) if "tmp-" in name]
    good = run(singpy, conf, cache, image, "cat", "/etc/marker", path=f"{tools}:/usr/bin:/bin")
    assert good.returncode == 0 and good.stdout.split() == [MARKER], good.stderr
    if singpy.uid != 0:  # the lock was released: this run unpacks it
        assert STARTED_NOTE in good.stderr, good.stderr
        wait_unpacked(cache)
        assert calls(tools) == 1


def test_go_comes_from_under_a_pid_namespace_init(as_user: Singpy, images: dict[str, Path], workdir: Path,
                                                  conf: Path, fuse_open: str) -> None:
    """With --pid the payload is forked by the namespace's init: its execve still sends the go."""
    cache = sifs.new_cache(as_user, workdir, "warm-pid")
    image = str(images["singpy"])
    first = run(as_user, conf, cache, "--pid", image, "cat", "/etc/marker")
    assert first.returncode == 0 and first.stdout.split() == [MARKER] and STARTED_NOTE in first.stderr, first.stderr
    wait_unpacked(cache)
    second = run(as_user, conf, cache, "--pid", image, "cat", "/etc/marker")
    assert second.returncode == 0 and second.stdout.split() == [MARKER] and UNPACKED_NOTE in second.stderr


TMPFS_SIZES = {"too small": 0, "large enough": 256 << 20}  # 0: the image's squashfs bytes, a third of what it needs


class SmallDisk:
    """A cache on a tmpfs of its own, in a mount namespace this test makes (a process holds it: `sleep`), seen by
    the singpy runs started with `run` and by the test under /proc/PID/root."""

    def __init__(self, singpy: Singpy, cache: Path, size: int) -> None:
        self.singpy = singpy
        self.cache = cache
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "sh", "-c",
             'mount -t tmpfs -o "size=$2,mode=0700,uid=$3,gid=$4" singpy-warm-test "$1" && echo ready && '
             'exec sleep 600', "sh", str(cache), str(size), str(singpy.uid), str(singpy.gid)],
            stdout=subprocess.PIPE, text=True)
        assert self.holder.stdout is not None and self.holder.stdout.readline() == "ready\n"
        self.view = Path(f"/proc/{self.holder.pid}/root{cache}")

    def run(self, conf: Path, *args: str, path: str) -> subprocess.CompletedProcess[str]:
        argv, ids = self.singpy.command(["--config", str(conf), "-v", "exec", *args])
        switch = ["setpriv", f"--reuid={self.singpy.uid}", f"--regid={self.singpy.gid}", "--clear-groups"] \
            if ids else []
        return subprocess.run(["nsenter", f"--target={self.holder.pid}", "--mount", "--", *switch, *argv],
                              env=self.singpy.env(SINGPY_CACHEDIR=str(self.cache), PATH=path), cwd="/",
                              capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


@pytest.mark.parametrize("room", TMPFS_SIZES)
def test_unpacking_skipped_when_the_cache_disk_is_too_small(as_user: Singpy, images: dict[str, Path],
                                                            workdir: Path, conf: Path, fuse_open: str,
                                                            room: str) -> None:
    """A cache filesystem the unpacked image would leave too full (under a tenth free): no unpacking, FUSE every
    run, no error; one with room: unpacked as anywhere."""
    if os.geteuid() != 0:
        pytest.skip("a tmpfs in a mount namespace of the test's needs root")
    image = images["singpy"]
    slug = room.replace(" ", "-")
    cache = sifs.new_cache(as_user, workdir, f"warm-disk-{slug}")
    tools = unpacker_dir(workdir, f"warm-disk-tools-{slug}", 'exec /usr/bin/unsquashfs "$@"')
    path = f"{tools}:/usr/bin:/bin"
    disk = SmallDisk(as_user, cache, TMPFS_SIZES[room] or image.stat().st_size)
    try:
        first = disk.run(conf, str(image), "cat", "/etc/marker", path=path)
        assert first.returncode == 0 and first.stdout.split() == [MARKER], first.stderr
        assert "squashfuse" in first.stderr, first.stderr
        if room == "too small":
            assert "not unpacking" in first.stderr and "free" in first.stderr, first.stderr
            assert STARTED_NOTE not in first.stderr
            time.sleep(START_DELAY + 0.3)
            assert calls(tools) == 0 and trees(disk.view) == [] and not busy(disk.view)
            again = disk.run(conf, str(image), "cat", "/etc/marker", path=path)
            assert again.returncode == 0 and again.stdout.split() == [MARKER] and "squashfuse" in again.stderr
            return
        assert STARTED_NOTE in first.stderr, first.stderr
        wait_unpacked(disk.view)
        second = disk.run(conf, str(image), "cat", "/etc/marker", path=path)
        assert second.returncode == 0 and second.stdout.split() == [MARKER], second.stderr
        assert UNPACKED_NOTE in second.stderr and calls(tools) == 1
    finally:
        disk.close()

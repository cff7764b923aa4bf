"""The extraction cache indexes what it unpacked (singpy.image.cache.populate): the image is opened once, hashed
and unpacked from that descriptor, indexed under that file's identity (ctime included), and nothing is kept if it
changed meanwhile; a wait for another's unpacking is bounded; a file unsquashfs can't unpack is not retried.

Each test reproduces a defect a user saw: a file renamed over the image while it was unpacked ran another file's
tree; a rewrite in place with the mtime restored ran the old tree; `exec --unsquash` waited for ever on a stopped
unpacking; an image with a device node outside /dev was hashed and unpacked again after every run. As the test
user, /dev/fuse open to users (the only case where `unsquash in background`, on by default, unpacks).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
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
)
from tests.support.warming import fixture_conf as fixture_conf  # noqa: F401

FAILED_NOTE = "an unpacking of this very file failed before"


@pytest.fixture(scope="session")
def pair(workdir: Path) -> dict[str, Path]:
    """Two bare squashfs images of one size, /etc/marker "image-A" in one, "image-B" in the other; and "C", whose
    /etc/mydev is a character device (a user's unsquashfs can't make it: exit status 2)."""
    made = {}
    for name in ("A", "B", "C"):
        out = workdir / f"identity-{name}.squashfs"
        if not out.exists():
            source = workdir / f"identity-{name}-source"
            shutil.copytree(sifs.busybox_tree(workdir), source, symlinks=True, dirs_exist_ok=True)
            (source / "etc" / "marker").write_text(f"image-{name}\n")
            device = ["-p", "etc/mydev c 644 0 0 1 3"] if name == "C" else []
            subprocess.run(["mksquashfs", str(source), str(out), "-noappend", "-comp", "gzip", "-all-root", "-quiet",
                            "-no-progress", *device], check=True, stdout=subprocess.DEVNULL)
            out.chmod(0o644)
        made[name] = out
    assert made["A"].stat().st_size == made["B"].stat().st_size  # a rewrite in place keeps the size
    return made


def place(singpy: Singpy, workdir: Path, name: str, images: dict[str, Path]) -> Path:
    """A directory of the user's holding copies of `images` (NAME: source), where its runs may rename them."""
    directory = workdir / f"identity-{name}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for target, source in images.items():
        shutil.copyfile(source, directory / target)
        os.chown(directory / target, singpy.uid, singpy.gid)
    os.chown(directory, singpy.uid, singpy.gid)
    return directory


def wait_idle(cache: Path, timeout: float = 60) -> None:
    """The background unpacking started by the last run is over (its lock gone: it unpacked, failed or gave up)."""
    deadline = time.monotonic() + timeout
    while busy(cache):
        assert time.monotonic() < deadline, f"the unpacking never ended: {sorted(os.listdir(cache / 'index'))}"
        time.sleep(0.05)


def marker(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_an_image_renamed_over_before_unsquashfs_never_poisons_its_digest(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """B renamed over the image after it was hashed, before unsquashfs opened it: before, B's tree was kept under
    A's digest, and every later run of A (any copy: same digest) ran B. Now unsquashfs reads the file hashed."""
    cache = sifs.new_cache(as_user, workdir, "identity-poison")
    home = place(as_user, workdir, "poison", {"img": pair["A"], "b": pair["B"], "fresh": pair["A"]})
    tools = unpacker_dir(workdir, "identity-poison-tools",
                         f'[ -e {home}/b ] && mv -f {home}/b {home}/img\nexec /usr/bin/unsquashfs "$@"')
    path = f"{tools}:/usr/bin:/bin"
    first = run(as_user, conf, cache, str(home / "img"), "cat", "/etc/marker", path=path)
    assert marker(first) == "image-A" and STARTED_NOTE in first.stderr, first.stderr
    wait_idle(cache)
    assert calls(tools) == 1 and not (home / "b").exists()  # the swap happened, inside the unpacking
    assert marker(run(as_user, conf, cache, str(home / "img"), "cat", "/etc/marker", path=path)) == "image-B"
    wait_idle(cache)
    # a genuine copy of A, twice: the second run starts from whatever tree the cache holds for A's digest
    assert marker(run(as_user, conf, cache, str(home / "fresh"), "cat", "/etc/marker", path=path)) == "image-A"
    wait_idle(cache)
    second = run(as_user, conf, cache, str(home / "fresh"), "cat", "/etc/marker", path=path)
    assert marker(second) == "image-A" and UNPACKED_NOTE in second.stderr, second.stderr


SWAP_AFTER = '/usr/bin/unsquashfs "$@"; status=$?\n[ -e {home}/b ] && mv -f {home}/b {home}/img\nexit $status'


def test_an_image_renamed_over_after_unsquashfs_is_not_indexed_as_it(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """B renamed over the image once A was unpacked, before the index was written: before, the index was written
    under a new stat of the path (B's) and B's next run ran A's tree. Now B runs B."""
    cache = sifs.new_cache(as_user, workdir, "identity-race")
    home = place(as_user, workdir, "race", {"img": pair["A"], "b": pair["B"]})
    tools = unpacker_dir(workdir, "identity-race-tools", SWAP_AFTER.format(home=home))
    path = f"{tools}:/usr/bin:/bin"
    assert marker(run(as_user, conf, cache, str(home / "img"), "cat", "/etc/marker", path=path)) == "image-A"
    wait_idle(cache)
    assert calls(tools) == 1 and not (home / "b").exists()
    second = run(as_user, conf, cache, str(home / "img"), "cat", "/etc/marker", path=path)
    assert marker(second) == "image-B" and UNPACKED_NOTE not in second.stderr, second.stderr


def test_the_extract_strategy_reads_again_an_image_renamed_over(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """`exec --unsquash` (the foreground unpacking, the same populate) of an image A that B is renamed over while
    A is unpacked (a concurrent pull of the same name, as cwltool's jobs do): A's tree is not kept, B is read
    again and runs, and only B is indexed (before the identity checks: A's tree, indexed under B's name; with
    them but no second read: a FATAL line for a run that had only raced a pull)."""
    cache = sifs.new_cache(as_user, workdir, "identity-extract")
    home = place(as_user, workdir, "extract", {"img": pair["A"], "b": pair["B"]})
    tools = unpacker_dir(workdir, "identity-extract-tools", SWAP_AFTER.format(home=home))
    path = f"{tools}:/usr/bin:/bin"
    first = run(as_user, conf, cache, "--unsquash", str(home / "img"), "cat", "/etc/marker", path=path)
    assert marker(first) == "image-B", first.stderr
    assert calls(tools) == 2 and len(trees(cache)) == 1  # A's unpacking thrown away, B's kept
    second = run(as_user, conf, cache, "--unsquash", str(home / "img"), "cat", "/etc/marker", path=path)
    assert marker(second) == "image-B" and calls(tools) == 2  # from the index: B's tree


def test_an_image_rewritten_in_place_with_its_mtime_restored_runs_its_new_content(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """rsync --inplace -t (or cp -p onto it): the same inode, size and mtime, new content; its ctime changed, and
    the index misses (before: the old tree ran)."""
    cache = sifs.new_cache(as_user, workdir, "identity-inplace")
    home = place(as_user, workdir, "inplace", {"img": pair["A"]})
    image = home / "img"
    assert marker(run(as_user, conf, cache, str(image), "cat", "/etc/marker")) == "image-A"
    wait_idle(cache)
    assert trees(cache)
    again = run(as_user, conf, cache, str(image), "cat", "/etc/marker")
    assert marker(again) == "image-A" and UNPACKED_NOTE in again.stderr  # the tree is used
    before = image.stat()
    time.sleep(0.05)  # a later ctime than the unpacking's, whatever the filesystem's clock granularity
    with open(image, "r+b") as handle:
        handle.write(pair["B"].read_bytes())
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = image.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    third = run(as_user, conf, cache, str(image), "cat", "/etc/marker")
    assert marker(third) == "image-B" and UNPACKED_NOTE not in third.stderr, third.stderr
    wait_idle(cache)


def test_extract_waits_a_bounded_time_for_a_stopped_unpacking(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """A background unpacking that never ends (stopped with its job) holds the digest's lock: `exec --unsquash` of
    a copy of the image waits a bounded time, then one FATAL line (before: it waited for ever)."""
    cache = sifs.new_cache(as_user, workdir, "identity-stopped")
    home = place(as_user, workdir, "stopped", {"img": pair["A"], "copy": pair["A"]})
    tools = unpacker_dir(workdir, "identity-stopped-tools", STALLING)
    first = run(as_user, conf, cache, str(home / "img"), "true", path=f"{tools}:/usr/bin:/bin")
    assert first.returncode == 0 and STARTED_NOTE in first.stderr, first.stderr
    stalled, unpacker = wait_file(tools / "calls"), wait_file(tools / "unpacker")
    try:
        started = time.monotonic()
        second = as_user.run("--config", str(conf), "exec", "--unsquash", str(home / "copy"), "cat", "/etc/marker",
                             env=as_user.env(SINGPY_CACHEDIR=str(cache)), timeout=WARM_WAIT_LEAST + 25)
        took = time.monotonic() - started
        second.stderr = "\n".join(line for line in second.stderr.splitlines() if not line.startswith("INFO"))
        assert_one_fatal(second, "another singpy's unpacking of this image has been under way for over 5 s")
        assert WARM_WAIT_LEAST <= took < WARM_WAIT_LEAST + 20
        assert [name for name in os.listdir(cache / "index") if not name.startswith(".")] == []
    finally:
        for pid in (unpacker, stalled):
            os.kill(pid, signal.SIGKILL)


def test_an_image_unsquashfs_cannot_unpack_is_not_unpacked_after_every_run(
        as_user: Singpy, pair: dict[str, Path], workdir: Path, conf: Path, fuse_open: str) -> None:
    """A device node outside /dev: a user's unsquashfs fails (status 2). That file is marked, and later runs go
    on with FUSE without unpacking it again (before: hashed and unpacked after every run); `cache clean` forgets."""
    cache = sifs.new_cache(as_user, workdir, "identity-failed")
    home = place(as_user, workdir, "failed", {"img": pair["C"], "other": pair["A"]})
    tools = unpacker_dir(workdir, "identity-failed-tools", 'exec /usr/bin/unsquashfs "$@"')
    path = f"{tools}:/usr/bin:/bin"
    image = str(home / "img")
    first = run(as_user, conf, cache, image, "cat", "/etc/marker", path=path)
    assert marker(first) == "image-C" and STARTED_NOTE in first.stderr, first.stderr
    wait_idle(cache)
    assert calls(tools) == 1 and trees(cache) == []
    for _ in range(2):
        later = run(as_user, conf, cache, image, "cat", "/etc/marker", path=path)
        assert marker(later) == "image-C" and "squashfuse" in later.stderr, later.stderr
        assert FAILED_NOTE in later.stderr and STARTED_NOTE not in later.stderr, later.stderr
        wait_idle(cache)
    assert calls(tools) == 1
    # another image's tree: `cache clean` of a cache holding nothing else says "nothing to remove" (cli/cache.py)
    assert marker(run(as_user, conf, cache, str(home / "other"), "cat", "/etc/marker", path=path)) == "image-A"
    wait_idle(cache)
    as_user.ok("cache", "clean", "--force", env=as_user.env(SINGPY_CACHEDIR=str(cache)))
    assert [name for name in os.listdir(cache / "index") if name.endswith(".failed")] == []
    retried = run(as_user, conf, cache, image, "cat", "/etc/marker", path=path)
    assert marker(retried) == "image-C" and STARTED_NOTE in retried.stderr, retried.stderr
    wait_idle(cache)
    assert calls(tools) == 3  # img, other, img again

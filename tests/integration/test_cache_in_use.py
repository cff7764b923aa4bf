"""`singpy cache clean` never removes the root of a running container (task "inuse").

A run from a tree of the extraction cache (`--unsquash`: root too; a user's warm "cached" run, the default
with /dev/fuse open) holds a shared flock on the entry's record (DIGEST.json) for the container's whole life
(the payload inherits it; a supervisor keeps it: --pid). `cache clean` keeps such an entry, says so in one
line, and removes everything else; once the container has ended, the next clean removes it and leaves nothing.

The container's payload waits, bounded, for a flag file the test makes after the clean, then reads the image:
on the old code the clean deleted the tree under it (`cat: can't open '/etc/marker'`).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import sifs
from tests.support.sifs import MARKER

KEPT = "is in use by a running container: kept"
PAYLOAD = ('echo ready; i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; '
           "cat /etc/marker")


@pytest.fixture(scope="module")
def images(workdir: Path) -> tuple[Path, Path]:
    """Two images with different partitions (two cache entries): the SIF, and a bare squashfs with one more file."""
    other = workdir / "inuse-other.squashfs"
    if not other.exists():
        tmp = other.with_suffix(".tmp")
        subprocess.run(["mksquashfs", str(sifs.busybox_tree(workdir)), str(tmp), "-noappend", "-all-root", "-quiet",
                        "-no-progress", "-p", "etc/inuse-other f 644 0 0 echo other"],
                       check=True, stdout=subprocess.DEVNULL)
        tmp.rename(other)
    return sifs.siftool_sif(workdir), other


def entries(cache: Path) -> list[str]:
    """Everything in the cache's rootfs/: trees, their records and hidden files (locks, temporary trees)."""
    root = cache / "rootfs"
    return sorted(os.listdir(root)) if root.exists() else []


def trees(cache: Path) -> list[str]:
    return [name for name in entries(cache) if len(name) == 64]


def start_container(singpy: Singpy, cache: Path, flag: Path, *args: str) -> subprocess.Popen[str]:
    """`singpy ARGS sh -c PAYLOAD` (ARGS: up to the image), running until `flag` exists (60 s at most); back once
    its payload has started."""
    process = singpy.popen([*args, "sh", "-c", PAYLOAD, "sh", str(flag)],
                           env=singpy.env(SINGPY_CACHEDIR=str(cache)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()  # bounded: the payload prints it first, or singpy fails and closes it
    if line.strip() != "ready":
        process.kill()
        _, err = process.communicate(timeout=30)
        pytest.fail(f"the container did not start: {line!r} {err}")
    return process


def finish(process: subprocess.Popen[str], flag: Path) -> tuple[int, str, str]:
    flag.touch()
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def clean(singpy: Singpy, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = singpy.run("cache", "clean", *args, env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("flags", [(), ("--pid",)], ids=["exec", "pid"])
def test_clean_keeps_a_running_containers_tree(singpy: Singpy, images: tuple[Path, Path], workdir: Path,
                                               flags: tuple[str, ...]) -> None:
    """The payload execs in place (its descriptor) or under a supervisor (--pid): its tree stays while it runs;
    the other entry goes; after the container, a clean removes the kept one and leaves nothing."""
    used, idle = images
    cache = sifs.new_cache(singpy, workdir, f"inuse-{'-'.join(flags) or 'exec'}")
    singpy.ok("exec", "--unsquash", str(idle), "true", env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    flag = workdir / f"inuse-flag-{singpy.profile}-{'-'.join(flags) or 'exec'}"
    flag.unlink(missing_ok=True)
    process = start_container(singpy, cache, flag, "exec", "--unsquash", *flags, str(used))
    try:
        assert len(trees(cache)) == 2
        dry = clean(singpy, cache, "--dry-run")
        assert dry.stdout.count("in use by a running container") == 1, dry.stdout
        assert "would remove 1 cache entries" in dry.stdout
        result = clean(singpy, cache, "--force")
        assert result.stderr.count(KEPT) == 1 and "Traceback" not in result.stderr, result.stderr
        assert "removed 1 cache entries" in result.stdout, result.stdout
        kept = trees(cache)
        assert len(kept) == 1 and result.stderr.split("INFO:")[1].split()[0] == kept[0][:16]
    finally:
        code, out, err = finish(process, flag)
    assert code == 0 and out.split() == [MARKER], err  # the image was there to the end
    listed = singpy.ok("cache", "list", env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    assert kept[0][:16] in listed
    after = clean(singpy, cache, "--force")
    assert "removed 1 cache entries" in after.stdout and KEPT not in after.stderr, after.stderr
    assert entries(cache) == []  # no tree, record or lock left


def test_the_payload_holds_one_read_only_descriptor(singpy: Singpy, images: tuple[Path, Path], workdir: Path) -> None:
    """What the payload gets besides its stdio: the entry's record, read-only (nothing else of singpy's)."""
    cache = sifs.new_cache(singpy, workdir, "inuse-descriptor")
    out = singpy.ok("exec", "--unsquash", str(images[0]), "sh", "-c",
                    'cd /proc/self/fd && for fd in *; do echo "$fd $(readlink "$fd")"; done; cat /proc/$$/fdinfo/3',
                    env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    lines = out.splitlines()
    digest = trees(cache)[0]
    assert [line.split()[0] for line in lines[:5]] == ["0", "1", "2", "3", "4"], out  # 4: the shell's own
    assert lines[3] == f"3 {cache}/rootfs/{digest}.json", out
    flags = next(line.split()[1] for line in lines if line.startswith("flags:"))
    assert int(flags, 8) & 0o3 == os.O_RDONLY, out


def test_warm_cached_run_is_kept(as_user: Singpy, workdir: Path, fuse_open: str) -> None:
    """The reviewer's case: a user's run from the tree a background unpacking left (`unsquash in background`, the
    default with /dev/fuse open), a `cache clean --force` meanwhile."""
    cache = sifs.new_cache(as_user, workdir, "inuse-warm")
    image = sifs.singpy_sif(workdir)
    conf = workdir / "inuse-defaults.conf"  # singpy's defaults: `unsquash in background` is on
    conf.write_text("")
    conf.chmod(0o644)
    env = as_user.env(SINGPY_CACHEDIR=str(cache))
    as_user.ok("--config", str(conf), "exec", str(image), "true", env=env)
    deadline = time.monotonic() + 60
    while (not trees(cache) or any(name.endswith(".warm") for name in os.listdir(cache / "index"))) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trees(cache), entries(cache)
    flag = workdir / "inuse-flag-warm"
    flag.unlink(missing_ok=True)
    process = start_container(as_user, cache, flag, "--config", str(conf), "-v", "exec", str(image))
    try:
        result = clean(as_user, cache, "--force")
        assert KEPT in result.stderr and "removed 0 cache entries" in result.stdout, result.stderr
    finally:
        code, out, err = finish(process, flag)
    assert code == 0 and out.split() == [MARKER], err
    assert "using the tree a background unpacking left" in err  # it ran from the tree, not through FUSE
    clean(as_user, cache, "--force")
    assert entries(cache) == []


def test_a_held_entry_is_kept_until_its_holder_closes(workdir: Path, images: tuple[Path, Path]) -> None:
    """The locks themselves, in this process: a held entry is IN_USE (its tree intact); released, it is removed
    whole; a run holding an entry removed since its lookup learns it (None) and unpacks again (squashfs.prepare)."""
    from singpy.image import cache, squashfs
    from singpy.plan import ImageSpec

    location = str(workdir / "caches" / f"inuse-locks-{os.getpid()}")
    image = ImageSpec(kind="squashfs", path=str(images[1]), strategy="extract", tool="/usr/bin/unsquashfs",
                      cache=location)
    prepared = squashfs.prepare(image, root=os.geteuid() == 0)
    assert prepared.rootfs is not None and prepared.in_use[0] >= 0
    digest = os.path.basename(prepared.rootfs)
    try:
        assert cache.remove_entry(location, digest) == cache.IN_USE
        assert (Path(prepared.rootfs) / "etc" / "inuse-other").read_text() == "other\n"
    finally:
        os.close(prepared.in_use[0])
    assert cache.remove_entry(location, digest) == cache.REMOVED
    assert entries(Path(location)) == []
    assert squashfs.hold(location, digest) is None  # looked up before the removal: gone
    again = squashfs.prepare(image, root=os.geteuid() == 0)  # unpacked again, and held
    try:
        assert again.rootfs == prepared.rootfs and os.path.isdir(again.rootfs) and again.in_use[0] >= 0
    finally:
        os.close(again.in_use[0])
    assert cache.remove_entry(location, digest) == cache.REMOVED and entries(Path(location)) == []


def test_an_instance_from_a_tree_is_kept(singpy: Singpy, images: tuple[Path, Path], workdir: Path) -> None:
    """An instance's holder, the process that lives as long as its container, keeps the entry's record locked."""
    cache = sifs.new_cache(singpy, workdir, "inuse-instance")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    name = f"inuse{uuid.uuid4().hex[:8]}"  # the profile's home is shared with other copies of the suite
    singpy.ok("instance", "start", "--unsquash", str(images[0]), name, env=env)
    try:
        result = clean(singpy, cache, "--force")
        assert KEPT in result.stderr and "removed 0 cache entries" in result.stdout, result.stderr
        assert singpy.ok("exec", f"instance://{name}", "cat", "/etc/marker", env=env).split() == [MARKER]
    finally:
        singpy.run("instance", "stop", name, env=env)
    deadline = time.monotonic() + 10  # the holder ends just after `instance stop` returns
    while KEPT in (after := clean(singpy, cache, "--force")).stderr and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "removed 1 cache entries" in after.stdout, after.stderr
    assert entries(cache) == []

"""`unsquash in background`: a SIF through FUSE on its first run, from the extraction cache after.

A fresh squashfuse mount costs a user's run ~30-50 ms (the mount, then every
file the payload reads decompressed through a new FUSE connection), where a
tree of the extraction cache (singpy.image.cache) costs what a sandbox does.
Unpacking takes longer than one FUSE run (unsquashfs of a 1 MB busybox image:
~250 ms), and a large image takes minutes, so a first run never waits for it:

* `plan` (in singpy.image.squashfs.choose, FUSE chosen for a user): the
  tree this very file left in the cache, if any (`cache.lookup`: no hashing)
  is used as the `extract` strategy uses it (warm = "cached"); otherwise the
  run mounts the image with FUSE and plans to unpack it behind itself
  (warm = "background", or "background-or-wait" for an image small enough to
  wait for: see WAIT_LIMIT).
* `start` (in squashfs.prepare, on the host before any namespace) takes the
  image's unpacking lock without waiting (`index/.KEY.warm`, KEY the file's
  identity as in the index: no hashing on the launcher's path). Got: a
  detached process (its own session, nice 19 and SCHED_IDLE, stdio on
  /dev/null, no other descriptor of the launcher but the lock) runs
  `cache.populate` once the run is past its start-up (START_DELAY), with every
  rule of the cache (ownership checks, the tree renamed into place only when
  complete, a killed unpacking's temporary tree removed by the next one), and
  drops the lock when done. Busy: another run is unpacking it, so a burst of
  jobs starts one unpacking; this run mounts the image with FUSE, or, for a
  small image, waits for the lock (a blocking flock: no polling, no CPU), then
  takes the tree (FUSE if the unpacking failed).

A cache that `cachefiles.check_owned` refuses (someone else's, writable by
others) is never used nor written: the run mounts the image with FUSE, as
without the directive. Only the user's own cache is ever read (the cache's
rules: the index link of the one form singpy writes, an entry owned by the user).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.plan import ImageSpec

WAIT_LIMIT = 64 << 20  # squashfs bytes: an image up to this size being unpacked is waited for rather than mounted
# The unpacking starts this long after the run that started it: unpacking beside a run's start-up (even at nice 19,
# SCHED_IDLE) made that first run ~45 ms slower on a loaded 2-core machine, a 0.15 s delay ~6 ms (docs/images.md).
START_DELAY = 0.2
CACHED, BACKGROUND, OR_WAIT = "cached", "background", "background-or-wait"


def plan(image: ImageSpec, *, cache: str, limit: int, env: Mapping[str, str]) -> ImageSpec:
    """`image` as FUSE chose it, or from the cache, or with its unpacking planned (see the module's docstring).

    `limit`: the largest partition unpacked, in bytes (0: any).
    """
    from singpy.image import cache as extraction
    from singpy.image.tools import find_tool

    length = partition_length(image)
    if limit and length > limit:
        console.verbose(f"not unpacking {image.path} in the background: {length} bytes, over `unsquash in "
                        f"background max size`")
        return image
    if length >= extraction.LARGE_EXTRACTION and extraction.filesystem_of(cache) in extraction.NETWORK_FS_TYPES:
        # no one would see the warning a foreground unpacking gives (cache.shared_storage_warning): not there
        console.verbose(f"not unpacking {image.path} in the background: the cache {cache} is on network storage")
        return image
    unpacker = find_tool("unsquashfs", env)
    if unpacker is None:
        console.verbose("not unpacking the image in the background: unsquashfs is not installed")
        return image
    try:
        tree = extraction.lookup(cache, image.path, image.offset, image.size)
    except (ImageError, OSError) as error:  # a cache someone else could fill: never used, never written
        console.verbose(f"not using the cache for this image: {getattr(error, 'message', error)}")
        return image
    if tree is not None:
        console.verbose(f"using the tree a background unpacking left in the cache: {tree}")
        return image.replace(strategy="extract", tool=unpacker, cache=cache, rootfs=tree, warm=CACHED)
    return image.replace(cache=cache, warm=OR_WAIT if length <= WAIT_LIMIT else BACKGROUND, unpacker=unpacker)


def partition_length(image: ImageSpec) -> int:
    """The squashfs partition's size in bytes (a bare squashfs file: the file's)."""
    return image.size or max(os.stat(image.path).st_size - image.offset, 0)


def lock_path(cache: str, image: ImageSpec) -> str:
    """The lock held while this very file's partition is unpacked in the background (keyed as the index is)."""
    from singpy.image.cache import INDEX, index_key

    return f"{cache}/{INDEX}/.{index_key(image.path, image.offset, image.size)}.warm"


def start(image: ImageSpec) -> ImageSpec:
    """Called on the host before any namespace: unpack behind this run, or wait for the unpacking under way."""
    from singpy.host.cachefiles import make_private_dirs
    from singpy.image import cache as extraction

    try:
        for sub in ("", extraction.ROOTFS, extraction.INDEX):
            make_private_dirs(f"{image.cache}/{sub}" if sub else image.cache)
        path = lock_path(image.cache, image)
        lock = extraction.lock_file(path, wait=None)
    except (ImageError, OSError) as error:
        console.verbose(f"not unpacking the image in the background: {getattr(error, 'message', error)}")
        return image
    if lock is None:
        return _wait(image, path) if image.warm == OR_WAIT else image
    tree = extraction.lookup(image.cache, image.path, image.offset, image.size, checked=True)
    if tree is not None:  # finished between our plan and our lock
        _release(path, lock)
        return image.replace(strategy="extract", tool=image.unpacker, rootfs=tree, warm=CACHED)
    console.verbose(f"unpacking {image.path} into the cache in the background, for later runs")
    _spawn(image, path, lock)
    os.close(lock)  # the unpacking process holds it now (flock belongs to the open file, which it shares)
    return image


def _release(path: str, lock: int) -> None:
    os.unlink(path)  # while locked: see cache.lock_file
    os.close(lock)


def _wait(image: ImageSpec, path: str) -> ImageSpec:
    """Another run is unpacking this small image: wait for it (flock, shared: every waiter wakes at once)."""
    import fcntl

    from singpy.image import cache as extraction

    console.verbose(f"waiting for another singpy to finish unpacking {image.path}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        fd = -1  # done (or gone) already
    if fd >= 0:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)
    tree = extraction.lookup(image.cache, image.path, image.offset, image.size, checked=True)
    if tree is None:
        console.verbose("the background unpacking left no tree: mounting the image with FUSE")
        return image
    return image.replace(strategy="extract", tool=image.unpacker, rootfs=tree, warm=CACHED)


def _spawn(image: ImageSpec, path: str, lock: int) -> None:
    """A detached process (double fork: never our child, never a zombie) unpacks the image holding `lock`."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()  # out of the terminal's session: no hangup, no job-control signal reaches it
            if os.fork() == 0:
                _detach(lock)
                code = _unpack(image, path, lock)
            else:
                code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def _detach(keep: int) -> None:
    """stdio on /dev/null, every other descriptor of the launcher closed (a caller's pipe must see its end), the
    lowest priority."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 1024)
    os.chdir("/")  # never holds the caller's directory busy (an unmount of a job's scratch)
    try:  # best effort: where a host refuses them, the unpacking still runs, delayed (START_DELAY)
        os.nice(19)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # CPU time no one else wants (unsquashfs too)
    except OSError:
        pass


def _unpack(image: ImageSpec, path: str, lock: int) -> int:
    """In the detached process: populate the cache (every rule of singpy.image.cache), then drop the lock."""
    import time

    from singpy.image import cache as extraction

    time.sleep(START_DELAY)
    try:
        extraction.populate(image.cache, image.path, image.offset, image.size, unsquashfs=image.unpacker,
                            root=False, checked=True)
        return 0
    except Exception:  # noqa: BLE001 - nobody to tell: the next run mounts the image with FUSE again
        return 1
    finally:
        _release(path, lock)


def remove_stale_locks(cache: str) -> list[str]:
    """Remove the background unpacking locks of `cache` that no live unpacking holds (`singpy cache clean`)."""
    from singpy.image import cache as extraction

    try:
        names = os.listdir(f"{cache}/{extraction.INDEX}")
    except OSError:
        return []
    stale = []
    for name in names:
        if name.startswith(".") and name.endswith(".warm"):
            lock = extraction.lock_file(f"{cache}/{extraction.INDEX}/{name}", wait=None, create=False)
            if lock is not None:
                stale.append(f"{cache}/{extraction.INDEX}/{name}")
                _release(stale[-1], lock)
    return stale

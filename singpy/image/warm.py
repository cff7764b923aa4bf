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
  Not when the cache's filesystem would be left too full (`room_problem`):
  FUSE then, every run, with a --verbose note.
* `start` (in squashfs.prepare, on the host before any namespace) takes the
  image's unpacking lock without waiting (`index/.KEY.warm`, KEY the file's
  identity as in the index: no hashing on the launcher's path). Got: a
  detached process (its own session, nice 19 and SCHED_IDLE, stdio on
  /dev/null, no other descriptor of the launcher but the lock and the read
  end of its go pipe) is forked now, on the host, but waits for the go: one
  byte that the launch writes right before the payload's execve
  (ProcessSpec.go_pipe, singpy.launch.process; the write end is close-on-exec,
  so the payload never holds it). A launch that fails (a user's error), is
  killed or exits never sends it: the pipe's end of file (every holder of the
  write end gone) or GO_TIMEOUT, and the process drops the lock and exits,
  having written nothing. After the go it runs `cache.populate` once the
  payload is past its start-up (START_DELAY) and the room is still there,
  with every rule of the cache (ownership checks, the tree renamed into place
  only when complete, a killed unpacking's temporary tree removed by the next
  one), and drops the lock when done. Busy: another run is unpacking it, so a
  burst of jobs starts one unpacking; this run mounts the image with FUSE, or,
  for a small image, waits for the lock (bounded: cachefiles.WAIT_RATE), then
  takes the tree (FUSE if the unpacking failed, never started or outlasted
  the wait). The unpacking unpacks the file the launch locked or nothing
  (`cache.populate`'s `key`: a file renamed over the path since is not it).
* A file whose unpacking failed (unsquashfs could not unpack all of it: a
  user can't make a device node outside /dev) is not hashed and unpacked
  again after every run: `index/.KEY.failed` marks it (keyed by its identity,
  so a new version of the image is tried), `plan` honours it, and
  `singpy cache clean` removes it (`remove_stale_locks`).

A cache that `cachefiles.check_owned` refuses (someone else's, writable by
others) is never used nor written: the run mounts the image with FUSE, as
without the directive. Only the user's own cache is ever read (the cache's
rules: the index link of the one form singpy writes, an entry owned by the user).
"""

from __future__ import annotations

import os

from singpy import console
from singpy.errors import ImageError
from singpy.plan import ImageSpec

TYPE_CHECKING = False  # see singpy.record: `typing` (and collections.abc) are not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

WAIT_LIMIT = 64 << 20  # squashfs bytes: an image up to this size being unpacked is waited for rather than mounted
# ... but never for longer than a slow unpacking of its size takes: cachefiles.wait_bound, shared with the extraction
# cache's own lock (the `extract` strategy's wait for an unpacking under way).
# The unpacking starts this long after the run that started it: unpacking beside a run's start-up (even at nice 19,
# SCHED_IDLE) made that first run ~45 ms slower on a loaded 2-core machine, a 0.15 s delay ~6 ms (docs/images.md).
START_DELAY = 0.2
# The longest wait for a launch's go: a launch takes well under a second, but a process that holds the write end and
# never execs a payload (an instance without a startscript) must not keep the lock, which small-image runs wait on.
GO_TIMEOUT = 30.0
# The disk guard (room_problem): an unpacked tree is assumed to take GROWTH bytes per byte of squashfs (root
# filesystems compress 2-3x with gzip, xz or zstd) plus a block per inode, and must leave a tenth of the cache's
# filesystem free, at most MARGIN_CAP (and a tenth of its inodes, where it counts them).
GROWTH = 3
MARGIN_SHARE = 10
MARGIN_CAP = 1 << 30
CACHED, BACKGROUND, OR_WAIT = "cached", "background", "background-or-wait"
PROCESS_NAME = "singpy-unpack"  # the detached unpacking's name (/proc/PID/comm)


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
    from singpy.host.cachefiles import filesystem_of

    if length >= extraction.LARGE_EXTRACTION and filesystem_of(cache) in extraction.NETWORK_FS_TYPES:
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
    if _failed_before(cache, image):
        console.verbose(f"not unpacking {image.path} in the background: an unpacking of this very file failed "
                        "before (`singpy cache clean` forgets it)")
        return image
    problem = room_problem(image, cache)
    if problem:
        console.verbose(f"not unpacking {image.path} in the background: {problem}")
        return image
    return image.replace(cache=cache, warm=OR_WAIT if length <= WAIT_LIMIT else BACKGROUND, unpacker=unpacker)


def shared(image: ImageSpec) -> ImageSpec:
    """`image` for a rank of a shared container (--sharens, a job step's ranks: singpy.launch.jobs): it never
    waits for an unpacking under way. The container is its holder's, mounted with FUSE or from the tree, and a
    rank that waited for the tree would only start later, into that same container (jobs.share_spec compares
    the two as one root)."""
    return image.replace(warm=BACKGROUND) if image.warm == OR_WAIT else image


def partition_length(image: ImageSpec) -> int:
    """The squashfs partition's size in bytes (a bare squashfs file: the file's)."""
    return image.size or max(os.stat(image.path).st_size - image.offset, 0)


def room_problem(image: ImageSpec, cache: str) -> str:
    """Why the unpacked image would leave the cache's filesystem too full (see GROWTH), or "" when it fits."""
    needed, inodes = _unpacked_estimate(image)
    where = cache
    while not os.path.exists(where) and where not in ("/", ""):
        where = os.path.dirname(where)
    try:
        disk = os.statvfs(where or "/")
    except OSError:
        return ""  # not known: the unpacking reports nothing anyway, and a full disk stops it (cache.populate)
    needed += inodes * disk.f_frsize
    free, size = disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize
    margin = min(size // MARGIN_SHARE, MARGIN_CAP)
    if free - needed < margin:
        return f"unpacked, it would take about {_mib(needed)} of the {_mib(free)} free in {where}, where " \
               f"{_mib(margin)} stay free (a tenth of its {_mib(size)} filesystem, at most 1 GiB)"
    if disk.f_files and disk.f_favail - inodes < disk.f_files // MARGIN_SHARE:
        return f"its {inodes} files would leave under a tenth of the inodes of {where} free"
    return ""


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _unpacked_estimate(image: ImageSpec) -> tuple[int, int]:
    """(bytes, inodes) the unpacked tree is assumed to need: the squashfs superblock's bytes_used times GROWTH,
    and its inode count (one read of 96 bytes: the inode table is not walked); a partition that is no squashfs
    4 superblock counts as its length, with no inodes."""
    length = partition_length(image)
    try:
        fd = os.open(image.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            block = os.pread(fd, 96, image.offset)
        finally:
            os.close(fd)
    except OSError:
        block = b""
    if len(block) < 96 or block[:4] != b"hsqs":
        return length * GROWTH, 0
    inodes = int.from_bytes(block[4:8], "little")
    used = min(int.from_bytes(block[40:48], "little"), length)  # a forged superblock can't claim more than is there
    return used * GROWTH, inodes


def lock_path(cache: str, image: ImageSpec, *, suffix: str = ".warm") -> str:
    """The lock held while this very file's partition is unpacked in the background (keyed as the index is);
    with `suffix` ".failed", the mark that its unpacking failed."""
    from singpy.image.cache import INDEX, index_key

    return f"{cache}/{INDEX}/.{index_key(image.path, image.offset, image.size)}{suffix}"


def _key(path: str) -> str:
    """The index key in a `lock_path`."""
    return os.path.basename(path)[1:].rsplit(".", 1)[0]


def _failed_before(cache: str, image: ImageSpec) -> bool:
    """Whether `_mark_failed` marked this very file (a regular file of the user's: the cache's rules)."""
    try:
        info = os.lstat(lock_path(cache, image, suffix=".failed"))
    except OSError:
        return False
    return info.st_mode & 0o170000 == 0o100000 and info.st_uid == os.geteuid()


def _mark_failed(cache: str, key: str, error: ImageError) -> None:
    """Mark the file of `key` as one unsquashfs could not unpack (`plan` then leaves it to FUSE): written as the
    cache's files are (cachefiles.publish: a random O_EXCL | O_NOFOLLOW name renamed; no link followed)."""
    from singpy.host.cachefiles import publish
    from singpy.image.cache import INDEX

    try:  # noqa: SIM105 - contextlib is not imported on the start-up path
        publish(f"{cache}/{INDEX}/.{key}.failed", f"{error.message}\n".encode(errors="replace"))
    except OSError:
        pass  # tried again next time


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
    console.verbose(f"unpacking {image.path} into the cache in the background, for later runs (once the "
                    f"container has started)")
    try:
        go = _spawn(image, path, lock)
    except OSError as error:  # no process (EAGAIN): FUSE this time, the lock dropped for the next run
        _release(path, lock)
        console.verbose(f"not unpacking the image in the background: {error.strerror}")
        return image
    os.close(lock)  # the unpacking process holds it now (flock belongs to the open file, which it shares)
    return image.replace(go_pipe=(go, os.fstat(go).st_ino))


def _release(path: str, lock: int) -> None:
    os.unlink(path)  # while locked: see cache.lock_file
    os.close(lock)


def _wait(image: ImageSpec, path: str) -> ImageSpec:
    """Another run is unpacking this small image: wait for it (flock, shared: every waiter gets it at once), for a
    bounded time (cachefiles.wait_bound)."""
    from singpy.host.cachefiles import locked_within, wait_bound
    from singpy.image import cache as extraction

    console.verbose(f"waiting for another singpy to finish unpacking {image.path}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        fd = -1  # done (or gone) already
    if fd >= 0:
        bound = wait_bound(partition_length(image))
        try:
            done = locked_within(fd, bound)
        finally:
            os.close(fd)
        if not done:
            console.verbose(f"the unpacking under way took over {bound:g} s: mounting the image with FUSE")
            return image
    tree = extraction.lookup(image.cache, image.path, image.offset, image.size, checked=True)
    if tree is None:
        console.verbose("the background unpacking left no tree: mounting the image with FUSE")
        return image
    return image.replace(strategy="extract", tool=image.unpacker, rootfs=tree, warm=CACHED)


def _spawn(image: ImageSpec, path: str, lock: int) -> int:
    """A detached process (double fork: never our child, never a zombie) that unpacks the image holding `lock`
    once the go comes; returns the write end of its go pipe (close-on-exec)."""
    wait_end, go_end = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()  # out of the terminal's session: no hangup, no job-control signal reaches it
                if os.fork() == 0:
                    _detach((lock, wait_end))  # our go_end closed: its end of file must mean the launch's end
                    code = _unpack(image, path, lock, wait_end)
                else:
                    code = 0
            finally:
                os._exit(code)
    except BaseException:
        os.close(go_end)
        raise
    finally:
        os.close(wait_end)
    os.waitpid(pid, 0)
    return go_end


def _detach(keep: tuple[int, ...]) -> None:
    """stdio on /dev/null, every other descriptor of the launcher closed (a caller's pipe must see its end), the
    lowest priority."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 1024)
    os.chdir("/")  # never holds the caller's directory busy (an unmount of a job's scratch)
    try:  # what `ps -o comm`, top and the suite's leftover checks show (its command line is still the launcher's)
        with open("/proc/self/comm", "w") as comm:
            comm.write(PROCESS_NAME)
    except OSError:
        pass
    try:  # best effort: where a host refuses them, the unpacking still runs, delayed (START_DELAY)
        os.nice(19)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # CPU time no one else wants (unsquashfs too)
    except OSError:
        pass


def _unpack(image: ImageSpec, path: str, lock: int, wait_end: int) -> int:
    """In the detached process: once the launch's go came, populate the cache (every rule of
    singpy.image.cache) from the very file the launch locked (`path`'s key); then drop the lock. No go: drop it at
    once, having written nothing. unsquashfs failed (not for want of room): that file is marked (`_mark_failed`)."""
    import time

    from singpy.image import cache as extraction
    from singpy.image.tools import ToolError

    try:
        if not _go_came(wait_end):
            return 1
        time.sleep(START_DELAY)
        if room_problem(image, image.cache):  # other unpackings may have filled the disk since the run planned it
            return 1
        extraction.populate(image.cache, image.path, image.offset, image.size, unsquashfs=image.unpacker,
                            root=False, checked=True, key=_key(path))
        return 0
    except ToolError as error:  # cache.populate turned a full disk's into a plain ImageError: not marked
        _mark_failed(image.cache, _key(path), error)
        return 1
    except Exception:  # noqa: BLE001 - nobody to tell: the next run mounts the image with FUSE again
        return 1
    finally:
        _release(path, lock)


def _go_came(wait_end: int) -> bool:
    """Whether the launch sent its go (ProcessSpec.go_pipe) within GO_TIMEOUT; end of file: it ended without."""
    import select

    poller = select.poll()
    poller.register(wait_end, select.POLLIN)
    try:
        if not poller.poll(int(GO_TIMEOUT * 1000)):
            return False
        return os.read(wait_end, 1) != b""  # its one byte
    finally:
        os.close(wait_end)


def remove_stale_locks(cache: str) -> list[str]:
    """Remove the background unpacking locks of `cache` that no live unpacking holds, and the marks of failed
    unpackings (`singpy cache clean`: a new unsquashfs may do better)."""
    from singpy.image import cache as extraction

    try:
        names = os.listdir(f"{cache}/{extraction.INDEX}")
    except OSError:
        return []
    stale = []
    for name in names:
        if name.startswith(".") and name.endswith(".failed"):
            try:  # unlink never follows a link
                os.unlink(f"{cache}/{extraction.INDEX}/{name}")
                stale.append(f"{cache}/{extraction.INDEX}/{name}")
            except OSError:
                pass
        elif name.startswith(".") and name.endswith(".warm"):
            lock = extraction.lock_file(f"{cache}/{extraction.INDEX}/{name}", wait=None, create=False)
            if lock is not None:
                stale.append(f"{cache}/{extraction.INDEX}/{name}")
                _release(stale[-1], lock)
    return stale

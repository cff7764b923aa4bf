"""Getting a root filesystem out of a squashfs (a SIF partition or a bare file).

Three strategies, tried in this order and chosen by `choose` before
anything is started ([1] sif.md section 13, after Apptainer and SingularityCE):

1. ``loop`` (root only): the kernel's squashfs driver on a loop device whose
   offset and size limit select the partition (`singpy.kernel.loop`),
   mounted inside the container's private mount namespace. Nothing runs
   beside the container, and the mount and the device go away with the
   namespace. An admin may turn it off (`allow kernel squashfs = no`, as in
   SingularityCE).
2. ``fuse`` (needs `squashfuse_ll` or `squashfuse`, and /dev/fuse readable and
   writable by the user): the launcher, holding CAP_SYS_ADMIN in its new
   user namespace, opens /dev/fuse and mounts a FUSE filesystem on it
   itself; squashfuse then serves that descriptor (mount point
   `/dev/fd/N`, libfuse >= 3.3), so it needs no privilege and no setuid
   fusermount, as Apptainer's starter does. squashfuse must stay alive as
   long as the container, so the launcher stays as its supervisor
   (`singpy.launch.process.supervise`). With `unsquash in background = yes`,
   a user's FUSE run also unpacks the image into the cache behind itself, and
   later runs take that tree as `extract` does (`singpy.image.warm`).
3. ``extract``: `unsquashfs` into the per-user cache (`singpy.image.cache`),
   reused by later runs; the tree is then used like a sandbox directory.
   Chosen with `--unsquash` or `unsquash = yes`, and whenever neither of
   the above is possible.

`attach` is called in the staging root (singpy.layers.rootfs), where the host is
at /oldroot, and returns the image root as seen from there.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.constants import FUSE_DEVICE
from singpy.errors import ImageError, KernelError
from singpy.kernel import loop
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs
from singpy.plan import ImageSpec

TYPE_CHECKING = False  # see singpy.record: `collections` is not loaded on a SIF launch (issue 31)
if TYPE_CHECKING:
    from collections.abc import Mapping

FUSE_TOOLS = ("squashfuse_ll", "squashfuse")  # the low-level one is faster (Apptainer prefers it too)
_MOUNT_FLAGS = k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV
_MAGIC = b"hsqs"  # a squashfs superblock's first bytes (little-endian)
# (path, offset) -> the image opened and checked by `choose` (loop, fuse), and its file's (st_dev, st_ino):
# `attach` mounts that very file (a loop device on it, squashfuse given /proc/self/fd/N), whatever its owner renamed
# over the path since.
_opened: dict[tuple[str, int], tuple[int, int, int]] = {}


def choose(image: ImageSpec, *, uid: int, unsquash: bool, allow_kernel: bool, env: Mapping[str, str],
           cache: str, user_namespace: bool = False, background: int | None = None) -> ImageSpec:
    """Pick how to get the root of a SIF or squashfs image; reported at --verbose.

    `user_namespace`: root will mount it inside a user namespace of its own
    (--fakeroot), where the kernel refuses squashfs (not mountable in a user
    namespace): FUSE or extraction then, as for a user. `background`: a
    user's FUSE run unpacks the image into the cache behind it, up to this
    many bytes (0: any), for later runs (`unsquash in background`,
    singpy.image.warm); None: never.
    """
    from singpy.image.tools import find_tool

    where = f"partition at offset {image.offset}, {image.size} bytes" if image.offset else "whole file"
    console.verbose(f"image {image.path}: {image.kind} ({where}{', ' + image.arch if image.arch else ''})")
    if unsquash:
        console.verbose("extracting the image, as asked (--unsquash or `unsquash = yes`)")
        return _extract(image, env, cache, fuse_missing=None)
    if uid == 0 and not user_namespace and allow_kernel and os.path.exists("/dev/loop-control"):
        console.verbose("mounting it with the kernel's squashfs on a loop device (running as root)")
        open_checked(image)
        return image.replace(strategy="loop")
    tool = next((path for name in FUSE_TOOLS if (path := find_tool(name, env))), None)
    usable = os.access(FUSE_DEVICE, os.R_OK | os.W_OK)
    if tool is not None and usable:
        image = image.replace(strategy="fuse", tool=tool)
        if background is not None and uid != 0:
            from singpy.image import warm

            image = warm.plan(image, cache=cache, limit=background, env=env)  # the tree unpacked, if there is one
        if image.strategy == "fuse":  # (a tree of the cache: the image itself is not opened)
            open_checked(image)
            console.verbose(f"mounting it with {os.path.basename(tool)} (FUSE)")
        return image
    why = "squashfuse is not installed" if tool is None else f"{FUSE_DEVICE} is not readable and writable by you"
    console.verbose(f"can't use FUSE ({why}): extracting the image into the cache instead")
    return _extract(image, env, cache, fuse_missing="tool" if tool is None else "device")


def open_checked(image: ImageSpec) -> None:
    """Open the image once, on the host, and check it there: a regular file with a squashfs at its offset.

    `attach` mounts this descriptor's file; whatever the path names by then
    (a link or another file swapped in by its owner) is never mounted.
    """
    try:
        fd = os.open(image.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as error:
        raise ImageError(f"can't open the image {image.path}: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        regular = info.st_mode & 0o170000 == 0o100000
        magic = os.pread(fd, len(_MAGIC), image.offset) if regular else b""
    except OSError as error:
        os.close(fd)
        raise ImageError(f"can't read the image {image.path}: {error.strerror}") from None
    if magic != _MAGIC:
        os.close(fd)
        raise ImageError(f"can't use the image {image.path}: " + (f"no squashfs at offset {image.offset}" if regular
                                                                  else "not a regular file"))
    _opened[(image.path, image.offset)] = (fd, info.st_dev, info.st_ino)


def checked_descriptor(image: ImageSpec) -> int:
    """The descriptor `choose` checked; should it be closed since (a shared container's holder closes the
    descriptors it does not know: singpy.launch.holder), the path opened again if it is still that file."""
    entry = _opened.get((image.path, image.offset))
    if entry is None:  # every loop or fuse plan went through choose: a bug, never the user's doing
        raise ImageError(f"can't mount the squashfs of {image.path}: it was not checked before the launch")
    _opened[(image.path, image.offset)] = entry = rootfs.checked_file(entry, image.path, os.O_RDONLY,
                                                                     f"squashfs of {image.path}")
    return entry[0]


def _extract(image: ImageSpec, env: Mapping[str, str], cache: str, *, fuse_missing: str | None) -> ImageSpec:
    """The `extract` strategy; `fuse_missing` says what FUSE lacked ("tool", "device"; None: extraction was asked)."""
    from singpy.image.tools import find_tool

    tool = find_tool("unsquashfs", env)
    if tool is None:
        raise _cannot_open(image, env, fuse_missing)
    return image.replace(strategy="extract", tool=tool, cache=cache)


def _cannot_open(image: ImageSpec, env: Mapping[str, str], fuse_missing: str | None) -> ImageError:
    """No unsquashfs, and FUSE not usable either: which program or device is missing, and its package."""
    from singpy.host import hostcheck
    from singpy.image.tools import find_tool

    extract = f"{hostcheck.package('unsquashfs')} to extract images"
    mount = f"{extract}, or {hostcheck.package('squashfuse')} to mount them"
    state = hostcheck.fuse_state(os.getuid()) if fuse_missing == "device" else None
    if state is not None:
        why = f"FUSE is not usable: {state[0]}, and unsquashfs is not installed (not found in PATH)"
        fix = f"{extract}, or make FUSE usable: {state[1]}"
    elif fuse_missing is None and any(find_tool(name, env) for name in FUSE_TOOLS):
        why = "extraction was asked for (--unsquash or `unsquash = yes`), but unsquashfs is not installed (not " \
              "found in PATH)"
        fix = extract
    else:
        why, fix = "squashfuse and unsquashfs are not installed (not found in PATH)", mount
    return ImageError(f"can't run {image.path}: no way to open a squashfs image here: {why}; {fix}",
                      hint=hostcheck.HINT)


def prepare(image: ImageSpec, *, root: bool) -> ImageSpec:
    """Called on the host, before any namespace: unpack into the cache (once) for `extract`; for a FUSE run
    planned to unpack in the background (singpy.image.warm), start it (or wait for the one under way). A tree of
    the cache is held in use for the container's life (`hold`)."""
    if image.warm in ("background", "background-or-wait"):
        from singpy.image import warm

        image = warm.start(image)  # FUSE, or the tree of the unpacking it waited for (warm "cached")
    if image.strategy != "extract":
        return image
    from singpy.image import cache

    tree = image.rootfs if image.warm else cache.lookup(image.cache, image.path, image.offset, image.size)
    if tree is not None and not image.warm:  # warm "cached" said it (singpy.image.warm)
        console.verbose(f"using the unpacked image from the cache: {tree}")
    for _ in range(3):  # a tree removed (`singpy cache clean`) before it is held is unpacked again
        if tree is None:
            tree = cache.populate(image.cache, image.path, image.offset, image.size, unsquashfs=image.tool,
                                  root=root)
        held = hold(image.cache, os.path.basename(tree))
        if held is not None:
            return image.replace(rootfs=tree, in_use=held)
        tree = None
    raise ImageError(f"can't run {image.path}: its unpacked tree in the cache {image.cache} was removed as it "
                     "started, again and again (`singpy cache clean`?)")


HOLD_WAIT = 2.0  # seconds a run waits for a removal's exclusive lock on a record (held across two calls)


def hold(cache: str, digest: str) -> tuple[int, int] | None:
    """A shared flock on the cache entry's record (singpy.image.cache.in_use_path), for a container run from its
    tree: (the descriptor, read-only and close-on-exec, and its file's inode), kept by the container's longest-lived
    process (ProcessSpec.in_use: the payload, a supervisor) so that `singpy cache clean` leaves the tree alone.
    None: the entry is gone (removed since it was looked up); (-1, 0): no lock could be had (the run goes on,
    unprotected: a record removed by hand).

    Its cost on the launch path: an open, a flock, an fstat and a stat.
    """
    import fcntl

    from singpy.image.cache import ROOTFS, in_use_path

    entry, path = f"{cache}/{ROOTFS}/{digest}", in_use_path(cache, digest)
    for _ in range(3):  # a removal unlinks the record under its exclusive lock: one opened just before is stale
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY)
        except OSError as error:
            return _unheld(entry, error) if os.path.isdir(entry) else None  # else removed since it was looked up
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # a removal has it: wait for it (bounded); the tree is most likely gone then
            from singpy.host.cachefiles import locked_within

            if not locked_within(fd, HOLD_WAIT):
                os.close(fd)
                return None
        except OSError as error:  # no locks on this filesystem (ENOLCK)
            os.close(fd)
            return _unheld(entry, error)
        info = os.fstat(fd)
        if info.st_nlink and os.path.isdir(entry):
            return fd, info.st_ino
        os.close(fd)
        if info.st_nlink:  # our lock is on the live record, and the tree is gone
            return None
    return None


def _unheld(entry: str, error: OSError) -> tuple[int, int]:
    console.verbose(f"can't mark {entry} in use, `singpy cache clean` could remove it: {error.strerror}")
    return -1, 0


def attach(image: ImageSpec, uid: int, gid: int) -> tuple[str, tuple[int, ...]]:
    """Mount a `loop` or `fuse` image on IMAGE: (its path, pids of the helpers serving it).

    Called in the staging root, holding CAP_SYS_ADMIN over the mount
    namespace; everything it needs is imported already (the package is out
    of reach there).
    """
    os.mkdir(rootfs.IMAGE)
    try:
        if image.strategy == "loop":
            _mount_loop(image)
            return rootfs.IMAGE, ()
        return rootfs.IMAGE, (_mount_fuse(image, uid, gid),)
    finally:  # the loop device, or squashfuse's copy, holds the file now
        release_checked(image)


def release_checked(image: ImageSpec) -> None:
    """Close the descriptor `open_checked` left for `image` (once it is mounted, or the mount failed)."""
    entry = _opened.pop((image.path, image.offset), None)
    if entry is not None and rootfs.is_file(*entry):
        os.close(entry[0])


def _mount_loop(image: ImageSpec) -> None:
    fd, device = loop.attach(rootfs.host_path(image.path), image.offset, image.size,
                             dev=rootfs.host_path("/dev"), backing_fd=checked_descriptor(image))
    try:
        console.verbose(f"mounting {device} (offset {image.offset}) as squashfs")
        try:
            k.mount(device, rootfs.IMAGE, "squashfs", _MOUNT_FLAGS)
        except KernelError as error:
            raise ImageError(f"can't mount the squashfs of {image.path}: {error.reason}",
                             hint="the image may be corrupt: check it with `singpy inspect --list`") from None
    finally:
        os.close(fd)  # with autoclear, the mount now holds the device alone


def _mount_fuse(image: ImageSpec, uid: int, gid: int) -> int:
    """Mount FUSE on IMAGE and start squashfuse serving it; return squashfuse's pid."""
    checked = checked_descriptor(image)
    fd = rootfs.mount_fuse(rootfs.IMAGE, "squashfuse", f"fuse.{os.path.basename(image.tool)}", _MOUNT_FLAGS,
                           uid=uid, gid=gid, what=image.path, hint="run with --unsquash to extract the image instead")
    try:
        # squashfuse opens the checked descriptor (/proc/self/fd/N, as Apptainer hands it over: a host's /dev
        # may lack the /dev/fd link), that file, not what the path names now; the last argument is libfuse's
        # "/dev/fd/N" (a mounted descriptor), a name it parses, never opens.
        argv = [image.tool, "-f", "-o", f"offset={image.offset}", f"/proc/self/fd/{checked}", f"/dev/fd/{fd}"]
        os.set_inheritable(checked, True)  # only across this fork: the payload must not get it
        try:
            pid, errors = process.spawn_helper(argv, root=rootfs.HOST, keep_fd=fd,
                                               quiet=console.level() < console.DEBUG)
        finally:
            os.set_inheritable(checked, False)
    finally:
        # Ours must go before we touch the mount: if squashfuse fails, the kernel then aborts
        # the connection (ENOTCONN) instead of leaving our first access waiting forever.
        os.close(fd)
    try:
        os.stat(rootfs.IMAGE)
    except OSError as error:
        reason = process.helper_failure(pid, errors) or error.strerror
        raise ImageError(f"can't mount the squashfs of {image.path} with {os.path.basename(image.tool)}: "
                         f"{reason}") from None
    # `errors` stays open, unread, for the supervisor's lifetime: closed, a later message
    # from squashfuse would kill it with SIGPIPE.
    return pid

"""Mounting an ext3 overlay image (a file, or a SIF's overlay partition) for the container.

Also a Singularity 2.x ext3 image as the container's root (`choose_root`,
`attach_root` at the end): the same strategies, on IMAGE.

The image holds Apptainer's layout, `upper/` and `work/` at its top (see
singpy.image.overlaycreate). `choose` (on the host, before any namespace)
checks the filesystem and picks one of two strategies; `attach` (in the
staging root, singpy.layers.rootfs) mounts it at /scratch/overlayN:

1. ``loop`` (root without a user namespace): the kernel's ext3 on a loop
   device limited to the filesystem's bytes (`singpy.kernel.loop`),
   read-write unless the overlay is `:ro`. Nothing runs beside the
   container; mount and device go with its mount namespace.
2. ``fuse`` (a user, or root with --fakeroot: the kernel mounts no ext3 in a
   user namespace): fuse2fs, as Apptainer does, with `fakeroot` for a user
   (its own permission checks are then the kernel's alone) and
   `allow_other`. fuse2fs 1.47 is built on libfuse 2, which can't serve a
   FUSE descriptor mounted beforehand (`/dev/fd/N` needs libfuse >= 3.3), so
   fuse2fs mounts it itself: it needs CAP_SYS_ADMIN in our user namespace,
   given to it as an ambient capability when the user is not root there, and
   it runs chrooted in the host tree, its mount then moved to ours.
   It is a helper supervised until the container ends, then stopped with
   SIGTERM (also if the launcher dies): it writes the image's bitmaps and
   superblock only when it exits. The launcher holds its mount until then
   (`process.hold_mount`), so that it never begins that exit on its own.

A writable image is locked (an open file description lock on its bytes,
`F_OFD_SETLK`) while a container uses it, so that a second container can't
write it at the same time; a read-only use takes a shared lock. The lock
is taken in `choose`, on the host: one FATAL line before anything starts.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import time
from collections.abc import Mapping

from singpy import console
from singpy.constants import FUSE_DEVICE
from singpy.errors import ImageError, KernelError
from singpy.kernel import loop
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs
from singpy.plan import ImageSpec, OverlaySpec

FUSE_TOOL = "fuse2fs"
FUSE_HINT = "install fuse2fs (Debian, Ubuntu: package fuse2fs; RHEL, Fedora: e2fsprogs or fuse2fs)"
CAP_SYS_ADMIN = 21
MOUNT_TIMEOUT = 10.0  # seconds fuse2fs gets to mount (Apptainer's limit)
_SHADOWED = ("tmp", "mnt", "media", "run")  # host directories over one of which fuse2fs's mount point is made

# The superblock starts 1024 bytes into the filesystem: magic at 56, features at 92 (compat, incompat, ro_compat).
_SUPERBLOCK = 1024
_MAGIC = b"\x53\xef"
_FEATURES = struct.Struct("<III")
_COMPAT_HAS_JOURNAL = 0x4
_INCOMPAT_EXT3 = 0x2 | 0x4 | 0x10  # filetype, needs recovery, meta_bg: what ext3 may have (Apptainer's check)
_ROCOMPAT_EXT3 = 0x1 | 0x2 | 0x4  # sparse_super, large_file, btree_dir
_MOUNT_FLAGS = k.MS_NOSUID | k.MS_NODEV
_F_OFD_SETLK = 37  # fcntl.h; Python's fcntl module has the constant from 3.12 only

_locks: list[int] = []  # descriptors holding the image locks, open as long as the launcher (or its exec) lives
# (path, offset) -> the descriptor `choose` checked and locked, and its file's (st_dev, st_ino): `attach` mounts
# that very file (a loop device on it, fuse2fs given /dev/fd/N), whatever its owner renamed over the path since.
_checked: dict[tuple[str, int], tuple[int, int, int]] = {}


def choose(spec: OverlaySpec, *, uid: int, user_namespace: bool, env: Mapping[str, str],
           allow_kernel: bool = True) -> OverlaySpec:
    """Check the image and pick how to mount it; raises ImageError when it can't be used here.

    `allow_kernel`: `allow kernel extfs` (SingularityCE's directive): no makes root use fuse2fs too."""
    from singpy.image.tools import find_tool

    fd = _open_checked(spec)
    _lock(fd, spec)
    if _kernel_ext3(uid, user_namespace, allow_kernel):
        console.verbose(f"overlay image {spec.path}: kernel ext3 on a loop device (running as root)")
        return spec.replace(strategy="loop")
    tool = find_tool(FUSE_TOOL, env)
    if tool is None:
        raise ImageError(f"can't use the overlay image {spec.path}: fuse2fs is not installed (it mounts ext3 "
                         "images without root)", hint=FUSE_HINT)
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        raise ImageError(f"can't use the overlay image {spec.path}: FUSE is not usable ({FUSE_DEVICE} is not "
                         "readable and writable by you)",
                         hint="ask the administrator to make /dev/fuse usable by users (mode 0666), or use an "
                         "overlay directory instead")
    console.verbose(f"overlay image {spec.path}: mounting it with {tool} (FUSE)")
    return spec.replace(strategy="fuse", tool=tool)


def _open_checked(spec: OverlaySpec, what: str = "") -> int:
    """The image opened as it will be used (read-write unless :ro), its superblock checked: ext3."""
    what = what or f"overlay image {spec.path}"
    flags = (os.O_RDONLY if spec.readonly else os.O_RDWR) | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(spec.path, flags)
    except OSError as error:
        hint = f"use {spec.path}:ro for a read-only overlay" if error.errno == 13 and not spec.readonly else None
        raise ImageError(f"can't open the {what}: {error.strerror}", hint=hint) from None
    try:
        info = os.fstat(fd)
        if not (info.st_mode & 0o170000 == 0o100000):
            raise ImageError(f"{what} is not a regular file")
        end = spec.offset + spec.size if spec.size else info.st_size
        block = os.pread(fd, 1024, spec.offset + _SUPERBLOCK) if end <= info.st_size else b""
    except OSError as error:
        os.close(fd)
        raise ImageError(f"can't read the {what}: {error.strerror}") from None
    except ImageError:
        os.close(fd)
        raise
    if len(block) < 1024 or block[56:58] != _MAGIC:
        os.close(fd)
        raise ImageError(f"{what} is not an ext3 filesystem (no ext2/3/4 superblock)",
                         hint="make one with `singpy overlay create FILE.img`")
    compat, incompat, rocompat = _FEATURES.unpack_from(block, 92)
    if not compat & _COMPAT_HAS_JOURNAL or incompat & ~_INCOMPAT_EXT3 or rocompat & ~_ROCOMPAT_EXT3:
        os.close(fd)
        raise ImageError(f"{what} is not a valid ext3 image (ext2 or ext4 features)",
                         hint="make one with `singpy overlay create FILE.img`")
    return fd


def _lock(fd: int, spec: OverlaySpec, what: str = "") -> None:
    """Lock the filesystem's bytes, exclusively when writable (Apptainer's `lockSection`); kept till exit.

    Apptainer takes the same byte-range locks (classic POSIX ones, which
    conflict with these), so an Apptainer container and a singpy one can't
    write one image at once either.
    """
    kind = fcntl.F_RDLCK if spec.readonly else fcntl.F_WRLCK
    what = what or f"overlay image {spec.path}"
    # struct flock: type, whence (short), start, len (off_t), pid (int), padding.
    request = struct.pack("hhqqi4x", kind, os.SEEK_SET, spec.offset, spec.size, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, request)
    except OSError as error:
        os.close(fd)
        if error.errno in (11, 13):  # EAGAIN, EACCES: held by another process
            usage = "writing" if not spec.readonly else "reading"
            raise ImageError(f"can't open the {what} for {usage}: it is in use for writing by another "
                             "container" if spec.readonly else
                             f"can't open the {what} for {usage}: it is in use by another container") from None
        if error.errno != 37:  # ENOLCK: a filesystem without locks; Apptainer goes on (a verbose note)
            raise ImageError(f"can't lock the {what}: {error.strerror}") from None
        console.verbose(f"can't lock {spec.path} (no locks on its filesystem): two containers must not write it "
                        "at once")
    os.set_inheritable(fd, True)  # the lock lasts as long as this descriptor: into the container, until it ends
    _locks.append(fd)
    info = os.fstat(fd)
    _checked[(spec.path, spec.offset)] = (fd, info.st_dev, info.st_ino)


def _checked_descriptor(spec: OverlaySpec, what: str) -> int:
    """The descriptor `choose` (or `choose_root`) checked and locked for this image.

    A shared container's holder closes the descriptors it does not know
    (singpy.launch.holder): then the path is opened again, and used only if
    it is still the file checked. Not locked again: the launch that forked
    the holder holds the lock (a second one, on a new open file, would
    conflict with it).
    """
    entry = _checked.get((spec.path, spec.offset))
    if entry is None:  # every plan with an ext3 layer went through choose: a bug, never the user's doing
        raise ImageError(f"can't mount the {what}: it was not checked before the launch")
    flags = os.O_RDONLY if spec.readonly else os.O_RDWR
    _checked[(spec.path, spec.offset)] = entry = rootfs.checked_file(entry, spec.path, flags, what)
    return entry[0]


def attach(spec: OverlaySpec, index: int, uid: int, gid: int) -> tuple[str, int | None]:
    """Mount the image at /scratch/overlayINDEX: (that path, the pid of fuse2fs serving it, or None).

    Called in the staging root, holding CAP_SYS_ADMIN over the mount
    namespace; everything it needs is imported already (the package is out
    of reach there).
    """
    target = f"{rootfs.SCRATCH}/overlay{index}"
    os.mkdir(target)
    if spec.strategy == "loop":
        _mount_loop(spec, target)
        return target, None
    return target, _mount_fuse(spec, target, f"overlay{index}", uid)


def _mount_loop(spec: OverlaySpec, target: str, what: str = "") -> None:
    what = what or f"overlay image {spec.path}"
    fd, device = loop.attach(rootfs.host_path(spec.path), spec.offset, spec.size, dev=rootfs.host_path("/dev"),
                             writable=not spec.readonly, backing_fd=_checked_descriptor(spec, what))
    try:
        console.verbose(f"mounting {device} (offset {spec.offset}) as ext3 on {target}")
        flags = _MOUNT_FLAGS | (k.MS_RDONLY if spec.readonly else 0)
        try:
            k.mount(device, target, "ext3", flags)
        except KernelError as error:
            raise ImageError(f"can't mount the {what}: {error.reason}",
                             hint="the image may be corrupt: check it with `e2fsck -f`") from None
    finally:
        os.close(fd)  # with autoclear, the mount now holds the device alone


def _mount_fuse(spec: OverlaySpec, target: str, name: str, uid: int, what: str = "") -> int:
    """Start fuse2fs mounting the image itself, move the mount to `target`; return fuse2fs's pid.

    fuse2fs runs chrooted in the host tree, as squashfuse does (it finds its
    libraries there, even after the pivots: a process whose root is the
    staging root would be moved into the container's by pivot_root). Its
    mount point must then be in that tree: a directory of a small tmpfs put
    over a host directory (/tmp) in our mount namespace only, for the time of
    the mount; the image is handed over as a descriptor (/dev/fd/N), since
    its path may be under that directory, and it is the descriptor `choose`
    checked: fuse2fs's open of /dev/fd/N reaches that file, whatever the
    path names now.
    """
    what = what or f"overlay image {spec.path}"
    image = _checked_descriptor(spec, what)  # stays open: it holds the lock
    shadowed = _shadow()
    try:
        inside = f"/{os.path.relpath(shadowed, rootfs.HOST)}/{name}"  # the mount point fuse2fs sees
        os.mkdir(rootfs.HOST + inside)
        pid, errors = _start_fuse2fs(spec, image, inside, uid)
        _wait_mounted(what, rootfs.HOST + inside, pid, errors)
        k.mount(rootfs.HOST + inside, target, None, k.MS_MOVE)
        process.hold_mount(pid, target)
    finally:
        k.umount(shadowed, k.MNT_DETACH)
    return pid


def _shadow() -> str:
    """A tmpfs over the first real directory of _SHADOWED in the host tree (our mount namespace only)."""
    for name in _SHADOWED:
        path = f"{rootfs.HOST}/{name}"
        if os.path.isdir(path) and not os.path.islink(path):
            k.mount("singpy-fuse2fs", path, "tmpfs", k.MS_NOSUID | k.MS_NODEV, "mode=0755,size=64k")
            return path
    raise ImageError("can't mount an overlay image with fuse2fs: the host has none of "
                     + ", ".join(f"/{name}" for name in _SHADOWED))


def _start_fuse2fs(spec: OverlaySpec, image: int, mount_point: str, uid: int) -> tuple[int, int]:
    options = ["allow_other"]
    if spec.readonly:
        options.append("ro")
    if uid != 0:
        options.append("fakeroot")  # Apptainer's: it bypasses fuse2fs's own checks, the kernel's remain
    if spec.offset:
        options.append(f"offset={spec.offset}")
    # -s: single-threaded; threaded fuse2fs 1.47 was seen to hang for good under fuse-overlayfs (--fakeroot)
    argv = [spec.tool, "-f", "-s", "-o", ",".join(options), f"/dev/fd/{image}", mount_point]
    console.debug(f"running {argv} in {rootfs.HOST}")
    # A user who is not root in our user namespace would lose CAP_SYS_ADMIN at execve, and fuse2fs needs it to mount.
    inheritable = k.raise_ambient(CAP_SYS_ADMIN) if os.geteuid() != 0 else None
    try:
        # `errors` stays open, unread, for the supervisor's lifetime: closed, a later message
        # from fuse2fs would kill it with SIGPIPE.
        return process.spawn_helper(argv, root=rootfs.HOST, keep_fd=image, quiet=console.level() < console.DEBUG,
                                    death_signal=signal.SIGTERM)
    finally:
        if inheritable is not None:
            k.clear_ambient(inheritable)  # the payload, exec'd later, must not keep it


def _wait_mounted(what: str, mount_point: str, pid: int, errors: int) -> None:
    base = os.stat(os.path.dirname(mount_point)).st_dev
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while os.stat(mount_point).st_dev == base:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            reason = process.helper_failure(pid, errors) or "fuse2fs exited"
            raise ImageError(f"can't mount the {what} with fuse2fs: {reason}",
                             hint="the image may be corrupt: check it with `e2fsck -f`")
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            reason = process.helper_failure(pid, errors)
            raise ImageError(f"can't mount the {what}: fuse2fs did not mount it in "
                             f"{MOUNT_TIMEOUT:.0f} s" + (f" ({reason})" if reason else ""))
        time.sleep(0.002)


# --- a Singularity 2.x ext3 image (`.img`) as the container's root ------------------------------------------------
# Mounted as an overlay image is, by the same strategies, on IMAGE instead of SCRATCH/overlayN;
# singpy.launch.launch then uses it as it uses a mounted squashfs.
# Read-only, unless --writable (Apptainer writes such images in place).


def choose_root(image: ImageSpec, *, uid: int, user_namespace: bool, writable: bool,
                env: Mapping[str, str], allow_kernel: bool = True) -> ImageSpec:
    """Check and lock the image (shared, exclusive with --writable), and pick how to mount it: loop or fuse."""
    from singpy.image.tools import find_tool

    layer, what = _root_layer(image, writable), _root_what(image)
    _lock(_open_checked(layer, what), layer, what)
    where = f"filesystem at offset {image.offset}, after its launch line" if image.offset else "whole file"
    console.verbose(f"image {image.path}: Singularity 2.x ext3 image ({where}, {image.size} bytes)"
                    f"{', read-write (--writable)' if writable else ''}")
    if _kernel_ext3(uid, user_namespace, allow_kernel):
        console.verbose("mounting it with the kernel's ext3 on a loop device (running as root)")
        return image.replace(strategy="loop")
    tool = find_tool(FUSE_TOOL, env)
    usable = os.access(FUSE_DEVICE, os.R_OK | os.W_OK)
    if tool is None or not usable:
        from singpy.host import hostcheck

        state = None if usable else hostcheck.fuse_state(os.getuid())
        why, fix = (("fuse2fs is not installed (not found in PATH)", hostcheck.package(FUSE_TOOL)) if tool is None
                    else (f"FUSE is not usable: {state[0]}", state[1]) if state is not None
                    else (f"FUSE is not usable: {FUSE_DEVICE} is not readable and writable by you",
                          "an administrator can make it 0666"))
        raise ImageError(f"can't run {image.path}: without root, singpy mounts an ext3 image (Singularity 2.x) with "
                         f"fuse2fs, and {why}; {fix}, or run it as root (--unsquash extracts squashfs images only)",
                         hint=_convert_hint(image))
    console.verbose(f"mounting it with {tool} (FUSE)")
    return image.replace(strategy="fuse", tool=tool)


def _kernel_ext3(uid: int, user_namespace: bool, allow_kernel: bool) -> bool:
    """Whether the kernel's ext3 on a loop device mounts the image: root outside a user namespace, allowed."""
    if uid != 0 or user_namespace or not os.path.exists("/dev/loop-control"):
        return False
    if not allow_kernel:
        console.verbose("`allow kernel extfs = no` in the configuration: fuse2fs, as for a user")
    return allow_kernel


def _convert_hint(image: ImageSpec) -> str:
    """How a user makes a SIF of it without FUSE: debugfs reads the filesystem from the file (no mount, no root)."""
    source = f"{image.path}?offset={image.offset}" if image.offset else image.path
    return (f"to make a SIF of it without root: `mkdir DIR && debugfs -R 'rdump / DIR' '{source}'`, then "
            "`singpy build new.sif DIR`")


def attach_root(image: ImageSpec, uid: int, *, writable: bool) -> tuple[str, tuple[int, ...]]:
    """Mount the image on IMAGE: (that path, the pid of fuse2fs serving it, if any), as `attach` does a layer.

    Called in the staging root, holding CAP_SYS_ADMIN over the mount
    namespace; everything it needs is imported already.
    """
    layer, what = _root_layer(image, writable), _root_what(image)
    os.mkdir(rootfs.IMAGE)
    if image.strategy == "loop":
        _mount_loop(layer, rootfs.IMAGE, what)
        return rootfs.IMAGE, ()
    return rootfs.IMAGE, (_mount_fuse(layer, rootfs.IMAGE, "image", uid, what),)


def _root_layer(image: ImageSpec, writable: bool) -> OverlaySpec:
    """The image described as the overlay image the strategies above mount (the same bytes, the same tools)."""
    return OverlaySpec(path=image.path, kind="extfs", readonly=not writable, offset=image.offset, size=image.size,
                       strategy=image.strategy, tool=image.tool)


def _root_what(image: ImageSpec) -> str:
    return f"ext3 image {image.path}"

"""The underlay: the mount points an image lacks, added without an overlay.

Apptainer's answer to kernels that mount no overlayfs in a user namespace
(before Linux 5.11, `userxattr` unknown) or to `enable overlay = no`
([1] apptainer internal/pkg/runtime/engine/apptainer/container_linux.go,
addRootfsMount / underlay): the container's root is a tmpfs holding, for
each entry of the image's root, an entry of the same kind with the image's
own bound on it (a directory on a directory, a file on an empty file; a
symbolic link is copied as a link, never followed on the host), and the
missing mount points beside them. A missing point deeper down (/home/alice
where the image has /home) makes that directory a tmpfs level of its own,
built the same way; what lies below a missing directory (/data/x/y) is made
in the level holding it.

Called in the staging root (singpy.layers.rootfs.mount_image) on NEWROOT, before
the plan's mounts. Every directory of the image is reached through its
`Tree` (links followed inside the image only: singpy.mounts.rootpath) and
every entry is opened O_PATH | O_NOFOLLOW relative to it; a bind's source is
that descriptor (/proc/self/fd/N), so nothing is resolved on the host. The
levels are tmpfs of this launch, so plain paths are safe there. Each bind
is made read-only, nosuid and nodev as the image is bound, and each level is
remounted so once it is complete: nothing in the container's root can be
written, as with the overlay of mount points.

Imported only when used (singpy.layers.rootfs.load_underlay): a plain run never
pays for it.
"""

from __future__ import annotations

import os
import stat

from singpy import console
from singpy.errors import ImageError, PathError
from singpy.kernel import syscalls as k
from singpy.layers.staging import NEWROOT, remount
from singpy.mounts.rootpath import Tree

_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_IMAGE_FLAGS = k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV  # as the image itself is bound (singpy.layers.rootfs)
_OVERFLOW_ID = 65534


class _Node:
    """A path below a level: the mount points the image lacks, as a tree of names."""

    __slots__ = ("children", "is_dir")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.is_dir = True  # a leaf's kind (a file bind needs a file); a node with children is a directory

    def add(self, parts: list[str], is_dir: bool) -> None:
        node = self
        for part in parts:
            node = node.children.setdefault(part, _Node())
        node.is_dir = is_dir


def mount_root(image: Tree, mount_points: list[tuple[str, bool]]) -> None:
    """The image on NEWROOT as an underlay holding `mount_points` (paths below the root, resolved in the image)."""
    root = _Node()
    for relative, is_dir in mount_points:
        root.add([part for part in relative.split("/") if part], is_dir)
    console.verbose("mount points the image lacks: in an underlay (the image's entries bound in tmpfs levels)")
    _level(image, "", NEWROOT, root)


def _level(image: Tree, relative: str, target: str, node: _Node) -> None:
    """Image directory `relative` (no link in it) as a tmpfs on `target`: its entries bound, the missing ones made."""
    found = image.lookup(relative or "/")
    if found.fd is None or not stat.S_ISDIR(os.fstat(found.fd).st_mode):
        if found.fd is not None:
            os.close(found.fd)
        raise ImageError(f"can't build the underlay: /{relative} is no longer a directory of the image")
    directory = found.fd
    try:
        info = os.fstat(directory)
        k.mount("singpy-underlay", target, "tmpfs", k.MS_NOSUID | k.MS_NODEV,
                f"mode={stat.S_IMODE(info.st_mode):o}", shown=f"/{relative}")
        _own(target, info, image.proc)
        names = _names(directory, image.proc, relative)
        for name in names:
            child = node.children.get(name)
            path = f"{target}/{name}"
            shown = f"/{relative}/{name}" if relative else f"/{name}"
            if child is not None and child.children and _is_dir(directory, name):
                os.mkdir(path)
                _level(image, f"{relative}/{name}" if relative else name, path, child)
            else:
                _entry(directory, name, path, shown, image.proc)
        for name, child in node.children.items():
            if name not in names:
                _make(f"{target}/{name}", child)
        remount(target, _IMAGE_FLAGS, shown=f"/{relative}")
    finally:
        os.close(directory)


def _names(directory: int, proc: str, relative: str) -> list[str]:
    try:
        handle = os.open(k.fd_path(directory, proc), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise PathError(f"can't list /{relative} of the image: {error.strerror}") from None
    try:
        return sorted(os.listdir(handle))
    finally:
        os.close(handle)


def _is_dir(directory: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _own(path: str, info: os.stat_result, proc: str) -> None:
    """The level gets the owner of the image's directory where it is mapped here; else it stays the user's
    (root inside with --fakeroot), as the overlay's layer of mount points is."""
    if _overflow_id(proc) in (info.st_uid, info.st_gid):
        return  # unmapped: the kernel shows "nobody", which --fakeroot's ranges may map to a real id
    try:  # (no contextlib: after the first pivot only modules already loaded can be imported)
        os.chown(path, info.st_uid, info.st_gid)
    except OSError:
        return  # an id not mapped in the user namespace


def _overflow_id(proc: str) -> int:
    """The id the kernel shows for an unmapped one (/proc/sys/kernel/overflowuid, 65534 by default)."""
    try:
        with open(f"{proc}/sys/kernel/overflowuid", "rb") as handle:
            return int(handle.read().strip() or _OVERFLOW_ID)
    except (OSError, ValueError):
        return _OVERFLOW_ID


def _entry(directory: int, name: str, path: str, shown: str, proc: str) -> None:
    """One entry of the image on `path`: a link copied, anything else bound read-only on its own kind."""
    try:
        source = os.open(name, _OPEN, dir_fd=directory)
    except FileNotFoundError:
        return  # gone meanwhile (a sandbox being changed)
    except OSError as error:
        raise PathError(f"can't open {shown} in the image: {error.strerror}") from None
    try:
        mode = os.fstat(source).st_mode  # the descriptor's own type: what is bound is what was checked
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink("", dir_fd=source), path)
            return
        if stat.S_ISDIR(mode):
            os.mkdir(path)
        else:  # a file, or a FIFO, socket or device node: bound on an empty file (nodev, as the image is)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        k.mount(k.fd_path(source, proc), path, None, k.MS_BIND | k.MS_REC, shown=shown)
        remount(path, _IMAGE_FLAGS, shown=shown)
    finally:
        os.close(source)


def _make(path: str, node: _Node) -> None:
    """A mount point the image lacks, and what the plan mounts below it, in a level (ours: a tmpfs)."""
    if node.children or node.is_dir:
        os.mkdir(path)
        os.chmod(path, 0o755)  # whatever the user's umask, as a directory of the overlay's layer
        for name, child in node.children.items():
            _make(f"{path}/{name}", child)
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        os.chmod(path, 0o644)

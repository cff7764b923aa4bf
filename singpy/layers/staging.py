"""The staging root's paths and `remount`: what every way of mounting the image shares.

Below singpy.layers.rootfs (which re-exports them), singpy.layers.underlay
and singpy.layers.overlayfs, so that rootfs may pick the underlay without a
cycle. Imports only the kernel layer.
"""

from __future__ import annotations

import os

from singpy.kernel import syscalls as k

STAGE = "/tmp"  # where the staging tmpfs is mounted before the first pivot
HOST = "/oldroot"  # the host's root, seen from the staging root
NEWROOT = "/newroot"  # the container's root, seen from the staging root
SCRATCH = "/scratch"  # launcher files and overlay layers
IMAGE = "/image"  # mount point of a squashfs image (loop or FUSE), see singpy.image.squashfs
PROC = HOST + "/proc"  # the host's procfs, seen from the staging root (for /proc/self/fd/N)


def remount(target: str, flags: int, *, shown: str | None = None, clear: int = 0) -> None:
    """Add `flags` to the bind mount at `target`, keeping the flags it already has, but for `clear`.

    Inside a user namespace the kernel refuses a remount that would clear a
    flag locked by a more privileged namespace (nosuid, nodev, noexec, atime),
    so the current flags are read back and kept. `clear` (MS_NOSUID, for
    --allow-setuid: root, in no user namespace, where nothing is locked) is
    taken off. `shown` names a descriptor's path (k.fd_path) in messages.
    """
    current = _mount_flags(target)
    if current & flags == flags and not current & clear:
        return
    k.mount(None, target, None, k.MS_REMOUNT | k.MS_BIND | (current & ~clear) | flags, shown=shown)


def allow_setuid(target: str, *, mount_setattr: bool) -> None:
    """Clear nosuid on the mount at `target` and on every mount below it (--allow-setuid: the image's root and
    its layers, before any other mount; singpy.launch.setuid): one mount_setattr(2), else a remount of each."""
    if mount_setattr and k.clear_nosuid_tree(target):
        return
    from singpy.kernel.mountinfo import mount_points  # loaded before the pivot, by singpy.launch.setuid

    for point in mount_points(PROC):
        if point == target or point.startswith(target + "/"):
            remount(point, 0, clear=k.MS_NOSUID)


_STATVFS_TO_MS = ((os.ST_RDONLY, k.MS_RDONLY), (os.ST_NOSUID, k.MS_NOSUID), (os.ST_NODEV, k.MS_NODEV),
                  (os.ST_NOEXEC, k.MS_NOEXEC), (os.ST_NOATIME, k.MS_NOATIME),
                  (os.ST_NODIRATIME, k.MS_NODIRATIME), (os.ST_RELATIME, k.MS_RELATIME))


def _mount_flags(target: str) -> int:
    flags = os.statvfs(target).f_flag
    return sum(ms for st, ms in _STATVFS_TO_MS if flags & st)

"""The container root: a staging root, the image mounted on it, the final pivot.

The pivot_root dance, as bubblewrap does it ([1] bubblewrap.c, setup_newroot
and the two pivots; [2] man 2 pivot_root, "pivot_root(".", ".")"):

1. In the new mount namespace every mount is made a slave of the host's (or
   private, `mount slave = no`), so nothing we do propagates back to the host,
   while what the host mounts later (an automounted home or project
   directory) still shows up inside, as with Apptainer's `mount slave = yes`.
2. A tmpfs is mounted on /tmp and becomes the root (first pivot); the host
   tree is now at /oldroot, untouched by the tmpfs. The tmpfs holds the
   mount point of the container root (/newroot) and the launcher's scratch
   files (passwd, overlay layers): they live in memory in a namespace that
   dies with the container, so nothing is ever left behind on the host.
3. A squashfs image, if that is what we run, is mounted on /image (see
   singpy.image.squashfs); a directory image stays where it is, under /oldroot.
   The image is bound (read-only) or overlaid on /newroot, the mount plan is
   applied on top of it, and the second pivot makes /newroot the root; the
   staging root and the host tree beneath it are then detached.
"""

from __future__ import annotations

import os
import stat
import sys

from singpy import console
from singpy.constants import FUSE_DEVICE
from singpy.errors import ImageError, KernelError
from singpy.kernel import syscalls as k
from singpy.layers.staging import HOST as HOST
from singpy.layers.staging import IMAGE as IMAGE
from singpy.layers.staging import NEWROOT as NEWROOT
from singpy.layers.staging import PROC as PROC
from singpy.layers.staging import SCRATCH as SCRATCH
from singpy.layers.staging import STAGE as STAGE
from singpy.layers.staging import allow_setuid as allow_setuid
from singpy.layers.staging import remount as remount
from singpy.mounts.rootpath import Tree, resolve


def enter_staging(fstype: str = "tmpfs", size_mib: int = 0, *, slave: bool = True) -> None:
    """Called in the new mount namespace, with CAP_SYS_ADMIN over it.

    The staging filesystem is Apptainer's session directory: `fstype` (tmpfs,
    or ramfs, `memory fs type`) and `size_mib` (`sessiondir max size`, 0 for
    no limit: the kernel's default of half the memory) bound what
    --writable-tmpfs can write, since its upper layer lives there. `slave`
    (`mount slave`): the host's shared mounts become slaves, so that mount
    events reach the container one way only; False makes every mount private.
    MS_SLAVE leaves a private mount private, and what singpy mounts itself is
    private either way: nothing propagates back.
    """
    k.mount(None, "/", None, k.MS_REC | (k.MS_SLAVE if slave else k.MS_PRIVATE))
    options = f"mode=0755,size={size_mib}m" if size_mib else "mode=0755"
    k.mount("singpy", STAGE, fstype, k.MS_NOSUID | k.MS_NODEV, options)
    for name in (HOST, NEWROOT, SCRATCH):
        os.mkdir(STAGE + name)
    k.pivot_root(STAGE, STAGE + HOST)
    os.chdir("/")


def host_path(path: str) -> str:
    """Where host `path` is, seen from the staging root (host symlinks resolved)."""
    return resolve(HOST, path)


def checked_file(checked: tuple[int, int, int], path: str, flags: int, what: str) -> tuple[int, int, int]:
    """The descriptor of a file checked before the launch, `checked` = (fd, st_dev, st_ino): that one while it is
    still open on the file; else (a shared container's holder closes the descriptors it does not know) host
    `path` opened again with `flags`, used only if it is still that file (one renamed over it is never mounted)."""
    fd, device, inode = checked
    if is_file(fd, device, inode):
        return checked
    try:
        fd = os.open(host_path(path), flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as error:
        raise ImageError(f"can't open the {what}: {error.strerror}") from None
    if not is_file(fd, device, inode):
        os.close(fd)
        raise ImageError(f"can't mount the {what}: it was replaced since it was checked")
    return fd, device, inode


def is_file(fd: int, device: int, inode: int) -> bool:
    """Whether `fd` is open on the file (device, inode): not closed since, nor its number reused."""
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == (device, inode)


def mount_image(image: Tree, *, mount_points: list[tuple[str, bool]], writable: bool, userns: bool,
                underlay: str = "fallback") -> None:
    """Put the image's root filesystem (`image`, a tree in the staging root) on NEWROOT, never writing it.

    With nothing to add, the image is bound read-only. Otherwise it becomes
    the lower layer of an overlay whose top layer (in the staging tmpfs)
    holds the mount points the image lacks, so they need no write to the
    image and no permission over its directories; `--writable-tmpfs` adds a
    writable tmpfs upper layer. `userxattr` is what overlayfs needs inside a
    user namespace (kernel >= 5.11). Device nodes in the image never work
    (nodev, as Apptainer mounts an image): /dev comes from the host or a tmpfs.

    `underlay` (the plan's): "always" puts the mount points in an underlay
    (singpy.layers.underlay) instead of the overlay; "fallback" does where the kernel
    refuses the overlay (Linux < 5.11 in a user namespace, overlayfs missing);
    "no" makes that refusal fatal. --writable-tmpfs needs the overlay.
    """
    if not mount_points and not writable:
        k.mount(image.root, NEWROOT, None, k.MS_BIND | k.MS_REC)
        remount(NEWROOT, k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV)  # read-only before anything is mounted on it
        return
    if not writable and underlay == "always":
        mount_underlay(image, mount_points)
        return
    layers = escape(image.root)
    if mount_points:
        make_mount_point_layer(image, mount_points)
        layers = f"{SCRATCH}/layer:{layers}"
    options = f"lowerdir={layers}"
    if writable:
        for name in ("upper", "work"):
            os.mkdir(f"{SCRATCH}/{name}")
        options += f",upperdir={SCRATCH}/upper,workdir={SCRATCH}/work"
    try:
        k.mount("overlay", NEWROOT, "overlay", k.MS_NOSUID | k.MS_NODEV, options + (",userxattr" if userns else ""))
    except KernelError as error:
        if writable:
            raise ImageError(f"can't make the image writable (--writable-tmpfs): the kernel refuses the overlay "
                             f"({error.reason})", hint="`enable overlay = driver` in singpy.conf makes singpy use "
                             "fuse-overlayfs (docs/overlays.md)") from None
        if underlay == "no":
            raise ImageError(f"can't add the mount points the image lacks: the kernel refuses the overlay "
                             f"({error.reason}) and `enable underlay = no` in the configuration",
                             hint="create them in the image, or leave those mounts out (--no-home)") from None
        console.verbose(f"the kernel refused the overlay of mount points ({error.reason}): using the underlay")
        mount_underlay(image, mount_points)


def mount_underlay(image: Tree, mount_points: list[tuple[str, bool]]) -> None:
    """singpy.layers.underlay's mount_root, imported where it is first needed: before the first pivot
    (singpy.launch.launch, when the plan asks for it) or after it (the kernel refused the overlay).

    After the first pivot the packages' directories are below HOST: each is added
    to its package's search path (singpy's and singpy.layers', which this
    import walks), so the import finds the same file there.
    """
    if "singpy.layers.underlay" not in sys.modules:
        import singpy
        import singpy.layers

        for package in (singpy, singpy.layers):
            if not os.path.isdir(package.__path__[0]):
                package.__path__.append(host_path(package.__path__[0]))
    from singpy.layers import underlay

    underlay.mount_root(image, mount_points)


def make_mount_point_layer(image: Tree, mount_points: list[tuple[str, bool]]) -> None:
    """Empty files and directories for the missing mount points, with the image's directory modes.

    The paths were resolved in the image (no link in them); the layer is a
    fresh directory of the staging tmpfs, so plain path strings are safe here.
    """
    layer = f"{SCRATCH}/layer"
    os.mkdir(layer)
    os.chmod(layer, stat.S_IMODE(os.fstat(image.fd).st_mode))
    made: set[str] = set()  # what the layer has so far (a CDI spec's libraries share their directories)
    for relative, is_dir in mount_points:
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            _mirror_dir(image, layer, "/".join(parts[:depth]), made)
        if is_dir:
            _mirror_dir(image, layer, relative, made)
        elif relative not in made:
            made.add(relative)
            os.close(os.open(f"{layer}/{relative}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def _mirror_dir(image: Tree, layer: str, relative: str, made: set[str]) -> None:
    if relative in made:
        return
    made.add(relative)
    path = f"{layer}/{relative}"
    if os.path.isdir(path):
        return
    os.mkdir(path)
    found = image.lookup(relative, follow=False)
    mode = 0o755
    if found.fd is not None:
        info = os.fstat(found.fd)
        os.close(found.fd)
        if stat.S_ISDIR(info.st_mode):
            mode = stat.S_IMODE(info.st_mode)
    os.chmod(path, mode)


def mount_fuse(target: str, source: str, fstype: str, flags: int, *, uid: int, gid: int, what: str,
               hint: str | None = None) -> int:
    """Open /dev/fuse and mount a FUSE filesystem on `target` for it; the descriptor, for the server to serve.

    rootmode is the mode of the root inode's type (a directory); user_id and
    group_id are who may use the mount without allow_other ([1]
    linux/fs/fuse/inode.c). `what` names the filesystem in messages.
    """
    try:
        fd = os.open(host_path(FUSE_DEVICE), os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        raise ImageError(f"can't open {FUSE_DEVICE} for {what}: {error.strerror}") from None
    try:
        k.mount(source, target, fstype, flags, f"fd={fd},rootmode=40000,user_id={uid},group_id={gid}")
    except KernelError as error:
        os.close(fd)
        raise ImageError(f"can't mount FUSE for {what}: {error.reason}", hint=hint) from None
    return fd


def escape(path: str) -> str:
    """overlayfs splits its options on ',' and its layers on ':'."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def finish_root(*, writable: bool) -> None:
    """Make the root read-only (unless --writable-tmpfs) and pivot into it."""
    if not writable:
        remount(NEWROOT, k.MS_RDONLY)
    os.chdir(NEWROOT)
    k.pivot_root(".", ".")
    k.umount(".", k.MNT_DETACH)
    os.chdir("/")

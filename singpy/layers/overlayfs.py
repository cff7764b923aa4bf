"""The container's root when the image is written or has layers over it: --writable, --overlay, a SIF's partition.

Launch side of singpy.layers.overlay, called in the staging root (singpy.layers.rootfs)
before the container is forked, so that the helpers serving the layers
(fuse2fs, fuse-overlayfs) are the launcher's children and stop with it
(`process.supervise`). Imported by singpy.launch.launch before the first pivot:
the package is out of reach afterwards.

* `--writable` on a sandbox: the image directory is bound read-write on
  NEWROOT; nothing else is added, so a mount point the image lacks can't be
  made (singpy.mounts.apply refuses to create one in the image).
* Otherwise an overlay on NEWROOT, its lower layers top first: the read-only
  overlays (the last given on top), the layer of missing mount points
  (singpy.layers.rootfs), the image. Its upper layer is the one writable overlay's
  `upper/` (with `work/` beside it, both made when missing, as Apptainer
  does), or a tmpfs for --writable-tmpfs, or none. A read-only overlay shows
  its `upper/`, or the whole directory when it has none (Apptainer's rule).
  The mount points go below the user's layers, never in their persistent
  `upper/` (Apptainer's session layer sits at the same place).
* Each overlay directory is bound into the staging root first
  (`SCRATCH/overlayN`): the layer paths handed to the kernel and to
  fuse-overlayfs are then ours, free of the ':' and ',' their option syntax
  reserves, and upper/ and work/ are on one mount, as the kernel requires.
* The kernel's overlayfs (`userxattr` in a user namespace), or
  fuse-overlayfs when the plan says so (`enable overlay = driver`, a layer on
  a filesystem the kernel's overlayfs can't use), or when the kernel refuses
  the mount and the plan names fuse-overlayfs: one --verbose line says which.
  fuse-overlayfs serves a FUSE mount the launcher made on /dev/fuse itself
  (mount point `/dev/fd/N`, as squashfuse in singpy.image.squashfs). It runs
  in the staging root, where the layers are, with the host's /usr, /lib,
  /etc and /proc reached through links made there for it.
"""

from __future__ import annotations

import errno
import os
import stat

from singpy import console
from singpy.errors import ImageError, KernelError
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs
from singpy.mounts.rootpath import Tree
from singpy.plan import LaunchPlan, OverlaySpec

_FLAGS = k.MS_NOSUID | k.MS_NODEV
# What fuse-overlayfs needs from the host, linked into the staging root (where it runs).
_HOST_DIRS = ("usr", "lib", "lib64", "lib32", "libx32", "bin", "sbin", "etc", "proc", "dev")


class Layers:
    """The overlay's layers as seen from the staging root."""

    def __init__(self) -> None:
        self.lower: list[str] = []  # top first
        self.upper = ""  # "" when nothing is written
        self.work = ""
        self.held: list[int] = []  # descriptors upper and work name (/proc/self/fd/N), open until the mount is made


def mount_root(plan: LaunchPlan, image: Tree, mount_points: list[tuple[str, bool]], uid: int,
               gid: int) -> tuple[int, ...]:
    """Put the image and its layers on NEWROOT; returns the pids of the helpers serving them."""
    if plan.writable and not plan.overlays:
        console.verbose(f"binding the image {plan.image.path} read-write (--writable)")
        k.mount(image.root, rootfs.NEWROOT, None, k.MS_BIND | k.MS_REC)
        rootfs.remount(rootfs.NEWROOT, _FLAGS)
        return ()
    # Should anything fail from here on, the helpers started die with the launcher (process.fork_tied).
    layers, helpers = _attach(plan.overlays, uid, gid)
    try:
        return _mount_layers(plan, image, mount_points, layers, helpers, uid, gid)
    finally:
        for fd in layers.held:
            os.close(fd)


def _mount_layers(plan: LaunchPlan, image: Tree, mount_points: list[tuple[str, bool]], layers: Layers,
                  helpers: tuple[int, ...], uid: int, gid: int) -> tuple[int, ...]:
    if mount_points:
        rootfs.make_mount_point_layer(image, mount_points)
        layers.lower.append(rootfs.SCRATCH + "/layer")
    layers.lower.append(image.root)
    if plan.writable_tmpfs:
        for name in ("upper", "work"):
            os.mkdir(f"{rootfs.SCRATCH}/{name}")
        layers.upper, layers.work = rootfs.SCRATCH + "/upper", rootfs.SCRATCH + "/work"
    helper = _mount(plan, layers, uid, gid)
    return (*helpers, helper) if helper is not None else helpers


def _attach(overlays: tuple[OverlaySpec, ...], uid: int, gid: int) -> tuple[Layers, tuple[int, ...]]:
    """Each overlay reachable in the staging root (lowest first in the plan); its upper/ and work/ checked."""
    layers = Layers()
    helpers: list[int] = []
    for index, spec in enumerate(overlays):
        top, helper = _attach_one(spec, index, uid, gid)
        if helper is not None:
            helpers.append(helper)
        if spec.readonly:
            upper = f"{top}/upper"
            layers.lower.insert(0, upper if _is_dir(upper) else top)
        else:
            layers.held = list(_upper_work(spec, top))
            layers.upper, layers.work = (k.fd_path(fd, rootfs.PROC) for fd in layers.held)
    return layers, tuple(helpers)


def _attach_one(spec: OverlaySpec, index: int, uid: int, gid: int) -> tuple[str, int | None]:
    if spec.kind == "extfs":
        from singpy.image import extfs

        return extfs.attach(spec, index, uid, gid)
    top = f"{rootfs.SCRATCH}/overlay{index}"
    os.mkdir(top)
    source = rootfs.host_path(spec.path)
    console.verbose(f"overlay {spec.path}{' (read-only)' if spec.readonly else ''}")
    k.mount(source, top, None, k.MS_BIND, shown=spec.path)
    rootfs.remount(top, _FLAGS | (k.MS_RDONLY if spec.readonly else 0), shown=spec.path)
    return top, None


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _upper_work(spec: OverlaySpec, top: str) -> tuple[int, int]:
    """The writable overlay's upper/ and work/, made (0755) when missing, as O_PATH descriptors.

    A link or a file at either is refused before either is made, and what
    this run made is removed if it fails. The kernel and fuse-overlayfs get
    /proc/self/fd/N of these descriptors, never the names: the directory may
    be writable by another user, who could swap a link in after the check.
    """
    directory = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    made: list[str] = []
    held: list[int] = []
    try:
        for name in ("upper", "work"):
            _refuse_non_directory(spec, directory, name)
        for name in ("upper", "work"):
            try:
                os.mkdir(name, 0o755, dir_fd=directory)
                made.append(name)
                console.verbose(f"made {spec.path}/{name}")
            except FileExistsError:
                pass
            except OSError as error:
                raise ImageError(f"overlay {spec.path}: can't make {name}/: {error.strerror}") from None
            held.append(_open_directory(spec, directory, name))
    except BaseException:
        for fd in held:
            os.close(fd)
        for name in reversed(made):
            try:  # noqa: SIM105 - contextlib is not imported for one call (start-up time)
                os.rmdir(name, dir_fd=directory)
            except OSError:
                pass  # not empty: no longer only what this run made
        raise
    finally:
        os.close(directory)
    return held[0], held[1]


def _refuse_non_directory(spec: OverlaySpec, directory: int, name: str) -> None:
    try:
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise ImageError(f"overlay {spec.path}: can't use {name}/: {error.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise ImageError(f"overlay {spec.path}: {name} is not a directory")


def _open_directory(spec: OverlaySpec, directory: int, name: str) -> int:
    try:
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except OSError as error:  # ENOTDIR: a link or a file put there since the check
        reason = "is not a directory" if error.errno == errno.ENOTDIR else f"can't be used: {error.strerror}"
        raise ImageError(f"overlay {spec.path}: {name} {reason}") from None


def _mount(plan: LaunchPlan, layers: Layers, uid: int, gid: int) -> int | None:
    """The overlay on NEWROOT: the kernel's, or fuse-overlayfs (then its pid)."""
    if plan.overlay_driver != "fuse":
        try:
            _mount_kernel(layers, userns=plan.namespaces.user)
            console.verbose("root overlay: the kernel's overlayfs")
            return None
        except KernelError as error:
            if not plan.overlay_tool:
                raise ImageError(f"can't mount the overlay on the image: {error.reason}",
                                 hint="install fuse-overlayfs, which singpy uses where the kernel refuses") from None
            console.verbose(f"the kernel's overlayfs refused the layers ({error.reason}): using fuse-overlayfs")
    return _mount_fuse(plan, layers, uid, gid)


def _mount_kernel(layers: Layers, *, userns: bool) -> None:
    options = "lowerdir=" + ":".join(rootfs.escape(path) for path in layers.lower)
    if layers.upper:
        options += f",upperdir={rootfs.escape(layers.upper)},workdir={rootfs.escape(layers.work)}"
    k.mount("overlay", rootfs.NEWROOT, "overlay", _FLAGS, options + (",userxattr" if userns else ""))


def _mount_fuse(plan: LaunchPlan, layers: Layers, uid: int, gid: int) -> int:
    """Mount FUSE on NEWROOT and start fuse-overlayfs serving it; return its pid."""
    # The FUSE mount serves ids as seen in our user namespace: the user is 0 there with --fakeroot.
    uid, gid = (0, 0) if plan.fakeroot is not None else (uid, gid)
    _link_host_dirs()
    lower = []
    for number, path in enumerate(layers.lower):  # our own names: fuse-overlayfs splits lowerdir on ':'
        if path.startswith(rootfs.SCRATCH + "/") and "," not in path and ":" not in path:
            lower.append(path)
            continue
        alias = f"{rootfs.SCRATCH}/lower{number}"
        os.mkdir(alias)
        k.mount(path, alias, None, k.MS_BIND | k.MS_REC)
        lower.append(alias)
    # noacl (as Apptainer passes it): with ACLs on, the kernel asks for system.posix_acl_access, which a
    # layer on squashfuse or a tmpfs can't answer, and every lookup of a user's process fails (EOPNOTSUPP).
    options = "noacl,lowerdir=" + ":".join(lower)
    if layers.upper:
        options += f",upperdir={layers.upper},workdir={layers.work}"
    fd = rootfs.mount_fuse(rootfs.NEWROOT, "fuse-overlayfs", "fuse.fuse-overlayfs", _FLAGS, uid=uid, gid=gid,
                           what="fuse-overlayfs")
    try:
        argv = [rootfs.host_path(plan.overlay_tool), "-f", "-o", options, f"/dev/fd/{fd}"]
        console.verbose("root overlay: fuse-overlayfs")
        console.debug(f"running {' '.join(argv)}")
        for held in layers.held:  # upper and work, named by /proc/self/fd/N: the same numbers in fuse-overlayfs
            os.set_inheritable(held, True)
        try:
            pid, errors = process.spawn_helper(argv, root="/", keep_fd=fd, quiet=console.level() < console.DEBUG)
        finally:
            for held in layers.held:
                os.set_inheritable(held, False)
    finally:
        os.close(fd)  # ours goes first: should fuse-overlayfs fail, the kernel aborts the connection
    try:
        os.stat(rootfs.NEWROOT)
    except OSError as error:
        why = process.helper_failure(pid, errors) or error.strerror
        raise ImageError(f"can't mount the overlay with fuse-overlayfs: {why}") from None
    return pid


def _link_host_dirs() -> None:
    """fuse-overlayfs runs in the staging root (where the layers are): its loader and libraries via links."""
    for name in _HOST_DIRS:
        if os.path.lexists(f"{rootfs.HOST}/{name}") and not os.path.lexists(f"/{name}"):
            os.symlink(f"{rootfs.HOST}/{name}", f"/{name}")

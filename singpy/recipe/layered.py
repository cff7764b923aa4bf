"""A stage's root filesystem as an overlay on its base image, instead of a copy unpacked for this build.

Unpacking a base image creates every one of its files, and on some disks
that alone takes seconds for a few thousand files (about 0.8 ms each on
ext4 mounted `discard`: benchmarks/README.md). Most builds change a few
files. So when the base is a squashfs (the SIF `pull` keeps in its cache,
or a local SIF or squashfs) and the output is a SIF, the build process
moves into a mount namespace of its own and each such stage becomes an
overlay, mounted at work/stageN:

    lower  the base, read-only: as root, the image itself on a loop device
           (the kernel's squashfs); for a user, who can't mount squashfs,
           the image unpacked once into the cache (`build-rootfs/`) and
           shared by every later build of that image
    upper  work/upperN: what the stage adds or changes

Everything else in the build is unchanged: %setup, %files, %post, the
metadata, %test and mksquashfs see a directory. The mounts exist in that
namespace only, so nothing is ever mounted on the host, and they end with
the build process whatever happens; `release` unmounts them before the work
directory is removed.

A user builds in the user namespace %post runs in, with the user's
subordinate id range (singpy.layers.fakeroot), and unpacks the cached tree there:
the image's owners are kept as subordinate ids on disk, exactly as in an
unpacked build, and read back as the image's ids in the namespace. Why not
squashfuse: on the reference VM reading an image through FUSE cost more
than unpacking it (mksquashfs of a mounted 52 MB image: 3.0 s through
squashfuse, 1.7 s through the kernel). The stage is unpacked as before with
a single mapping (the image's other owners can't be represented), with the
cache on network storage, or when the kernel refuses the overlay.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from singpy import console
from singpy.errors import KernelError, SingpyError
from singpy.kernel import syscalls as k
from singpy.plan import IdMap

_READ_ONLY = k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV


BUILD_TREES = "build-rootfs"  # the cache's subdirectory of base images unpacked for users' builds


class Layers:
    """The build's mount namespace: how bases become lower layers, and what was mounted (for `release`)."""

    def __init__(self, *, strategy: str, cache: str = "", unsquashfs: str = "", map_key: str = "") -> None:
        self.strategy = strategy  # "loop" (root) or "tree" (a user: the base unpacked once into the cache)
        self.cache = cache  # the user's cache directory, for "tree"
        self.unsquashfs = unsquashfs  # its path, for "tree"
        self.map_key = map_key  # names the id mapping a "tree" was unpacked with (its owners depend on it)
        self.mounts: list[str] = []  # mount points, in the order they were made

    def mount_stage(self, image: str, rootfs: str, work: str, number: int) -> bool:
        """Mount an overlay at `rootfs` on the squashfs `image` (SIF or bare); False: unpack it instead."""
        from singpy.image.detect import classify, sif_partition

        spec = classify(image)
        if spec.kind == "sandbox":
            return False
        if spec.kind == "sif":
            spec = sif_partition(spec.path, check_arch=False)  # a foreign base builds as it did unpacked
        upper, scratch = f"{work}/upper{number}", f"{work}/overlay-work{number}"
        made = [upper, scratch, rootfs]
        mounted = len(self.mounts)
        try:
            if self.strategy == "loop":
                lower = f"{work}/base{number}"
                made.insert(0, lower)
                os.mkdir(lower, 0o755)
                self._mount_loop(spec.path, spec.offset, spec.size, lower)
            else:
                lower = self._tree(spec.path, spec.offset, spec.size)
            for path in (upper, scratch, rootfs):
                os.mkdir(path, 0o755)
            options = f"lowerdir={_escape(lower)},upperdir={_escape(upper)},workdir={_escape(scratch)}"
            k.mount("overlay", rootfs, "overlay", k.MS_NOSUID | k.MS_NODEV,
                    options + (",userxattr" if self.strategy == "tree" else ""))
        except (KernelError, OSError) as error:
            reason = error.reason if isinstance(error, KernelError) else error.strerror
            console.verbose(f"can't use {image} as an overlay's lower layer ({reason}): unpacking it instead")
            self._undo(mounted)
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            return False
        self.mounts.append(rootfs)
        console.verbose(f"stage root {rootfs}: an overlay on {image} ({self.strategy}: {lower}), not unpacked "
                        "in the work directory")
        return True

    def _mount_loop(self, path: str, offset: int, size: int, target: str) -> None:
        from singpy.kernel import loop

        fd, device = loop.attach(path, offset, size)
        try:
            k.mount(device, target, "squashfs", _READ_ONLY)
        finally:
            os.close(fd)  # autoclear: the device goes with the mount
        self.mounts.append(target)

    def _tree(self, path: str, offset: int, size: int) -> str:
        """The base unpacked in the cache by root of the build's namespace, so with its owners (as the user's
        subordinate ids on disk): made by the first build of that image, shared read-only by the next ones."""
        from singpy.image import cache

        suffix = f"-{self.map_key}"
        # checked=True: `plan` made and checked the directories on the host; in this namespace its owners
        # (root among them) can't be seen
        tree = cache.lookup(self.cache, path, offset, size, kind=BUILD_TREES, suffix=suffix, checked=True)
        if tree is not None:
            console.verbose(f"using the base unpacked in the cache: {tree}")
            return tree
        # root=False: unsquashfs's options for a user (no xattrs, no /dev), which the namespace's root is
        return cache.populate(self.cache, path, offset, size, unsquashfs=self.unsquashfs, root=False,
                              kind=BUILD_TREES, suffix=suffix, checked=True)

    def release(self) -> None:
        """Unmount everything, newest first; safe to call twice."""
        self._undo(0)

    def _undo(self, mounts: int) -> None:
        """Unmount what was mounted after the first `mounts`."""
        while len(self.mounts) > mounts:
            with contextlib.suppress(KernelError):
                k.umount(self.mounts.pop(), k.MNT_DETACH)


def _escape(path: str) -> str:
    from singpy.layers.rootfs import escape

    return escape(path)


def plan(idmap: IdMap | None, env: Mapping[str, str], home: str) -> Layers | None:
    """How this build's bases become lower layers, or None when they can't (then every stage is unpacked).

    Root mounts them with the kernel's squashfs. A user (who can't) gets each
    base unpacked once into the cache, with its owners: only with a
    subordinate id range (a single mapping can't represent them) and a cache
    on local storage (on NFS a tree of thousands of files is slow to make and
    to read, and counts against a quota).
    """
    if idmap is None:
        if _kernel_squashfs_allowed(env) and os.path.exists("/dev/loop-control"):
            return Layers(strategy="loop")
        return None
    if not idmap.helper:
        console.verbose("single id mapping: the base image is unpacked in the work directory (its other owners "
                        "can't be kept in the cache)")
        return None
    from singpy.host import cachefiles
    from singpy.image import cache
    from singpy.image.tools import find_tool

    location = cachefiles.cache_dir(env, home)
    kind = cachefiles.filesystem_of(location)
    if kind in cache.NETWORK_FS_TYPES:
        console.verbose(f"the cache {location} is on {kind}: the base image is unpacked in the work directory")
        return None
    unsquashfs = find_tool("unsquashfs", env)
    if unsquashfs is None:
        return None
    for sub in ("", BUILD_TREES, cache.INDEX):  # made and checked here, on the host (see Layers._tree)
        cachefiles.make_private_dirs(f"{location}/{sub}")
    return Layers(strategy="tree", cache=location, unsquashfs=unsquashfs, map_key=map_key(idmap))


def map_key(idmap: IdMap) -> str:
    """12 hex digits naming an id mapping: a tree unpacked with another range would have other host owners."""
    import hashlib

    text = repr((idmap.uids, idmap.gids))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _kernel_squashfs_allowed(env: Mapping[str, str]) -> bool:
    """`allow kernel squashfs` of singpy.conf (an admin may forbid the kernel's squashfs driver)."""
    from singpy.config import sysconf

    try:
        return sysconf.load(sysconf.default_path(env)).flag("allow kernel squashfs")
    except SingpyError:
        return False


def enter(idmap: IdMap | None) -> None:
    """Move the build process into a mount namespace of its own: in the build's user namespace for a user.

    Mount propagation is turned off first thing, so that nothing mounted in
    it reaches the host. Called once, single-threaded, before any stage.
    """
    if idmap is None:
        k.unshare(k.CLONE_NEWNS)
    else:
        from singpy.layers import fakeroot

        fakeroot.enter_user_namespace(idmap, k.CLONE_NEWUSER | k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)


# --- the cache's build trees, for `singpy cache list|clean` ----------------------------------------------------------


def build_trees(cache: str) -> list[tuple[str, float, int]]:
    """(name, unpacked at (epoch s), size in bytes) of every complete base unpacked for builds.

    Sizes skip what the user can't read (directories of the image's other
    owners, which are subordinate ids on disk).
    """
    where = f"{cache}/{BUILD_TREES}"
    try:
        names = sorted(name for name in os.listdir(where) if not name.startswith(".") and
                       os.path.isdir(f"{where}/{name}"))
    except FileNotFoundError:
        return []
    found = []
    from singpy.image import trees

    for name in names:
        found.append((name, os.lstat(f"{where}/{name}").st_mtime, trees.disk_usage(f"{where}/{name}")))
    return found


def remove_build_trees(cache: str, *, older_than: float | None = None) -> int:
    """Remove the bases unpacked for builds (those unpacked before `older_than`, epoch s): how many.

    What the user can't remove alone (files of subordinate ids) is removed as
    root of a user namespace with the user's mapping, as a build's work
    directory is (singpy.recipe.workdir).
    """
    from singpy.layers import fakeroot
    from singpy.recipe import workdir

    where = f"{cache}/{BUILD_TREES}"
    idmap = fakeroot.own_id_map() if os.getuid() != 0 else None
    removed = 0
    for name, made, _ in build_trees(cache):
        if older_than is not None and made >= older_than:
            continue
        path = f"{where}/{name}"
        workdir.remove(path, idmap, what="the base unpacked for builds")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}.json")
        removed += 1
    return removed


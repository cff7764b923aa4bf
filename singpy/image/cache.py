"""The per-user extraction cache: squashfs partitions unpacked once, reused by later runs.

Layout, under `$SINGPY_CACHEDIR`, else `$APPTAINER_CACHEDIR/singpy` (or
`$SINGULARITY_CACHEDIR/singpy`: where Apptainer users already put their caches),
else `$XDG_CACHE_HOME/singpy`, else `~/.cache/singpy` (mode 0700)::

    rootfs/<sha256>/              a complete tree: the partition with that digest, unpacked
    rootfs/<sha256>.json          where it came from (`cache list`); flock()ed, shared, by its running containers
    rootfs/.<sha256>.lock         flock()ed while that partition is extracted, deleted after
    rootfs/.<sha256>.tmp-XXXXXX/  an extraction in progress (or killed midway)
    index/<dev>-<ino>-<size>-<mtime_ns>-<ctime_ns>-<offset>-<length> -> ../rootfs/<sha256>
    index/.<same key>.warm        flock()ed while that file is unpacked in the background (singpy.image.warm)
    index/.<same key>.failed      that file's background unpacking failed: not tried again (singpy.image.warm)

Entries are keyed by the partition's content, so two copies of an image
share one tree. Hashing a partition of several GB takes seconds, so the
index maps a file's identity (device, inode, size, mtime and ctime in ns:
any rewrite of the file changes one of them, whatever its path, and no user
can set a ctime back) to the digest, and a repeat run costs two system calls
and no hashing (`lookup`).

The index must name the tree of that very file: `populate` opens the image
once, takes its identity from the descriptor, hashes the partition from it,
and gives unsquashfs that descriptor (/proc/self/fd/N), never the path again;
if the file changed meanwhile (its identity is compared after), nothing is
kept. A file renamed over the image, or rewritten, during an unpacking is
never indexed as the image, nor does its content land under the image's digest.

Populating is atomic: the tree is unpacked into a hidden temporary
directory and renamed into place only when complete, so no run ever sees a
half-written tree. An exclusive `flock` on the entry's lock file makes
concurrent first runs of one image extract once: the others wait (for a
bounded time: cachefiles.wait_bound), then find the entry. A killed extraction leaves only a hidden temporary
directory and releases its lock with its file descriptor; the next extraction of that digest removes it.

A container run from a tree holds a shared flock on the entry's record (its `.json`, written before the tree is
renamed into place) for its whole life (singpy.image.squashfs.hold); `cache clean` (`remove_entry`) keeps an
entry whose record it can't lock exclusively.

The cache is trusted only as far as cachefiles.check_owned goes (issue 24): the
cache, `rootfs/` and `index/` must be the user's (or root's) and writable by no
one else, checked on every use (a few lstat calls), or the run stops. An index
link is followed only if it has the one form singpy writes; files are written
under random O_EXCL | O_NOFOLLOW names and renamed.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.errors import ImageError
from singpy.host.cachefiles import check_owned, filesystem_of, identity, make_private_dirs, publish, read_private

TYPE_CHECKING = False  # see singpy.record: `collections` is not loaded on a SIF launch (issue 31)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ROOTFS, INDEX = "rootfs", "index"
_HASH_CHUNK = 1 << 20


CACHEDIR_HINT = "set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a directory on a filesystem with room"


def index_key(path: str, offset: int, length: int, info: os.stat_result | None = None) -> str:
    """The identity of a partition of a file: any rewrite of the file changes it (see the module's docstring).
    `info`: the file's fstat, where the caller holds it open (stat(path) otherwise)."""
    info = os.stat(path) if info is None else info
    return f"{identity(info, ctime=True)}-{offset:x}-{length:x}"


def check(cache: str, kind: str = ROOTFS) -> None:
    """Refuse a cache (and its `kind` and index directories) that someone else could have filled."""
    check_owned(cache, below=(kind, INDEX))


def lookup(cache: str, path: str, offset: int, length: int, *, kind: str = ROOTFS, suffix: str = "",
           checked: bool = False) -> str | None:
    """The unpacked tree of this partition if this very file was unpacked before; no hashing.

    `kind` and `suffix`: the subdirectory and name of another kind of tree of
    the same partition (singpy.recipe.basetree); the index names the digest.
    `checked`: the caller ran `check` already (singpy.recipe.layered, before
    entering a user namespace where the host's owners can't be seen).
    """
    import stat

    if not checked:
        check(cache, kind)
    try:
        target = os.readlink(f"{cache}/{INDEX}/{index_key(path, offset, length)}")
    except OSError:
        return None
    digest = target.removeprefix(f"../{ROOTFS}/")
    if len(digest) != 64 or not all(char in "0123456789abcdef" for char in digest):
        return None  # not a link singpy wrote: never followed
    entry = f"{cache}/{kind}/{digest}{suffix}"
    try:
        info = os.lstat(entry)
    except OSError:
        return None
    return entry if stat.S_ISDIR(info.st_mode) and info.st_uid in (os.geteuid(), 0) else None


def populate(cache: str, path: str, offset: int, length: int, *, unsquashfs: str, root: bool, kind: str = ROOTFS,
             suffix: str = "", checked: bool = False, key: str | None = None) -> str:
    """Unpack the partition into the cache unless an identical one is there; return the tree.

    The tree is `kind/DIGEST` + `suffix` (see `lookup`); `checked`: the caller made those directories and
    checked them (see `lookup`). `key`: the index key of the file the caller locked (singpy.image.warm): another
    file at `path` by now is an ImageError, nothing done. The file is opened once and never again by its path
    (the module's docstring); one that changed while it was read leaves nothing (read again, twice at most,
    without `key`). Every failure is one `ImageError` (unsquashfs's own: a ToolError); a full filesystem says
    so, naming the cache and how to choose another. SIGTERM, SIGHUP and SIGINT during the extraction stop
    unsquashfs and remove the temporary tree.
    """
    from singpy.host.hostfiles import open_regular

    for sub in ("", kind, INDEX) if not checked else ():
        make_private_dirs(f"{cache}/{sub}" if sub else cache)  # checked once made: someone else's is refused
    # The image's path may be a link the user made (as Apptainer allows): followed once, here; the descriptor
    # then stands for the file wherever it was found (no O_NOFOLLOW: it would refuse that link, and protect nothing
    # the descriptor does not).
    for attempt in range(3):  # a file renamed over meanwhile (a concurrent pull of the same name): read the new one
        fd = open_regular(path, what="image", error=ImageError)
        try:
            first = os.fstat(fd)
            found = index_key(path, offset, length, first)
            if key is not None and found != key:
                raise ImageError(f"can't unpack {path}: it is no longer the file whose unpacking was planned")
            image = Opened(path, fd, first)
            digest = _populate_opened(cache, image, offset, length, unsquashfs=unsquashfs, root=root, kind=kind,
                                      suffix=suffix)
            image.check_unchanged()  # the digest read (and the tree unpacked) was this file's: index it
        except Changed:
            if key is not None or attempt == 2:
                raise
            continue  # (after the finally below)
        finally:
            os.close(fd)
        _write_index(cache, found, digest)  # under the identity of the file read, never a new stat(path)
        return f"{cache}/{kind}/{digest}{suffix}"
    raise AssertionError("unreachable")


class Changed(ImageError):  # the image changed (or was renamed over) while it was read: nothing of it was kept
    pass


class Opened:
    """The image `populate` opened: its path (for messages), its descriptor, its fstat when opened."""

    def __init__(self, path: str, fd: int, info: os.stat_result) -> None:
        self.path, self.fd, self.info = path, fd, info

    def check_unchanged(self) -> None:
        """An ImageError if the file was replaced or rewritten since it was opened (a rename over its path
        changes its ctime too: its link count drops)."""
        now = os.fstat(self.fd)
        if identity(now, ctime=True) != identity(self.info, ctime=True):
            raise Changed(f"can't unpack {self.path} into the cache: it was replaced or changed while it was "
                          "read; nothing was kept")

    @property
    def proc_path(self) -> str:
        """The descriptor as a path for unsquashfs (given it with pass_fds): /proc/self/fd, which every Linux
        host has, where /dev/fd is a link some hosts' /dev lack."""
        return f"/proc/self/fd/{self.fd}"


def _populate_opened(cache: str, image: Opened, offset: int, length: int, *, unsquashfs: str, root: bool, kind: str,
                     suffix: str) -> str:
    """`populate`, on the image opened: hash the partition from the descriptor, unpack it unless its tree is
    there; the digest."""
    path = image.path
    console.verbose(f"computing the digest of {path} (offset {offset}, {length} bytes)")
    digest = _digest(image.fd, path, offset, length)
    entry = f"{cache}/{kind}/{digest}{suffix}"
    if not os.path.isdir(entry):
        from singpy.image import tools

        _warn_if_shared(cache, length)
        with tools.Interruptible():
            try:
                _populate_locked(image, offset, length, f"{digest}{suffix}", entry, unsquashfs=unsquashfs,
                                 root=root)
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"unpacking {path} into the cache {interrupted.message}") from None
            except OSError as error:
                raise _cache_error(ImageError(f"can't unpack {path} into the cache {cache}: {error.strerror}"),
                                   cache) from None
            except ImageError as error:
                raise _cache_error(error, cache) from None
    return digest


# Filesystems of network and cluster storage, by their names in /proc/self/mountinfo.
NETWORK_FS_TYPES = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "fuse.sshfs",
                    "afs", "panfs", "wekafs", "fuse.glusterfs", "fuse.ceph", "9p")
LARGE_EXTRACTION = 256 << 20  # compressed bytes of a partition whose extraction onto network storage is warned of


def _warn_if_shared(cache: str, length: int) -> None:
    """A large extraction into a cache on network storage: once (the tree is reused after), say where to move it."""
    if length >= LARGE_EXTRACTION:
        warning = shared_storage_warning(cache, filesystem_of(cache), length)
        if warning:
            console.warning(warning)


def shared_storage_warning(cache: str, kind: str, length: int) -> str:
    """The warning for unpacking `length` bytes into `cache` on a filesystem of type `kind` ("" for none).

    The default cache is in the home directory, which on most clusters is on
    NFS or Lustre under a small quota: unpacking there writes thousands of
    files through the network, and every start reads them back the same way.
    """
    if length < LARGE_EXTRACTION or kind not in NETWORK_FS_TYPES:
        return ""
    from singpy.console import human_size

    return (f"the cache {cache} is on {kind} (network storage): unpacking {human_size(length)} there is slow and "
            "counts against your quota; set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to node-local storage, such as "
            "a directory in /tmp or $TMPDIR")


def _populate_locked(image: Opened, offset: int, length: int, digest: str, entry: str, *, unsquashfs: str,
                     root: bool) -> None:
    from singpy.host.cachefiles import wait_bound

    lock_path = f"{os.path.dirname(entry)}/.{digest}.lock"
    bound = wait_bound(length)  # an unpacking stopped with its job (SIGSTOP) or on a hung disk holds it for ever
    lock = lock_file(lock_path, wait=f"another singpy to finish unpacking {image.path}", within=bound)
    if lock is None:
        raise ImageError(f"can't unpack {image.path} into the cache: another singpy's unpacking of this image has "
                         f"been under way for over {bound:g} s (stopped, or on a hung disk?)",
                         hint="run it again once that unpacking has ended (or been killed)")
    try:
        if not os.path.isdir(entry):  # the run we waited for may have made it
            _extract(image, offset, digest, entry, unsquashfs=unsquashfs, root=root)
    finally:
        os.unlink(lock_path)  # while locked, so that it is safe (see lock_file): no lock file stays behind
        os.close(lock)


def _cache_error(error: ImageError, cache: str) -> ImageError:
    """`error`, or, when the cache's filesystem is full, the error that says so and what to do."""
    from singpy.image import tools

    if tools.out_of_space(error, cache):
        return ImageError(f"no space left on device in {cache} (the cache of unpacked images): "
                          f"{CACHEDIR_HINT}", hint="`singpy cache clean` removes unpacked images")
    return error


def lock_file(path: str, *, wait: str | None, create: bool = True, within: float | None = None) -> int | None:
    """An open descriptor holding an exclusive flock on `path`; None if busy and `wait` is None.

    A lock file is deleted only by a process holding its lock, so a lock
    taken on a file that is no longer at `path` is stale: try again. With
    `create` false, a missing file is None too. `within`: wait (`wait` says
    for what) at most this many seconds in all, then None.
    """
    import fcntl
    import time

    deadline = None if within is None else time.monotonic() + within
    while True:
        try:
            flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
            fd = os.open(path, flags, 0o600)  # a link planted at a lock's name is never followed (nor created)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as error:
            import errno

            if error.errno != errno.ELOOP:
                raise
            os.unlink(path)  # a link at a lock's name: never one of ours, so no lock is lost; try again
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait is None:
                os.close(fd)
                return None
            console.info(f"waiting for {wait}")
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not _locked_before(fd, deadline):
                os.close(fd)
                return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _locked_before(fd: int, deadline: float) -> bool:
    import time

    from singpy.host.cachefiles import locked_within

    return locked_within(fd, max(deadline - time.monotonic(), 0.0), exclusive=True)


def _digest(fd: int, path: str, offset: int, length: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    try:
        remaining = length
        while remaining > 0:
            chunk = os.pread(fd, min(_HASH_CHUNK, remaining), offset + length - remaining)
            if not chunk:
                raise ImageError(f"can't read image {path}: the partition is truncated")
            digest.update(chunk)
            remaining -= len(chunk)
    except OSError as error:
        raise ImageError(f"can't read image {path}: {error.strerror}") from None
    return digest.hexdigest()


def _extract(image: Opened, offset: int, digest: str, entry: str, *, unsquashfs: str, root: bool) -> None:
    """Called holding the entry's lock: unpack into a temporary directory, then rename it into place (if the
    image is still the file opened: else the tree is thrown away)."""
    import tempfile

    from singpy.image import tools

    parent = os.path.dirname(entry)
    for name in os.listdir(parent):
        if name.startswith(f".{digest}.tmp-"):  # left by a killed run: no live run holds our lock
            console.verbose(f"removing an interrupted extraction: {parent}/{name}")
            remove_tree(f"{parent}/{name}")
    tmp = tempfile.mkdtemp(prefix=f".{digest}.tmp-", dir=parent)
    path = image.path
    try:
        tree = f"{tmp}/root"
        console.verbose(f"unpacking {path} into the cache ({entry})")
        tools.run_tool([unsquashfs, *unpack_options(offset, tree, root=root), image.proc_path, *unpack_filter(root)],
                       label=f"Unpacking {os.path.basename(path)}", failure=f"can't unpack {path}",
                       pass_fds=(image.fd,))
        image.check_unchanged()  # what unsquashfs read is what was hashed
        if not root and not os.path.lexists(f"{tree}/dev"):  # unpacked without dev (unpack_filter)
            os.mkdir(f"{tree}/dev", 0o755)
        _write_info(f"{entry}.json", path, offset)
        os.rename(tree, entry)
    finally:
        remove_tree(tmp)


def unpack_options(offset: int, dest: str, *, root: bool) -> list[str]:
    """unsquashfs options for unpacking a partition at `offset` into the new directory `dest`.

    As in Apptainer's unprivileged extraction, a user skips the xattrs it
    could not set and /dev (device nodes need privilege; the container gets
    its /dev from the host or a tmpfs anyway): see `unpack_filter`.
    """
    return ["-o", str(offset), "-d", dest, *([] if root else ["-no-xattrs", "-excludes"])]


def unpack_filter(root: bool) -> list[str]:
    return [] if root else ["dev"]


def _write_info(path: str, source: str, offset: int) -> None:
    import time

    write_record(path, {"source": os.path.realpath(source), "offset": offset, "created": int(time.time())})


def write_record(path: str, record: Mapping[str, object]) -> None:
    """A small JSON file of the cache, written whole or not at all (an OSError leaves nothing behind)."""
    import json

    publish(path, json.dumps(record).encode())


def read_record(path: str) -> dict[str, object]:
    """What `write_record` wrote, or {}: the cache is the user's, anything may be there instead."""
    import json

    text = read_private(path, 1 << 16)  # the user's regular file, no link followed
    try:
        data = json.loads(text) if text is not None else {}
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_index(cache: str, key: str, digest: str) -> None:
    link = f"{cache}/{INDEX}/{key}"
    tmp = f"{cache}/{INDEX}/.{key}.{os.urandom(8).hex()}.tmp"  # symlink() never follows nor replaces: O_EXCL
    try:
        os.symlink(f"../{ROOTFS}/{digest}", tmp)
        os.replace(tmp, link)
    except OSError as error:  # the entry is usable anyway; the next run hashes again
        console.debug(f"can't write the cache index {link}: {error.strerror}")


def remove_tree(path: str) -> None:
    """rm -rf that also gets through the read-only directories an image may carry, and through trees
    of any depth (singpy.image.trees: no recursion, no path longer than one name)."""
    from singpy.image import trees

    trees.remove(path)


def entries(cache: str) -> Iterator[str]:
    """Digests of the complete entries in the cache."""
    try:
        names = sorted(os.listdir(f"{cache}/{ROOTFS}"))
    except FileNotFoundError:
        return
    for name in names:
        if len(name) == 64 and not name.startswith(".") and os.path.isdir(f"{cache}/{ROOTFS}/{name}"):
            yield name


def entry_info(cache: str, digest: str, *, size: bool = True) -> dict[str, object]:
    """What `_write_info` recorded about an entry, plus (`size`) its size on disk in bytes."""
    data = read_record(f"{cache}/{ROOTFS}/{digest}.json")
    # only the fields _write_info writes, of the types it writes
    info = {key: data[key] for key, kind in (("source", str), ("offset", int), ("created", int))
            if isinstance(data.get(key), kind) and not isinstance(data.get(key), bool)}
    if size:
        from singpy.image import trees

        info["size"] = trees.disk_usage(f"{cache}/{ROOTFS}/{digest}")
    return info


REMOVED, UNPACKING, IN_USE = "removed", "unpacking", "in use"  # what `remove_entry` did


def in_use_path(cache: str, digest: str) -> str:
    """The entry's record, its in-use lock too (see the module's docstring): no other file to leave behind."""
    return f"{cache}/{ROOTFS}/{digest}.json"


def remove_entry(cache: str, digest: str) -> str:
    """Delete one entry and its index links: REMOVED; left alone: UNPACKING (an extraction of it is under way) or
    IN_USE (a running container's root: `in_use_path`), where only the leftovers of killed work go."""
    base = f"{cache}/{ROOTFS}"
    lock = lock_file(f"{base}/.{digest}.lock", wait=None)
    if lock is None:
        return UNPACKING
    try:
        for name in os.listdir(base):  # a killed extraction's or removal's tree: no live one holds our lock
            if name.startswith(f".{digest}.tmp-"):
                remove_tree(f"{base}/{name}")
        if not _take_out_of_use(base, digest):
            return IN_USE
        for name in (f".{digest}.tmp-removing", f"{digest}.json"):  # nothing there is fine
            remove_tree(f"{base}/{name}")
    finally:
        try:
            os.unlink(f"{base}/.{digest}.lock")  # while locked: see lock_file
        finally:
            os.close(lock)
    _prune_index(cache)
    return REMOVED


def _take_out_of_use(base: str, digest: str) -> bool:
    """Under the record's exclusive lock, held across two calls only (False, nothing done, while a container holds
    it): the tree renamed out of sight (no run picks up a tree being deleted), the record unlinked."""
    record = f"{base}/{digest}.json"
    held = lock_file(record, wait=None, create=False)
    if held is None and os.path.lexists(record):  # held (none: a killed removal's rest, which no run can hold)
        return False
    try:
        if os.path.isdir(f"{base}/{digest}"):
            os.rename(f"{base}/{digest}", f"{base}/.{digest}.tmp-removing")
        if held is not None:
            os.unlink(record)  # while locked: a run that opened it before finds it unlinked (squashfs.hold)
    finally:
        if held is not None:
            os.close(held)
    return True


def _prune_index(cache: str) -> None:
    """Drop index links whose entry is gone."""
    try:
        names = os.listdir(f"{cache}/{INDEX}")
    except FileNotFoundError:
        return
    for name in names:
        link = f"{cache}/{INDEX}/{name}"
        if not os.path.exists(link):
            os.unlink(link)

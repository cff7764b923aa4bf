"""The per-user extraction cache: squashfs partitions unpacked once, reused by later runs.

Layout, under `$SINGPY_CACHEDIR`, else `$APPTAINER_CACHEDIR/singpy` (or
`$SINGULARITY_CACHEDIR/singpy`: where Apptainer users already put their caches),
else `$XDG_CACHE_HOME/singpy`, else `~/.cache/singpy` (mode 0700)::

    rootfs/<sha256>/              a complete tree: the partition with that digest, unpacked
    rootfs/<sha256>.json          where it came from (for `singpy cache list`)
    rootfs/.<sha256>.lock         flock()ed while that partition is extracted, deleted after
    rootfs/.<sha256>.tmp-XXXXXX/  an extraction in progress (or killed midway)
    index/<dev>-<ino>-<size>-<mtime_ns>-<offset>-<length> -> ../rootfs/<sha256>

Entries are keyed by the partition's content, so two copies of an image
share one tree. Hashing a partition of several GB takes seconds, so the
index maps a file's identity (device, inode, size and mtime in ns: any
rewrite of the file changes one of them, whatever its path) to the digest,
and a repeat run costs two system calls and no hashing (`lookup`).

Populating is atomic: the tree is unpacked into a hidden temporary
directory and renamed into place only when complete, so no run ever sees a
half-written tree. An exclusive `flock` on the entry's lock file makes
concurrent first runs of one image extract once: the others wait, then find
the entry. A killed extraction leaves only a hidden temporary directory and
releases its lock with its file descriptor; the next extraction of that
digest (holding the lock, so none is live) removes it.

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
from singpy.host.cachefiles import check_owned, identity, make_private_dirs, publish, read_private

TYPE_CHECKING = False  # see singpy.record: `collections` is not loaded on a SIF launch (issue 31)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

ROOTFS, INDEX = "rootfs", "index"
_HASH_CHUNK = 1 << 20


CACHEDIR_HINT = "set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a directory on a filesystem with room"


def index_key(path: str, offset: int, length: int) -> str:
    """The identity of a partition of a file: any rewrite of the file changes it (see the module's docstring)."""
    info = os.stat(path)
    return f"{identity(info)}-{offset:x}-{length:x}"


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
             suffix: str = "", checked: bool = False) -> str:
    """Unpack the partition into the cache unless an identical one is there; return the tree.

    The tree is `kind/DIGEST` + `suffix` (see `lookup`); `checked`: the
    caller made those directories and checked them (see `lookup`).

    Every failure is one `ImageError`; a full filesystem says so, naming the
    cache directory and how to choose another. SIGTERM, SIGHUP and SIGINT
    during the extraction stop unsquashfs and remove the temporary tree.
    """
    for sub in ("", kind, INDEX) if not checked else ():
        make_private_dirs(f"{cache}/{sub}" if sub else cache)  # checked once made: someone else's is refused
    console.verbose(f"computing the digest of {path} (offset {offset}, {length} bytes)")
    digest = _digest(path, offset, length)
    entry = f"{cache}/{kind}/{digest}{suffix}"
    if not os.path.isdir(entry):
        from singpy.image import tools

        _warn_if_shared(cache, length)
        with tools.Interruptible():
            try:
                _populate_locked(path, offset, f"{digest}{suffix}", entry, unsquashfs=unsquashfs, root=root)
            except tools.Interrupted as interrupted:
                raise tools.Interrupted(f"unpacking {path} into the cache {interrupted.message}") from None
            except OSError as error:
                raise _cache_error(ImageError(f"can't unpack {path} into the cache {cache}: {error.strerror}"),
                                   cache) from None
            except ImageError as error:
                raise _cache_error(error, cache) from None
    _write_index(cache, index_key(path, offset, length), digest)
    return entry


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


def filesystem_of(path: str) -> str:
    """The type of the filesystem `path` (or, missing, its nearest existing parent) is on; "" if unknown."""
    while not os.path.exists(path) and path not in ("/", ""):
        path = os.path.dirname(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
            return filesystem_type(os.path.realpath(path or "/"), mountinfo.read())
    except OSError:
        return ""


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


def filesystem_type(path: str, mountinfo: str) -> str:
    """The type of the filesystem that real path `path` is on, from mountinfo(5) text ("" if none matches)."""
    best, kind = "", ""
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts = fields.split(" ")
        if len(parts) < 5 or not after:
            continue
        point = parts[4].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last of equal mount points is the one on top
            best, kind = point, after.split(" ", 1)[0]
    return kind


def _populate_locked(path: str, offset: int, digest: str, entry: str, *, unsquashfs: str, root: bool) -> None:
    lock_path = f"{os.path.dirname(entry)}/.{digest}.lock"
    lock = lock_file(lock_path, wait=f"another singpy to finish unpacking {path}")
    assert lock is not None
    try:
        if not os.path.isdir(entry):  # the run we waited for may have made it
            _extract(path, offset, digest, entry, unsquashfs=unsquashfs, root=root)
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


def lock_file(path: str, *, wait: str | None, create: bool = True) -> int | None:
    """An open descriptor holding an exclusive flock on `path`; None if busy and `wait` is None.

    A lock file is deleted only by a process holding its lock, so a lock
    taken on a file that is no longer at `path` is stale: try again. With
    `create` false, a missing file is None too.
    """
    import fcntl

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
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _digest(path: str, offset: int, length: int) -> str:
    import hashlib

    from singpy.host.hostfiles import open_regular

    digest = hashlib.sha256()
    fd = open_regular(path, what="image", error=ImageError)
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
    finally:
        os.close(fd)
    return digest.hexdigest()


def _extract(path: str, offset: int, digest: str, entry: str, *, unsquashfs: str, root: bool) -> None:
    """Called holding the entry's lock: unpack into a temporary directory, then rename it into place."""
    import tempfile

    from singpy.image import tools

    parent = os.path.dirname(entry)
    for name in os.listdir(parent):
        if name.startswith(f".{digest}.tmp-"):  # left by a killed run: no live run holds our lock
            console.verbose(f"removing an interrupted extraction: {parent}/{name}")
            remove_tree(f"{parent}/{name}")
    tmp = tempfile.mkdtemp(prefix=f".{digest}.tmp-", dir=parent)
    try:
        tree = f"{tmp}/root"
        console.verbose(f"unpacking {path} into the cache ({entry})")
        tools.run_tool([unsquashfs, *unpack_options(offset, tree, root=root), path, *unpack_filter(root)],
                       label=f"Unpacking {os.path.basename(path)}", failure=f"can't unpack {path}")
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


def remove_entry(cache: str, digest: str) -> bool:
    """Delete one entry and its index links; False if an extraction of it is under way."""
    base = f"{cache}/{ROOTFS}"
    lock = lock_file(f"{base}/.{digest}.lock", wait=None)
    if lock is None:
        return False
    try:
        # Out of sight first (a rename is atomic), so no run picks up a tree being deleted.
        if os.path.isdir(f"{base}/{digest}"):
            os.rename(f"{base}/{digest}", f"{base}/.{digest}.tmp-removing")
        for name in os.listdir(base):
            if name.startswith(f".{digest}.tmp-") or name == f"{digest}.json":
                remove_tree(f"{base}/{name}")
        os.unlink(f"{base}/.{digest}.lock")  # while locked: see lock_file
    finally:
        os.close(lock)
    _prune_index(cache)
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

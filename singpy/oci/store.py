"""Where pulled images live in the user's cache (singpy.host.cachefiles.cache_dir).

    blobs/sha256/<hex>            a verified blob (layer, config), shared by every image that has it
    blobs/sha256/<hex>.partial    a download in progress or cut short: the next pull resumes it
    blobs/sha256/.<hex>.lock      flock()ed while that blob downloads
    sif/<hex>.sif                 the SIF made from the platform manifest with that digest
    sif/<hex>.id                  "sha256:<hex> <identity>": that digest and the SIF's identity
                                  (cachefiles.identity), written after it: a SIF is used only if both match;
                                  "... unsynced:<boot id>" for a download not fsynced (hashed again in
                                  a later boot before it is used: seal_sif)
    sif/<hex>.json                where it came from (for `singpy cache list`)
    sif/.<hex>.lock               flock()ed while that SIF is made
    refs/<key>.json               what a reference (and platform) last resolved to: lets a cached image
                                  run without the registry, and `docker://X@sha256:...` run with no request
    tmp/<random>/                 a conversion under way (unless SINGPY_TMPDIR or APPTAINER_TMPDIR says
                                  where): never /tmp, whose size is Apptainer's most common complaint

Everything is published by rename, so no run ever uses half of anything; a
killed pull leaves a `.partial` blob (resumed later) and a work directory
that the next conversion of the same image removes, or `cache clean` does.

Nothing in the cache is trusted for what its name claims (issue 24). The cache
and each directory down to it must pass cachefiles.check_owned (someone else's
directory is refused, not used); a blob is hashed again whenever a pull reuses
it (a file swapped there is downloaded again); a SIF runs only while its `.id`
record matches it, a few system calls and no hashing on the start-up path.
Small files are written under random O_EXCL | O_NOFOLLOW names and renamed.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.errors import ImageError
from singpy.host import cachefiles
from singpy.image import cache
from singpy.oci.ref import valid_digest

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time (a cached image starts fast)
if TYPE_CHECKING:  # nor `contextlib` nor `collections` (~1 ms of a cached docker:// run's imports: issue 31)
    from collections.abc import Mapping
    from typing import Any

BLOBS, SIFS, REFS, WORK = "blobs/sha256", "sif", "refs", "tmp"
TMPDIR_VARIABLES = ("SINGPY_TMPDIR", "APPTAINER_TMPDIR", "SINGULARITY_TMPDIR")


def hex_of(digest: str) -> str:
    """The hex part of a sha256 digest, checked: digests come from the network and name files."""
    if not (digest.startswith("sha256:") and valid_digest(digest)):
        raise ImageError(f"unsupported digest {digest[:80]!r}: singpy stores sha256 digests only")
    return digest[7:]


def is_hex(text: str) -> bool:
    """Whether `text` is the 64 lower-case hex digits of a sha256 digest."""
    return valid_digest(f"sha256:{text}")


def location(env: Mapping[str, str], home: str) -> str:
    """The user's cache directory (cachefiles.cache_dir), refused if it, a directory above it or the
    directories of pulled images and references fail cachefiles.check_owned: a dozen lstat calls."""
    where = cachefiles.cache_dir(env, home)
    cachefiles.check_owned(where, below=(SIFS, REFS))
    return where


def ensure(location: str, sub: str) -> str:
    """`location/sub`, created private (0700) with its parents if missing; both must pass check_owned."""
    path = f"{location}/{sub}"
    cachefiles.make_private_dirs(location)  # the cache root first: 0700 decides who can see the rest
    cachefiles.make_private_dirs(path)
    return path


def blob_path(location: str, digest: str) -> str:
    return f"{location}/{BLOBS}/{hex_of(digest)}"


def sif_path(location: str, digest: str) -> str:
    return f"{location}/{SIFS}/{hex_of(digest)}.sif"


def usable_sif(location: str, digest: str) -> str:
    """The cached SIF made from the manifest `digest`, or "" if there is none that singpy made and sealed.

    The SIF must be a regular file of the user's whose identity (device, inode, size, mtime) is the one
    `seal_sif` recorded with that digest: a file copied, moved or rewritten there afterwards is not used
    (a SIF is never hashed on the start-up path: gigabytes). The caller checked the directory (`location`).
    """
    sif = sif_path(location, digest)
    try:
        info = os.lstat(sif)
    except OSError:
        return ""
    seal = cachefiles.read_private(sif.removesuffix(".sif") + ".id", 256)
    if (info.st_mode & 0o170000) != 0o100000 or info.st_uid not in (os.geteuid(), 0) or seal is None:
        return ""
    words = seal.decode("ascii", "replace").split()
    if words[:2] != [digest, cachefiles.identity(info)]:
        return ""
    if len(words) == 2:
        return sif
    if len(words) == 3 and words[2].startswith(UNSYNCED):  # a download not fsynced (seal_sif's `unsynced`)
        return sif if words[2] == UNSYNCED + boot_id() else _verified_after_restart(sif, digest)
    return ""


UNSYNCED = "unsynced:"  # + the boot id: the seal's third word for a SIF downloaded without an fsync
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """This boot's id (the kernel's random UUID, new at every boot); "" where it can't be read."""
    try:
        with open(_BOOT_ID, "rb") as handle:
            text = handle.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if len(text) == 36 and text.replace("-", "").isalnum() else ""


def _verified_after_restart(sif: str, digest: str) -> str:
    """A SIF sealed `unsynced` in an earlier boot: a crash may have torn it (its size and mtime can survive
    while its blocks did not), so its bytes are hashed again (`digest` is its own hash: an oras://, library
    or http(s) download). The same: fsynced and sealed for good; else removed, to be downloaded again."""
    import hashlib

    console.info(f"checking the cached SIF {digest[:19]} again: the machine restarted since its download")
    hasher = hashlib.sha256()
    try:
        fd = os.open(sif, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            while chunk := os.read(fd, 1 << 20):
                hasher.update(chunk)
            same = f"sha256:{hasher.hexdigest()}" == digest
            if same:
                os.fsync(fd)
                cachefiles.publish(sif.removesuffix(".sif") + ".id",
                                   f"{digest} {cachefiles.identity(os.fstat(fd))}\n".encode())
        finally:
            os.close(fd)
    except OSError as error:
        console.warning(f"can't check the cached SIF {sif}: {error.strerror}: downloading it again")
        return ""
    if not same:
        console.warning(f"the cached SIF {digest[:19]} does not match its digest after a restart: "
                        "downloading it again")
        for suffix in (".id", ".sif"):  # the seal first: a SIF without one is never used
            _unlink_quietly(sif.removesuffix(".sif") + suffix)
        return ""
    return sif


def seal_sif(sif: str, digest: str, record: Mapping[str, object], *, unsynced: bool = False) -> None:
    """Tie the SIF just made to `digest` (`usable_sif`), and record where it came from for `cache list`.

    `unsynced`: the SIF is `digest`'s own bytes, verified, but not fsynced (singpy.oci.quickget's download):
    the seal names this boot, and a run in a later boot hashes the file again before it trusts it
    (docs/pull.md, "Speed"). Where the boot id can't be read, the SIF is fsynced now instead."""
    base = sif.removesuffix(".sif")
    boot = boot_id() if unsynced else ""
    mark = f" {UNSYNCED}{boot}" if boot else ""
    try:
        if unsynced and not boot:
            _fsync(sif)
        cachefiles.publish(f"{base}.id", f"{digest} {cachefiles.identity(os.lstat(sif))}{mark}\n".encode())
    except OSError as error:
        _unlink_quietly(sif)  # unsealed, it would never be used: not left behind
        raise ImageError(f"can't record the digest of {sif}: {error.strerror}") from None
    try:  # for `singpy cache list`: the image is usable without it
        cache.write_record(f"{base}.json", record)
    except OSError as error:
        console.debug(f"can't record where {sif} came from: {error.strerror}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cached_blob(path: str, digest: str) -> Any:
    """The blob `digest` at `path`, opened (binary, at its start) once its bytes are checked against the digest
    now; None if there is none. A file there with other bytes (a copy gone wrong, a disk error), a link or
    anything else is removed with a warning, so that the caller downloads it again."""
    import hashlib
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        fd, problem = -1, error.strerror
    else:
        handle = os.fdopen(fd, "rb")
        problem = "it is not a regular file" if not stat.S_ISREG(os.fstat(fd).st_mode) else ""
        hasher = hashlib.sha256()
        while not problem and (chunk := handle.read(1 << 20)):
            hasher.update(chunk)
        if not problem and f"sha256:{hasher.hexdigest()}" == digest:
            handle.seek(0)
            return handle
        handle.close()
    console.warning(f"the cached layer {digest[:19]} does not match its digest ({problem or 'other bytes'}): "
                    "downloading it again")
    try:
        cache.remove_tree(path)
    except OSError as error:
        raise ImageError(f"can't remove the bad cached layer {path}: {error.strerror}") from None
    return None


def open_blob(location: str, digest: str) -> Any:
    """The blob just downloaded (and verified) into the cache, opened without following a link."""
    path = blob_path(location, digest)
    try:
        return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
    except OSError as error:
        raise ImageError(f"can't read the cached layer {digest}: {error.strerror}") from None


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        return


def _unlink_if_there(path: str) -> bool:
    """Whether `path` was there to remove; any other failure is raised."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class locked:  # noqa: N801 - called as the function it was: `with store.locked(...)`
    """`with locked(path, waiting_for=...)`: hold the flock of `path` (created if needed, deleted on release)
    for the block. A class rather than a contextlib decorator: that module is not imported on a cached run."""

    def __init__(self, path: str, *, waiting_for: str) -> None:
        self.path, self.waiting_for, self.fd = path, waiting_for, -1

    def __enter__(self) -> None:
        fd = cache.lock_file(self.path, wait=self.waiting_for)
        assert fd is not None
        self.fd = fd

    def __exit__(self, *exc: object) -> None:
        _unlink_quietly(self.path)  # while locked, as cache.lock_file requires
        os.close(self.fd)


_REF_NAME_MAX = 240  # bytes of a refs/ file name (filesystems take 255)


def _ref_path(location: str, reference: str, platform: str) -> str:
    """refs/NAME for a reference and platform: the text made safe as one file name (readable in `ls`). A
    longer one keeps its beginning and ends with the SHA-256 of the whole text: two references (or platforms)
    never share a record, however long their names ('~' is never in an escaped name)."""
    text = f"{reference} {platform}"
    safe = "".join(char if char.isascii() and (char.isalnum() or char in "._-") else f"%{ord(char):02x}"
                   for char in text)
    if len(safe) > _REF_NAME_MAX:
        import hashlib

        safe = f"{safe[:_REF_NAME_MAX - 65]}~{hashlib.sha256(text.encode()).hexdigest()}"
    return f"{location}/{REFS}/{safe}"


def remember(location: str, reference: str, platform: str, *, top: str, digest: str) -> None:
    """Record that `reference` for `platform` resolved to the manifest `digest` (through `top`).

    Two digests on one line: read on every run of a cached image, without a JSON parser.
    """
    ensure(location, REFS)
    path = _ref_path(location, reference, platform)
    try:
        cachefiles.publish(path, f"{top} {digest}\n".encode())
    except OSError as error:  # the image runs anyway; the next run asks the registry again
        console.debug(f"can't write {path}: {error.strerror}")


def recall(location: str, reference: str, platform: str) -> dict[str, str]:
    """What `remember` recorded for this reference and platform ({} if nothing usable). Regular files of the
    user's only, no link followed, in a directory the caller checked (`location`); never a FIFO that would hang."""
    data = cachefiles.read_private(_ref_path(location, reference, platform), 200)
    words = data.decode("ascii", "replace").split() if data is not None else []
    if len(words) != 2 or not all(word.startswith("sha256:") and valid_digest(word) for word in words):
        return {}
    return {"top": words[0], "digest": words[1]}


def work_dir(location: str, env: Mapping[str, str], *, purpose: str) -> str:
    """A new private directory for a conversion: in $SINGPY_TMPDIR (or APPTAINER_TMPDIR), else the cache."""
    import tempfile

    variable = next((name for name in TMPDIR_VARIABLES if env.get(name)), "")
    parent = os.path.abspath(env[variable]) if variable else ensure(location, WORK)
    if variable:  # someone else's directory could swap what we unpack there: refused, as a cache would be
        cachefiles.check_owned(parent, what=f"work directory's parent ({variable})", sticky_ok=True)
    else:
        _sweep_work(parent)
    try:
        made = tempfile.mkdtemp(prefix=f"{purpose}-", dir=parent)
    except OSError as error:
        raise ImageError(f"can't create a work directory in {parent}: {error.strerror}",
                         hint=f"set {variable or 'SINGPY_TMPDIR'} to a writable directory with room") from None
    try:
        cachefiles.check_owned(made, what="work directory")
    except ImageError:
        os.rmdir(made)  # empty: made just now
        raise
    return made


def _sweep_work(parent: str) -> None:
    """Remove work directories whose pull was killed: those whose pid-lock no live process holds."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        lock = f"{parent}/{name}/.lock"
        fd = cache.lock_file(lock, wait=None, create=False)
        if fd is None:
            continue  # in use, or not one of ours
        try:
            console.verbose(f"removing an interrupted conversion: {parent}/{name}")
            cache.remove_tree(f"{parent}/{name}")
        finally:
            os.close(fd)


def hold_work_dir(path: str) -> int:
    """Lock a work directory for the life of this process: `_sweep_work` leaves it alone."""
    fd = cache.lock_file(f"{path}/.lock", wait=None)
    assert fd is not None  # just created by us
    return fd


def space_error(error: ImageError, directory: str, env: Mapping[str, str], *, cache: str = "") -> ImageError:
    """`error`, or, when a filesystem it wrote to is full, one that names its directory and the variable to change.

    `directory` is where the work went (a TMPDIR variable's, or the cache's tmp/), `cache` the cache, when the
    work also wrote there (blobs, the SIF): the one whose filesystem is full now is named; when neither is
    any more (a failed write's file was removed), the one the error's text names, else `directory`.
    """
    from singpy.image import tools

    chosen = next((name for name in TMPDIR_VARIABLES if env.get(name)), None)
    candidates = [(directory, chosen or "SINGPY_TMPDIR (or APPTAINER_TMPDIR)")]
    if cache:
        candidates.append((cache, "SINGPY_CACHEDIR (or APPTAINER_CACHEDIR)"))
    full = [candidate for candidate in candidates if tools.filesystem_full(candidate[0])]
    if not full:
        if not tools.says_no_space(error):
            return error
        text = f"{error.message} {getattr(error, 'output', '') or ''}"
        full = [candidate for candidate in candidates[1:] if candidate[0] in text] or candidates
    where, variable = full[0]
    return ImageError(f"no space left on device in {where}: set {variable} to a directory with room",
                      hint="`singpy cache clean` removes pulled images and layers from the cache")


def pulled_images(location: str) -> list[tuple[str, dict[str, Any]]]:
    """(hex digest, record with "size") of each SIF made by a pull, oldest first."""
    found = []
    try:
        names = os.listdir(f"{location}/{SIFS}")
    except OSError:
        return []
    for name in names:
        hex_digest = name.removesuffix(".sif")
        if not name.endswith(".sif") or not is_hex(hex_digest):
            continue
        try:
            size = os.lstat(f"{location}/{SIFS}/{name}").st_blocks * 512
        except OSError:
            continue
        record = cache.read_record(f"{location}/{SIFS}/{hex_digest}.json")
        found.append((hex_digest, {**record, "size": size}))
    return sorted(found, key=lambda item: created(item[1]))


def created(record: Mapping[str, Any]) -> int:
    value = record.get("created")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def blobs_usage(location: str) -> tuple[int, int]:
    """How many blobs (complete or partial) the cache holds, and their size on disk."""
    count = size = 0
    try:
        entries = list(os.scandir(f"{location}/{BLOBS}"))
    except OSError:
        return 0, 0
    for entry in entries:
        if not entry.name.startswith("."):
            count += 1
            size += entry.stat(follow_symlinks=False).st_blocks * 512
    return count, size


def remove_pulled(location: str, hex_digest: str) -> bool:
    """Delete one pulled SIF and its record; False if it is being made right now."""
    lock = f"{location}/{SIFS}/.{hex_digest}.lock"
    fd = cache.lock_file(lock, wait=None)
    if fd is None:
        return False
    try:
        for name in (f"{hex_digest}.sif", f"{hex_digest}.id", f"{hex_digest}.json"):
            _unlink_if_there(f"{location}/{SIFS}/{name}")
        os.unlink(lock)  # while locked, as cache.lock_file requires
    finally:
        os.close(fd)
    return True


def remove_blobs(location: str) -> int:
    """Delete every blob no pull is downloading, and the references (they would point nowhere); the count."""
    removed = 0
    directory = f"{location}/{BLOBS}"
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        hex_digest = name.split(".")[0]
        if name.startswith(".") or not is_hex(hex_digest):
            continue
        fd = cache.lock_file(f"{directory}/.{hex_digest}.lock", wait=None)
        if fd is None:
            continue  # downloading now
        try:
            removed += _unlink_if_there(f"{directory}/{name}")
            os.unlink(f"{directory}/.{hex_digest}.lock")
        finally:
            os.close(fd)
    cache.remove_tree(f"{location}/{REFS}")
    _sweep_work(f"{location}/{WORK}")
    return removed

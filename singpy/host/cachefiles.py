"""Where the user's cache is, and the small files the start-up path keeps there.

Kept apart from singpy.image.cache (the extraction cache, ~1.5 ms to import
here with what it pulls in) because `--nv` and `--device` read and write
their small cache files on every launch of a plain sandbox, which imports
nothing else from the cache. Imports only `os`. Also what singpy.image.cache
and singpy.image.warm share without importing each other: the bounded wait for
another's unpacking (`wait_bound`, `locked_within`) and the type of the
filesystem a cache is on (`filesystem_of`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import NoReturn


def cache_dir(env: Mapping[str, str], home: str) -> str:
    """The invoking user's cache directory (not created here).

    Apptainer keeps its own cache in `$APPTAINER_CACHEDIR/cache`; singpy's
    goes beside it, in `singpy/`, so that the two never mix.
    """
    if env.get("SINGPY_CACHEDIR"):
        return os.path.abspath(env["SINGPY_CACHEDIR"])
    for name in ("APPTAINER_CACHEDIR", "SINGULARITY_CACHEDIR"):
        if env.get(name):
            return os.path.join(os.path.abspath(env[name]), "singpy")
    if env.get("XDG_CACHE_HOME"):
        return os.path.join(os.path.abspath(env["XDG_CACHE_HOME"]), "singpy")
    return os.path.join(home, ".cache", "singpy")


def identity(info: os.stat_result, *, ctime: bool = False) -> str:
    """A file as the cache names it: device, inode, size and mtime in ns (in hex). Any rewrite of the file
    changes one of them, whatever its path, unless its mtime is set back after (rsync --inplace -t, cp -p onto
    it): `ctime` adds the change time, which no user can set, for the extraction cache's index (an image so
    rewritten must not run its old tree). Not for the OCI store's seals (singpy.oci.store): a hard link to a
    stored SIF (an oras:// pull's target) changes its ctime and would unseal it."""
    base = f"{info.st_dev:x}-{info.st_ino:x}-{info.st_size:x}-{info.st_mtime_ns:x}"
    return f"{base}-{info.st_ctime_ns:x}" if ctime else base


# A wait for another singpy's unpacking (of a tree into the cache) is bounded by what a slow unpacking of the
# image's size takes: WAIT_RATE squashfs bytes a second, WAIT_LEAST seconds at least. An unpacking stopped with
# its job (SIGSTOP, scontrol suspend) or stuck on a hung disk must not stop every later run for ever.
WAIT_RATE = 1 << 20
WAIT_LEAST = 5.0


def wait_bound(length: int) -> float:
    """Seconds to wait for an unpacking of `length` squashfs bytes under way (see WAIT_RATE)."""
    return max(WAIT_LEAST, length / WAIT_RATE)


def locked_within(fd: int, seconds: float, *, exclusive: bool = False) -> bool:
    """Whether a lock (flock, shared unless `exclusive`) on `fd` was had within `seconds`; polled, the pauses
    growing from 5 ms to 0.1 s: a blocking flock has no timeout."""
    import fcntl
    import time

    deadline, pause = time.monotonic() + seconds, 0.005
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    while True:
        try:
            fcntl.flock(fd, mode)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 0.1)


def filesystem_of(path: str) -> str:
    """The type of the filesystem `path` (or, missing, its nearest existing parent) is on; "" if unknown."""
    while not os.path.exists(path) and path not in ("/", ""):
        path = os.path.dirname(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
            return filesystem_type(os.path.realpath(path or "/"), mountinfo.read())
    except OSError:
        return ""


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


def make_private_dirs(path: str, *, what: str = "cache directory") -> None:
    """`path` and its missing parents, created private (0700), held to `check_owned` before (nothing is made in
    someone else's directory) and after: one that someone else made first (makedirs accepts any existing
    directory) is refused. One ImageError if either fails."""
    check_owned(path, what=what)  # first: root must not even make a directory in someone else's
    try:
        _make_dirs(path)
    except OSError as error:
        from singpy.errors import ImageError
        from singpy.host.hostfiles import shown

        raise ImageError(f"can't create the {what} {shown(path)}: {error.strerror}",
                         hint="set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a writable directory") from None
    check_owned(path, what=what)


def _make_dirs(path: str) -> None:
    """mkdir -p with every directory it makes 0700 (os.makedirs gives that mode to the last one only).

    Iterative (a deep path must not exhaust the stack); a directory another process makes at the same
    moment is no error (the caller checks who owns it).
    """
    missing = []
    current = os.path.normpath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise


def create_new(path: str) -> tuple[int, str]:
    """A new empty file (0600) to be renamed to `path` later: (descriptor open for writing, its name).

    Beside `path` under a hidden name no one can guess (random), made with O_EXCL | O_NOFOLLOW: a link or file
    planted at a name we were going to use can't make us write through it. OSError if it can't be made.
    """
    directory, name = os.path.split(path)
    while True:
        temporary = f"{directory}/.{name[:200]}.{os.urandom(8).hex()}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(temporary, flags, 0o600), temporary
        except FileExistsError:  # 64 random bits taken already: only by chance, or someone guessing
            continue


def publish(path: str, data: bytes, *, mode: int = 0o600, durable: bool = False) -> None:
    """Write `path` whole or not at all: a new file (`create_new`) renamed over it, so a concurrent reader sees
    the old content or the new, and a link at `path` is replaced, never followed. OSError, leaving nothing.

    `mode`: the file's mode once written (0600 until then); `durable`: on disk before it replaces the old one
    (a keyring, a configuration: not worth losing to a crash; a cache file can be made again)."""
    fd, temporary = create_new(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
            if mode != 0o600:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        try:  # noqa: SIM105 - contextlib is not imported on the start-up path
            os.unlink(temporary)
        except OSError:
            pass
        raise


def read_private(path: str, limit: int = 1 << 16) -> bytes | None:
    """The bytes of the regular file `path` of the user (or root), at most `limit`; None for anything else.

    No link is followed and no FIFO opened for good (O_NONBLOCK): a cache file is read only in a directory
    that passed `check_owned`, and only if it is one singpy could have written.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if (info.st_mode & 0o170000) != 0o100000 or info.st_uid not in (os.geteuid(), 0):  # S_ISREG
            return None
        chunks = []
        while limit > 0:
            chunk = os.read(fd, limit)
            if not chunk:
                break
            chunks.append(chunk)
            limit -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_fields(path: str, fields: Iterable[str]) -> None:
    """A small cache file of NUL-separated fields (`read_fields`), for what the start-up path keeps between runs
    (--nv's listing, an image's NVIDIA_ variables, a CDI spec's sonames) without importing json.

    Its directory is made private and must pass `check_owned` (an ImageError if not: these files decide what
    is mounted in a container); written atomically (`publish`: a concurrent run reads all of it or nothing).
    A file that can't be written is no error: the next run computes it again.
    """
    directory = os.path.dirname(path)
    existing = directory
    while not os.path.lexists(existing) and existing != "/":
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return  # a file where the cache should be: can't be written
    check_owned(directory)  # first: root must not even make a directory in someone else's
    try:
        _make_dirs(directory)
    except OSError:
        return
    check_owned(directory)
    try:  # noqa: SIM105 - contextlib is not imported on the start-up path
        publish(path, "\0".join(fields).encode(errors="surrogateescape"))
    except OSError:
        pass


def read_fields(path: str) -> list[str] | None:
    """What `write_fields` wrote, or None when there is no such file (or it can't be read, or isn't one singpy
    could have written). An ImageError if its directory fails `check_owned`: someone else may have put it there."""
    data = read_private(path, 1 << 24)
    if data is None:
        return None  # nothing read, nothing to trust: a miss costs no check
    check_owned(os.path.dirname(path))
    return data.decode(errors="surrogateescape").split("\0")


def check_owned(path: str, *, what: str = "cache directory", uid: int | None = None, sticky_ok: bool = False,
                below: Iterable[str] = ()) -> None:
    """Refuse a directory that someone else could have filled: the rule ssh applies to `~/.ssh`.

    From `/` down to `path`, every existing component (links included) is owned by the user or by root;
    `path` itself is not writable by group or others, and a directory above it that is must be sticky
    (like /tmp: others can add entries there, but not rename or remove ours). What does not exist yet is
    no error: callers check again once they have made it (private), so a directory someone else made
    first in the meantime is refused too. One ImageError names the first entry that fails and why.

    With `sticky_ok`, `path` may be writable by others if sticky too: the parent of a directory singpy makes
    with a random name (a work directory in $SINGPY_TMPDIR=/tmp), which is checked itself once made.
    `below`: relative paths of directories in `path` held to the same rule as `path`, one lstat per component.

    One lstat per component (a few microseconds each): checked every time a cache is used.
    """
    me = os.geteuid() if uid is None else uid
    full = os.path.abspath(path)
    current = ""
    for name in full.split("/")[1:] if full != "/" else [""]:
        current = f"{current}/{name}" if name else "/"
        if not _check_one(current, me, what, strict=current == full and not sticky_ok, sticky_ok=sticky_ok):
            return
    for sub in below:
        current = full
        for name in sub.split("/"):
            current = f"{current}/{name}"
            if not _check_one(current, me, what, strict=True, sticky_ok=False):
                break


def _check_one(current: str, me: int, what: str, *, strict: bool, sticky_ok: bool) -> bool:
    """One component of `check_owned`: False if it does not exist (nothing there to distrust yet)."""
    import stat

    try:
        info = os.lstat(current)
    except FileNotFoundError:
        return False
    except OSError as error:  # a parent we may not search (chmod 000 ~/.cache/singpy): say which
        from singpy.errors import ImageError
        from singpy.host.hostfiles import shown

        parent = os.path.dirname(current)
        raise ImageError(f"can't use the {what} {shown(parent)}: {(error.strerror or str(error)).lower()}",
                         hint=f"give yourself access to it (chmod u+rwx {shown(parent)})") from None
    if info.st_uid not in (me, 0):
        _refuse(current, what, f"it belongs to uid {info.st_uid}, not to you or root")
    if stat.S_ISLNK(info.st_mode):
        target = os.path.realpath(current)
        # the link is ours or root's; where it leads must pass too (as a parent, unless it is the last)
        check_owned(target, what=what, uid=me, sticky_ok=sticky_ok or not strict)
        try:
            info = os.stat(target)
        except OSError:
            return False  # a dangling link: nothing there yet, as for a missing component
    elif not stat.S_ISDIR(info.st_mode):
        _refuse(current, what, "it is not a directory")
    if info.st_mode & 0o022 and (strict or not info.st_mode & stat.S_ISVTX):
        who = "others" if info.st_mode & 0o002 else "its group"
        _refuse(current, what, f"it is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})")
    return True


def _refuse(path: str, what: str, reason: str) -> NoReturn:
    from singpy.errors import ImageError
    from singpy.host.hostfiles import shown

    elsewhere = ", or point SINGPY_CACHEDIR elsewhere" if "cache" in what else ""
    raise ImageError(f"refusing the {what} {shown(path)}: {reason}",
                     hint=f"use a directory that only you (or root) can write (chmod go-w){elsewhere}")

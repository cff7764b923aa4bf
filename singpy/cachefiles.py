"""Where the user's cache is, and the small files the start-up path keeps there.

Kept apart from singpy.image.cache (the extraction cache, ~1.5 ms to import
here with what it pulls in) because `--nv` and `--device` read and write
their small cache files on every launch of a plain sandbox, which imports
nothing else from the cache. Imports only `os`.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


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


def identity(info: os.stat_result) -> str:
    """A file as the cache names it: device, inode, size and mtime in ns (in hex). Any rewrite of the file
    changes one of them, whatever its path."""
    return f"{info.st_dev:x}-{info.st_ino:x}-{info.st_size:x}-{info.st_mtime_ns:x}"


def make_private_dirs(path: str) -> None:
    """`path` and its missing parents, created private (0700); one ImageError if that fails."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as error:
        from singpy.errors import ImageError
        from singpy.hostfiles import shown

        raise ImageError(f"can't create the cache directory {shown(path)}: {error.strerror}",
                         hint="set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a writable directory") from None


def write_fields(path: str, fields: Iterable[str]) -> None:
    """A small cache file of NUL-separated fields (`read_fields`), for what the start-up path keeps between runs
    (--nv's listing, an image's NVIDIA_ variables, a CDI spec's sonames) without importing json. Written
    atomically (a concurrent run reads all of it or nothing), its directory made private; one that can't be
    written is no error."""
    partial = f"{path}.{os.getpid()}.partial"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(partial, "wb") as out:
            out.write("\0".join(fields).encode(errors="surrogateescape"))
        os.replace(partial, path)
    except OSError:
        import contextlib  # only when the write failed: not imported on the start-up path

        with contextlib.suppress(OSError):
            os.unlink(partial)


def read_fields(path: str) -> list[str] | None:
    """What `write_fields` wrote, or None when there is no such file (or it can't be read)."""
    try:
        with open(path, "rb") as saved:
            return saved.read().decode(errors="surrogateescape").split("\0")
    except OSError:
        return None


def check_owned(path: str, *, what: str = "cache directory", uid: int | None = None) -> None:
    """Refuse a directory that someone else could have filled: the rule ssh applies to `~/.ssh`.

    From `/` down to `path`, every existing component (links included) is owned by the user or by root;
    `path` itself is not writable by group or others, and a directory above it that is must be sticky
    (like /tmp: others can add entries there, but not rename or remove ours). What does not exist yet is
    no error: callers check again once they have made it (private), so a directory someone else made
    first in the meantime is refused too. One ImageError names the first entry that fails and why.

    One lstat per component (a few microseconds each): checked every time a cache is used.
    """
    import stat

    me = os.geteuid() if uid is None else uid
    full = os.path.abspath(path)
    current = ""
    for name in full.split("/")[1:] if full != "/" else [""]:
        current = f"{current}/{name}" if name else "/"
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        except OSError as error:
            _refuse(current, what, f"can't look at it: {error.strerror}")
        if info.st_uid not in (me, 0):
            _refuse(current, what, f"it belongs to uid {info.st_uid}, not to you or root")
        if stat.S_ISLNK(info.st_mode):
            target = os.path.realpath(current)
            check_owned(target, what=what, uid=me)  # the link is ours or root's; where it leads must pass too
            info = os.stat(target)
        elif not stat.S_ISDIR(info.st_mode):
            _refuse(current, what, "it is not a directory")
        last = current == full
        if info.st_mode & 0o022 and (last or not info.st_mode & stat.S_ISVTX):
            who = "others" if info.st_mode & 0o002 else "its group"
            _refuse(current, what, f"it is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})")


def _refuse(path: str, what: str, reason: str) -> None:
    from singpy.errors import ImageError
    from singpy.hostfiles import shown

    raise ImageError(f"refusing the {what} {shown(path)}: {reason}",
                     hint="use a directory that only you (or root) can write, e.g. chmod go-w, or point "
                          "SINGPY_CACHEDIR elsewhere")

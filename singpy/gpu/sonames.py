"""The sonames of a CDI spec's libraries, kept in the user's cache between launches.

update-ldcache (singpy.gpu.cdi) needs the soname of every library a spec
mounts in its folders: some 64 ELF headers, ~2 ms of every `--device` launch
here, for answers that change only when the files do. They are kept in one
small file per set of libraries (singpy.host.cachefiles), each entry with the
library's identity (device, inode, size, mtime: a driver update replaces the
files), and used only when every identity still matches. A miss reads the
files and saves; a cache that can't be read or written is no error, one
that someone else could have written is refused (cachefiles.read_fields).
"""

from __future__ import annotations

import os
import stat

from singpy.host.cachefiles import identity, read_fields, write_fields

_FORMAT = "1"  # in the file name: a singpy reading another layout misses, it never misreads
_SEPARATOR = "\x01"  # between a library's path and its identity (no NUL in a path; the identity has none)


def sonames(files: dict[str, os.stat_result], cache: str | None) -> dict[str, str | None]:
    """The soname of each of `files` (host path -> its stat), None for one without (or not a regular file)."""
    keys = [f"{path}{_SEPARATOR}{identity(info)}" for path, info in files.items()]
    entry = _entry(cache, keys)
    if entry is not None:
        fields = read_fields(entry)
        if fields is not None and fields[0::2] == keys:
            return {path: name or None for path, name in zip(files, fields[1::2], strict=True)}
    from singpy.gpu.elf import soname  # only on a miss

    found = {path: soname(path) if stat.S_ISREG(info.st_mode) else None for path, info in files.items()}
    if entry is not None:
        pairs = zip(keys, found.values(), strict=True)
        write_fields(entry, (field for key, name in pairs for field in (key, name or "")))
    return found


def _entry(cache: str | None, keys: list[str]) -> str | None:
    """The cache file for this set of libraries; None without a cache (or without libraries)."""
    if not keys or not cache or not os.path.isabs(cache):
        return None
    import zlib  # a checksum names the file; the keys inside it decide

    digest = zlib.crc32("\0".join(keys).encode(errors="surrogateescape"))
    return f"{cache}/cdi-sonames/{_FORMAT}-{digest:08x}-{len(keys)}"

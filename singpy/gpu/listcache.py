"""nvidia-container-cli's listing, kept per driver: `--nv` runs the tool once per driver, not once per launch.

`nvidia-container-cli list` loads NVML and walks the driver's files: about
+23 ms on every `--nv` launch (benchmarks/README.md), for an answer that only
changes when the driver does. The listing, as singpy resolved it (libraries
with their soname links, binaries), is kept in the user's cache under a name
made of what a driver update changes: the driver's version
(/proc/driver/nvidia/version), the tool's identity (device, inode, size,
mtime) and the ld cache's mtime (ldconfig runs when driver libraries are
installed). Any of them changing is a miss; a miss runs the tool and saves.
Saved atomically (a temporary file renamed), NUL-separated: reading it
imports nothing. A cache that can't be read or written is no error; one that
someone else could have written is refused (cachefiles.write_fields: the
listing decides what is mounted into the container).

The newest GLIBC_2.x each listed file needs is kept too (read once, when the
listing is saved): an image whose glibc is known is then checked against it
without reading the ~70 files' version tables on every launch.
"""

from __future__ import annotations

import os

from singpy.gpu import GpuHost
from singpy.gpu.ldcache import HostFiles

_LIBRARY, _BINARY, _GLIBC = "L", "B", "G"
_FORMAT = "2"  # in the file name: a singpy reading another layout misses, it never misreads


def entry(cli: str, host: GpuHost) -> str | None:
    """The cache file for this tool and driver; None when a part of the key can't be read (no driver: no cache)."""
    from singpy.gpu.versions import driver_version_text
    from singpy.host import cachefiles

    version = driver_version_text(host.proc_driver_version)
    directory = cachefiles.cache_dir(host.env, host.env.get("HOME", ""))
    if version is None or not os.path.isabs(directory):
        return None
    try:
        tool = os.stat(cli)
        ld_cache = os.stat(host.ld_cache_file or "/etc/ld.so.cache").st_mtime_ns
    except OSError:
        return None
    name = f"{_FORMAT}-{version}-{cachefiles.identity(tool)}-{ld_cache:x}"
    return f"{directory}/nv-list/{name}"


def load(path: str, cli: str) -> HostFiles | None:
    from singpy.host.cachefiles import read_fields

    fields = read_fields(path)
    if fields is None:
        return None
    found: dict[str, list[tuple[str, str]]] = {_LIBRARY: [], _BINARY: [], _GLIBC: []}
    for kind, name, value in zip(fields[::3], fields[1::3], fields[2::3], strict=False):
        if kind in found:
            found[kind].append((name, value))
    libraries = found[_LIBRARY]
    return HostFiles(libraries=tuple(libraries), binaries=tuple(found[_BINARY]), glibc=tuple(found[_GLIBC]),
                     warnings=() if libraries else ("could not find any nv libraries on this host",),
                     notes=(f"libraries and binaries listed by {cli} (the listing kept for this driver: {path})",))


def save(path: str, files: HostFiles) -> None:
    from singpy.gpu.ldcache import glibc_needs
    from singpy.host.cachefiles import write_fields

    records = ((_LIBRARY, files.libraries), (_BINARY, files.binaries), (_GLIBC, files.glibc or glibc_needs(files)))
    write_fields(path, (field for kind, pairs in records for name, value in pairs for field in (kind, name, value)))

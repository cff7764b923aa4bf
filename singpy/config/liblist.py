"""Parse `etc/nvliblist.conf` / `etc/rocmliblist.conf` (Apptainer's format).

One entry per line; each line is stripped, blank lines and lines starting
with `#` are skipped (there are no inline comments).  Entries are classified
as Apptainer main does in `internal/pkg/util/gpu/paths.go` (`gpuliblist` and
`paths`):

* the substring ``.so`` anywhere  -> library (bare name or absolute path);
* otherwise an absolute path      -> plain file (Apptainer >= 1.4);
* otherwise                       -> binary, looked up on $PATH later.

Duplicates are dropped, first occurrence kept, so the order of the file is
the order of the binds.
"""

from __future__ import annotations

from singpy.errors import ConfigError
from singpy.record import Record


class LibList(Record):
    """The three kinds of entries of a liblist file, in file order."""

    binaries: tuple[str, ...]  # names looked up on $PATH, bound at /usr/bin/<name>
    libraries: tuple[str, ...]  # "libcuda.so" (ld cache prefix) or an absolute .so path
    files: tuple[str, ...]  # absolute paths bound at the same path when present


def parse_liblist(text: str) -> LibList:
    """Classify the entries of a liblist file's text."""
    kinds: dict[str, list[str]] = {"binaries": [], "libraries": [], "files": []}
    seen: set[str] = set()
    for raw in text.splitlines():
        entry = raw.strip()
        if not entry or entry.startswith("#") or entry in seen:
            continue
        seen.add(entry)
        if ".so" in entry:
            kinds["libraries"].append(entry)
        elif entry.startswith("/"):
            kinds["files"].append(entry)
        else:
            kinds["binaries"].append(entry)
    return LibList(
        binaries=tuple(kinds["binaries"]),
        libraries=tuple(kinds["libraries"]),
        files=tuple(kinds["files"]),
    )


def load_liblist(path: str) -> LibList:
    """Read and parse a liblist file; an unreadable file is a `ConfigError`."""
    from singpy.host.hostfiles import read_text

    try:  # a regular UTF-8 file of at most 1 MiB: never a FIFO that blocks, nor a device without end
        text = read_text(path, what="GPU library list", error=ConfigError, unreadable=f"could not read {path}")
    except ConfigError as error:
        raise ConfigError(
            error.message, hint="check the path of the GPU library list (nvliblist.conf / rocmliblist.conf)"
        ) from None
    return parse_liblist(text)

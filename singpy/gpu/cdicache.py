"""The edits of a --device request, kept in the user's cache between launches.

Reading the CDI specs, checking each of their ~70 edits and making the mounts
is ~4 ms of every `--device` launch here (the JSON scan, a stat and a check
per mount, the sonames, ~200 mount records, the modules that do it), for a
result that changes only when a spec or what it points at does. So what
singpy.gpu.cdi.discover returns is kept in one small file (singpy.host.cachefiles)
named after the request: the devices asked for, the spec directories and
every spec file in them (name, device, inode, size, mtime). It is used only
while everything it binds is as it was then: each device node of the same
type and major:minor, each other source the same file (device, inode, size,
mtime: a driver update replaces the libraries). Anything else (no entry, a
spec edited, added or removed, a node or a file changed or gone) reads the
specs again, which names the problem in one FATAL line if there is one.
"""

from __future__ import annotations

import os
import stat

from singpy.gpu import CDI_SPEC_SUFFIXES, GpuContribution
from singpy.host.cachefiles import identity, read_fields, write_fields
from singpy.plan import Missing, MountOp, MountSpec, Stage

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Sequence

# In the file name: a singpy writing another layout misses, it never misreads. "2": the edits of a spec are checked
# more (env names, HOME dropped, links out of a mount): a "1" entry may hold what a spec can no longer give.
_FORMAT = "2"
_MOUNT_FIELDS = 9  # after the tag: op, dest, source, readonly, dev, missing, stage, mode, what the source was


def discover(values: Sequence[str], dirs: Sequence[str], *, cache: str | None) -> GpuContribution:
    """singpy.gpu.cdi.discover, through the cache."""
    key = _request_key(values, dirs)
    entry = _entry(cache, key) if key is not None else None
    if entry is not None and key is not None and (kept := _load(entry, key)) is not None:
        return kept
    from singpy.gpu import cdi

    found = cdi.discover(values, dirs, cache=cache)
    if entry is not None and key is not None:
        _save(entry, key, found)
    return found


def _request_key(values: Sequence[str], dirs: Sequence[str]) -> str | None:
    """What the result depends on besides the host files it binds; None when a directory can't be read
    (singpy.gpu.cdi then says why)."""
    listings: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    for directory in dirs:
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(CDI_SPEC_SUFFIXES))
            listings.append((directory, tuple((name, identity(os.stat(os.path.join(directory, name))))
                                              for name in names)))
        except FileNotFoundError:
            listings.append((directory, ()))
        except OSError:
            return None
    return repr((_FORMAT, tuple(values), tuple(listings)))


def _entry(cache: str | None, key: str) -> str | None:
    if not cache or not os.path.isabs(cache):
        return None
    import zlib  # a checksum names the file; the key inside it decides

    return f"{cache}/cdi-edits/{_FORMAT}-{zlib.crc32(key.encode(errors='surrogateescape')):08x}"


def _what(info: os.stat_result, device: bool) -> str:
    """A device node by type and number (udev may make it anew), anything else as a file."""
    return f"{stat.S_IFMT(info.st_mode):o}:{info.st_rdev:x}" if device else identity(info)


def _save(entry: str, key: str, found: GpuContribution) -> None:
    fields = [key]
    for spec in found.mounts:
        what = ""
        if spec.op == MountOp.BIND:
            assert spec.source is not None
            try:
                what = _what(os.stat(spec.source), spec.dev)
            except OSError:
                return  # gone meanwhile: nothing to keep
        fields += ["m", spec.op, spec.dest, spec.source or "", "1" if spec.readonly else "",
                   "1" if spec.dev else "", spec.missing, str(spec.stage), spec.mode, what]
    for name, value in found.env:
        fields += ["e", name, value]
    fields += [field for text in found.warnings for field in ("w", text)]
    fields += [field for text in found.notes for field in ("t", text)]
    fields += [field for name in found.keep_host_env for field in ("k", name)]
    fields += ["l", "1" if found.libs_dir_used else ""]
    write_fields(entry, fields)


def _load(entry: str, key: str) -> GpuContribution | None:
    """What was kept for this request, if every source it binds is still what it was; None otherwise."""
    fields = read_fields(entry)
    if not fields or fields[0] != key:
        return None
    mounts: list[MountSpec] = []
    env: list[tuple[str, str]] = []
    texts: dict[str, list[str]] = {"w": [], "t": [], "k": []}
    libs_dir_used = False
    index = 1
    try:
        while index < len(fields):
            tag = fields[index]
            if tag == "m":
                op, dest, source, readonly, dev, missing, stage_number, mode, what = \
                    fields[index + 1:index + 1 + _MOUNT_FIELDS]
                index += 1 + _MOUNT_FIELDS
                stage = int(stage_number)
                if op not in MountOp.ALL or missing not in Missing.ALL or stage not in Stage.ALL:
                    return None  # not a file this layout wrote
                if op == MountOp.BIND and not _unchanged(source, bool(dev), what):
                    return None
                mounts.append(MountSpec(op=op, dest=dest, source=source or None,  # type: ignore[arg-type]
                                        readonly=bool(readonly), dev=bool(dev), missing=missing,  # type: ignore[arg-type]
                                        stage=stage, mode=mode))  # type: ignore[arg-type]  # checked above
            elif tag == "e":
                env.append((fields[index + 1], fields[index + 2]))
                index += 3
            elif tag in texts:
                texts[tag].append(fields[index + 1])
                index += 2
            elif tag == "l":
                libs_dir_used = bool(fields[index + 1])
                index += 2
            else:
                return None
    except (ValueError, IndexError):  # not a file this layout wrote
        return None
    return GpuContribution(mounts=tuple(mounts), env=tuple(env), keep_host_env=tuple(texts["k"]),
                           libs_dir_used=libs_dir_used, warnings=tuple(texts["w"]),
                           notes=(*texts["t"], f"CDI edits read from the cache ({entry})"))


def _unchanged(source: str, device: bool, what: str) -> bool:
    try:
        return _what(os.stat(source), device) == what
    except OSError:
        return False

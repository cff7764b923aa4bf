"""Layer entries for the test images: Entry records (tar members), their helpers, and the PAX tar of a layer.

Names are written exactly as given: "../../etc/x", "/etc/abs" or a symlink followed by a file under it make
the hostile layers a safe extractor must refuse or contain. tests.support.oci re-exports every public name.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

from singpy.record import Record

MTIME = 1_700_000_000  # every entry's default modification time: digests do not depend on the clock


class Entry(Record):
    """One tar member. kind: file, dir, symlink, hardlink, char, block, fifo. `link`: symlink target or the
    member name a hard link points to. `pax`: extra PAX header records (e.g. SCHILY.xattr.*)."""

    name: str
    kind: str = "file"
    content: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    link: str = ""
    major: int = 0
    minor: int = 0
    mtime: int = MTIME
    pax: tuple[tuple[str, str], ...] = ()


def file(name: str, content: bytes | str = b"", *, mode: int = 0o644, uid: int = 0, gid: int = 0,
         mtime: int = MTIME) -> Entry:
    data = content.encode() if isinstance(content, str) else content
    return Entry(name=name, kind="file", content=data, mode=mode, uid=uid, gid=gid, mtime=mtime)


def directory(name: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0, mtime: int = MTIME) -> Entry:
    return Entry(name=name, kind="dir", mode=mode, uid=uid, gid=gid, mtime=mtime)


def symlink(name: str, target: str, *, uid: int = 0, gid: int = 0, mtime: int = MTIME) -> Entry:
    return Entry(name=name, kind="symlink", link=target, mode=0o777, uid=uid, gid=gid, mtime=mtime)


def hardlink(name: str, target: str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    """A hard link to the earlier member `target` (a member name, as tar stores it)."""
    return Entry(name=name, kind="hardlink", link=target, mode=mode, uid=uid, gid=gid)


def whiteout(path: str) -> Entry:
    """Deletes `path` of the layers below: an empty file `.wh.NAME` next to it."""
    parent, _, base = path.rstrip("/").rpartition("/")
    return file(f"{parent}/.wh.{base}" if parent else f".wh.{base}")


def opaque(path: str) -> Entry:
    """Hides everything the layers below put in directory `path`."""
    return file(f"{path.rstrip('/')}/.wh..wh..opq")


def char_device(name: str, major: int, minor: int, *, mode: int = 0o666, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="char", major=major, minor=minor, mode=mode, uid=uid, gid=gid)


def block_device(name: str, major: int, minor: int, *, mode: int = 0o660, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="block", major=major, minor=minor, mode=mode, uid=uid, gid=gid)


def fifo(name: str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="fifo", mode=mode, uid=uid, gid=gid)


def tree(root: Path, *, exclude: Iterable[str] = (), owner: tuple[int, int] | None = (0, 0),
         mtime: int | None = MTIME, prefix: str = "") -> list[Entry]:
    """The entries of a directory on disk, parents first, sorted; hard links become `hardlink` entries.

    `exclude`: top-level names left out. `owner`: (uid, gid) written for every entry, `mtime` likewise (None:
    as on disk). Modes, link targets and device numbers as on disk. Content is read now.
    """
    skipped = set(exclude)
    entries: list[Entry] = []
    seen: dict[tuple[int, int], str] = {}
    for current, dirs, files in os.walk(root):
        relative = os.path.relpath(current, root)
        if relative == ".":
            dirs[:] = [name for name in dirs if name not in skipped]
            files = [name for name in files if name not in skipped]
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(current, name)
            member = prefix + os.path.normpath(os.path.join(relative, name))
            entries.append(_from_disk(path, member, owner, mtime, seen))
    return entries


def _from_disk(path: str, member: str, owner: tuple[int, int] | None, mtime: int | None,
               seen: dict[tuple[int, int], str]) -> Entry:
    info = os.lstat(path)
    uid, gid = owner if owner is not None else (info.st_uid, info.st_gid)
    base = Entry(name=member, mode=stat.S_IMODE(info.st_mode), uid=uid, gid=gid,
                 mtime=int(info.st_mtime) if mtime is None else mtime)
    if stat.S_ISLNK(info.st_mode):
        return base.replace(kind="symlink", link=os.readlink(path), mode=0o777)
    if stat.S_ISDIR(info.st_mode):
        return base.replace(kind="dir")
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in seen:
        return base.replace(kind="hardlink", link=seen[key])
    seen[key] = member
    if stat.S_ISREG(info.st_mode):
        with open(path, "rb") as handle:
            return base.replace(kind="file", content=handle.read())
    if stat.S_ISFIFO(info.st_mode):
        return base.replace(kind="fifo")
    kind = "char" if stat.S_ISCHR(info.st_mode) else "block"
    return base.replace(kind=kind, major=os.major(info.st_rdev), minor=os.minor(info.st_rdev))


_TAR_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
              "hardlink": tarfile.LNKTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE,
              "fifo": tarfile.FIFOTYPE}


def tar_bytes(entries: Iterable[Entry]) -> bytes:
    """An uncompressed PAX tar of `entries`, in the order given, names as given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = _TAR_TYPES[entry.kind]
            info.mode = entry.mode
            info.uid, info.gid = entry.uid, entry.gid
            info.uname = info.gname = ""
            info.mtime = entry.mtime
            info.linkname = entry.link
            info.devmajor, info.devminor = entry.major, entry.minor
            info.pax_headers = dict(entry.pax)
            if entry.kind == "file":
                info.size = len(entry.content)
                archive.addfile(info, io.BytesIO(entry.content))
            else:
                archive.addfile(info)
    return buffer.getvalue()

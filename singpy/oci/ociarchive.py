"""The `oci-archive:` and `docker-archive:` transports' files: an uncompressed tar, its members read in place.

The members are located once (headers only) and each is read from its
offset with pread(), so nothing is extracted and several blobs can be read
at once; a compressed archive is refused (it could only be read by
unpacking it). An archive's names only index its own members: its links
resolve to members, never to files.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
from typing import Any, BinaryIO

from singpy.errors import ImageError
from singpy.host.hostfiles import kind_name
from singpy.oci.localfiles import CHUNK, Files

MAX_MEMBERS = 1 << 16  # members of an archive: real ones hold a few per layer
_MAX_LINKS = 16  # links followed from one archive member to another
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


class Archive(Files):
    """An uncompressed tar: its members located once from their headers, each read in place with pread()."""

    def __init__(self, path: str, where: str) -> None:
        super().__init__(where)
        self.path = path
        self.members: dict[str, tuple[int, int]] = {}  # name -> (offset of the data, size)
        self.links: dict[str, tuple[bool, str]] = {}  # name -> (symbolic?, target as written)
        fd = self._open_file()
        try:
            info = os.fstat(fd)
            self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            self._check_uncompressed(fd)
            self._index(fd)
        finally:
            os.close(fd)

    def _open_file(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageError(f"{self.where}: no such file") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ImageError(f"{self.where} is {kind_name(mode)}, not a tar archive")
        os.set_blocking(fd, True)
        return fd

    def _check_uncompressed(self, fd: int) -> None:
        head = os.pread(fd, 8, 0)
        for magic, name in _COMPRESSED:
            if head.startswith(magic):
                raise ImageError(f"{self.where} is a {name}-compressed archive: singpy reads uncompressed tar "
                                 "archives in place", hint=f"decompress it first (e.g. with {name} -d)")

    def _index(self, fd: int) -> None:
        handle = os.fdopen(os.dup(fd), "rb")
        try:
            with tarfile.open(fileobj=handle, mode="r:") as archive:
                for count, member in enumerate(archive, 1):
                    if count > MAX_MEMBERS:
                        raise ImageError(f"{self.where} has over {MAX_MEMBERS} members: not an image archive")
                    self._add(member)
        except tarfile.TarError as error:
            raise ImageError(f"{self.where} is not a tar archive ({error})") from None
        except (EOFError, ValueError, UnicodeError):
            raise ImageError(f"{self.where} is not a tar archive (truncated or malformed)") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        finally:
            handle.close()

    def _add(self, member: tarfile.TarInfo) -> None:
        name = _member_name(member.name)
        if name is None:
            return
        if member.isreg() and not member.issparse():
            self.members[name] = (member.offset_data, member.size)
            self.links.pop(name, None)
        elif member.issym() or member.islnk():
            self.links[name] = (member.issym(), member.linkname)
            self.members.pop(name, None)
        else:  # directories, devices...: nothing an image reads
            self.members.pop(name, None)
            self.links.pop(name, None)

    def _resolve(self, name: str) -> tuple[int, int] | None:
        """The data of member `name`, links followed to other members (docker save links duplicate layers)."""
        for _ in range(_MAX_LINKS):
            if name in self.members:
                return self.members[name]
            link = self.links.get(name)
            if link is None:
                return None
            symbolic, target = link
            joined = posixpath.join(posixpath.dirname(name), target) if symbolic and not target.startswith("/") \
                else target
            resolved = _member_name(joined)
            if resolved is None:
                return None
            name = resolved
        raise ImageError(f"{self.where}: too many links from member to member")

    def size(self, name: str) -> int | None:
        found = self._resolve(name)
        return None if found is None else found[1]

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        found = self._resolve(name)
        if found is None:
            return None
        fd = self._open_file()
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != self.identity:
            os.close(fd)
            raise ImageError(f"{self.where} changed while singpy read it")
        offset, size = found
        return io.BufferedReader(_Slice(fd, offset, size), CHUNK)


def _member_name(name: str) -> str | None:
    """An archive member's name in one spelling ("./blobs//x" -> "blobs/x", "../x" -> "x"), None for the top.

    Names only index the archive's own members: a `..` stops at its top, as it is never a host path."""
    normal = posixpath.normpath("/" + name).lstrip("/")
    if not normal or normal == ".":
        return None
    return normal


class _Slice(io.RawIOBase):
    """Bytes [offset, offset + size) of a file, read with pread(): streams of one archive do not share a position."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        super().__init__()
        self.fd, self.offset, self.size, self.position = fd, offset, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        data = os.pread(self.fd, wanted, self.offset + self.position)
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()

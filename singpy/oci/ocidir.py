"""The `oci:` transport's files: an OCI layout directory, opened below it one component at a time, nothing followed.

The directory itself is the user's choice; below it a symbolic link anywhere
in `blobs/ALG/HEX`, or a FIFO or device there, is refused, and a directory
replaced while singpy reads it is an error.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

from singpy.errors import ImageError
from singpy.host.hostfiles import kind_name
from singpy.oci.localfiles import Files

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Directory(Files):
    """An OCI layout directory. The directory itself is the user's choice; below it nothing is followed."""

    def __init__(self, path: str, where: str) -> None:
        super().__init__(where)
        self.path = path
        fd = self._open_root(first=True)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        self.identity = (info.st_dev, info.st_ino)

    def _open_root(self, *, first: bool = False) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageError(f"{self.where}: no such directory") from None
        except NotADirectoryError:
            raise ImageError(f"{self.where} is not a directory (an archive is read with oci-archive:)") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        if not first:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != self.identity:
                os.close(fd)
                raise ImageError(f"{self.where} was replaced while singpy read it")
        return fd

    def _open(self, name: str, what: str) -> int | None:
        """A descriptor of regular file `name`, opened component by component without following links."""
        *parents, last = name.split("/")
        current = self._open_root()
        try:
            for part in parents:
                try:
                    below = os.open(part, _DIRECTORY, dir_fd=current)
                except FileNotFoundError:
                    return None
                except OSError as error:
                    raise self._refused(part, what, error) from None
                os.close(current)
                current = below
            try:
                info = os.stat(last, dir_fd=current, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as error:
                raise ImageError(f"can't read {what} in {self.where}: {error.strerror}") from None
            if not stat.S_ISREG(info.st_mode):
                raise ImageError(f"{self.where}: {what} ({name}) is {kind_name(info.st_mode)}, not a regular file: "
                                 "refused")
            try:
                fd = os.open(last, _FILE, dir_fd=current)
            except OSError as error:
                raise ImageError(f"can't read {what} in {self.where}: {error.strerror}") from None
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(opened.st_mode):
                os.close(fd)
                raise ImageError(f"{self.where}: {name} changed while singpy read it")
            os.set_blocking(fd, True)
            return fd
        finally:
            os.close(current)

    def _refused(self, part: str, what: str, error: OSError) -> ImageError:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link, or a file is in the way
            return ImageError(f"{self.where}: {part} on the way to {what} is a symbolic link or not a directory: "
                              "refused")
        return ImageError(f"can't read {what} in {self.where}: {error.strerror}")

    def size(self, name: str) -> int | None:
        fd = self._open(name, name)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        fd = self._open(name, what)
        return None if fd is None else os.fdopen(fd, "rb")

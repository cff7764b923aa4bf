"""Removing and walking directory trees without recursion, on directory descriptors.

An image is untrusted: a layer may hold a directory thousands of levels
deep. shutil.rmtree, shutil.copytree and os.walk (Python 3.11) recurse, so
such a tree exhausts Python's stack (RecursionError), and its paths can be
longer than PATH_MAX (4096), which no system call takes as a string. Here a
walk holds one directory open at a time and names every entry relative to
it (`dir_fd=`), so neither the depth nor the length of a path matters; it
goes back up through "..", checked against the device and inode it came
down from, so a directory moved meanwhile stops the walk instead of leading
it elsewhere. Memory grows with the subdirectories still to visit, never
with the stack.

Stdlib only, imported lazily: the `singpy exec` path never needs it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Cursor:
    """One open directory of a tree, with the names and identities of the directories above it.

    `writable`: each directory is made readable, writable and searchable by
    its owner on the way down (an image may carry read-only directories, whose
    entries could not be removed otherwise).
    """

    def __init__(self, parent: int, name: str, *, writable: bool) -> None:
        self.writable = writable
        self.top = parent  # the caller's: never closed here
        self.fd = self._open(parent, name)
        info = os.fstat(parent)
        self.trail = [(name, (info.st_dev, info.st_ino))]  # (name, identity of the directory holding it)

    @property
    def depth(self) -> int:
        return len(self.trail)

    def down(self, name: str) -> None:
        child = self._open(self.fd, name)
        info = os.fstat(self.fd)
        self.trail.append((name, (info.st_dev, info.st_ino)))
        left, self.fd = self.fd, child  # forgotten, then closed: never closed twice (`close`)
        os.close(left)

    def up(self) -> str:
        """Back to the directory above (the caller's `parent` at the top); returns the name just left."""
        name, identity = self.trail.pop()
        if self.trail:
            parent = os.open("..", _DIR, dir_fd=self.fd)
            info = os.fstat(parent)
            if (info.st_dev, info.st_ino) != identity:
                os.close(parent)
                raise OSError(errno.ESTALE, f"{name} was moved while it was being walked")
        else:
            parent = self.top
        left, self.fd = self.fd, parent
        os.close(left)
        return name

    def close(self) -> None:
        """Close the open directory (not the caller's). A descriptor is forgotten before it is closed, here and on
        the way down and up: a signal's exception (image.tools.Interruptible) between the two leaves it open until
        the exit, where closing it twice would close what another thread opened meanwhile under that number."""
        if self.fd != self.top:
            left, self.fd = self.fd, self.top
            os.close(left)

    def _open(self, parent: int, name: str) -> int:
        if not self.writable:
            return os.open(name, _DIR, dir_fd=parent)
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except PermissionError:  # not readable by its owner: ours to open once its mode is
            _own_mode(parent, name)
            fd = os.open(name, _DIR, dir_fd=parent)
        if os.fstat(fd).st_mode & 0o700 != 0o700:
            with contextlib.suppress(PermissionError):  # not ours: maybe the group or others may write there
                os.fchmod(fd, 0o700)
        return fd


def _own_mode(parent: int, name: str) -> None:
    try:
        os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=False)
    except ValueError:  # Python's answer for a link (no fchmodat(AT_SYMLINK_NOFOLLOW) on one): never followed
        raise OSError(errno.ELOOP, f"{name} is a symbolic link") from None


def remove(path: str) -> None:
    """rm -rf `path` (nothing there is fine): a link itself, never what it points to."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        fd = os.open(parent, _DIR & ~os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        remove_at(fd, name)
    finally:
        os.close(fd)


def remove_at(parent: int, name: str) -> None:
    """Remove entry `name` of the open directory `parent`, and all below it when it is a directory.

    Depth-first, one directory open at a time: a directory is removed once
    it is empty, after its files, then its subdirectories one by one.
    """
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        os.unlink(name, dir_fd=parent)
        return
    cursor = _Cursor(parent, name, writable=True)
    pending: list[list[str] | None] = [None]  # per level: its subdirectories still to remove (None: not listed)
    try:
        while pending:
            if pending[-1] is None:
                pending[-1] = _unlink_files(cursor.fd)
            below = pending[-1]
            if below:
                sub = below.pop()
                try:
                    cursor.down(sub)
                except FileNotFoundError:  # gone meanwhile: nothing left to remove
                    continue
                pending.append(None)
                continue
            pending.pop()
            left = cursor.up()
            os.rmdir(left, dir_fd=cursor.fd)
    finally:
        cursor.close()


def _unlink_files(fd: int) -> list[str]:
    """Unlink every entry of directory `fd` but its subdirectories, which are returned."""
    below = []
    with os.scandir(fd) as listing:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, is_dir in names:
        if is_dir:
            below.append(name)
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except IsADirectoryError:  # replaced by a directory since the listing
            below.append(name)
    return below


def walk(path: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """(directory relative to `path` ("" for `path` itself), name, lstat) of every entry below `path`,
    top-down, links never followed. Directories that can't be opened (another owner's) are skipped."""
    parent, name = os.path.split(os.path.abspath(path))
    fd = os.open(parent, _DIR & ~os.O_NOFOLLOW)
    try:
        yield from walk_at(fd, name)
    finally:
        os.close(fd)


def walk_at(parent: int, name: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """`walk` of directory `name` of the open directory `parent`."""
    cursor = _Cursor(parent, name, writable=False)
    where = ""  # the current directory, relative to the top
    pending: list[list[str] | None] = [None]
    try:
        while pending:
            if pending[-1] is None:
                found = []
                with os.scandir(cursor.fd) as listing:
                    entries = [(entry.name, entry.stat(follow_symlinks=False)) for entry in listing]
                for entry, info in entries:
                    yield where, entry, info
                    if stat.S_ISDIR(info.st_mode):
                        found.append(entry)
                found.reverse()  # visited in listing order
                pending[-1] = found
            below = pending[-1]
            if below:
                sub = below.pop()
                try:
                    cursor.down(sub)
                except (FileNotFoundError, PermissionError, NotADirectoryError):
                    continue
                pending.append(None)
                where = f"{where}/{sub}" if where else sub
                continue
            pending.pop()
            if pending:
                cursor.up()
                where = where.rpartition("/")[0]
    finally:
        cursor.close()


def disk_usage(path: str) -> int:
    """Bytes on disk of the files below directory `path` (what the user can read of it); 0 if it is gone."""
    try:
        return sum(info.st_blocks * 512 for _, _, info in walk(path) if not stat.S_ISDIR(info.st_mode))
    except OSError:
        return 0

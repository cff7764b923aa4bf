"""The whiteout rules: `.wh.NAME` removes NAME of the lower layers, `.wh..wh..opq` empties its directory of them.

A whiteout hides only what lower layers made: this layer's own entries, and
the directories above them, stay ([1] OCI image-spec layer.md, Whiteouts).

[1] https://github.com/opencontainers/image-spec/blob/main/layer.md
"""

from __future__ import annotations

import os
import stat

from singpy.oci.layertree import OPEN_DIR, EntryError, LayerTree, clean, join, mode_at

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def whiteout(self: LayerTree, dirs: list[str], name: str) -> None:
    """Apply whiteout entry `name` (a name starting with WHITEOUT) of directory `dirs` to `self`."""
    hidden = name[len(WHITEOUT):]
    if name != OPAQUE and (hidden in ("", ".", "..") or hidden.startswith(WHITEOUT)):
        return  # not a whiteout of a name (".wh..wh.plnk": AUFS's own bookkeeping)
    try:
        found = self.directory(dirs, create=False)
    except EntryError:  # a file where a directory would be: nothing is below it to remove
        return
    if found is None:
        return
    if name == OPAQUE:
        prune(self, found[1])
        return
    parent, directory = found
    path = join(directory, hidden)
    mode = mode_at(parent, hidden)
    if path in self.written or path in self.kept:  # this layer's own: only what is below it from lower
        if mode is not None and stat.S_ISDIR(mode):
            prune(self, path)
        return
    if mode is not None:
        self.touch(parent, directory)
        self.clear(parent, hidden, path)
    if self.ownership is not None:
        self.ownership.forget(path)

def prune(self: LayerTree, top: str) -> None:
    """Remove everything below directory `top` that this layer did not write (an opaque whiteout).

    The directories this layer wrote are walked down by descriptors, each opened in the one above it
    and left by "..", one open at a time: never resolved again from the root, whose cost grows with
    the depth (a chain of thousands of directories whited out took a minute)."""
    found = self.directory(clean(top), create=False, follow=False)
    if found is None:
        return
    fd = os.open(".", OPEN_DIR, dir_fd=found[0])
    levels = [(top, _prune_here(self, fd, top))]  # per level: its directory, the kept subdirectories to visit
    trail: list[tuple[int, int]] = []  # the identity of each directory above `fd`
    try:
        while levels:
            directory, below = levels[-1]
            if not below:
                levels.pop()
                if trail:
                    fd = _up(fd, trail.pop())
                continue
            name = below.pop()
            try:
                child = os.open(name, OPEN_DIR, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):  # gone, or not a directory after all
                continue
            info = os.fstat(fd)
            trail.append((info.st_dev, info.st_ino))
            os.close(fd)
            fd = child
            path = join(directory, name)
            levels.append((path, _prune_here(self, fd, path)))
    finally:
        os.close(fd)


def _up(fd: int, identity: tuple[int, int]) -> int:
    """The directory above `fd`, which must be the one the walk came from (`identity`); `fd` closed."""
    try:
        parent = os.open("..", OPEN_DIR, dir_fd=fd)
    finally:
        os.close(fd)
    info = os.fstat(parent)
    if (info.st_dev, info.st_ino) != identity:
        os.close(parent)
        raise EntryError("a directory moved while an opaque whiteout was applied")
    return parent


def _prune_here(self: LayerTree, fd: int, directory: str) -> list[str]:
    """Remove the entries of `directory` (open as `fd`) this layer did not write; its kept subdirectories."""
    names = set(os.listdir(fd))
    if self.ownership is not None:
        names |= self.ownership.children(directory)
    below = []
    for name in names:
        path = join(directory, name)
        mode = mode_at(fd, name)
        if path in self.written or path in self.kept:
            if mode is not None and stat.S_ISDIR(mode):
                below.append(name)
            continue
        if mode is not None:
            self.touch(fd, directory)
            self.clear(fd, name, path)
        elif self.ownership is not None:
            self.ownership.forget(path)
    return below

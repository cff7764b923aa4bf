"""The whiteout rules: `.wh.NAME` removes NAME of the lower layers, `.wh..wh..opq` empties its directory of them.

A whiteout hides only what lower layers made: this layer's own entries, and
the directories above them, stay ([1] OCI image-spec layer.md, Whiteouts).

[1] https://github.com/opencontainers/image-spec/blob/main/layer.md
"""

from __future__ import annotations

import os
import stat

from singpy.oci.layertree import MAX_CACHED, OPEN_DIR, EntryError, LayerTree, clean, join, mode_at

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
    """Remove everything below directory `top` that this layer did not write (an opaque whiteout)."""
    pending = [top]
    while pending:
        directory = pending.pop()
        if len(self.cache) > MAX_CACHED:  # no descriptor of an earlier round is used again
            self.drop_cache()
        found = self.directory(clean(directory), create=False, follow=False)
        if found is None:
            continue
        fd = found[0]
        listing = os.open(".", OPEN_DIR, dir_fd=fd)
        try:
            names = set(os.listdir(listing))
        finally:
            os.close(listing)
        if self.ownership is not None:
            names |= self.ownership.children(directory)
        for name in names:
            path = join(directory, name)
            mode = mode_at(fd, name)
            if path in self.written or path in self.kept:
                if mode is not None and stat.S_ISDIR(mode):
                    pending.append(path)
                continue
            if mode is not None:
                self.touch(fd, directory)
                self.clear(fd, name, path)
            elif self.ownership is not None:
                self.ownership.forget(path)

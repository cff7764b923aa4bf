"""What an unprivileged extraction records: the image's modes, owners and device nodes, for mksquashfs.

As a user, layers are applied as the user's files (singpy.oci.layers); the
image's real modes, owners and devices are recorded in an `Ownership`, and
`squash_options` hands them to mksquashfs as pseudo definitions ([1]
mksquashfs 4.5.1 -pf), so that the SIF holds root-owned /usr, a uid-1000
home and /dev/null 1,3 as the image has them. (Extended attributes are not
recorded: mksquashfs 4.5.1 has no pseudo definition for them.)

[1] squashfs-tools 4.5.1 pseudo.c (read_pseudo_def) and mksquashfs.c (dir_scan2)
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator

from singpy.errors import ImageError
from singpy.image import trees

_MAX_LINE = 16000  # of a pseudo definition's name: mksquashfs 4.5.1 reads lines of up to 16383 bytes
_PLAIN = re.compile(rb"[A-Za-z0-9/._+,:=@%~^-]*\Z")  # bytes mksquashfs reads as they are in a pseudo file

# One recorded entry: (type, mode, uid, gid, major, minor, mtime); type is "m" (a file on disk whose mode
# and owner are the image's) or "c"/"b" (a device node that exists only here).
_Entry = tuple[str, int, int, int, int, int, int]


class Ownership:
    """The modes, owners and device nodes of the image, where the tree on disk (a user's) can't hold them.

    Keyed by guest path, links resolved ("/usr/bin/su", never "/bin/su" when
    /bin is a link), as mksquashfs sees the tree. `pseudo_definitions` gives
    them as mksquashfs pseudo definitions; the root directory itself goes to
    `-root-uid/-root-gid/-root-mode` (mksquashfs ignores a pseudo definition
    of "/" when it has a source directory).
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._children: dict[str, set[str]] = {}  # directory -> names below it that have an entry
        self.root: tuple[int, int, int] = (0o755, 0, 0)  # mode, uid, gid of "/"
        self.tree: str | None = None  # the directory the layers were applied to (set by apply_layer)
        self.unrecordable: list[str] = []  # paths no pseudo definition can name (set by pseudo_definitions)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def record(self, path: str, mode: int, uid: int = 0, gid: int = 0) -> None:
        """Guest path `path` (links resolved) is a file on disk whose mode and owner are `mode`, `uid`, `gid`."""
        if path == "/":
            self.root = (mode & 0o7777, uid, gid)
            return
        self._set(path, ("m", mode & 0o7777, uid, gid, 0, 0, 0))

    def device(self, path: str, kind: str, mode: int, uid: int, gid: int, major: int, minor: int,
               mtime: int) -> None:
        """A device node the tree on disk does not have; `kind` "c" or "b"."""
        self._set(path, (kind, mode & 0o7777, uid, gid, major, minor, mtime))

    def get(self, path: str) -> _Entry | None:
        if path == "/":
            return ("m", *self.root, 0, 0, 0)
        return self._entries.get(path)

    def copy(self, source: str, path: str) -> None:
        """`path` is a hard link to `source`: the same inode, so the same mode and owner."""
        entry = self._entries.get(source)
        if entry is not None:
            self._set(path, entry)

    def children(self, path: str) -> set[str]:
        """The names in directory `path` that have an entry, or entries below them."""
        return set(self._children.get(path, ()))

    def forget(self, path: str) -> None:
        """`path` and everything below it are gone."""
        parent, _, name = path.rpartition("/")
        names = self._children.get(parent or "/")
        if names is not None:
            names.discard(name)
        stack = [path]
        while stack:
            current = stack.pop()
            self._entries.pop(current, None)
            below = self._children.pop(current, None)
            if below:
                stack.extend(f"{current}/{name}" for name in below)

    def _set(self, path: str, entry: _Entry) -> None:
        self._entries[path] = entry
        while path != "/":  # every ancestor is listed in its parent: `forget` finds all below a path
            parent, _, name = path.rpartition("/")
            names = self._children.setdefault(parent or "/", set())
            if name in names:
                return
            names.add(name)
            path = parent or "/"

    def pseudo_definitions(self) -> Iterator[str]:
        """mksquashfs 4.5.1 pseudo definitions, one per line: "PATH m MODE UID GID" for a file on disk,
        "PATH C MTIME MODE UID GID MAJOR MINOR" (or B) for a device node.

        mksquashfs reads a pseudo file line by line, a name up to the first
        unescaped white space, a backslash taking the next byte as it is; a
        line that ends with a backslash goes on on the next line. So every
        byte but letters, digits and a few signs is escaped, and a name with
        a newline can't be written at all: such paths go to `unrecordable`
        (their files keep the builder's owner in the squashfs).
        """
        self.unrecordable = []
        for path, (kind, mode, uid, gid, major, minor, mtime) in self._entries.items():
            name = _pseudo_name(path)
            if name is None:
                self.unrecordable.append(path)
                continue
            if kind == "m":
                yield f"{name} m {mode:o} {uid} {gid}"
            else:
                yield f"{name} {kind.upper()} {min(max(mtime, 0), (1 << 32) - 1)} {mode:o} {uid} {gid} {major} {minor}"

    def complete(self) -> None:
        """Files added to the tree after its layers (Apptainer's /.singularity.d) are root's, as every
        file singpy adds to an image is: record those that have no entry, with their mode on disk."""
        if self.tree is None:
            return
        try:  # by descriptors: a path of the tree may be longer than PATH_MAX
            for where, name, info in trees.walk(self.tree):
                guest = f"/{where}/{name}" if where else f"/{name}"
                known = self._entries.get(guest)
                if known is None or known[0] != "m":  # new, or where a device node was recorded
                    self.record(guest, 0o777 if stat.S_ISLNK(info.st_mode) else info.st_mode)
        except OSError as error:
            raise ImageError(f"can't read {self.tree}: {error.strerror}") from None


def _pseudo_name(path: str) -> str | None:
    """`path` as a pseudo file names it, or None if it can't (a newline; over mksquashfs's 16383-byte lines)."""
    raw = os.fsencode(path)
    if b"\n" in raw:
        return None
    if not _PLAIN.match(raw):
        raw = b"".join(bytes((byte,)) if _PLAIN.match(bytes((byte,))) else b"\\" + bytes((byte,)) for byte in raw)
    return os.fsdecode(raw) if len(raw) < _MAX_LINE else None


def squash_options(ownership: Ownership | None, pseudo_file: str) -> list[str]:
    """The mksquashfs options that give the squashfs the image's modes, owners and device nodes.

    None (extracted as root: the tree holds them) needs none. Otherwise the
    pseudo definitions are written to `pseudo_file` (created) and the root
    directory's mode and owner given as options. Not `-all-root`, nor
    `-force-uid`: those override every pseudo definition in mksquashfs.
    Files of the tree that nothing recorded (added after the layers) are
    recorded as root's first (`Ownership.complete`).
    """
    if ownership is None:
        return []
    from singpy import console

    ownership.complete()
    try:
        with open(pseudo_file, "wb") as out:
            out.write(b"".join(os.fsencode(line) + b"\n" for line in ownership.pseudo_definitions()))
    except OSError as error:
        raise ImageError(f"can't write {pseudo_file}: {error.strerror}") from None
    if ownership.unrecordable:
        console.warning(f"{len(ownership.unrecordable)} file(s) keep your owner in the image: mksquashfs "
                        f"can't name them (a newline in the name, or too long a path: "
                        f"{_shown(ownership.unrecordable[0])})")
    mode, uid, gid = ownership.root
    return ["-pf", pseudo_file, "-root-mode", f"{mode:o}", "-root-uid", str(uid), "-root-gid", str(gid)]


def _shown(name: str) -> str:
    text = name if len(name) <= 200 else name[:200] + "..."
    return text if text.isprintable() else repr(text)

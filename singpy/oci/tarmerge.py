"""The image's final filesystem computed from its layers' headers alone: what the tree path would have made.

A pull can squash the image without writing it out as a tree
(singpy.oci.streamsquash): a first pass reads every layer's tar headers
(data skipped) and applies them here, to an in-memory `Index`, with the
rules of singpy.oci.layers, layertree and whiteouts: names cleaned as
paths, parents resolved inside the root through the image's links
(RESOLVE_IN_ROOT, as a process inside), the last component never
followed, a file over a directory replacing it, whiteouts and opaque
directories hiding only lower layers. Each regular file of the result
remembers which entry of which layer holds its data (`File.source`); a
hard link is the same `File` object under two names, as it is the same
inode on disk.

Whatever this model does not reproduce exactly raises `Unsupported`, and
the caller falls back to the tree path, which then does what it always did
(its FATAL line included, for a layer it refuses): a hard link to anything
but a regular file, an extended attribute as root, a path through a file,
a name the kernel would refuse, a layer that does not parse, ...
"""

from __future__ import annotations

import os
import tarfile

from singpy.oci.layertree import clean, join
from singpy.oci.whiteouts import OPAQUE, WHITEOUT

_MAX_NAME = 4096  # as singpy.oci.layers: a longer name is refused there
_MAX_COMPONENT = 255  # NAME_MAX: the tree path's mkdir/open would fail
_MAX_LINK = 4095  # a symlink target the kernel stores (PATH_MAX with its NUL)
_MAX_ID = (1 << 32) - 2
_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS (singpy.mounts.rootpath)


class Unsupported(Exception):
    """The stream can't express this image exactly: the tree path must convert it (the message says why)."""


class Node:
    """One inode of the final tree: its kind ("d", "f", "l", "c", "b", "p"), mode, owner and time."""

    __slots__ = ("kind", "mode", "uid", "gid", "mtime")

    def __init__(self, kind: str, mode: int, uid: int, gid: int, mtime: int) -> None:
        self.kind, self.mode, self.uid, self.gid, self.mtime = kind, mode & 0o7777, uid, gid, mtime


class Dir(Node):
    __slots__ = ("children",)

    def __init__(self, mode: int = 0o755, uid: int = 0, gid: int = 0, mtime: int = 0) -> None:
        super().__init__("d", mode, uid, gid, mtime)
        self.children: dict[str, Node] = {}


class File(Node):
    """A regular file: its data is entry `source` = (layer number, entry number) of the layers, or `content`."""

    __slots__ = ("source", "size", "content")

    def __init__(self, mode: int, uid: int, gid: int, mtime: int, *, source: tuple[int, int] | None,
                 size: int, content: bytes | None = None) -> None:
        super().__init__("f", mode, uid, gid, mtime)
        self.source, self.size, self.content = source, size, content


class Link(Node):
    __slots__ = ("target",)

    def __init__(self, target: str, uid: int, gid: int, mtime: int) -> None:
        super().__init__("l", 0o777, uid, gid, mtime)
        self.target = target


class Special(Node):
    """A FIFO ("p") or a device node ("c", "b")."""

    __slots__ = ("major", "minor")

    def __init__(self, kind: str, mode: int, uid: int, gid: int, mtime: int, major: int = 0, minor: int = 0) -> None:
        super().__init__(kind, mode, uid, gid, mtime)
        self.major, self.minor = major, minor


def mtime_of(member: tarfile.TarInfo) -> int:
    """The entry's time in whole seconds, within what squashfs stores (32 bits, unsigned)."""
    try:
        value = int(member.mtime)
    except (ValueError, OverflowError):  # NaN or infinity in a PAX header
        return 0
    return min(max(value, 0), (1 << 32) - 1)


class Index:
    """The final tree of an image's layers, built from their headers (`apply` each entry, `end_layer` after each).

    `as_root`: the tree path applies owners for real and also file
    capabilities (PAX SCHILY.xattr.*), which the stream does not carry: as
    root, an entry with extended attributes is `Unsupported`. As a user they
    are dropped by both paths.
    """

    def __init__(self, *, as_root: bool, root_mode: int) -> None:
        self.as_root = as_root
        self.root = Dir(root_mode, 0, 0, 0)
        self.layer = 0
        self.ordinal = 0  # the number of the current entry in its layer (every member tarfile yields)
        self.written: set[str] = set()  # this layer's entries (resolved paths), spared by its whiteouts
        self.kept: set[str] = {"/"}  # and their ancestors
        self.wanted_layers: set[int] = set()

    # -- layers and entries -----------------------------------------------------------------------------

    def end_layer(self) -> None:
        self.layer += 1
        self.ordinal = 0
        self.written = set()
        self.kept = {"/"}

    def apply(self, member: tarfile.TarInfo) -> None:
        """Apply one entry of the current layer (its data, if any, is not needed here)."""
        ordinal = self.ordinal
        self.ordinal += 1
        if len(member.name) > _MAX_NAME or len(member.linkname) > _MAX_NAME:
            raise Unsupported("a name too long")
        if "\0" in member.name or "\0" in member.linkname:  # the kernel refuses it; tar2sqfs would cut the name
            raise Unsupported("a NUL byte in a name")
        parts = clean(member.name)
        if not parts:
            if not member.isdir():
                raise Unsupported("the root replaced by a file")
            self._check(member, parts)
            self.root.mode, self.root.uid, self.root.gid = member.mode & 0o7777, member.uid, member.gid
            self.root.mtime = mtime_of(member)
            return
        name = parts[-1]
        if name.startswith(WHITEOUT):
            self._whiteout(parts[:-1], name)
            return
        self._check(member, parts)
        found = self.directory(parts[:-1], create=True)
        assert found is not None  # made where missing
        parent, directory = found
        path = join(directory, name)
        existing = parent.children.get(name)
        if member.islnk():
            if not self._hard_link(member, parent, name, path):
                return
        elif member.isreg():
            parent.children[name] = File(member.mode, member.uid, member.gid, mtime_of(member),
                                         source=(self.layer, ordinal), size=member.size)
        elif member.isdir():
            if isinstance(existing, Dir):
                existing.mode, existing.uid, existing.gid = member.mode & 0o7777, member.uid, member.gid
                existing.mtime = mtime_of(member)
            else:
                parent.children[name] = Dir(member.mode, member.uid, member.gid, mtime_of(member))
        elif member.issym():
            if len(os.fsencode(member.linkname)) > _MAX_LINK or not member.linkname:
                raise Unsupported("a symbolic link the kernel would refuse")
            parent.children[name] = Link(member.linkname, member.uid, member.gid, mtime_of(member))
        elif member.isfifo():
            parent.children[name] = Special("p", member.mode, member.uid, member.gid, mtime_of(member))
        else:
            if not (0 <= member.devmajor <= 0xFFF and 0 <= member.devminor <= 0xFFFFF):
                raise Unsupported("a device number out of range")
            parent.children[name] = Special("c" if member.ischr() else "b", member.mode, member.uid, member.gid,
                                            mtime_of(member), member.devmajor, member.devminor)
        self._mark_written(path)

    def _check(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.ischr()
                or member.isblk() or member.isfifo()):
            raise Unsupported(f"entry type {member.type!r}")
        if not (0 <= member.uid <= _MAX_ID and 0 <= member.gid <= _MAX_ID):
            raise Unsupported("an owner out of range")
        # encoded only when it might be too long: a character is at most 4 bytes (every entry passes here)
        if any(len(part) > _MAX_COMPONENT // 4 and len(os.fsencode(part)) > _MAX_COMPONENT for part in parts):
            raise Unsupported("a name longer than NAME_MAX")
        if self.as_root and any(key.startswith("SCHILY.xattr.") for key in member.pax_headers):
            raise Unsupported("extended attributes")

    def _hard_link(self, member: tarfile.TarInfo, parent: Dir, name: str, path: str) -> bool:
        """As singpy.oci.layers `_hard_link`, for a link to a regular file; False: a link to itself (no-op)."""
        target_parts = clean(member.linkname)
        if not target_parts:
            raise Unsupported("a hard link to the root")
        found = self.directory(target_parts[:-1], create=False)
        target_path = join(found[1], target_parts[-1]) if found is not None else "/" + "/".join(target_parts)
        if target_path == path:
            self._mark_written(path)
            return False
        target = found[0].children.get(target_parts[-1]) if found is not None else None
        if target_path.startswith(path + "/"):
            raise Unsupported("a hard link over a directory that holds its target")  # the tree path removes it first
        if not isinstance(target, File):
            raise Unsupported("a hard link to something other than a regular file")
        parent.children[name] = target
        return True

    def _mark_written(self, path: str) -> None:
        self.written.add(path)
        parent = path.rpartition("/")[0] or "/"
        while parent not in self.kept:
            self.kept.add(parent)
            parent = parent.rpartition("/")[0] or "/"

    # -- paths ---------------------------------------------------------------------------------------------

    def directory(self, parts: list[str], *, create: bool, follow: bool = True,
                  visited: dict[str, Dir] | None = None) -> tuple[Dir, str] | None:
        """The directory `parts` leads to and its resolved path, links followed inside the root (the last
        component's only when `follow`); missing directories made (0755, root's) when `create`, else None.
        Anything else in the way: Unsupported. Each directory the walk enters is put in `visited` by its
        resolved path (singpy.oci.streaminstall needs them all, even those a '..' or a link leaves)."""
        pending = list(reversed(parts))
        stack: list[tuple[Dir, str]] = []
        links = 0
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if stack:
                    stack.pop()
                continue
            here = stack[-1][0] if stack else self.root
            node = here.children.get(name)
            if node is None:
                if not create:
                    return None
                rest = [part for part in reversed(pending) if part not in ("", ".")]
                if ".." in rest:
                    raise Unsupported("a link through a missing directory and '..'")
                for missing in (name, *rest):
                    made = Dir(0o755, 0, 0, 0)
                    (stack[-1][0] if stack else self.root).children[missing] = made
                    stack.append((made, missing))
                    if visited is not None:
                        visited["/" + "/".join(part for _, part in stack)] = made
                break
            if isinstance(node, Link) and (follow or pending):
                links += 1
                if links > _MAX_LINKS:
                    raise Unsupported("too many levels of links")
                if node.target.startswith("/"):
                    stack.clear()
                pending.extend(reversed(node.target.split("/")))
                continue
            if not isinstance(node, Dir):
                raise Unsupported("a link not followed" if isinstance(node, Link) else "a path through a file")
            stack.append((node, name))
            if visited is not None:  # inline: this loop runs for every entry of every layer
                visited["/" + "/".join(part for _, part in stack)] = node
        if not stack:
            return self.root, "/"
        return stack[-1][0], "/" + "/".join(name for _, name in stack)

    # -- whiteouts -----------------------------------------------------------------------------------------

    def _whiteout(self, dirs: list[str], name: str) -> None:
        """As singpy.oci.whiteouts.whiteout: `.wh.NAME` hides NAME of lower layers, OPAQUE all below."""
        hidden = name[len(WHITEOUT):]
        if name != OPAQUE and (hidden in ("", ".", "..") or hidden.startswith(WHITEOUT)):
            return
        found = self.directory(dirs, create=False)
        if found is None:
            return
        directory, path_of_dir = found
        if name == OPAQUE:
            self._prune(directory, path_of_dir)
            return
        path = join(path_of_dir, hidden)
        node = directory.children.get(hidden)
        if path in self.written or path in self.kept:
            if isinstance(node, Dir):
                self._prune(node, path)
            return
        directory.children.pop(hidden, None)

    def _prune(self, top: Dir, top_path: str) -> None:
        """Remove everything below `top` that this layer did not write (an opaque whiteout)."""
        pending = [(top, top_path)]
        while pending:
            directory, path_of_dir = pending.pop()
            for name, node in list(directory.children.items()):
                path = join(path_of_dir, name)
                if path in self.written or path in self.kept:
                    if isinstance(node, Dir):
                        pending.append((node, path))
                    continue
                del directory.children[name]

    # -- the result ----------------------------------------------------------------------------------------

    def walk(self) -> list[tuple[str, Node]]:
        """Every entry but the root as (path without the leading '/', node), each directory before its
        children, names in sorted order (as the squashfs will hold them)."""
        found: list[tuple[str, Node]] = []
        pending: list[tuple[str, Dir]] = [("", self.root)]
        while pending:
            prefix, directory = pending.pop()
            below = []
            for name in sorted(directory.children):
                node = directory.children[name]
                path = f"{prefix}{name}"
                found.append((path, node))
                if isinstance(node, Dir):
                    below.append((f"{path}/", node))
            pending.extend(reversed(below))
        return found

"""Paths inside the container root, resolved as the container would see them.

`pathlib` discards the left side of a join when the right side is absolute
(`Path("/newroot") / "/etc/passwd"` is the *host* file), and a symlink in the
image may point anywhere; so guest paths are resolved here, one component at
a time, with absolute link targets taken relative to the container root, as a
process inside would see them. A `..` that would climb above the root is an
error rather than being silently clamped: a destination that tries to escape
the image is refused.
"""

from __future__ import annotations

import os

from singpy.errors import BindSpecError

_MAX_LINKS = 40  # as the kernel's MAXSYMLINKS


def resolve(root: str, guest: str) -> str:
    """Host path of `guest` inside `root`; the last components may not exist yet."""
    pending = [part for part in reversed(guest.split("/")) if part]
    resolved: list[str] = []
    current = root.rstrip("/")  # host path of `resolved`, kept as a string: this runs for every mount
    absent_from: int | None = None  # index of a missing component: nothing below it can be a link
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            if not resolved:
                raise BindSpecError(f"path {guest} escapes the container root through '..'")
            resolved.pop()
            current = current[:current.rindex("/")]
            if absent_from is not None and len(resolved) <= absent_from:
                absent_from = None
            continue
        try:
            if absent_from is not None:
                raise FileNotFoundError
            target = os.readlink(f"{current}/{name}")
        except OSError as error:  # not a link, or not there yet: take the name as it is
            if absent_from is None and isinstance(error, (FileNotFoundError, NotADirectoryError)):
                absent_from = len(resolved)
            resolved.append(name)
            current = f"{current}/{name}"
            continue
        links += 1
        if links > _MAX_LINKS:
            raise BindSpecError(f"path {guest} has too many levels of symbolic links in the container")
        if target.startswith("/"):
            resolved, current = [], root.rstrip("/")
        pending.extend(part for part in reversed(target.split("/")) if part)
    return current or "/"


class Resolver:
    """`resolve` below one root, remembering the last directory resolved.

    --nv binds some seventy libraries into one directory, from a handful of
    host directories: re-walking the same parent component by component for
    each of them was most of the cost of applying the mounts. Only the last
    component is looked at again (a symlink there takes the full walk). A
    mount on the remembered directory or above it may change what it
    resolves to: `forget` is called after every mount.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self._parent: str | None = None  # guest directory last resolved
        self._resolved = ""  # its host path

    def __call__(self, guest: str) -> str:
        parent, name = guest.rstrip("/").rsplit("/", 1) if guest.strip("/") else ("", "")
        if not name or name in (".", ".."):
            return resolve(self.root, guest)
        if parent != self._parent:
            self._parent, self._resolved = parent, resolve(self.root, parent or "/")
        candidate = os.path.join(self._resolved, name)
        return resolve(self.root, guest) if os.path.islink(candidate) else candidate

    def forget(self, mounted_on: str) -> None:
        if self._parent is not None and is_under(self._parent or "/", mounted_on):
            self._parent = None


def is_under(path: str, parent: str) -> bool:
    """True if `path` is `parent` or lies below it (both normalised, absolute)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")

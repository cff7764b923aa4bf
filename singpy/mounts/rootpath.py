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
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            if not resolved:
                raise BindSpecError(f"path {guest} escapes the container root through '..'")
            resolved.pop()
            continue
        try:
            target = os.readlink(os.path.join(root, *resolved, name))
        except OSError:  # not a link, or not there yet: take the name as it is
            resolved.append(name)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise BindSpecError(f"path {guest} has too many levels of symbolic links in the container")
        if target.startswith("/"):
            resolved = []
        pending.extend(part for part in reversed(target.split("/")) if part)
    return os.path.join(root, *resolved)


def is_under(path: str, parent: str) -> bool:
    """True if `path` is `parent` or lies below it (both normalised, absolute)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")

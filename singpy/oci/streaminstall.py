"""Apptainer's /.singularity.d installed over a merged `Index` (singpy.oci.tarmerge), with no image tree.

singpy.oci.convert `install` decides what to write by looking at the image:
/etc may be a link, /etc/resolv.conf a link to a file elsewhere, /tmp a
dangling link kept as it is... To get exactly what it does on the tree
path, it is run unchanged on a small scratch tree holding only what its
lookups traverse: every directory of the image its paths pass through
(links followed as `Tree` follows them) with all of their entries (a
directory or a link as it is, anything else as an empty file). What it
wrote or created there is then laid over the Index as the tree path would
leave it: Apptainer's files and directories root's (as root, a file
rewritten in place keeps the owner it had), the links at the root, and
the root made writable by its owner (as root only: a user's pull gives
mksquashfs the image's own root mode).

An image that has its own /.singularity.d (a SIF pushed as OCI, say) is
left to the tree path: install would read and move its files.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Mapping
from typing import Any

from singpy.constants import SINGULARITY_D
from singpy.errors import ImageError
from singpy.oci.tarmerge import Dir, File, Index, Link, Node, Unsupported


def install_over(index: Index, scratch: str, config: Mapping[str, Any], labels: Mapping[str, str],
                 deffile: bytes) -> dict[str, Any]:
    """Lay Apptainer's files over `index`, using the new directory `scratch`; returns the image's metadata
    as singpy.image.metadata.read_tree reads it from the tree."""
    from singpy.image.metadata import read_tree
    from singpy.oci import convert
    from singpy.oci.singularityd import DEFFILE, HISTORY, singularity_files, singularity_links, skeleton_dirs

    if SINGULARITY_D.lstrip("/") in index.root.children:
        raise Unsupported(f"the image has its own {SINGULARITY_D}")
    guests = [*skeleton_dirs(), *singularity_files(config, labels=labels, deffile=deffile), DEFFILE, HISTORY,
              *singularity_links()]
    seen: dict[str, Dir] = {"/": index.root}
    for guest in guests:
        for follow in (True, False):
            _visit(index, guest, follow, seen)
    _materialise(seen, scratch)
    try:
        written = convert.install(scratch, config, labels, deffile=deffile)
    except ImageError as error:  # the tree path says it in its own words
        raise Unsupported(f"install: {error.message}") from None
    _lay_over(index, scratch, written, singularity_links())
    return read_tree(scratch)


def _visit(index: Index, guest: str, follow: bool, seen: dict[str, Dir]) -> None:
    """Record in `seen` every directory that singpy.mounts.rootpath.Tree's walk of `guest` passes through
    (up to where the path stops: a missing name, a file, too many links)."""
    with contextlib.suppress(Unsupported):  # what stops the walk stops install's lookup too: what came before counts
        index.directory(guest.split("/"), create=False, follow=follow, visited=seen)


def _materialise(seen: dict[str, Dir], scratch: str) -> None:
    """The seen directories in `scratch`, each with all its entries (files as empty ones)."""
    try:
        os.mkdir(scratch, 0o755)
        for path in sorted(seen, key=lambda path: path.count("/") if path != "/" else 0):
            here = scratch + ("" if path == "/" else path)
            if path != "/":
                os.makedirs(here, 0o755, exist_ok=True)
            for name, node in seen[path].children.items():
                _make(f"{here}/{name}", node)
    except OSError as error:
        raise Unsupported(f"the scratch tree: {error.strerror}") from None


def _make(where: str, node: Node) -> None:
    if isinstance(node, Dir):
        os.makedirs(where, 0o755, exist_ok=True)
    elif isinstance(node, Link):
        os.symlink(node.target, where)
    else:
        os.close(os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


def _lay_over(index: Index, scratch: str, written: dict[str, int], links: Mapping[str, str]) -> None:
    """What install wrote in `scratch` (by resolved path, parents first) put into `index` as the tree has it."""
    now = int(time.time())
    counts = _link_counts(index)
    for path, mode in written.items():
        *dirs, name = path.strip("/").split("/")
        parent = _plain_directory(index, dirs)
        existing = parent.children.get(name)
        info = os.lstat(scratch + path)
        if stat.S_ISDIR(info.st_mode):
            if existing is not None:
                raise Unsupported(f"install made {path}, which the image has")
            parent.children[name] = Dir(mode, 0, 0, now)
        elif stat.S_ISREG(info.st_mode) and not isinstance(existing, Dir):
            with open(scratch + path, "rb") as handle:
                content = handle.read()
            owner = (0, 0)
            if index.as_root and isinstance(existing, File) and counts.get(id(existing)) == 1:
                owner = (existing.uid, existing.gid)  # rewritten in place, as convert does a lone file
            parent.children[name] = File(mode, *owner, now, source=None, size=len(content), content=content)
        else:
            raise Unsupported(f"install wrote {path} as something unexpected")
    for guest, target in links.items():
        name = guest.lstrip("/")
        made = os.path.islink(f"{scratch}/{name}") and os.readlink(f"{scratch}/{name}") == target
        node = index.root.children.get(name)
        if made and not (isinstance(node, Link) and node.target == target):
            index.root.children[name] = Link(target, 0, 0, now)
        elif not made and (node is None or isinstance(node, Link)):
            raise Unsupported(f"install left {guest} unlike the image")
    if index.as_root:
        index.root.mode |= stat.S_IWUSR  # convert's `_owner_writable`, done on the tree's real root


def _plain_directory(index: Index, dirs: list[str]) -> Dir:
    """The directory at resolved path `dirs` (no link on the way)."""
    here = index.root
    for name in dirs:
        below = here.children.get(name)
        if not isinstance(below, Dir):
            raise Unsupported(f"install wrote below {name}, which is not a directory in the image")
        here = below
    return here


def _link_counts(index: Index) -> dict[int, int]:
    """How many names each regular file has (its link count in the tree path)."""
    counts: dict[int, int] = {}
    for _, node in index.walk():
        if isinstance(node, File):
            counts[id(node)] = counts.get(id(node), 0) + 1
    return counts

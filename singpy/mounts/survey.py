"""survey: where a plan's mounts land in the image alone, before anything is mounted.

What it finds decides the layer of mount points the image lacks (singpy.layers.rootfs,
singpy.layers.overlayfs) and which of the image's scripts the container will still see
(singpy.image.scripts); apply_mounts (singpy.mounts.apply) then uses its resolver of
bind sources, so each host source is looked up once.
"""

from __future__ import annotations

import stat

from singpy.errors import PathError
from singpy.layers.rootfs import HOST
from singpy.mounts.rootpath import Resolver, Tree
from singpy.plan import Missing, MountOp, MountSpec


class Survey:
    """The plan's destinations, resolved in the image alone (links followed inside it), before any mount."""

    def __init__(self) -> None:
        self.missing: list[tuple[str, bool]] = []  # mount points the image lacks: (path below the root, is_dir)
        self.covering: set[str] = set()  # resolved destinations: what the container will not take from the image
        self.asked: set[str] = set()  # those of binds the user asked for (MountSpec.asked)
        self.host = Resolver(HOST)  # bind sources, resolved once for the survey and apply_mounts

    def covers(self, path: str) -> bool:
        """Whether a mount of the plan hides resolved path `path` of the image."""
        return _is_covered(path, self.covering)

    def asked_for(self, path: str) -> bool:
        """Whether a bind the user asked for puts its own file at resolved path `path` (or a directory above)."""
        return _is_covered(path, self.asked)


def survey(specs: tuple[MountSpec, ...], image: Tree) -> Survey:
    """Where the plan's mounts land in the image, and the mount points it lacks.

    A destination that an earlier mount covers is left to the moment that
    mount is there (`_Applier._target`); one that leads nowhere (a link loop,
    a file where a directory must be) is left for apply_mounts to report with
    its policy.
    """
    found_all = Survey()
    for spec in specs:
        if spec.op in (MountOp.SYMLINK, MountOp.SEAL):
            continue
        if found_all.covers(spec.dest):  # below a mount already: a covering path has no link in it
            continue
        if _left_out(spec, found_all.host):  # no mount point for it (/scratch an empty file on hosts without it)
            continue
        try:
            found = image.locate(spec.dest)
        except PathError:
            continue
        if found.missing and spec.op == MountOp.FILE and spec.merge:  # /etc/passwd, /etc/group: none is bound
            continue  # where the image has none (apply_mounts says so), as Apptainer
        if found.missing and not found_all.covers(found.path):
            found_all.missing.append((found.path.lstrip("/"), _wants_directory(spec, found_all.host)))
        found_all.covering.add(found.path)
        if spec.asked:
            found_all.asked.add(found.path)
    return found_all


def _is_covered(path: str, covering: set[str]) -> bool:
    """Whether `path` or one of its ancestors is mounted on (a walk up, not a scan of every mount)."""
    while path not in covering:
        if path in ("/", ""):
            return False
        path = path.rsplit("/", 1)[0] or "/"
    return True


def _left_out(spec: MountSpec, host: Resolver) -> bool:
    """A bind apply_mounts will skip: its source is not on this host and it may be left out (Missing.SKIP)."""
    return (spec.op == MountOp.BIND and spec.missing == Missing.SKIP and spec.source is not None
            and host.found(spec.source)[1] is None)


def _wants_directory(spec: MountSpec, host: Resolver) -> bool:
    if spec.op == MountOp.FILE:
        return False
    if spec.op == MountOp.BIND:
        assert spec.source is not None
        info = host.found(spec.source)[1]
        return info is not None and stat.S_ISDIR(info.st_mode)
    return True

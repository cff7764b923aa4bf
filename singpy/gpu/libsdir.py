"""/.singularity.d/libs: GPU libraries under every name programs open them by, one bind per file.

A driver library has several names: libcuda.so and libcuda.so.1 are links
to libcuda.so.550.54.14, and --nv offers each name the liblist or
nvidia-container-cli asks for. Binding every name costs a mount per name
(~140 for the ~70 libraries of a driver), and mounts were most of what
--nv added to a launch. So each distinct host file is bound once, under
one of its names, and its other names are symbolic links beside it in the
same tmpfs, made before the SEAL turns that tmpfs read-only. A relative
link resolves inside the container, to the file bound beside it, just as
the host's own links do on the host.

The CDI path (`singpy.gpu.cdi`) uses the same directory for what the
update-ldcache hook would have made findable: there the libraries are
already bound at the spec's own paths, so every name is a link (to that
path, or to the library's name in this directory for its soname).

Rejected: binding the host's library directory whole (it holds far more
than the driver, and the image's LD_LIBRARY_PATH would see all of it), and
one bind per name (the old way: correct, but a mount per name).
"""

from __future__ import annotations

import os

from singpy.constants import LIBS_DIR
from singpy.plan import MountOp, MountSpec, Stage

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Iterable


def libs_dir_mounts(files: Iterable[tuple[str, str]], links: Iterable[tuple[str, str]] = (),
                    directory: str = LIBS_DIR) -> tuple[MountSpec, ...]:
    """The tmpfs at `directory` (LIBS_DIR, or --compat32's LIBS32_DIR), one read-only bind per distinct host file,
    links for the other names, the seal.

    `files`: (name in LIBS_DIR, host path), in order; names that end at the
    same host file (through symlinks) share one bind. `links`: further
    (name, target) links; a relative target names an entry of LIBS_DIR, an
    absolute one a path in the container. The first entry for a name wins.
    Nothing at all when both are empty.
    """
    by_file: dict[str, list[str]] = {}  # the host file a path ends at -> its names, in order
    ends: dict[str, str] = {}  # path -> link_target(path): a listing gives every name of a file as the file
    taken: set[str] = set()
    for name, path in files:
        if name not in taken:
            taken.add(name)
            end = ends[path] if path in ends else ends.setdefault(path, link_target(path))
            by_file.setdefault(end, []).append(name)
    binds: list[MountSpec] = []
    symlinks: list[MountSpec] = []
    for real, names in by_file.items():
        bound = bound_name(real, names)
        binds.append(MountSpec(op=MountOp.BIND, source=real, dest=f"{directory}/{bound}", readonly=True,
                               stage=Stage.GPU))
        symlinks += [_link(name, bound, directory) for name in names if name != bound]
    for name, target in links:
        if name not in taken:
            taken.add(name)
            symlinks.append(_link(name, target, directory))
    if not binds and not symlinks:
        return ()
    return (MountSpec(op=MountOp.TMPFS, dest=directory, stage=Stage.GPU), *binds, *symlinks,
            MountSpec(op=MountOp.SEAL, dest=directory, stage=Stage.GPU))


def bound_name(real: str, names: list[str]) -> str:
    """The name a file is bound under: its own when it is one of `names`, else the most specific one.

    libcuda.so.550.54.14 itself when listed (nvidia-container-cli lists it), else
    libcuda.so.1 rather than libcuda.so: the longest name, the first of equals.
    """
    own = os.path.basename(real)
    return own if own in names else max(names, key=len)


def link_target(path: str) -> str:
    """The file a chain of symlinks ends at (libcuda.so -> libcuda.so.1 -> libcuda.so.550.54.14).

    Unlike os.path.realpath, the directories on the way are not resolved: a
    library and its links are compared in the same spelling, at a fraction
    of realpath's cost (it stats every component of every path).
    """
    for _ in range(40):
        try:
            target = os.readlink(path)
        except OSError:
            break
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return path


def link_notes(mounts: Iterable[MountSpec]) -> tuple[str, ...]:
    """One "linking DEST -> TARGET" line per link, for -v (the binds have their own lines)."""
    return tuple(f"linking {spec.dest} -> {spec.source}" for spec in mounts if spec.op == MountOp.SYMLINK)


def _link(name: str, target: str, directory: str) -> MountSpec:
    return MountSpec(op=MountOp.SYMLINK, source=target, dest=f"{directory}/{name}", stage=Stage.GPU)

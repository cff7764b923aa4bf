"""Where a build works, and removing it whatever happens.

A build's stages are unpacked root filesystems, often gigabytes: the work
directory is `$SINGPY_TMPDIR` (or APPTAINER_TMPDIR, SINGULARITY_TMPDIR) when
set, else the directory of the output, never /tmp by default (a small tmpfs
on many login nodes). A private (0700) `.singpy-build-XXXXXXXX` directory there
holds everything; the output is written there too and renamed into place,
so the output appears complete or not at all.

A directory named by one of those variables must pass
singpy.host.cachefiles.check_owned (sticky, like /tmp, allowed): in someone else's
directory the build's trees could be swapped under it (issue 24).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.oci.store import TMPDIR_VARIABLES
from singpy.plan import IdMap

PREFIX = ".singpy-build-"


def parent_dir(target: str, env: Mapping[str, str]) -> str:
    """The directory the work directory goes in (see the module's docstring)."""
    chosen = next((name for name in TMPDIR_VARIABLES if env.get(name)), "")
    if not chosen:
        return os.path.dirname(target)
    path = os.path.abspath(env[chosen])
    if not os.path.isdir(path):
        raise ImageError(f"{chosen}={env[chosen]} is not a directory: the build has nowhere to work")
    from singpy.host.cachefiles import check_owned

    check_owned(path, what=f"work directory's parent ({chosen})", sticky_ok=True)
    return path


def make(target: str, env: Mapping[str, str]) -> str:
    import tempfile

    parent = parent_dir(target, env)
    try:
        path = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    except OSError as error:
        raise ImageError(f"can't create a work directory in {parent}: {error.strerror}") from None
    if any(env.get(name) for name in TMPDIR_VARIABLES):  # the output's own directory is the user's choice
        from singpy.host.cachefiles import check_owned

        try:
            check_owned(path, what="work directory")
        except ImageError:
            os.rmdir(path)  # empty: made just now
            raise
    console.verbose(f"work directory: {path}")
    return path


def remove(path: str, idmap: IdMap | None, *, what: str = "the work directory") -> None:
    """Remove `path`; what the user cannot remove (files of subordinate ids) is removed in the namespace."""
    from singpy.image import cache

    try:
        cache.remove_tree(path)
        return
    except OSError:
        if idmap is None:
            raise
    import subprocess

    from singpy.recipe import mapped

    subprocess.run([*mapped.command(idmap), "rm", "-rf", "--one-file-system", path], stdin=subprocess.DEVNULL,
                   check=False)
    if os.path.lexists(path):
        raise ImageError(f"can't remove {what} {path}: remove it by hand")

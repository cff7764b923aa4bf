"""`build --fix-perms`: the owner may read, write and enter everything in a root filesystem.

Apptainer's FixPerms ([1] pkg/build/types/bundle.go): directories get
u+rwx, regular files u+rw, links and other files are left as they are. A
base image may hold read-only directories (Go's module cache, 0555 trees
of pip wheels), which its owner can't empty, so a sandbox built from it
can't be removed without this (LUMI's container tool always passes it).

The walk holds one directory open at a time besides the root, without
recursion: a directory's mode is fixed before it is opened (so an owner
without r or x on it can enter it), entries are changed relative to their
directory (`dir_fd=`) and links are never followed. A directory whose path
is past PATH_MAX is counted as a failure, as any entry that can't be changed. For a user whose
build has subordinate ids it runs as root of the build's user namespace
(`python -m singpy.recipe.fixperms ROOTFS` behind singpy.recipe.mapped), where
every owner of the tree is itself.
"""

from __future__ import annotations

import os
import stat
import sys

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def fix(rootfs: str) -> int:
    """Give the owner rwX on the tree at `rootfs`; returns how many entries could not be changed."""
    failures = 0
    os.chmod(rootfs, stat.S_IMODE(os.lstat(rootfs).st_mode) | 0o700)
    pending = [""]  # directories still to visit, relative to rootfs
    top = os.open(rootfs, _DIR)
    try:
        while pending:
            where = pending.pop()
            try:
                fd = os.open(where, _DIR, dir_fd=top) if where else os.dup(top)
            except OSError:
                failures += 1
                continue
            try:
                below, failed = _fix_entries(fd)
            finally:
                os.close(fd)
            failures += failed
            pending += [f"{where}/{name}" if where else name for name in below]
    finally:
        os.close(top)
    return failures


def _fix_entries(fd: int) -> tuple[list[str], int]:
    """Fix the entries of directory `fd`; returns its subdirectories (fixed already) and the failures."""
    below, failures = [], 0
    with os.scandir(fd) as listing:
        entries = [(entry.name, entry.stat(follow_symlinks=False)) for entry in listing]
    for name, info in entries:
        wanted = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600 if stat.S_ISREG(info.st_mode) else 0
        if wanted and stat.S_IMODE(info.st_mode) & wanted != wanted:
            try:
                os.chmod(name, stat.S_IMODE(info.st_mode) | wanted, dir_fd=fd, follow_symlinks=False)
            except OSError:
                failures += 1
        if stat.S_ISDIR(info.st_mode):
            below.append(name)
    return below, failures


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m singpy.recipe.fixperms ROOTFS\n")
        return 2
    failures = fix(argv[0])
    if failures:
        sys.stderr.write(f"--fix-perms: {failures} errors were encountered when setting permissions\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""--disable-cache (APPTAINER_DISABLE_CACHE) for run, exec and shell, as Apptainer's: a docker://, oci:,
oras://... image is pulled into a temporary directory, used, and removed when the container ends; nothing
is read from or written to the user's cache.

Every cache of the run (the pulled layers and SIF, a squashfs extracted for want of a mount, the CDI cache)
goes there, by pointing SINGPY_CACHEDIR at it for this run only (singpy.host.cachefiles.cache_dir); the
container never sees that variable (launcher variables never pass). The directory is made in $TMPDIR
(0700, the user's) and removed when this process exits, after the container: the launch runs in a child
that this process supervises (singpy.launch.process.supervise), where it would otherwise exec the payload.

A SIGKILL of the launcher (or of `pull --disable-cache`) leaves the directory in $TMPDIR, as Apptainer
leaves its own; singpy sweeps such leftovers at the next --disable-cache run. Each directory holds a
`.lock` that its process flocks for its whole life (the lock is shared with the supervised child, and the
kernel drops it when the last of them dies), so the sweep removes only directories of dead runs: in
$TMPDIR, named singpy-nocache-*, real directories (never a link) of the caller's, whose `.lock` (a
regular file of the caller's, opened without following a link) it can lock. A directory without a `.lock`
(an instance's, whose holder removes it; one of an older singpy) is left alone.
"""

from __future__ import annotations

import os
import sys

from singpy.constants import IMAGE_URI_PREFIXES

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

    from singpy.host.host import HostInfo


def is_pulled(reference: str) -> bool:
    """Whether the image reference is pulled before the launch (a transport), not a file or directory."""
    scheme, separator, _ = reference.partition("://")
    return reference.startswith(IMAGE_URI_PREFIXES) or bool(separator and scheme.isalnum() and scheme != "instance")


def in_temporary_cache(host: HostInfo, body: Callable[[HostInfo], int]) -> int:
    """`body` (the pull and the launch) with `host`'s caches in a fresh temporary directory, removed after it,
    whether it returned (the container ended: `launched`) or raised (the pull failed)."""
    import tempfile

    sweep(tempfile.gettempdir())
    try:
        directory = tempfile.mkdtemp(prefix=PREFIX)  # $TMPDIR, else /tmp; 0700
        lock = _hold(directory)
    except OSError as error:
        from singpy.errors import SingpyError

        raise SingpyError(f"--disable-cache: can't make a temporary directory in {tempfile.gettempdir()}: "
                          f"{error.strerror}", hint="set TMPDIR to a directory you can write to") from None
    try:
        return body(host.replace(env={**host.env, "SINGPY_CACHEDIR": directory}))
    finally:
        _remove(directory)
        os.close(lock)


PREFIX = "singpy-nocache-"
LOCK = ".lock"
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _hold(directory: str) -> int:
    """Create and flock `directory`/.lock for the life of this run (and of its supervised child)."""
    import fcntl

    fd = os.open(f"{directory}/{LOCK}", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours alone: just made, in a 0700 directory
    except OSError:
        os.close(fd)
        _remove(directory)
        raise
    return fd


def sweep(parent: str) -> None:
    """Remove the temporary caches in `parent` that runs killed before they could (see the module)."""
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(parent_fd):
            lock = _abandoned(parent_fd, name) if name.startswith(PREFIX) else -1
            if lock >= 0:
                try:  # with its lock held: another run sweeping at the same time skips it
                    _remove_at(parent_fd, name, f"{parent}/{name}")
                finally:
                    os.close(lock)
    except OSError:  # $TMPDIR unreadable: nothing to sweep
        pass
    finally:
        os.close(parent_fd)


def _abandoned(parent_fd: int, name: str) -> int:
    """The locked `.lock` of `name` in `parent_fd` where it is a temporary cache of the caller's that no live
    process holds (a run that died); -1 otherwise."""
    import fcntl
    import stat

    uid = os.geteuid()
    try:
        directory = os.open(name, _DIRECTORY, dir_fd=parent_fd)  # a link there: ELOOP or ENOTDIR, skipped
    except OSError:
        return -1
    try:
        info = os.fstat(directory)
        if info.st_uid != uid or not stat.S_ISDIR(info.st_mode):
            return -1  # someone else's: never touched
        lock = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError:
        return -1  # no lock there: an instance's, or an older singpy's
    finally:
        os.close(directory)
    try:
        held = os.fstat(lock)
        if held.st_uid == uid and stat.S_ISREG(held.st_mode):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
    except OSError:  # locked: its run is alive
        pass
    os.close(lock)
    return -1


def _remove_at(parent_fd: int, name: str, shown: str) -> None:
    from singpy import console
    from singpy.image import trees

    console.verbose(f"removing the temporary image directory of a killed run: {shown}")
    try:
        trees.remove_at(parent_fd, name)
    except OSError as error:
        console.warning(f"could not remove the temporary image directory {shown}: {error.strerror}")


def _remove(directory: str) -> None:
    from singpy.image import trees

    try:
        trees.remove(directory)
    except OSError as error:
        from singpy import console

        console.warning(f"could not remove the temporary image directory {directory}: {error.strerror}")


def launched(run: Callable[[], int]) -> int:
    """`run` (the launch) in a supervised child, so that this process outlives the container; its status."""
    from singpy.launch import process
    from singpy.launch.exitstatus import exit_as

    def child() -> NoReturn:
        status = run()  # returns only where the launch supervises (else the payload replaced the child)
        sys.stdout.flush()
        sys.stderr.flush()
        exit_as(status)  # -N: killed as the payload was, for the supervisor here to see

    return process.supervise(child)

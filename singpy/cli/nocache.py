"""--disable-cache (APPTAINER_DISABLE_CACHE) for run, exec and shell, as Apptainer's: a docker://, oci:,
oras://... image is pulled into a temporary directory, used, and removed when the container ends; nothing
is read from or written to the user's cache.

Every cache of the run (the pulled layers and SIF, a squashfs extracted for want of a mount, the CDI cache)
goes there, by pointing SINGPY_CACHEDIR at it for this run only (singpy.host.cachefiles.cache_dir); the
container never sees that variable (launcher variables never pass). The directory is made in $TMPDIR
(0700, the user's) and removed when this process exits, after the container: the launch runs in a child
that this process supervises (singpy.launch.process.supervise), where it would otherwise exec the payload. A
SIGKILL of the launcher leaves the directory in $TMPDIR, as Apptainer leaves its own.
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

    try:
        directory = tempfile.mkdtemp(prefix="singpy-nocache-")  # $TMPDIR, else /tmp; 0700
    except OSError as error:
        from singpy.errors import SingpyError

        raise SingpyError(f"--disable-cache: can't make a temporary directory in {tempfile.gettempdir()}: "
                          f"{error.strerror}", hint="set TMPDIR to a directory you can write to") from None
    try:
        return body(host.replace(env={**host.env, "SINGPY_CACHEDIR": directory}))
    finally:
        _remove(directory)


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

    def child() -> NoReturn:
        status = run()  # returns only where the launch supervises (else the payload replaced the child)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    return process.supervise(child)

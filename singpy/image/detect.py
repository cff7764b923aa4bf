"""Classify an image reference by what it is, not by its name.

A new format is one new branch here and one module under `singpy.image`.
"""

from __future__ import annotations

import os
import stat

from singpy.errors import ImageError
from singpy.plan import ImageSpec

SQUASHFS_MAGIC = b"hsqs"
SIF_MAGIC = b"SIF_MAGIC"
_SIF_MAGIC_AT = 32  # after the 32-byte launch script


def detect(reference: str) -> ImageSpec:
    """Return where the root filesystem of `reference` comes from."""
    path = os.path.abspath(reference)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ImageError(f"image {reference} does not exist") from None
    except OSError as error:
        raise ImageError(f"can't read image {reference}: {error.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        return _sandbox(path, reference)
    head = _read_head(path, reference)
    if head[_SIF_MAGIC_AT:_SIF_MAGIC_AT + len(SIF_MAGIC)] == SIF_MAGIC:
        return ImageSpec(kind="sif", path=path)
    if head[:4] == SQUASHFS_MAGIC:
        return ImageSpec(kind="squashfs", path=path, size=info.st_size)
    raise ImageError(f"{reference} is not a container image (not a directory, SIF or squashfs file)")


def _sandbox(path: str, reference: str) -> ImageSpec:
    if not os.access(path, os.R_OK | os.X_OK):
        raise ImageError(f"can't read image {reference}: permission denied")
    if not os.path.isdir(os.path.join(path, "bin")) and not os.path.isdir(os.path.join(path, "usr")):
        raise ImageError(f"{reference} is not a container image (a directory without bin/ or usr/)")
    return ImageSpec(kind="sandbox", path=path, rootfs=path)


def _read_head(path: str, reference: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(64)
    except OSError as error:
        raise ImageError(f"can't read image {reference}: {error.strerror}") from None

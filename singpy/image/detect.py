"""Classify an image reference by what it is, not by its name.

A new format is one new branch here and one module under `singpy.image`.

For a SIF, the primary system partition is located from the descriptors and
checked here: squashfs (the only filesystem singpy mounts), starting with a
squashfs superblock, built for this host's architecture. This runs on every
`singpy exec`, so it reads the header and descriptor table with `struct`
alone: `singpy.image.sif` costs about 17 ms to import (dataclasses, typing)
and is loaded only when something is wrong, to name the problem in the
reader's own words. tests/unit/test_detect.py checks that both readers agree
on every reference image.
"""

from __future__ import annotations

import os
import stat

from singpy.errors import ImageError, SifError
from singpy.host import hostfiles
from singpy.image.sifscan import _open as _open
from singpy.image.sifscan import _overlay as _overlay
from singpy.image.sifscan import _partitions as _partitions
from singpy.image.sifscan import _scan as _scan
from singpy.image.sifscan import arch_name as arch_name
from singpy.image.sifscan import host_arch as host_arch
from singpy.image.sifscan import overlay_partition as overlay_partition
from singpy.plan import ImageSpec

SQUASHFS_MAGIC = b"hsqs"
_SUPERBLOCK_SIZE = 96  # a squashfs is at least its superblock
SIF_MAGIC = b"SIF_MAGIC"
# Singularity 2.x images (.simg, which cwltool still ships): a launch line `#!/usr/bin/env run-singularity`,
# then the filesystem. Found as Apptainer finds it (pkg/image): the marker within the first 2048 bytes, the
# filesystem right after the newline that ends it.
_LAUNCH_MARKER = b" run-singularity"
_LAUNCH_SEARCH = 2048
# Their ext3 kind (.img): the filesystem at the top of the file or after the same line; its superblock's magic
# 1080 bytes in, then its feature flags (those of singpy.image.extfs, Apptainer's pkg/image/ext3.go).
_EXT_MAGIC_AT = 1080
_EXT_MAGIC = b"\x53\xef"
_EXT_FEATURES_END = 48  # magic (2) ... compat, incompat, ro_compat (36 to 48 after it)
_EXT_HAS_JOURNAL = 0x4
_EXT_INCOMPAT = 0x2 | 0x4 | 0x10  # filetype, needs recovery, meta_bg
_EXT_ROCOMPAT = 0x1 | 0x2 | 0x4  # sparse_super, large_file, btree_dir
_SIF_MAGIC_AT = 32  # after the 32-byte launch script
_FS_NAMES = {1: "squashfs", 2: "ext3", 3: "immutable object", 4: "raw", 5: "encrypted squashfs",
             6: "gocryptfs squashfs"}
_FS_ENCRYPTED_SQUASHFS, _FS_GOCRYPTFS = 5, 6  # a gocryptfs partition is a squashfs too: of the encrypted files
_ENCRYPTIONS = {_FS_ENCRYPTED_SQUASHFS: "luks", _FS_GOCRYPTFS: "gocryptfs"}  # ImageSpec.encryption (image.cryptmount)


def detect(reference: str) -> ImageSpec:
    """Return where the root filesystem of `reference` comes from, checked to be runnable here."""
    image = classify(reference)
    return sif_partition(image.path) if image.kind == "sif" else image


def classify(reference: str) -> ImageSpec:
    """The kind of image `reference` is (sandbox, sif, squashfs or ext3), from its content alone.

    Only a directory or a regular file can be an image: a FIFO or a device is
    refused from its stat(), before any open() that could block or never end.
    """
    path = os.path.abspath(reference)
    shown = hostfiles.shown(reference)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ImageError(f"image {shown} does not exist") from None
    except (OSError, ValueError) as error:
        raise ImageError(f"can't read image {shown}: {hostfiles.reason(error)}") from None
    if stat.S_ISDIR(info.st_mode):
        return _sandbox(path, reference)
    if not stat.S_ISREG(info.st_mode):
        raise ImageError(f"{shown} is not a container image ({hostfiles.kind_name(info.st_mode)})")
    head = _read_at(path, 0, 64, reference)
    if head[_SIF_MAGIC_AT:_SIF_MAGIC_AT + len(SIF_MAGIC)] == SIF_MAGIC:
        return ImageSpec(kind="sif", path=path)
    if head[:4] == SQUASHFS_MAGIC:
        return ImageSpec(kind="squashfs", path=path, size=info.st_size)
    head = _read_at(path, 0, _LAUNCH_SEARCH, reference)
    offset = _after_launch_line(head)
    if offset and head[offset:offset + 4] == SQUASHFS_MAGIC:
        return ImageSpec(kind="squashfs", path=path, offset=offset, size=info.st_size - offset)
    if _ext3_magic(head, offset):
        if not _ext3_features(head, offset):  # Apptainer's ErrNotValidExt3Image: a real error, not "no image"
            raise ImageError(f"{shown} is not a valid ext3 image (an ext2 or ext4 filesystem): singpy runs only "
                             "the ext3 images of Singularity 2.x")
        return ImageSpec(kind="ext3", path=path, offset=offset, size=info.st_size - offset)
    raise ImageError(f"{shown} is not a container image (not a directory, SIF, squashfs or ext3 file)")


def _after_launch_line(head: bytes) -> int:
    """Where a Singularity 2.x image's filesystem starts after its launch line; 0 without one (Apptainer's rule)."""
    found = head.find(_LAUNCH_MARKER)
    return found + len(_LAUNCH_MARKER) + 1 if found > 0 else 0  # and the newline


def _ext3_magic(head: bytes, offset: int) -> bool:
    """Whether an ext2/3/4 superblock starts at `offset` + 1024, in the first 2048 bytes (Apptainer reads no more)."""
    at = offset + _EXT_MAGIC_AT
    return at + _EXT_FEATURES_END <= len(head) and head[at:at + 2] == _EXT_MAGIC


def _ext3_features(head: bytes, offset: int) -> bool:
    """A journal and no feature ext3 lacks: Apptainer's CheckExt3Header (as singpy.image.extfs checks overlays)."""
    import struct  # only for an image file: a sandbox's launch never loads it (issue 31)

    compat, incompat, rocompat = struct.unpack_from("<III", head, offset + _EXT_MAGIC_AT + 36)
    return bool(compat & _EXT_HAS_JOURNAL) and not incompat & ~_EXT_INCOMPAT and not rocompat & ~_EXT_ROCOMPAT


def is_definition_file(reference: str) -> bool:
    """Whether `singpy build` should read `reference` as a definition file: a regular file that is no image.

    Anything else (a directory, a SIF, a missing path, a FIFO) goes to
    `classify`, which says what it is.
    """
    try:
        if not stat.S_ISREG(os.stat(reference).st_mode):
            return False
        head = _read_at(os.path.abspath(reference), 0, _LAUNCH_SEARCH, reference)
    except (OSError, ValueError, ImageError):
        return False
    if head[_SIF_MAGIC_AT:_SIF_MAGIC_AT + len(SIF_MAGIC)] == SIF_MAGIC or head[:4] == SQUASHFS_MAGIC:
        return False
    offset = _after_launch_line(head)
    return not (offset and head[offset:offset + 4] == SQUASHFS_MAGIC) and not _ext3_magic(head, offset)


def _sandbox(path: str, reference: str) -> ImageSpec:
    if not os.access(path, os.R_OK | os.X_OK):
        raise ImageError(f"can't read image {hostfiles.shown(reference)}: permission denied")
    if not os.path.isdir(os.path.join(path, "bin")) and not os.path.isdir(os.path.join(path, "usr")):
        raise ImageError(f"{hostfiles.shown(reference)} is not a container image (a directory without bin/ or usr/)")
    return ImageSpec(kind="sandbox", path=path, rootfs=path)


def sif_partition(path: str, *, check_arch: bool = True) -> ImageSpec:
    """The SIF's primary system partition, checked to be a squashfs (this host can run)."""
    partitions = _partitions(path)
    found = _scan(partitions)
    if found is None:
        from singpy.image.sif import read_sif  # names what is wrong, in the reader's words

        read_sif(path).primary_partition()
        raise SifError(f"corrupt SIF {path}")  # not reached: read_sif agrees that something is wrong
    offset, size, fstype, arch = found
    if fstype not in (1, _FS_ENCRYPTED_SQUASHFS, _FS_GOCRYPTFS):
        kind = _FS_NAMES.get(fstype, f"type {fstype}")
        raise ImageError(f"{path}: the primary partition is {kind}; singpy runs only squashfs partitions")
    # Apptainer's root-built kind (LUKS2) shows its squashfs only once dm-crypt has decrypted it
    if fstype != _FS_ENCRYPTED_SQUASHFS and (size < _SUPERBLOCK_SIZE or _read_at(path, offset, 4) != SQUASHFS_MAGIC):
        raise ImageError(f"{path}: the primary partition is not a squashfs filesystem (bad superblock)")
    host = host_arch()
    if check_arch and arch not in ("unknown", host):
        raise ImageError(f"{path}: image is {arch}, this host is {host}")
    overlay_offset, overlay_size = _overlay(partitions) or (0, 0)
    return ImageSpec(kind="sif", path=path, offset=offset, size=size, arch=arch, overlay_offset=overlay_offset,
                     overlay_size=overlay_size, encryption=_ENCRYPTIONS.get(fstype, ""))


def _read_at(path: str, offset: int, length: int, reference: str | None = None) -> bytes:
    """Up to `length` bytes at `offset` of the regular file `path`."""
    shown = hostfiles.shown(reference or path)
    try:
        fd = _open(path)
    except OSError as error:
        raise ImageError(f"can't read image {shown}: {hostfiles.reason(error)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ImageError(f"{shown} is not a container image ({hostfiles.kind_name(mode)})")
        return os.pread(fd, length, offset)
    except OSError as error:
        raise ImageError(f"can't read image {shown}: {hostfiles.reason(error)}") from None
    finally:
        os.close(fd)

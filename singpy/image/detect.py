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
import struct

from singpy.errors import ImageError, SifError
from singpy.plan import ImageSpec

SQUASHFS_MAGIC = b"hsqs"
_SUPERBLOCK_SIZE = 96  # a squashfs is at least its superblock
SIF_MAGIC = b"SIF_MAGIC"
_SIF_MAGIC_AT = 32  # after the 32-byte launch script
_HEADER = struct.Struct("<32s10s3s3s16s8q")  # as singpy.image.sif.HEADER
_DESCRIPTOR = struct.Struct("<i?III7q128s384s")  # as singpy.image.sif.DESCRIPTOR
_PARTITION = 0x4004
_PRIMSYS = 2
_FS_NAMES = {1: "squashfs", 2: "ext3", 3: "immutable object", 4: "raw", 5: "encrypted squashfs",
             6: "gocryptfs squashfs"}
# Go arch names by SIF code (sif.md section 3), and the kernel's machine names for them.
ARCHES = ("unknown", "386", "amd64", "arm", "arm64", "ppc64", "ppc64le", "mips", "mipsle", "mips64",
          "mips64le", "s390x", "riscv64", "loong64")
_MACHINES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "ppc64": "ppc64", "s390x": "s390x",
             "riscv64": "riscv64", "loongarch64": "loong64", "i686": "386"}


def detect(reference: str) -> ImageSpec:
    """Return where the root filesystem of `reference` comes from, checked to be runnable here."""
    image = classify(reference)
    return sif_partition(image.path) if image.kind == "sif" else image


def classify(reference: str) -> ImageSpec:
    """The kind of image `reference` is (sandbox, sif or squashfs), from its content alone."""
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


def sif_partition(path: str, *, check_arch: bool = True) -> ImageSpec:
    """The SIF's primary system partition, checked to be a squashfs (this host can run)."""
    found = _scan(path)
    if found is None:
        from singpy.image.sif import read_sif  # names what is wrong, in the reader's words

        read_sif(path).primary_partition()
        raise SifError(f"corrupt SIF {path}")  # not reached: read_sif agrees that something is wrong
    offset, size, fstype, arch = found
    if fstype != 1:
        kind = _FS_NAMES.get(fstype, f"type {fstype}")
        raise ImageError(f"{path}: the primary partition is {kind}; singpy runs only squashfs partitions")
    if size < _SUPERBLOCK_SIZE or _read_at(path, offset, 4) != SQUASHFS_MAGIC:
        raise ImageError(f"{path}: the primary partition is not a squashfs filesystem (bad superblock)")
    host = host_arch()
    if check_arch and arch not in ("unknown", host):
        raise ImageError(f"{path}: image is {arch}, this host is {host}")
    return ImageSpec(kind="sif", path=path, offset=offset, size=size, arch=arch)


def _scan(path: str) -> tuple[int, int, int, str] | None:
    """(offset, size, fstype, arch) of the primary partition, or None if anything is amiss.

    The checks are those of `singpy.image.sif.read_raw`: magic, version,
    descriptor table inside the file, every used object inside the file.
    """
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(_HEADER.size)
            if len(head) < _HEADER.size:
                return None
            fields = _HEADER.unpack(head)
            total, table_at, table_size = fields[8], fields[9], fields[10]
            if (fields[1] != b"SIF_MAGIC\0" or fields[2] != b"01\0" or not 0 <= total <= 0xFFFFFFFF
                    or table_size != total * _DESCRIPTOR.size or table_at < _HEADER.size
                    or table_at + table_size > size or fields[11] < 0):
                return None
            handle.seek(table_at)
            table = handle.read(table_size)
    except OSError:
        return None
    if len(table) != table_size:
        return None
    found = None
    for datatype, used, _, _, _, offset, length, *_, extra in _DESCRIPTOR.iter_unpack(table):
        if not used:
            continue
        if offset < 0 or length < 0 or offset + length > size:
            return None
        if datatype == _PARTITION and found is None and struct.unpack_from("<i", extra, 4)[0] == _PRIMSYS:
            found = (offset, length, struct.unpack_from("<i", extra)[0], _arch_name(extra[8:11]))
    return found


def _arch_name(code: bytes) -> str:
    if len(code) == 3 and code[2] == 0 and code[:2].isdigit() and int(code[:2]) < len(ARCHES):
        return ARCHES[int(code[:2])]
    return "unknown"


def host_arch() -> str:
    """This host's architecture, named as SIF partitions name it (Go's GOARCH)."""
    machine = os.uname().machine
    if machine in _MACHINES:
        return _MACHINES[machine]
    from singpy.image.sif import host_arch as full  # the rarer machines (arm, mips, i386...)

    return full()


def _read_at(path: str, offset: int, length: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(length)
    except OSError as error:
        raise ImageError(f"can't read image {path}: {error.strerror}") from None

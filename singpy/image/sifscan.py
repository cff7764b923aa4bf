"""A SIF's partitions read with `struct` alone: the part of the SIF format the start-up path needs.

Shared by the fast detector (singpy.image.detect, on every `singpy exec`)
and the full reader (singpy.image.sif, which re-exports `arch_name`,
`host_arch` and `overlay_partition`), below both: neither imports the other
for these. The checks are those of `singpy.image.sif.read_raw`.
"""

from __future__ import annotations

import os
import stat

from singpy.constants import ARCHES, MACHINE_ARCH

# `struct` is imported when a SIF is read, not at import: a sandbox's launch imports this module too (issue 31)
_HEADER = "<32s10s3s3s16s8q"  # as singpy.image.sif.HEADER
_DESCRIPTOR = "<i?III7q128s384s"  # as singpy.image.sif.DESCRIPTOR
_PARTITION = 0x4004
_PRIMSYS = 2
_OVERLAY = 4  # part type Overlay
_FS_EXT3 = 2


def overlay_partition(path: str) -> tuple[int, int] | None:
    """(offset, size) of a SIF's writable overlay partition (ext3, part type Overlay); None without one.

    What `singpy overlay create FILE.sif` and Apptainer's `overlay create`
    add. A file that is not a readable SIF has none (its detection names
    what is wrong with it).
    """
    return _overlay(_partitions(path))


def _overlay(partitions: list[tuple[int, int, int, bytes]] | None) -> tuple[int, int] | None:
    for datatype, offset, length, extra in partitions or ():
        fstype, parttype = _int32(extra, 0), _int32(extra, 4)
        if datatype == _PARTITION and parttype == _OVERLAY and fstype == _FS_EXT3:
            return offset, length
    return None


def _scan(partitions: list[tuple[int, int, int, bytes]] | None) -> tuple[int, int, int, str] | None:
    """(offset, size, fstype, arch) of the primary partition, or None if anything is amiss."""
    for datatype, offset, length, extra in partitions or ():
        if datatype == _PARTITION and _int32(extra, 4) == _PRIMSYS:
            return offset, length, _int32(extra, 0), arch_name(extra[8:11])
    return None


def _int32(extra: bytes, at: int) -> int:
    """The little-endian signed 32-bit number at `at` of a descriptor's extra field (struct's "<i")."""
    return int.from_bytes(extra[at:at + 4], "little", signed=True)


def _partitions(path: str) -> list[tuple[int, int, int, bytes]] | None:
    """(datatype, offset, size, extra) of every used descriptor in slot order, or None if anything is amiss.

    The checks are those of `singpy.image.sif.read_raw`: magic, version,
    descriptor table inside the file, every used object inside the file.
    """
    try:
        fd = _open(path)
    except OSError:
        return None
    import struct

    header, descriptor = struct.Struct(_HEADER), struct.Struct(_DESCRIPTOR)
    try:
        info = os.fstat(fd)
        size = info.st_size
        head = os.pread(fd, header.size, 0)
        if not stat.S_ISREG(info.st_mode) or len(head) < header.size:
            return None
        fields = header.unpack(head)
        total, table_at, table_size = fields[8], fields[9], fields[10]
        if (fields[1] != b"SIF_MAGIC\0" or fields[2] != b"01\0" or not 0 <= total <= 0xFFFFFFFF
                or table_size != total * descriptor.size or table_at < header.size
                or table_at + table_size > size or fields[11] < 0):
            return None
        table = os.pread(fd, table_size, table_at)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(table) != table_size:
        return None
    found = []
    for datatype, used, _, _, _, offset, length, *_, extra in descriptor.iter_unpack(table):
        if not used:
            continue
        if offset < 0 or length < 0 or offset + length > size:
            return None
        found.append((datatype, offset, length, extra))
    return found


def arch_name(code: bytes) -> str:
    """Go arch name for a 3-byte SIF arch code ("02\\0" is amd64); "unknown" for anything else."""
    if len(code) == 3 and code[2] == 0 and code[:2].isdigit() and int(code[:2]) < len(ARCHES):
        return ARCHES[int(code[:2])]
    return "unknown"


def host_arch() -> str:
    """This host's architecture, named as SIF partitions name it (Go's GOARCH)."""
    machine = os.uname().machine
    if machine in MACHINE_ARCH:
        return MACHINE_ARCH[machine]
    if machine.startswith("arm"):
        return "arm"
    if machine.startswith("mips"):
        import sys  # only reached on MIPS hosts, where endianness picks the name

        suffix = "le" if sys.byteorder == "little" else ""
        return ("mips64" if "64" in machine else "mips") + suffix
    return machine


def _open(path: str) -> int:
    """O_NONBLOCK: should a FIFO replace the file between two opens, the open does not wait for a writer."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)

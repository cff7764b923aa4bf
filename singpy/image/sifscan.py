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

TYPE_CHECKING = False  # see singpy.record: `collections` is not loaded on a SIF launch (issue 31)
if TYPE_CHECKING:
    from collections.abc import Iterator

# `struct` is imported when a SIF is read, not at import: a sandbox's launch imports this module too (issue 31)
_HEADER = "<32s10s3s3s16s8q"  # as singpy.image.sif.HEADER
_DESCRIPTOR = "<i?III7q128s384s"  # as singpy.image.sif.DESCRIPTOR
_PARTITION = 0x4004
_PRIMSYS = 2
_OVERLAY = 4  # part type Overlay
_FS_EXT3 = 2
_ID_MASK = 0x0FFFFFFF  # group IDs carry the 0xF0000000 nibble (as singpy.image.sif.ID_MASK)
MAX_DESCRIPTORS = 1 << 16  # a 38 MB table; writers make 48 slots, and a hostile header must not cost GBs of memory
_CHUNK = 1 << 20  # bytes of the descriptor table read at a time
_EXT_MAGIC_AT = 1080  # superblock (1024) + magic (56)
_EXT_FEATURES_END = 48  # magic ... compat, incompat, ro_compat at 36, 40, 44 after it


def overlay_partition(path: str) -> tuple[int, int] | None:
    """(offset, size) of a SIF's writable overlay partition (ext3, part type Overlay); None without one.

    What `singpy overlay create FILE.sif` and Apptainer's `overlay create`
    add. A file that is not a readable SIF has none (its detection names
    what is wrong with it).
    """
    return _overlay(_partitions(path))


def _overlay(partitions: list[tuple[int, int, int, bytes, int]] | None) -> tuple[int, int] | None:
    """Apptainer's choice (pkg/image/sif.go): with the rootfs in a group, an overlay in another group is ignored.

    Overlays whose ext3 header Apptainer would refuse never reach this list (`_partitions`).
    """
    partitions = partitions or []
    group = next((found[4] for found in partitions if _is_primary(found)), 0)
    for datatype, offset, length, extra, overlay_group in partitions:
        if _is_overlay(datatype, extra) and not (group and overlay_group != group):
            return offset, length
    return None


def _scan(partitions: list[tuple[int, int, int, bytes, int]] | None) -> tuple[int, int, int, str] | None:
    """(offset, size, fstype, arch) of the primary partition, or None if anything is amiss.

    Two primary partitions are amiss: Apptainer's GetDescriptor finds "multiple objects" and runs neither.
    """
    primaries = [found for found in partitions or () if _is_primary(found)]
    if len(primaries) != 1:
        return None
    _, offset, length, extra, _ = primaries[0]
    return offset, length, _int32(extra, 0), arch_name(extra[8:11])


def _is_primary(found: tuple[int, int, int, bytes, int]) -> bool:
    return found[0] == _PARTITION and _int32(found[3], 4) == _PRIMSYS


def _is_overlay(datatype: int, extra: bytes) -> bool:
    return datatype == _PARTITION and _int32(extra, 4) == _OVERLAY and _int32(extra, 0) == _FS_EXT3


def _int32(extra: bytes, at: int) -> int:
    """The little-endian signed 32-bit number at `at` of a descriptor's extra field (struct's "<i")."""
    return int.from_bytes(extra[at:at + 4], "little", signed=True)


def _partitions(path: str) -> list[tuple[int, int, int, bytes, int]] | None:
    """(datatype, offset, size, extra, group) of every used descriptor in slot order, or None if anything is amiss.

    The checks are those of `singpy.image.sif.read_raw`: magic, version,
    at most MAX_DESCRIPTORS descriptors, the table inside the file, every
    used object inside the file. An ext3 overlay partition without a valid
    ext3 header is left out, as Apptainer leaves it out.
    """
    try:
        fd = _open(path)
    except OSError:
        return None
    try:
        return _read_partitions(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_partitions(fd: int) -> list[tuple[int, int, int, bytes, int]] | None:
    import struct

    header, descriptor = struct.Struct(_HEADER), struct.Struct(_DESCRIPTOR)
    info = os.fstat(fd)
    size = info.st_size
    head = os.pread(fd, header.size, 0)
    if not stat.S_ISREG(info.st_mode) or len(head) < header.size:
        return None
    fields = header.unpack(head)
    total, table_at, table_size = fields[8], fields[9], fields[10]
    if (fields[1] != b"SIF_MAGIC\0" or fields[2] != b"01\0" or not 0 <= total <= MAX_DESCRIPTORS
            or table_size != total * descriptor.size or table_at < header.size
            or table_at + table_size > size or fields[11] < 0):
        return None
    found = []
    for slot in _used_slots(fd, table_at, total, descriptor.size):
        datatype, _, _, group, _, offset, length, *_, extra = descriptor.unpack(slot)
        if offset < 0 or length < 0 or offset + length > size:
            return None
        if not _is_overlay(datatype, extra) or _ext3_header(fd, offset):
            found.append((datatype, offset, length, extra, group & _ID_MASK))
    return found


def _used_slots(fd: int, table_at: int, total: int, slot_size: int) -> Iterator[bytes]:
    """The bytes of each used descriptor slot, the table read a bounded chunk at a time.

    Raises OSError on a short read (the file shrank): the caller's "amiss".
    """
    per_chunk = _CHUNK // slot_size
    for first in range(0, total, per_chunk):
        count = min(per_chunk, total - first)
        chunk = os.pread(fd, count * slot_size, table_at + first * slot_size)
        if len(chunk) != count * slot_size:
            raise OSError("descriptor table truncated")
        for at in range(0, len(chunk), slot_size):
            if chunk[at + 4]:  # the `used` flag, after the 4-byte datatype
                yield chunk[at:at + slot_size]


def _ext3_header(fd: int, offset: int) -> bool:
    """Apptainer's CheckExt3Header on an overlay partition: ext magic, a journal, no feature ext3 lacks."""
    superblock = os.pread(fd, _EXT_FEATURES_END, offset + _EXT_MAGIC_AT)
    if len(superblock) != _EXT_FEATURES_END or superblock[:2] != b"\x53\xef":
        return False
    compat, incompat, rocompat = (_int32(superblock, at) & 0xFFFFFFFF for at in (36, 40, 44))
    return bool(compat & 0x4) and not incompat & ~(0x2 | 0x4 | 0x10) and not rocompat & ~(0x1 | 0x2 | 0x4)


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

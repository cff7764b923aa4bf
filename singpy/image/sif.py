"""Read SIF (Singularity Image Format) files, the images Apptainer builds.

::

    offset 0           +-----------------------------------------------+
                       | global header: 128 bytes, zero to 4 KiB       |
                       |   launch script[32]  magic "SIF_MAGIC"[10]    |
                       |   version "01"[3]  arch[3]  uuid[16]          |
                       |   int64: created modified free total          |
                       |          descr. offset/size data offset/size  |
    DescriptorsOffset  +-----------------------------------------------+
    (usually 4096)     | descriptor slot 1      585 bytes each:        |
                       | descriptor slot 2      type used id group     |
                       | ...                    link offset size ...   |
                       | slot DescriptorsTotal  name[128] extra[384]   |
    DataOffset         +-----------------------------------------------+
    (32176 in v2,      | data objects, back to back, maybe aligned:    |
     32768 in v1)      | deffile, JSON, squashfs partition, signature; |
                       | each found only through its descriptor's      |
                       | Offset and Size                               |
                       +-----------------------------------------------+

All integers are little-endian and the structs are packed.  Nothing here
assumes a fixed layout: tables and objects are located through the header
and descriptors, and every one of them is checked against the file size, so
that any input yields a `SifImage` or a one-line `SifError`.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from typing import NamedTuple

from singpy.constants import ARCHES
from singpy.errors import SifError

# Shared with the fast detector, which the start-up path loads anyway; re-exported for the reader's users.
from singpy.image import sifscan
from singpy.image.sifscan import arch_name as arch_name
from singpy.image.sifscan import host_arch as host_arch
from singpy.image.sifscan import overlay_partition as overlay_partition  # (offset, size) of the ext3 overlay

HEADER = struct.Struct("<32s10s3s3s16s8q")  # 128 bytes
DESCRIPTOR = struct.Struct("<i?III7q128s384s")  # 585 bytes
PARTITION_EXTRA = struct.Struct("<ii3s")  # fstype, parttype, arch code

MAGIC = b"SIF_MAGIC\0"
VERSION = b"01\0"
ZERO_TIME = -62135596800  # Go's zero time.Time in Unix seconds: "no time"
GROUP_MASK = 0xF0000000  # group IDs and group links carry this nibble
ID_MASK = 0x0FFFFFFF
# At most 65536 slots (a 38 MB table; writers make 48): the header alone must not make a reader hold GBs.
MAX_DESCRIPTORS = sifscan.MAX_DESCRIPTORS

(DATA_DEFFILE, DATA_ENVVAR, DATA_LABELS, DATA_PARTITION, DATA_SIGNATURE, DATA_GENERIC_JSON,
 DATA_GENERIC, DATA_CRYPTO_MESSAGE, DATA_SBOM, DATA_OCI_ROOT_INDEX,
 DATA_OCI_BLOB) = range(0x4001, 0x400C)
FS_SQUASHFS, FS_EXT3, FS_IMMUOBJ, FS_RAW, FS_ENCRYPTED_SQUASHFS, FS_GOCRYPTFS = range(1, 7)
PART_SYSTEM, PART_PRIMSYS, PART_DATA, PART_OVERLAY = range(1, 5)

# Names as `siftool list` / `siftool info` print them.
TYPE_NAMES = dict(zip(range(0x4001, 0x400C), (
    "Def.FILE", "Env.Vars", "JSON.Labels", "FS", "Signature", "JSON.Generic", "Generic/Raw",
    "Cryptographic Message", "SBOM", "OCI.RootIndex", "OCI.Blob",
), strict=True))
FSTYPE_NAMES = dict(zip(range(1, 7), (
    "Squashfs", "Ext3", "Archive", "Raw", "Encrypted squashfs", "Gocryptfs squashfs",
), strict=True))
PARTTYPE_NAMES = dict(zip(range(1, 5), ("System", "*System", "Data", "Overlay"), strict=True))


class RawHeader(NamedTuple):
    """The global header exactly as stored (see HEADER)."""

    launch_script: bytes
    magic: bytes
    version: bytes
    arch: bytes
    id: bytes
    created: int
    modified: int
    descriptors_free: int
    descriptors_total: int
    descriptors_offset: int
    descriptors_size: int
    data_offset: int
    data_size: int


class RawDescriptor(NamedTuple):
    """One descriptor slot exactly as stored (see DESCRIPTOR); all zero when free."""

    datatype: int = 0
    used: bool = False
    id: int = 0
    group_id: int = 0
    link: int = 0
    offset: int = 0
    size: int = 0
    size_with_padding: int = 0
    created: int = 0
    modified: int = 0
    uid: int = 0
    gid: int = 0
    name: bytes = b""
    extra: bytes = b""


_EMPTY = RawDescriptor()  # what a writer stores in a free slot (kept as is when the slots are written back)
_ZERO_SLOT = bytes(DESCRIPTOR.size)
ARCH_CODES = {name: b"%02d\0" % i for i, name in enumerate(ARCHES) if i}  # the codes a writer may store


def _cstr(raw: bytes) -> str:
    """A NUL-padded byte field as text; never fails on bad UTF-8."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One data object descriptor; group and link are already unmasked."""

    datatype: int
    used: bool
    id: int
    group_id: int  # 0 = in no group
    link: int  # 0 = not linked; an object ID, or a group ID if link_is_group
    link_is_group: bool
    offset: int
    size: int
    size_with_padding: int
    created: int
    modified: int
    uid: int
    gid: int
    name: str
    extra: bytes

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.datatype, "Unknown")

    @property
    def is_partition(self) -> bool:
        return self.datatype == DATA_PARTITION

    def _partition(self) -> tuple[int, int, bytes]:
        if not self.is_partition:
            return 0, 0, b""
        fstype, parttype, arch = PARTITION_EXTRA.unpack_from(self.extra)
        return fstype, parttype, arch

    @property
    def fstype(self) -> int:
        """Filesystem type of a partition (FS_*); 0 for other objects."""
        return self._partition()[0]

    @property
    def parttype(self) -> int:
        """Partition type (PART_*); 0 for other objects."""
        return self._partition()[1]

    @property
    def arch(self) -> str:
        """Go arch name of a partition; "unknown" for other objects."""
        return arch_name(self._partition()[2])

    @property
    def fstype_name(self) -> str:
        return FSTYPE_NAMES.get(self.fstype, "Unknown")

    @property
    def parttype_name(self) -> str:
        return PARTTYPE_NAMES.get(self.parttype, "Unknown")

    @property
    def is_primary(self) -> bool:
        """Whether this is the primary system partition, i.e. the rootfs."""
        return self.parttype == PART_PRIMSYS


def _descriptor(raw: RawDescriptor) -> Descriptor:
    link_is_group = raw.link & GROUP_MASK == GROUP_MASK
    return Descriptor(
        datatype=raw.datatype, used=raw.used, id=raw.id, group_id=raw.group_id & ID_MASK,
        link=raw.link & ID_MASK if link_is_group else raw.link, link_is_group=link_is_group,
        offset=raw.offset, size=raw.size, size_with_padding=raw.size_with_padding,
        created=raw.created, modified=raw.modified, uid=raw.uid, gid=raw.gid,
        name=_cstr(raw.name), extra=raw.extra,
    )


@dataclass(frozen=True)
class SifImage:
    """A parsed SIF file: its header and its used descriptors, in slot order."""

    path: str
    file_size: int
    launch_script: str
    magic: str
    version: str
    arch: str
    uuid: str
    created: int
    modified: int
    descriptors_free: int
    descriptors_total: int
    descriptors_offset: int
    descriptors_size: int
    data_offset: int
    data_size: int
    descriptors: tuple[Descriptor, ...]

    def primary_partition(self) -> Descriptor:
        found = [desc for desc in self.descriptors if desc.is_primary]
        if len(found) > 1:  # Apptainer's GetDescriptor: "multiple objects found", no rootfs; slot order decides nothing
            ids = ", ".join(str(desc.id) for desc in found)
            raise SifError(f"corrupt SIF {self.path}: multiple primary system partitions (objects {ids})")
        if not found:
            raise SifError(f"no primary system partition in {self.path}")
        return found[0]

    def find(self, datatype: int, name: str | None = None) -> tuple[Descriptor, ...]:
        """The objects of one type (and, optionally, one name)."""
        return tuple(
            d for d in self.descriptors
            if d.datatype == datatype and (name is None or d.name == name)
        )

    def read_object(self, desc: Descriptor, *, max_size: int | None = None) -> bytes:
        """An object's bytes, read within its bounds (and at most max_size)."""
        if max_size is not None and desc.size > max_size:
            raise SifError(
                f"object {desc.id} in {self.path} is too large ({desc.size} > {max_size} bytes)"
            )
        try:
            with open(self.path, "rb") as f:
                f.seek(desc.offset)
                data = f.read(desc.size)
        except (OSError, ValueError, OverflowError) as e:
            raise SifError(f"can't read SIF object {desc.id} from {self.path}: {e}") from None
        if len(data) != desc.size:
            raise SifError(f"corrupt SIF {self.path}: object {desc.id} is truncated")
        return data


def is_sif(path: str | os.PathLike[str]) -> bool:
    """Cheap check: does the file carry the SIF magic where the header has it?"""
    try:
        head, _, fd = _open_sif(os.fspath(path))
    except SifError:
        return False
    os.close(fd)
    return head[32:42] == MAGIC


def _open_sif(path: str) -> tuple[bytes, int, int]:
    """Header bytes, file size and an open fd: refuses what is not a plain file."""
    try:
        # O_NONBLOCK so that a FIFO given by mistake cannot hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SifError(f"can't open SIF file {path}: {reason}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SifError(f"not a SIF file: {path} (not a regular file)")
        head = os.pread(fd, HEADER.size, 0)  # 128 bytes: is_sif needs 42 of them
    except OSError as e:
        os.close(fd)
        raise SifError(f"can't read SIF file {path}: {e.strerror}") from None
    except SifError:
        os.close(fd)
        raise
    return head, st.st_size, fd


def _check_header(path: str, head: bytes, size: int) -> RawHeader:
    if size == 0:
        raise SifError(f"not a SIF file: {path} (empty file)")
    if len(head) < 42 or head[32:42] != MAGIC:
        raise SifError(f"not a SIF file: {path} (bad magic)")
    if len(head) < HEADER.size:
        raise SifError(f"corrupt SIF {path}: header truncated at {len(head)} bytes")
    hdr = RawHeader._make(HEADER.unpack(head))
    if hdr.version != VERSION:
        # Escaped, so that a hostile file cannot put a newline in the message.
        version = "".join(chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in hdr.version.rstrip(b"\0"))
        raise SifError(f'unsupported SIF version "{version}": {path} (only "01" is known)')
    total, table_size = hdr.descriptors_total, hdr.descriptors_size
    if total > MAX_DESCRIPTORS:
        raise SifError(f"corrupt SIF {path}: {total} descriptors (at most {MAX_DESCRIPTORS})")
    if total < 0 or table_size != total * DESCRIPTOR.size:
        raise SifError(f"corrupt SIF {path}: bad descriptor table size")
    if hdr.descriptors_offset < HEADER.size or hdr.descriptors_offset + table_size > size:
        raise SifError(f"corrupt SIF {path}: descriptor table lies outside the file")
    if hdr.data_offset < 0:
        raise SifError(f"corrupt SIF {path}: negative data offset")
    return hdr


def _read_slots(path: str, fd: int, hdr: RawHeader) -> list[RawDescriptor]:
    """Every slot, the table read 1 MiB at a time; the usual all-zero free slot is one shared object."""
    per_chunk, slots = sifscan._CHUNK // DESCRIPTOR.size, []
    for first in range(0, hdr.descriptors_total, per_chunk):
        count = min(per_chunk, hdr.descriptors_total - first)
        try:
            chunk = os.pread(fd, count * DESCRIPTOR.size, hdr.descriptors_offset + first * DESCRIPTOR.size)
        except OSError as e:
            raise SifError(f"can't read SIF file {path}: {e.strerror}") from None
        if len(chunk) != count * DESCRIPTOR.size:
            raise SifError(f"corrupt SIF {path}: descriptor table is truncated")
        for at in range(0, len(chunk), DESCRIPTOR.size):
            free = chunk[at:at + DESCRIPTOR.size] == _ZERO_SLOT
            slots.append(_EMPTY if free else RawDescriptor._make(DESCRIPTOR.unpack_from(chunk, at)))
    return slots


def _check_slots(path: str, slots: list[RawDescriptor], size: int) -> None:
    for raw in slots:
        # Free slots are skipped: slots in use need not be contiguous.
        if raw.used and (raw.offset < 0 or raw.size < 0 or raw.offset + raw.size > size):
            raise SifError(f"corrupt SIF {path}: descriptor {raw.id} points outside the file")


def read_raw(path: str | os.PathLike[str]) -> tuple[RawHeader, list[RawDescriptor], int]:
    """Validated header, every descriptor slot (free ones too) and the file size."""
    spath = os.fspath(path)
    head, size, fd = _open_sif(spath)
    try:
        hdr = _check_header(spath, head, size)
        slots = _read_slots(spath, fd, hdr)
    finally:
        os.close(fd)
    _check_slots(spath, slots, size)
    return hdr, slots, size


def read_sif(path: str | os.PathLike[str]) -> SifImage:
    """Parse and validate a SIF file; any problem is a one-line `SifError`."""
    spath = os.fspath(path)
    hdr, slots, size = read_raw(spath)
    hexid = hdr.id.hex()
    return SifImage(
        path=spath, file_size=size, launch_script=_cstr(hdr.launch_script),
        magic=_cstr(hdr.magic), version=_cstr(hdr.version), arch=arch_name(hdr.arch),
        uuid=f"{hexid[:8]}-{hexid[8:12]}-{hexid[12:16]}-{hexid[16:20]}-{hexid[20:]}",
        created=hdr.created, modified=hdr.modified, descriptors_free=hdr.descriptors_free,
        descriptors_total=hdr.descriptors_total, descriptors_offset=hdr.descriptors_offset,
        descriptors_size=hdr.descriptors_size, data_offset=hdr.data_offset,
        data_size=hdr.data_size, descriptors=tuple(_descriptor(r) for r in slots if r.used),
    )

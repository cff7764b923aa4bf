"""Write SIF files byte for byte as the reference Go library (sylabs/sif) does.

`create_sif` builds a new image atomically (temp file + rename, mode 0755
less the umask, as the reference's os.OpenFile(..., 0755) gives);
`add_object`, `delete_object` and `set_primary_partition` edit one in place,
as `siftool add/del/setprim` do.  The allocation rules are the reference's:
the first free slot takes a new object and its ID is slot + 1; data goes at
the end of the last object, rounded up to the object's alignment (4096 for
partitions, none otherwise); the header's arch follows the primary system
partition; a "deterministic" image has a nil UUID and Go's zero time.
`build_sif_from_squashfs` lays a squashfs out the way `apptainer build` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from singpy.errors import ImageError, SifError
from singpy.image import sif
from singpy.image.sif import RawDescriptor, RawHeader, read_raw

LAUNCH_SCRIPT = "#!/usr/bin/env run-singularity\n"  # what Apptainer builds carry
DEFAULT_CAPACITY = 48
DESCRIPTORS_OFFSET = 4096
PARTITION_ALIGNMENT = 4096
_ARCH_UNKNOWN = b"00\0"
_NIL_ID = bytes(16)
JsonInput = bytes | str | Mapping[str, Any]


@dataclass(frozen=True)
class SifObject:
    """A data object to add: its bytes (or a file to stream them from) and metadata."""

    datatype: int = sif.DATA_GENERIC
    data: bytes = b""
    path: str | os.PathLike[str] | None = None  # stream the data from here instead
    name: str = ""
    group: int = 1  # 0: in no group
    link: int = 0  # 0: no link; an object ID, or a group ID when link_is_group
    link_is_group: bool = False
    fstype: int = 0  # partitions: FS_*, PART_*, Go arch name
    parttype: int = 0
    arch: str = ""
    extra: bytes = b""  # other types: raw metadata (signature, SBOM format, OCI digest)
    alignment: int | None = None  # None: 4096 for partitions, unaligned otherwise
    time: int | None = None  # object time; None: the image's (modification) time

    def metadata(self) -> bytes:
        if self.datatype != sif.DATA_PARTITION:
            if len(self.extra) > 384:
                raise SifError("object metadata is longer than 384 bytes")
            return self.extra
        if self.arch not in sif.ARCH_CODES:
            raise SifError(f"unknown architecture: {self.arch!r}")
        return sif.PARTITION_EXTRA.pack(self.fstype, self.parttype, sif.ARCH_CODES[self.arch])

    def raw_group(self) -> int:
        return self.group | sif.GROUP_MASK

    def raw_link(self) -> int:
        return self.link | sif.GROUP_MASK if self.link_is_group and self.link else self.link


def _next_aligned(offset: int, alignment: int) -> int:
    """The reference's nextAligned: a bit mask, exact for the powers of two it expects; any other alignment
    (`siftool add --alignment 100`) gives what the reference gives, which a byte-exact writer must too."""
    if alignment <= 0 or offset % alignment == 0:
        return offset
    return (offset & ~(alignment - 1)) + alignment


def _is_primary(d: RawDescriptor) -> bool:
    return (
        d.used and d.datatype == sif.DATA_PARTITION
        and sif.PARTITION_EXTRA.unpack_from(d.extra)[1] == sif.PART_PRIMSYS
    )


class _Image:
    """Header and descriptor table in memory, data written straight to the file."""

    def __init__(self, f: BinaryIO, hdr: RawHeader, slots: list[RawDescriptor]) -> None:
        self.f, self.hdr, self.slots = f, hdr, slots
        self.flushed = False  # set once the table and header of an in-place edit are written (`_flush_held`)

    def data_end(self) -> int:
        return max([self.hdr.data_offset] + [d.offset + d.size for d in self.slots if d.used])

    def index(self, object_id: int) -> int:
        for i, d in enumerate(self.slots):
            if d.used and d.id == object_id:
                return i
        raise SifError(f"no object with ID {object_id} in the SIF image")

    def add(self, obj: SifObject, t: int) -> None:
        slot = next((i for i, d in enumerate(self.slots) if not d.used), len(self.slots))
        if slot >= len(self.slots):
            raise SifError("no free descriptor left in the SIF image")
        extra, name = obj.metadata(), obj.name.encode()
        if len(name) > 128:
            raise SifError(f"object name is longer than 128 bytes: {obj.name!r}")
        if obj.datatype == sif.DATA_PARTITION and obj.parttype == sif.PART_PRIMSYS:
            if any(_is_primary(d) for d in self.slots):
                raise SifError("the SIF image already has a primary system partition")
            self.hdr = self.hdr._replace(arch=sif.ARCH_CODES[obj.arch])
        end = self.data_end()
        offset = _next_aligned(end, _alignment(obj))
        size = self._write_data(obj, offset)
        t = t if obj.time is None else obj.time
        self.slots[slot] = RawDescriptor(
            obj.datatype, True, slot + 1, obj.raw_group(), obj.raw_link(), offset, size,
            offset - end + size, t, t, 0, 0, name, extra,
        )
        self.hdr = self.hdr._replace(
            descriptors_free=self.hdr.descriptors_free - 1,
            data_size=offset + size - self.hdr.data_offset,  # padding included
        )

    def _write_data(self, obj: SifObject, offset: int) -> int:
        self.f.seek(offset)
        if obj.path is None:
            self.f.write(obj.data)
            return len(obj.data)
        fd, size = _open_source(obj.path, os.fstat(self.f.fileno()))
        with os.fdopen(fd, "rb") as src:
            _copy_exactly(src, self.f, size, os.fspath(obj.path))
        return size

    def delete(self, object_id: int, t: int, *, zero: bool, compact: bool) -> None:
        i = self.index(object_id)
        d = self.slots[i]
        if zero:
            self.f.seek(d.offset)
            for start in range(0, d.size, 1 << 20):
                self.f.write(bytes(min(1 << 20, d.size - start)))
        if _is_primary(d):
            self.hdr = self.hdr._replace(arch=_ARCH_UNKNOWN)
        self.slots[i] = RawDescriptor()
        self.hdr = self.hdr._replace(
            descriptors_free=self.hdr.descriptors_free + 1, modified=t
        )
        if compact:
            self.hdr = self.hdr._replace(data_size=self.data_end() - self.hdr.data_offset)
            self.f.truncate(self.data_end())

    def set_primary(self, object_id: int, t: int) -> None:
        i = self.index(object_id)
        d = self.slots[i]
        if d.datatype != sif.DATA_PARTITION:
            raise SifError(f"object {object_id} is not a partition")
        fstype, parttype, arch = sif.PARTITION_EXTRA.unpack_from(d.extra)
        if parttype == sif.PART_PRIMSYS:
            return
        if parttype != sif.PART_SYSTEM:
            raise SifError(f"object {object_id} is not a system partition")
        for j, old in enumerate(self.slots):
            if _is_primary(old):
                ofs, _, oarch = sif.PARTITION_EXTRA.unpack_from(old.extra)
                extra = sif.PARTITION_EXTRA.pack(ofs, sif.PART_SYSTEM, oarch)
                self.slots[j] = old._replace(extra=extra, modified=t)
        extra = sif.PARTITION_EXTRA.pack(fstype, sif.PART_PRIMSYS, arch)
        self.slots[i] = d._replace(extra=extra, modified=t)
        self.hdr = self.hdr._replace(arch=arch, modified=t)

    def flush(self) -> None:
        self.f.seek(self.hdr.descriptors_offset)
        self.f.write(b"".join(sif.DESCRIPTOR.pack(*d) for d in self.slots))
        self.f.seek(0)
        self.f.write(sif.HEADER.pack(*self.hdr))
        # The reference writes to a buffer that grows even on an empty write,
        # so a 0-slot table still makes the file reach DescriptorsOffset.
        table_end = self.hdr.descriptors_offset + self.hdr.descriptors_size
        if self.f.seek(0, os.SEEK_END) < table_end:
            self.f.truncate(table_end)


def _open_source(path: str | os.PathLike[str], target: os.stat_result) -> tuple[int, int]:
    """An open fd on an object's source and its size: a regular file, not the image itself.

    O_NONBLOCK, so that a FIFO is refused rather than waited on; the image
    as its own source would grow while it is read, for ever.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError) as e:
        raise ImageError(f"can't read {shown}: {getattr(e, 'strerror', None) or e}") from None
    info = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(info.st_mode):
        problem = f"can't add {shown}: not a regular file"
    elif (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):
        problem = f"can't add {shown} to itself"
    if problem:
        os.close(fd)
        raise ImageError(problem)
    return fd, info.st_size


def _copy_exactly(src: BinaryIO, out: BinaryIO, size: int, shown: str) -> None:
    """`size` bytes, the source's size when it was opened: a file that grows meanwhile adds nothing more."""
    left = size
    while left:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            raise ImageError(f"can't add {shown}: it shrank while it was read")
        out.write(chunk)
        left -= len(chunk)


def sif_mode() -> int:
    """0755 less the umask: a SIF is executable through its launch script, readable by whom the user lets read."""
    from singpy.host.hostfiles import current_umask

    return 0o755 & ~current_umask()


def _alignment(obj: SifObject) -> int:
    if obj.alignment is not None:
        return obj.alignment
    return PARTITION_ALIGNMENT if obj.datatype == sif.DATA_PARTITION else 0


def create_sif(
    out_path: str | os.PathLike[str],
    objects: list[SifObject],
    *,
    launch_script: str = LAUNCH_SCRIPT,
    id: uuid.UUID | None = None,  # noqa: A002 - the reference's name for it
    created: int | None = None,
    modified: int | None = None,
    deterministic: bool = False,
    capacity: int = DEFAULT_CAPACITY,
) -> None:
    """Write a new SIF holding `objects` (IDs 1, 2, ...) atomically, mode 0755 less the umask.

    Times are Unix seconds; by default "now", or Go's zero time (sif.ZERO_TIME) and a
    nil UUID when `deterministic`.  Objects take `created` unless they set a time.
    """
    script = launch_script.encode()
    if len(script) >= 32:
        raise SifError("launch script is too long (31 bytes at most)")
    if not 0 <= capacity <= sif.MAX_DESCRIPTORS:
        raise SifError(f"unsupported descriptor capacity: {capacity}")
    if created is None:
        created = sif.ZERO_TIME if deterministic else int(time.time())
    raw_id = id.bytes if id is not None else _NIL_ID if deterministic else uuid.uuid4().bytes
    table_size = capacity * sif.DESCRIPTOR.size
    hdr = RawHeader(
        script, sif.MAGIC, sif.VERSION, _ARCH_UNKNOWN, raw_id, created,
        created if modified is None else modified, capacity, capacity, DESCRIPTORS_OFFSET,
        table_size, DESCRIPTORS_OFFSET + table_size, 0,
    )

    def build(f: BinaryIO) -> None:
        image = _Image(f, hdr, [RawDescriptor()] * capacity)
        for obj in objects:
            image.add(obj, created)
        image.flush()

    _atomic_write(os.fspath(out_path), build)


def _atomic_write(out: str, build: Callable[[BinaryIO], None]) -> None:
    """A signal (SIGTERM, SIGHUP, SIGINT) removes the temporary file as an error does (Interrupted goes on up)."""
    directory, base = os.path.split(os.path.abspath(out))
    with _interruptible():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
        except OSError as e:
            raise ImageError(f"can't create SIF file {out}: {e.strerror}") from None
        try:
            with os.fdopen(fd, "w+b") as f:
                build(f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, sif_mode())
            os.replace(tmp, out)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise ImageError(f"can't write SIF file {out}: {e.strerror}") from None
            raise


def _edit(
    path: str | os.PathLike[str], when: int | None, edit: Callable[[_Image, int], None]
) -> None:
    """Apply one in-place edit; `when` defaults as in the reference (zero time stays).

    An error or a signal (SIGTERM, SIGHUP, SIGINT) before the table is
    written truncates the data written so far; the table and the header are
    then written with those signals held, so the image is the old or the new.
    """
    from singpy.image.tools import Interrupted

    hdr, slots, size = read_raw(path)
    if when is None:
        frozen = hdr.id == _NIL_ID and hdr.created == hdr.modified == sif.ZERO_TIME
        when = sif.ZERO_TIME if frozen else int(time.time())
    shown = os.fspath(path)
    image = None
    try:
        with _interruptible(), open(path, "r+b") as f:
            image = _Image(f, hdr, slots)
            try:
                edit(image, when)
            except BaseException:
                f.truncate(size)  # drop the data of an object that was not recorded
                raise
            _flush_held(image)
    except OSError as e:
        raise ImageError(f"can't write SIF file {shown}: {e.strerror}") from None
    except (ValueError, OverflowError) as e:  # an offset past what a file can have (a huge --alignment)
        raise ImageError(f"can't write SIF file {shown}: {e}") from None
    except Interrupted as e:
        after = image is not None and image.flushed  # the signal held during the flush arrives after it
        raise Interrupted(f"editing {shown} {e.message}" + (" after the edit was written" if after
                                                            else ": the image is as it was")) from None


def _interruptible() -> contextlib.AbstractContextManager[None]:
    """`tools.Interruptible()`, unless a caller's (a build's) is active already: leaving a nested one would re-arm
    the caller's handler, which a first signal had set aside so that a second cannot cut its clean-up short."""
    import signal

    from singpy.image import tools

    if signal.getsignal(signal.SIGTERM) is tools._raise_interrupted:
        return contextlib.nullcontext()
    return tools.Interruptible()


def _flush_held(image: _Image) -> None:
    """`image.flush()` with SIGTERM, SIGHUP and SIGINT held: half a table and an old header would disagree."""
    import signal

    held = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        image.flush()
        image.f.flush()
        image.flushed = True
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def add_object(path: str | os.PathLike[str], obj: SifObject, *, when: int | None = None) -> None:
    """Append one object to an existing image (like `siftool add`)."""

    def edit(image: _Image, t: int) -> None:
        image.add(obj, t)
        image.hdr = image.hdr._replace(modified=t)

    _edit(path, when, edit)


def delete_object(
    path: str | os.PathLike[str], object_id: int, *, zero: bool = False,
    compact: bool = False, when: int | None = None,
) -> None:
    """Free an object's slot; optionally zero its bytes and trim the file's tail."""
    _edit(path, when, lambda image, t: image.delete(object_id, t, zero=zero, compact=compact))


def set_primary_partition(
    path: str | os.PathLike[str], object_id: int, *, when: int | None = None
) -> None:
    """Make a system partition the primary one, demoting the previous primary."""
    _edit(path, when, lambda image, t: image.set_primary(object_id, t))


def _json_bytes(value: JsonInput) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _inspect_metadata(inspect: JsonInput | None, labels: JsonInput | None) -> bytes:
    """inspect-metadata.json, where Apptainer keeps labels (data.attributes.labels)."""
    if labels is None:
        return b"" if inspect is None else _json_bytes(inspect)
    try:
        doc: Any = {"data": {"attributes": {}}, "type": "container"}
        if inspect is not None:
            doc = json.loads(_json_bytes(inspect))
        doc.setdefault("data", {}).setdefault("attributes", {})["labels"] = json.loads(
            _json_bytes(labels)
        )
    except (ValueError, AttributeError, TypeError) as e:
        raise SifError(f"bad image metadata JSON: {e}") from None
    return _json_bytes(doc)


def build_sif_from_squashfs(
    out_path: str | os.PathLike[str],
    squashfs_path: str | os.PathLike[str],
    *,
    arch: str,
    deffile: bytes | str | None = None,
    labels_json: JsonInput | None = None,
    inspect_metadata: JsonInput | None = None,
    oci_config: JsonInput | None = None,
    deterministic: bool = False,
) -> None:
    """Write what `apptainer build` writes: deffile, JSON objects, rootfs; all group 1."""
    try:
        with open(squashfs_path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ImageError(f"can't read {os.fspath(squashfs_path)}: {e.strerror}") from None
    if magic != b"hsqs":
        raise SifError(f"not a squashfs image: {os.fspath(squashfs_path)}")
    objects = []
    if deffile is not None:
        data = deffile.encode() if isinstance(deffile, str) else deffile
        objects.append(SifObject(sif.DATA_DEFFILE, data))
    json_objects = {  # Apptainer adds the non-empty ones sorted by name
        "inspect-metadata.json": _inspect_metadata(inspect_metadata, labels_json),
        "oci-config.json": b"" if oci_config is None else _json_bytes(oci_config),
    }
    for name, data in sorted(json_objects.items()):
        if data:
            objects.append(SifObject(sif.DATA_GENERIC_JSON, data, name=name))
    objects.append(SifObject(
        sif.DATA_PARTITION, path=squashfs_path, fstype=sif.FS_SQUASHFS, parttype=sif.PART_PRIMSYS, arch=arch,
    ))
    create_sif(out_path, objects, deterministic=deterministic)


def append_partition(path: str | os.PathLike[str], obj: SifObject) -> None:
    """`add_object` for a partition streamed from a file (an overlay), durable in that order.

    The data goes past the current end of the image and reaches the disk
    before the descriptor and the header that point at it are written: a
    crash in between leaves the image as it was, plus unused bytes at its
    end. Any error or signal before that truncates them away (`_edit`).
    """

    def edit(image: _Image, t: int) -> None:
        image.add(obj, t)
        image.f.flush()
        os.fsync(image.f.fileno())
        image.hdr = image.hdr._replace(modified=t)

    _edit(path, None, edit)

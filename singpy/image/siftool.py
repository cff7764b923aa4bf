"""`singpy sif`: Apptainer's `sif` command (the reference siftool's), as text and data.

The output formats are siftool's (Apptainer 1.5 embeds it as `apptainer sif`):
`header` and `info` are Go tabwriter tables (padding 1 and 2), `list` a
fixed-width table, sizes in Go's "27 KiB", times as Go prints a UTC time,
and a field the file leaves at its zero value (no launch script, a nil ID,
Go's zero time, no name) is left out. Every string comes from the file, so
each cell is escaped for the terminal (singpy.console.escape).

`add_options` turns siftool add's numbered flags into a SifObject for
singpy.image.sifwrite, with siftool's rules (each flag a partition or
signature needs, the ranges it accepts) and its error wording.
"""

from __future__ import annotations

import struct
import time

from singpy.console import escape
from singpy.constants import ARCHES
from singpy.errors import UsageError
from singpy.image import sif
from singpy.image.sif import Descriptor, SifImage
from singpy.image.sifwrite import SifObject

_RULE = "-" * 78
# Go's crypto.Hash names of the hash codes a signature stores (sif's HashSHA256 = 1, ...)
HASH_NAMES = {1: "SHA-256", 2: "SHA-384", 3: "SHA-512", 4: "BLAKE2s-256", 5: "BLAKE2b-256"}
CRYPTO_FORMATS = {1: "OpenPGP", 2: "PEM"}
CRYPTO_MESSAGES = {0x100: "Clear Signature", 0x200: "RSA-OAEP"}
SBOM_FORMATS = ("cyclonedx-json", "cyclonedx-xml", "github-json", "spdx-json", "spdx-rdf", "spdx-tag-value",
                "spdx-yaml", "syft-json")  # stored as 1, 2, ...
_INT = struct.Struct("<i")
MAX_ALIGNMENT = 1 << 30  # siftool takes any int64; past 1 GiB an object would start beyond any file size (ValueError)
_CRYPTO = struct.Struct("<ii")


def readable_size(size: int) -> str:
    """Go siftool's readableSize: "710 B", "27 KiB", "790 KiB" (rounded half away from zero)."""
    if -1024 < size < 1024:
        return f"{size} B"
    divisor, exponent, count = 1024, 0, int(size / 1024)
    while count <= -1024 or count >= 1024:
        divisor *= 1024
        exponent += 1
        count = int(count / 1024)
    value = size / divisor
    rounded = int(abs(value) + 0.5) * (1 if value >= 0 else -1)
    return f"{rounded} {'KMGTPE'[exponent]}iB"


def go_time(seconds: int) -> str:
    """A SIF time as Go prints time.Time.UTC(): "2021-08-02 21:41:28 +0000 UTC"."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):  # far outside what a SIF writer stores: the raw number
        return str(seconds)


def _table(rows: list[tuple[str, str]], *, padding: int, indent: str = "") -> str:
    """Go's tabwriter for `label:\\tvalue` lines: the label column as wide as its longest cell plus `padding`."""
    width = max((len(label) for label, _ in rows), default=0) + padding
    return "".join(f"{indent}{label.ljust(width)}{value}\n" for label, value in rows)


def header_text(image: SifImage) -> str:
    rows = []
    if image.launch_script:
        rows.append(("Launch Script:", escape(image.launch_script.removesuffix("\n"))))
    rows.append(("Version:", escape(image.version)))
    if image.arch != "unknown":
        rows.append(("Primary Architecture:", escape(image.arch)))
    if image.uuid != "00000000-0000-0000-0000-000000000000":
        rows.append(("ID:", image.uuid))
    if image.created != sif.ZERO_TIME:
        rows.append(("Created At:", go_time(image.created)))
    if image.modified != sif.ZERO_TIME:
        rows.append(("Modified At:", go_time(image.modified)))
    rows += [("Descriptors Free:", str(image.descriptors_free)),
             ("Descriptors Total:", str(image.descriptors_total)),
             ("Descriptors Offset:", str(image.descriptors_offset)),
             ("Descriptors Size:", readable_size(image.descriptors_size)),
             ("Data Offset:", str(image.data_offset)),
             ("Data Size:", readable_size(image.data_size))]
    return _table(rows, padding=1)


def list_text(image: SifImage) -> str:
    lines = [_RULE, f"{'ID':<4} {'|GROUP':<8} {'|LINK':<8} {'|SIF POSITION (start-end)':<26} |TYPE", _RULE]
    for desc in image.descriptors:
        group = f"|{'NONE':<7} " if not desc.group_id else f"|{desc.group_id:<7} "
        if not desc.link:
            link = f"|{'NONE':<7} "
        elif desc.link_is_group:
            link = f"|{desc.link:<3} (G) "
        else:
            link = f"|{desc.link:<7} "
        position = f"|{desc.offset}-{desc.offset + desc.size} "
        lines.append(f"{desc.id:<4} {group}{link}{position:<26} |{escape(type_text(desc))}")
    return "\n".join(lines) + "\n"


def type_text(desc: Descriptor) -> str:
    """The TYPE cell of `list`: the type and, for some, its metadata in parentheses."""
    name = desc.type_name
    if desc.datatype == sif.DATA_PARTITION:
        return f"{name} ({desc.fstype_name}/{desc.parttype_name}/{desc.arch})"
    if desc.datatype == sif.DATA_SIGNATURE:
        return f"{name} ({_hash_name(desc)})"
    if desc.datatype == sif.DATA_CRYPTO_MESSAGE:
        form, message = _crypto(desc)
        return f"{name} ({form}/{message})"
    if desc.datatype == sif.DATA_SBOM:
        return f"{name} ({_sbom_format(desc)})"
    return name


def info_text(desc: Descriptor) -> str:
    link = f"{desc.link} (G)" if desc.link_is_group else str(desc.link or "NONE")
    rows = [("Data Type:", desc.type_name), ("ID:", str(desc.id)), ("Group ID:", str(desc.group_id or "NONE")),
            ("Linked ID:", link), ("Offset:", str(desc.offset)), ("Size:", str(desc.size))]
    if desc.created != sif.ZERO_TIME:
        rows.append(("Created At:", go_time(desc.created)))
    if desc.modified != sif.ZERO_TIME:
        rows.append(("Modified At:", go_time(desc.modified)))
    if desc.name:
        rows.append(("Name:", escape(desc.name)))
    rows += _metadata_rows(desc)
    return _table(rows, padding=2, indent="  ")


def _metadata_rows(desc: Descriptor) -> list[tuple[str, str]]:
    if desc.datatype == sif.DATA_PARTITION:
        return [("Filesystem Type:", desc.fstype_name), ("Partition Type:", desc.parttype_name),
                ("Architecture:", escape(desc.arch))]
    if desc.datatype == sif.DATA_SIGNATURE:
        entity = desc.extra[4:24]
        rows = [("Hash Type:", _hash_name(desc))]
        return rows + [("Entity:", entity.hex().upper())] if any(entity) else rows
    if desc.datatype == sif.DATA_CRYPTO_MESSAGE:
        form, message = _crypto(desc)
        return [("Format Type:", form), ("Message Type:", message)]
    if desc.datatype == sif.DATA_SBOM:
        return [("Format:", _sbom_format(desc))]
    if desc.datatype in (sif.DATA_OCI_BLOB, sif.DATA_OCI_ROOT_INDEX):
        return [("Digest:", escape(desc.extra.split(b"\0", 1)[0].decode(errors="replace")))]
    return []


def _hash_name(desc: Descriptor) -> str:
    return HASH_NAMES.get(_INT.unpack_from(desc.extra)[0], "Unknown")


def _crypto(desc: Descriptor) -> tuple[str, str]:
    form, message = _CRYPTO.unpack_from(desc.extra)
    return CRYPTO_FORMATS.get(form, "Unknown"), CRYPTO_MESSAGES.get(message, "Unknown")


def _sbom_format(desc: Descriptor) -> str:
    code = _INT.unpack_from(desc.extra)[0]
    return SBOM_FORMATS[code - 1] if 0 < code <= len(SBOM_FORMATS) else "unknown"


def find_descriptor(image: SifImage, object_id: int) -> Descriptor:
    for desc in image.descriptors:
        if desc.id == object_id:
            return desc
    from singpy.errors import SifError

    raise SifError(f"{image.path}: object {object_id} not found")


class AddFlags:
    """siftool add's flags as given (0: not given, as its defaults)."""

    def __init__(self, *, datatype: int, parttype: int = 0, partfs: int = 0, partarch: int = 0, signhash: int = 0,
                 signentity: str = "", sbomformat: str = "", groupid: int = 0, link: int = 0, alignment: int = 0,
                 filename: str = "") -> None:
        self.datatype, self.parttype, self.partfs, self.partarch = datatype, parttype, partfs, partarch
        self.signhash, self.signentity, self.sbomformat = signhash, signentity, sbomformat
        self.groupid, self.link, self.alignment, self.filename = groupid, link, alignment, filename


def add_options(flags: AddFlags, source: str) -> SifObject:
    """The object `siftool add` would add from `source` with these flags (its checks, its messages)."""
    if not 1 <= flags.datatype <= 9:
        raise UsageError("--datatype flag is required with a valid range (1 to 9)")
    datatype = sif.DATA_DEFFILE + flags.datatype - 1
    partition = {}
    extra = b""
    if datatype == sif.DATA_PARTITION:
        if not (flags.partfs and flags.parttype and flags.partarch):
            raise UsageError("with partition datatype, --partfs, --parttype and --partarch must be passed")
        if not 0 < flags.partarch < len(ARCHES) - 1:  # siftool's 1-386 ... 12-riscv64
            raise UsageError(f"unknown --partarch {flags.partarch}: 1-386 ... 12-riscv64")
        partition = {"fstype": flags.partfs, "parttype": flags.parttype, "arch": ARCHES[flags.partarch]}
    elif datatype == sif.DATA_SIGNATURE:
        extra = _signature_extra(flags)
    elif datatype == sif.DATA_SBOM:
        if flags.sbomformat not in SBOM_FORMATS:
            raise UsageError("with SBOM datatype, --sbomformat must be passed: one of " + ", ".join(SBOM_FORMATS))
        extra = _INT.pack(SBOM_FORMATS.index(flags.sbomformat) + 1)
    elif datatype == sif.DATA_CRYPTO_MESSAGE:
        extra = _CRYPTO.pack(0, 0)
    for name, value in (("--groupid", flags.groupid), ("--link", flags.link)):
        if not 0 <= value <= sif.ID_MASK:
            raise UsageError(f"{name} {value} is out of range (0 to {sif.ID_MASK})")
    if not 0 <= flags.alignment <= MAX_ALIGNMENT:
        raise UsageError(f"--alignment {flags.alignment} is out of range (0 to {MAX_ALIGNMENT})")
    # siftool's help says the name defaults to the input's, but it stores none unless --filename is given
    return SifObject(datatype=datatype, path=source, name=flags.filename,
                     group=flags.groupid, link=flags.link, extra=extra,
                     alignment=flags.alignment or None, **partition)  # type: ignore[arg-type]


def _signature_extra(flags: AddFlags) -> bytes:
    if flags.signhash not in HASH_NAMES or not flags.signentity:
        raise UsageError("with signature datatype, --signhash (1 to 5) and --signentity must be passed")
    try:
        entity = bytes.fromhex(flags.signentity)
    except ValueError:
        raise UsageError(f"--signentity {flags.signentity!r} is not a hexadecimal fingerprint") from None
    if len(entity) > 20:
        raise UsageError("--signentity is longer than a 20-byte fingerprint")
    return _INT.pack(flags.signhash) + entity.ljust(20, b"\0")

"""The SIF side of signatures: what is signed, where signatures live, as the apptainer/sif `integrity` package.

A signature object (type Signature, in no group) is linked to the object group it covers.
Its payload signs the JSON *image metadata*::

    {"version":1,"header":{"digest":"sha256:…"},
     "objects":[{"relativeId":0,"descriptorDigest":"sha256:…","objectDigest":"sha256:…"}, …]}

The header digest covers the launch script, magic, version and UUID; a descriptor digest
covers the descriptor fields that cannot move (not its offset nor its group), with the
object's ID relative to the smallest ID of its group, so that objects can be moved and
re-numbered without breaking a signature. Legacy (pre-2020) signatures instead sign
`SIFHASH:\\n<hex>`, the digest of one object's data or a group's data back to back, and
are linked to that object or group: they do not cover descriptors, hence `--legacy-insecure`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import NamedTuple

from singpy.errors import SingpyError
from singpy.image import sif

DATA_SIGNATURE = 0x4005
SIGNATURE_EXTRA = struct.Struct("<i20s")  # hash type, then the OpenPGP fingerprint (zero: none)
# The descriptor's hash type codes (sif's hashType) and the digest names of the metadata JSON.
HASH_TYPES = {1: "sha256", 2: "sha384", 3: "sha512"}
DIGEST_NAMES = ("sha224", "sha256", "sha384", "sha512", "sha512_224", "sha512_256")
_INTEGRITY_FIELDS = struct.Struct("<i?IIqqqq")  # type, used, relative ID, link, size, created, uid, gid
_CHUNK = 1 << 20


class IntegrityError(SingpyError):
    """An image, a signature or its metadata does not match: the image was altered or is not what was signed."""

    def __init__(self, message: str, *, object_id: int = 0) -> None:
        super().__init__(message)
        self.object_id = object_id  # the data object whose bytes differ (0: not one object)


class SifObjects(NamedTuple):
    """An image's header and used descriptors, as stored (groups and links with their mask bits)."""

    path: str
    header: sif.RawHeader
    used: tuple[sif.RawDescriptor, ...]

    def group_of(self, raw: sif.RawDescriptor) -> int:
        return raw.group_id & sif.ID_MASK

    def group_ids(self) -> list[int]:
        return sorted({g for g in (self.group_of(d) for d in self.used) if g})

    def group_objects(self, group: int) -> list[sif.RawDescriptor]:
        objects = [d for d in self.used if self.group_of(d) == group]
        if not objects:
            raise SingpyError(f"integrity: group not found: {group}")
        return objects

    def by_id(self, object_id: int) -> sif.RawDescriptor:
        for d in self.used:
            if d.id == object_id:
                return d
        raise SingpyError(f"integrity: object not found: {object_id}")

    def min_id(self, raw_group: int) -> int:
        """The smallest object ID of a stored group (no group counts as one): relative IDs start there."""
        return min(d.id for d in self.used if d.group_id == raw_group)

    def signatures_of_group(self, group: int) -> list[sif.RawDescriptor]:
        link = group | sif.GROUP_MASK
        return [d for d in self.used if d.datatype == DATA_SIGNATURE and d.link == link]

    def signatures_of_object(self, object_id: int) -> list[sif.RawDescriptor]:
        return [d for d in self.used if d.datatype == DATA_SIGNATURE and d.link == object_id]

    def read(self, raw: sif.RawDescriptor, *, limit: int = 1 << 20) -> bytes:
        """A (signature) object's bytes; signatures are small, a huge one is refused, never read whole."""
        if raw.size > limit:
            raise IntegrityError(f"integrity: signature object {raw.id} is too large ({raw.size} bytes)")
        with open(self.path, "rb") as f:
            f.seek(raw.offset)
            return f.read(raw.size)

    def digest_data(self, objects: list[sif.RawDescriptor], algorithm: str) -> bytes:
        """The digest of objects' data back to back, read in chunks (partitions are large)."""
        h = hashlib.new(algorithm)
        with open(self.path, "rb") as f:
            for raw in objects:
                f.seek(raw.offset)
                left = raw.size
                while left:
                    chunk = f.read(min(left, _CHUNK))
                    if not chunk:
                        raise IntegrityError(f"integrity: object {raw.id} is truncated")
                    h.update(chunk)
                    left -= len(chunk)
        return h.digest()


def load(path: str) -> SifObjects:
    header, slots, _size = sif.read_raw(path)
    return SifObjects(path, header, tuple(d for d in slots if d.used))


def signature_metadata(raw: sif.RawDescriptor) -> tuple[str, bytes]:
    """(hash algorithm, fingerprint or b"") stored in a signature's descriptor."""
    hash_type, fingerprint = SIGNATURE_EXTRA.unpack_from(raw.extra.ljust(SIGNATURE_EXTRA.size, b"\0"))
    if hash_type not in HASH_TYPES:
        raise IntegrityError(f"integrity: signature object {raw.id}: hash algorithm unsupported")
    return HASH_TYPES[hash_type], b"" if fingerprint == bytes(20) else fingerprint


def signature_extra(hash_type: int, fingerprint: bytes = b"") -> bytes:
    return SIGNATURE_EXTRA.pack(hash_type, fingerprint)


def header_bytes(header: sif.RawHeader) -> bytes:
    return header.launch_script + header.magic + header.version + header.id


def descriptor_bytes(raw: sif.RawDescriptor, min_id: int) -> bytes:
    fields = _INTEGRITY_FIELDS.pack(raw.datatype, raw.used, raw.id - min_id, raw.link, raw.size, raw.created,
                                    raw.uid, raw.gid)
    return fields + raw.name + raw.extra


def _digest(algorithm: str, value: bytes) -> str:
    return f"{algorithm}:{value.hex()}"


def image_metadata(image: SifObjects, group: int, objects: list[sif.RawDescriptor], algorithm: str = "sha256") -> bytes:
    """The JSON a signature signs, byte for byte as Go's json.Marshal writes it (compact, in field order)."""
    min_id = image.min_id(group | sif.GROUP_MASK)
    entries = [{
        "relativeId": raw.id - min_id,
        "descriptorDigest": _digest(algorithm, hashlib.new(algorithm, descriptor_bytes(raw, min_id)).digest()),
        "objectDigest": _digest(algorithm, image.digest_data([raw], algorithm)),
    } for raw in objects]
    header = _digest(algorithm, hashlib.new(algorithm, header_bytes(image.header)).digest())
    document = {"version": 1, "header": {"digest": header}, "objects": entries}
    return json.dumps(document, separators=(",", ":")).encode()


def _parse_digest(value: object) -> tuple[str, bytes]:
    if not isinstance(value, str) or value.count(":") != 1:
        raise IntegrityError("integrity: digest malformed")
    name, hexvalue = value.split(":")
    if name not in DIGEST_NAMES:
        raise IntegrityError("integrity: hash algorithm unsupported")
    try:
        digest = bytes.fromhex(hexvalue)
    except ValueError:
        raise IntegrityError("integrity: digest malformed") from None
    if len(digest) != hashlib.new(name).digest_size:
        raise IntegrityError("integrity: digest malformed")
    return name, digest


def check_metadata(image: SifObjects, group: int, objects: list[sif.RawDescriptor], plaintext: bytes,
                   *, subset: bool) -> list[sif.RawDescriptor]:
    """Check the signed metadata against the image; the objects verified, or IntegrityError naming what differs."""
    try:
        document = json.loads(plaintext)
        signed = {int(o["relativeId"]): o for o in document["objects"] if isinstance(o, dict)}
        header_digest = document["header"]["digest"]
        if len(signed) != len(document["objects"]):
            raise ValueError("an entry is not an object")
    except (ValueError, TypeError, KeyError, RecursionError):
        raise IntegrityError("integrity: signed metadata malformed") from None
    min_id = image.min_id(group | sif.GROUP_MASK)
    if not subset:
        present = {raw.id - min_id for raw in objects}
        for rid in sorted(set(signed) ^ present):
            reason = "object not signed" if rid in present else "signed object not found"
            raise IntegrityError(f"integrity: object {rid + min_id}: {reason}")
    name, value = _parse_digest(header_digest)
    if hashlib.new(name, header_bytes(image.header)).digest() != value:
        raise IntegrityError("integrity: header integrity compromised")
    verified = []
    for raw in objects:
        entry = signed.get(raw.id - min_id)
        if entry is None:
            raise IntegrityError(f"integrity: object {raw.id}: object not signed")
        name, value = _parse_digest(entry.get("descriptorDigest"))
        if hashlib.new(name, descriptor_bytes(raw, min_id)).digest() != value:
            raise IntegrityError(f"integrity: data object descriptor integrity compromised: {raw.id}", object_id=raw.id)
        name, value = _parse_digest(entry.get("objectDigest"))
        if image.digest_data([raw], name) != value:
            raise IntegrityError(f"integrity: data object integrity compromised: {raw.id}", object_id=raw.id)
        verified.append(raw)
    return verified


def check_legacy(image: SifObjects, objects: list[sif.RawDescriptor], plaintext: bytes, algorithm: str) -> None:
    """A legacy `SIFHASH:` signature: the digest of the objects' data back to back."""
    text = plaintext.removeprefix(b"SIFHASH:\n").removesuffix(b"\n")
    try:
        value = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise IntegrityError("integrity: digest malformed") from None
    if image.digest_data(objects, algorithm) != value:
        which = f": {objects[0].id}" if len(objects) == 1 else ""
        raise IntegrityError(f"integrity: data object integrity compromised{which}",
                             object_id=objects[0].id if len(objects) == 1 else 0)

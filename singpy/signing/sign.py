"""Signing a SIF, as Apptainer's `sign` (apptainer/sif `integrity.Signer`): one signature object per group.

By default every object group is signed; `--group-id` signs one group, `--sif-id` one object
(the signature then covers that object alone, linked to its group). Each signature is a new
Signature object, in no group, linked to the group, its descriptor naming the hash (SHA-256)
and, for OpenPGP, the key's fingerprint. The image is checked whole before anything is written,
and each object is appended by sifwrite (which restores the file if a write fails).
"""

from __future__ import annotations

from collections.abc import Callable

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.image.sif import RawDescriptor
    from singpy.signing.sifsig import SifObjects

SHA256 = 1  # the descriptor's hash type code


def _selection(image: SifObjects, groups: list[int], object_ids: list[int]) -> list[tuple[int, list[RawDescriptor]]]:
    """(group, objects) pairs to sign: the objects asked for, grouped, else whole groups."""
    chosen: dict[int, list[RawDescriptor]] = {}
    for group in groups:
        chosen[group] = image.group_objects(group)
    for object_id in object_ids:
        raw = image.by_id(object_id)
        group = image.group_of(raw)
        if not group:
            raise SingpyError(f"integrity: object {object_id} is not in an object group")
        chosen.setdefault(group, []).append(raw)
    if not chosen:
        ids = image.group_ids()
        if not ids:
            raise SingpyError("integrity: no groups found")
        chosen = {g: image.group_objects(g) for g in ids}
    return sorted(chosen.items())


def sign_image(path: str, sign_message: Callable[[bytes], bytes], *, fingerprint: bytes = b"",
               groups: list[int] | None = None, objects: list[int] | None = None) -> list[int]:
    """Add a signature per selected group, made by `sign_message` (metadata JSON → signature object bytes).

    Every message is made before the first object is written, so a failing key leaves the image as it was.
    Returns the groups signed.
    """
    from singpy.image import sif, sifwrite
    from singpy.signing import sifsig

    image = sifsig.load(path)
    selection = _selection(image, list(groups or ()), list(objects or ()))
    signed = [(group, sign_message(sifsig.image_metadata(image, group, chosen))) for group, chosen in selection]
    for group, message in signed:
        sifwrite.add_object(path, sifwrite.SifObject(
            datatype=sif.DATA_SIGNATURE, data=message, group=0, link=group, link_is_group=True,
            extra=sifsig.signature_extra(SHA256, fingerprint)))
    return [group for group, _ in signed]

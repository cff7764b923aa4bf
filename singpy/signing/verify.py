"""Verifying a SIF's signatures, as Apptainer's `verify` (apptainer/sif `integrity.Verifier`).

What is checked is a list of tasks: by default every object group, each against the signatures
linked to it; `--group-id` one group; `--sif-id` one object (against its group's signatures);
with `--legacy-insecure` the legacy signatures of the primary partition (or of every object,
with `--all`). Every signature of a task must verify, with the key material given: OpenPGP
keyrings (clear-signed metadata; pgp.py), or public keys / a certificate (DSSE; dsse.py).
Each signature's outcome (`SignatureResult`) goes to a callback as it is checked (the command
prints it), and the first failure stops the verification, as in Apptainer.

`signer_fingerprints` is the question the execution control list and `Fingerprints:` ask:
which keys of the user's and the global keyring signed every signed group of this image.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from pysequoia import Cert

    from singpy.image.sif import RawDescriptor
    from singpy.signing import pgp
    from singpy.signing.dsse import PublicKey
    from singpy.signing.sifsig import SifObjects


class SignatureNotFoundError(SingpyError):
    """The image (or the group or object asked for) carries no signature."""


class UnknownSignerError(SingpyError):
    """A signature made by a key that is not in the keyrings (Apptainer: "unknown entity")."""

    keyid = ""  # the issuer key ID the signature names (16 hex digits), "" if not known


class Signer(NamedTuple):
    """Who signed: an OpenPGP key (fingerprint, user ID, keyring) or a key / certificate (DSSE)."""

    kind: str  # "pgp", "key" or "certificate"
    fingerprint: str  # OpenPGP fingerprint, uppercase hex; for DSSE the key ID "SHA256:…"
    name: str  # OpenPGP user ID; for DSSE the key file or the certificate chain
    keyring: str = ""  # "GLOBAL", "LOCAL" or "" (OpenPGP)


class SignatureResult(NamedTuple):
    signature: RawDescriptor
    signer: Signer | None  # None: the signer is not known (no key given verifies it)
    claimed_fingerprint: str  # the fingerprint the signature's descriptor names ("" for DSSE)
    verified: tuple[RawDescriptor, ...]
    error: SingpyError | None


class KeyMaterial(NamedTuple):
    """What signatures are checked against: OpenPGP certificates and/or public keys (DSSE)."""

    local_certs: tuple[Cert, ...] | None = None  # None: no OpenPGP material at all
    global_certs: tuple[Cert, ...] = ()
    keys: tuple[PublicKey, ...] | None = None  # None: no DSSE material
    key_kind: str = "key"  # "key" or "certificate"
    key_label: str = ""  # for a certificate: its chain, subject first
    # `verify` without --local: asked for a fingerprint or key ID no keyring holds, the certificates a keyserver
    # gives for it (Apptainer's hybrid keyring; used for this verification only, never imported)
    fetch: Callable[[str], tuple[Cert, ...]] | None = None


def pgp_material(config_dir: str | None = None) -> KeyMaterial:
    """The user's public keyring and the global one beside the configuration."""
    from singpy.signing import keyring

    return KeyMaterial(local_certs=tuple(keyring.public_certs()), global_certs=tuple(keyring.global_certs(config_dir)))


class _Task(NamedTuple):
    group: int  # the group whose objects are checked (legacy object tasks: 0)
    objects: list[RawDescriptor]
    signatures: list[RawDescriptor]
    subset: bool  # the objects are a part of what the signatures cover (--sif-id)
    legacy: bool


def _signature_missing(what: str) -> SignatureNotFoundError:
    return SignatureNotFoundError(f"integrity: signature not found for {what}")


def _is_legacy(image: SifObjects, sig: RawDescriptor) -> bool:
    from singpy.signing.pgp import is_clearsigned

    data = image.read(sig)
    if not is_clearsigned(data):
        return False
    body = data.split(b"\n\n", 1)[-1] if b"\n\n" in data else data.split(b"\r\n\r\n", 1)[-1]
    return body.lstrip(b"- ").startswith(b"SIFHASH:")


def _group_task(image: SifObjects, group: int, objects: list[RawDescriptor] | None, legacy: bool) -> _Task:
    sigs = [s for s in image.signatures_of_group(group) if _is_legacy(image, s) == legacy]
    if not sigs:
        raise _signature_missing(f"object group {group}")
    chosen = objects if objects is not None else image.group_objects(group)
    return _Task(group, chosen, sigs, objects is not None, legacy)


def _tasks(image: SifObjects, groups: list[int], object_ids: list[int], legacy: bool,
           all_objects: bool) -> list[_Task]:
    from singpy.image import sif

    if legacy and all_objects:
        grouped = {d.id for d in image.used if d.datatype != sif.DATA_SIGNATURE and image.group_of(d)}
        object_ids = sorted(grouped | set(object_ids))
    elif legacy and not groups and not object_ids:
        primary = [d for d in image.used if d.datatype == sif.DATA_PARTITION
                   and sif.PARTITION_EXTRA.unpack_from(d.extra)[1] == sif.PART_PRIMSYS]
        if not primary:
            raise SingpyError("integrity: no primary system partition to verify")
        if len(primary) > 1:  # which one counts would hang on slot order alone (Apptainer: multiple objects found)
            raise SingpyError(f"integrity: multiple primary system partitions (objects "
                              f"{', '.join(str(d.id) for d in primary)})")
        object_ids = [primary[0].id]
    if not groups and not object_ids:
        groups = image.group_ids()
        if not groups:
            raise SingpyError("integrity: no groups found")
    tasks = [_group_task(image, g, None, legacy) for g in groups]
    for object_id in object_ids:
        raw = image.by_id(object_id)
        if legacy:
            sigs = image.signatures_of_object(object_id)
            if not sigs:
                raise _signature_missing(f"object {object_id}")
            tasks.append(_Task(0, [raw], sigs, False, True))
        else:
            tasks.append(_group_task(image, image.group_of(raw), [raw], False))
    return tasks


def _pgp_signer(material: KeyMaterial, fingerprint: str, fetched: tuple[Cert, ...] = ()) -> Signer:
    """Who signed, and where the key was: the global keyring, the user's, else a keyserver ("": REMOTE)."""
    from singpy.signing import keyring

    for where, certs in (("GLOBAL", material.global_certs), ("LOCAL", material.local_certs or ()), ("", fetched)):
        for cert in certs:
            if keyring.fingerprint(cert) == fingerprint:
                return Signer("pgp", fingerprint, keyring.primary_name(cert), where)
    return Signer("pgp", fingerprint, "", "")


def _gpgv(data: bytes, sig: RawDescriptor, certs: list[Cert]) -> pgp.PgpResult:
    """pgp.verify_clearsigned, its failures as this module's: an unknown signer, else an integrity error."""
    from singpy.signing import pgp
    from singpy.signing.sifsig import IntegrityError

    try:
        return pgp.verify_clearsigned(data, certs)
    except pgp.UnknownSignerError as e:
        unknown = UnknownSignerError(f"integrity: signature object {sig.id} not valid: {e.message}")
        unknown.keyid = e.keyid
        raise unknown from None
    except pgp.PgpError as e:
        raise IntegrityError(f"integrity: signature object {sig.id} not valid: {e.message}") from None


def _open_pgp(data: bytes, sig: RawDescriptor, claimed: str, material: KeyMaterial) -> tuple[bytes, Signer]:
    from singpy.signing.sifsig import IntegrityError

    if material.local_certs is None:
        raise SingpyError("integrity: key material not provided for PGP clear-sign signature")
    certs = [*material.global_certs, *material.local_certs]
    fetched: tuple[Cert, ...] = ()
    try:
        result = _gpgv(data, sig, certs)
    except UnknownSignerError as unknown:
        # the keyrings lack the signer: the keyserver is asked for the fingerprint the descriptor names (else the
        # signature's key ID); what it gives is only a candidate, which gpgv checks as any other key
        fetched = material.fetch(claimed or unknown.keyid) if material.fetch and (claimed or unknown.keyid) else ()
        if not fetched:
            raise
        result = _gpgv(data, sig, [*certs, *fetched])
    if claimed and result.fingerprint != claimed:
        raise IntegrityError("integrity: fingerprint in descriptor does not correspond to signing entity")
    return result.plaintext, _pgp_signer(material, result.fingerprint, fetched)


def _open_dsse(data: bytes, sig: RawDescriptor, hash_name: str, material: KeyMaterial) -> tuple[bytes, Signer]:
    from singpy.signing import dsse
    from singpy.signing.sifsig import IntegrityError

    if material.keys is None:
        raise SingpyError("integrity: key material not provided for DSSE envelope signature")
    try:
        payload, accepted = dsse.verify_envelope(data, list(material.keys), hash_name)
    except dsse.DsseError as e:
        raise IntegrityError(f"integrity: signature object {sig.id} not valid: {e.message}") from None
    key = accepted[0]
    name = material.key_label or f"{key.origin} ({key.kind})"
    return payload, Signer(material.key_kind, key.keyid, name)


def _check(image: SifObjects, task: _Task, sig: RawDescriptor, material: KeyMaterial) -> SignatureResult:
    from singpy.signing import dsse, pgp, sifsig

    hash_name, fp = sifsig.signature_metadata(sig)
    claimed = fp.hex().upper()
    data = image.read(sig)
    signer: Signer | None = None
    verified: list[RawDescriptor] = []
    try:
        if dsse.is_envelope(data):
            plaintext, signer = _open_dsse(data, sig, hash_name, material)
        elif pgp.is_clearsigned(data):
            plaintext, signer = _open_pgp(data, sig, claimed, material)
        else:
            raise sifsig.IntegrityError("integrity: signature format not recognized")
        if task.legacy:
            sifsig.check_legacy(image, task.objects, plaintext, hash_name)
            verified = task.objects
        else:
            verified = sifsig.check_metadata(image, task.group, task.objects, plaintext, subset=task.subset)
    except SingpyError as e:
        return SignatureResult(sig, signer, claimed, tuple(verified), e)
    return SignatureResult(sig, signer, claimed, tuple(verified), None)


def verify(path: str, material: KeyMaterial, *, groups: list[int] | None = None, objects: list[int] | None = None,
           legacy: bool = False, all_objects: bool = False,
           on_result: Callable[[SignatureResult], None] | None = None) -> list[SignatureResult]:
    """Verify every signature the options select; the results, or the first failure raised (after on_result)."""
    from singpy.signing import sifsig

    image = sifsig.load(path)
    _refuse_ungrouped(image)
    results = []
    for task in _tasks(image, list(groups or ()), list(objects or ()), legacy, all_objects):
        for sig in task.signatures:
            result = _check(image, task, sig, material)
            if on_result is not None:
                on_result(result)
            if result.error is not None:
                raise result.error
            results.append(result)
    return results


def _refuse_ungrouped(image: SifObjects) -> None:
    """As sif's Verifier (errNonGroupedObject): an object outside every group is signed by nobody."""
    from singpy.signing import sifsig

    if any(not image.group_of(d) and d.datatype != sifsig.DATA_SIGNATURE for d in image.used):
        raise sifsig.IntegrityError("integrity: non-signature object not associated with object group")


def signer_fingerprints(path: str, *, legacy: bool = False, config_dir: str | None = None,
                        global_only: bool = False) -> list[str]:
    """Uppercase fingerprints of the keyring keys (user's and global; `global_only`: the global one alone, as
    Apptainer's ECL) whose signatures verify over every signed group of the image (or, legacy, its primary
    partition). Unsigned: []. Signers not in the keyrings and DSSE signatures are not counted. A signature that is
    present but does not verify (a tampered image, descriptor or signature) raises a SingpyError
    (sifsig.IntegrityError)."""
    from singpy.signing import sifsig
    from singpy.signing.pgp import is_clearsigned

    if global_only:  # the ECL's question: the keyring beside ecl.toml, as ecl.toml itself only if root's
        from singpy.signing import keyring

        material = KeyMaterial(local_certs=(), global_certs=tuple(keyring.global_certs(config_dir, roots_only=True)))
    else:
        material = pgp_material(config_dir)
    image = sifsig.load(path)
    try:
        tasks = _tasks(image, [], [], legacy, False)
    except SignatureNotFoundError:
        return []
    except SingpyError:
        if not image.group_ids():
            return []
        raise
    _refuse_ungrouped(image)  # no signature covers it, and the launch may run it (the first system partition)
    signed_by: list[set[str]] = []
    for task in tasks:
        good: set[str] = set()
        for sig in task.signatures:
            if not is_clearsigned(image.read(sig)):
                continue  # DSSE: no fingerprint to name
            result = _check(image, task, sig, material)
            if isinstance(result.error, UnknownSignerError):
                continue
            if result.error is not None:
                raise result.error
            if result.signer is not None and result.signer.keyring:
                good.add(result.signer.fingerprint)
        signed_by.append(good)
    return sorted(set.intersection(*signed_by)) if signed_by else []

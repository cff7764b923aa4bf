"""Key-based signatures: DSSE envelopes (ECDSA, RSA, Ed25519) and X.509 certificate chains, on `cryptography`.

An envelope is Apptainer's (sigstore's dsse wrapper)::

    {"payloadType":"application/vnd.sylabs.sif-metadata+json","payload":"<base64 metadata JSON>",
     "signatures":[{"keyid":"SHA256:<base64 of the SHA-256 of the public key's DER>","sig":"<base64>"}]}

Each signature signs DSSE's pre-authentication encoding, "DSSEv1 <len> <type> <len> <payload>":
RSA with PKCS#1 v1.5, ECDSA with an ASN.1 signature, both over the hash named in the SIF
descriptor (SHA-256 by default); Ed25519 over the bytes themselves.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from typing import NamedTuple

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
    from cryptography.hazmat.primitives.hashes import HashAlgorithm
    from cryptography.x509 import Certificate

PAYLOAD_TYPE = "application/vnd.sylabs.sif-metadata+json"
MAX_PEM = 1 << 20


class DsseError(SingpyError):
    """A key, a certificate or an envelope cannot be used, or a signature does not verify."""


class PublicKey(NamedTuple):
    key: PublicKeyTypes
    origin: str  # the file it came from, for messages

    @property
    def keyid(self) -> str:
        return key_id(self.key)

    @property
    def kind(self) -> str:
        return type(self.key).__name__.removeprefix("_").replace("PublicKey", "").upper() or "KEY"


def _read_pem(path: str, what: str) -> bytes:
    from singpy.host.hostfiles import read_text

    return read_text(path, what=what, error=DsseError, limit=MAX_PEM).encode()


def key_id(key: PublicKeyTypes) -> str:
    from cryptography.hazmat.primitives import serialization

    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "SHA256:" + base64.b64encode(hashlib.sha256(der).digest()).decode().rstrip("=")


def load_public_key(path: str) -> PublicKey:
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        return PublicKey(load_pem_public_key(_read_pem(path, "key material")), path)
    except (ValueError, TypeError) as e:
        raise DsseError(f"failed to load key material: {path}: {e}") from None


def load_private_key(path: str, ask_passphrase: Callable[[], bytes]) -> PrivateKeyTypes:
    """A PEM private key; `ask_passphrase` is called only if the key is encrypted."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pem = _read_pem(path, "key material")
    try:
        try:
            return load_pem_private_key(pem, None)
        except TypeError:  # encrypted: now, and only now, ask
            return load_pem_private_key(pem, ask_passphrase())
    except (TypeError, ValueError):
        raise DsseError(f"failed to load key material: {path}: not a private key, or a wrong passphrase") from None


def _pae(payload: bytes) -> bytes:
    kind = PAYLOAD_TYPE.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _hash(name: str) -> HashAlgorithm:
    from cryptography.hazmat.primitives import hashes

    algorithms: dict[str, type[HashAlgorithm]] = {"sha256": hashes.SHA256, "sha384": hashes.SHA384,
                                                  "sha512": hashes.SHA512}
    return algorithms[name]()


def _sign_bytes(key: PrivateKeyTypes, message: bytes, hash_name: str) -> bytes:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(message, padding.PKCS1v15(), _hash(hash_name))
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(_hash(hash_name)))
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(message)
    raise DsseError(f"unsupported key type: {type(key).__name__} (RSA, ECDSA and Ed25519 are)")


def _verifies(key: PublicKeyTypes, signature: bytes, message: bytes, hash_name: str) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PKCS1v15(), _hash(hash_name))
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(_hash(hash_name)))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def sign_envelope(payload: bytes, key: PrivateKeyTypes, hash_name: str = "sha256") -> bytes:
    signature = _sign_bytes(key, _pae(payload), hash_name)
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                "signatures": [{"keyid": key_id(key.public_key()), "sig": base64.b64encode(signature).decode()}]}
    return json.dumps(envelope, separators=(",", ":")).encode()


def is_envelope(data: bytes) -> bool:
    try:
        envelope = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return False
    return isinstance(envelope, dict) and envelope.get("payloadType") == PAYLOAD_TYPE


def verify_envelope(data: bytes, keys: list[PublicKey], hash_name: str) -> tuple[bytes, list[PublicKey]]:
    """The payload and the keys whose signature verifies (at least one, else DsseError)."""
    try:
        envelope = json.loads(data)
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = [base64.b64decode(s["sig"], validate=True) for s in envelope["signatures"]]
    except (ValueError, TypeError, KeyError, binascii.Error, RecursionError):
        raise DsseError("dsse: verify envelope failed: malformed envelope") from None
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise DsseError("dsse: verify envelope failed: unexpected payload type")
    message = _pae(payload)
    accepted = [k for k in keys if any(_verifies(k.key, s, message, hash_name) for s in signatures)]
    if not accepted:
        raise DsseError("dsse: verify envelope failed: accepted signatures do not match threshold, "
                        "Found: 0, Expected 1")
    return payload, accepted


def _load_certs(path: str, what: str) -> list[Certificate]:
    from cryptography.x509 import load_pem_x509_certificates

    try:
        return load_pem_x509_certificates(_read_pem(path, what))
    except ValueError as e:
        raise DsseError(f"failed to load {what}: {path}: {e}") from None


def certificate_key(cert_path: str, intermediates: str | None, roots: str | None,
                    *, ocsp: bool = False) -> tuple[PublicKey, str]:
    """The leaf's public key once its chain to a root is verified for code signing (Go's x509 Verify) and,
    with `ocsp`, found unrevoked by the chain's OCSP responders."""
    leaf = _load_certs(cert_path, "certificate")[0]
    pool = _load_certs(intermediates, "intermediate certificates") if intermediates else []
    anchors = _load_certs(roots, "root certificates") if roots else []
    if not anchors:
        raise DsseError("failed to verify certificate: no root certificates given (--certificate-roots)")
    from singpy.signing.x509chain import verify_chain

    chain = verify_chain(leaf, pool, anchors)
    if ocsp:
        from singpy.signing.ocsp import check_chain

        check_chain(chain)
    subject = leaf.subject.rfc4514_string()
    issuers = [c.subject.rfc4514_string() for c in chain[1:]]
    return PublicKey(leaf.public_key(), cert_path), " <- ".join([subject, *issuers])

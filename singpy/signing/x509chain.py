"""An X.509 chain checked as Go's `x509.Certificate.Verify` with the code-signing usage (Apptainer's verify).

From the leaf, each certificate must be directly issued (name and signature) by the next,
one of the intermediates or a root; every certificate must be within its validity period,
every issuer a CA (basic constraints), and the leaf (and, where they say, the CAs) must allow
code signing. On `cryptography`'s primitives: no PKI policy of its own here beyond those rules.
"""

from __future__ import annotations

import datetime

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.hashes import HashAlgorithm
    from cryptography.x509 import Certificate

MAX_DEPTH = 8


class CertificateError(SingpyError):
    """A certificate chain does not verify."""


def _valid_now(cert: Certificate, now: datetime.datetime) -> None:
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertificateError(f"failed to verify certificate: x509: certificate has expired or is not yet valid "
                               f"({cert.subject.rfc4514_string()})")


def _allows_code_signing(cert: Certificate) -> bool:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no EKU: any usage (Go's rule)
    return ExtendedKeyUsageOID.CODE_SIGNING in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages


def is_ca(cert: Certificate) -> bool:
    from cryptography import x509

    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def signature_valid(key: object, signature: bytes, data: bytes, algorithm: HashAlgorithm | None) -> bool:
    """Whether `signature` by `key` (RSA PKCS#1 v1.5, ECDSA, Ed25519) is over `data`, as X.509 and OCSP sign."""
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    try:
        if isinstance(key, rsa.RSAPublicKey) and algorithm is not None:
            key.verify(signature, data, padding.PKCS1v15(), algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey) and algorithm is not None:
            key.verify(signature, data, ec.ECDSA(algorithm))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            return False
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError):
        return False
    return True


def issued_by(cert: Certificate, issuer: Certificate) -> bool:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

    if cert.issuer != issuer.subject or not is_ca(issuer):
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError):
        return False
    return True


def verify_chain(leaf: Certificate, intermediates: list[Certificate], roots: list[Certificate]) -> list[Certificate]:
    """The chain leaf → … → root, or CertificateError saying why none exists."""
    now = datetime.datetime.now(datetime.UTC)
    _valid_now(leaf, now)
    chain = [leaf]
    for _ in range(MAX_DEPTH):
        current = chain[-1]
        if not _allows_code_signing(current):
            raise CertificateError("failed to verify certificate: x509: certificate specifies an incompatible "
                                   "key usage")
        root = next((r for r in roots if issued_by(current, r)), None)
        if root is not None:
            _valid_now(root, now)
            return [*chain, root]
        issuer = next((c for c in intermediates if c not in chain and issued_by(current, c)), None)
        if issuer is None:
            break
        _valid_now(issuer, now)
        chain.append(issuer)
    raise CertificateError("failed to verify certificate: x509: certificate signed by unknown authority")

"""`verify --ocsp-verify`: the certificate chain's revocation status asked of its OCSP responders, as Apptainer.

As internal/pkg/signature/verify_ocsp.go: every certificate of the verified chain but a self-signed
one is looked up by its authority key ID among the chain; its issuer must be a CA; the request
(SHA-1 certificate ID, as Apptainer's) is POSTed to the first OCSP URL of the certificate's
authority information access; the answer must be signed by the issuer (or by a responder
certificate the issuer signed), be current, and say "good". A responder certificate the issuer
delegated to is itself checked unless it carries the OCSP no-check extension. The answer comes
from the network: it is parsed by `cryptography`, bounded in size and time.
"""

from __future__ import annotations

import datetime

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from cryptography.x509 import Certificate
    from cryptography.x509.ocsp import OCSPResponse

TIMEOUT = 10.0
MAX_RESPONSE = 1 << 20
NO_CHECK_OID = "1.3.6.1.5.5.7.48.1.5"


class OcspError(SingpyError):
    """A certificate is revoked, unknown to its responder, or its status cannot be learnt."""


def _key_ids(cert: Certificate) -> tuple[bytes, bytes]:
    """(subject key ID, authority key ID); b"" for a missing one."""
    from cryptography import x509

    try:
        ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    except x509.ExtensionNotFound:
        ski = b""
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier or b""
    except x509.ExtensionNotFound:
        aki = b""
    return ski, aki


def _ocsp_url(cert: Certificate) -> str:
    from cryptography import x509
    from cryptography.x509.oid import AuthorityInformationAccessOID

    try:
        access = list(cert.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value)
    except x509.ExtensionNotFound:
        access = []
    urls = [str(a.access_location.value) for a in access if a.access_method == AuthorityInformationAccessOID.OCSP]
    if not urls:
        raise OcspError("certificate does not support OCSP")
    if not urls[0].startswith(("http://", "https://")):
        raise OcspError(f"cannot parse OCSP Server from certificate: {urls[0][:200]}")
    return urls[0]


def _post(url: str, body: bytes) -> bytes:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/ocsp-request", "Accept": "application/ocsp-response"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:  # noqa: S310 (http(s) checked above)
            data: bytes = answer.read(MAX_RESPONSE + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise OcspError(f"OCSP Send Request err: {getattr(e, 'reason', e)}") from None
    if len(data) > MAX_RESPONSE:
        raise OcspError("OCSP response err: response too large")
    return data


def _signed_by(response: OCSPResponse, signer: Certificate) -> bool:
    from singpy.signing.x509chain import signature_valid

    return signature_valid(signer.public_key(), response.signature, response.tbs_response_bytes,
                           response.signature_hash_algorithm)


def _query(cert: Certificate, issuer: Certificate) -> Certificate | None:
    """The status of `cert`; returns the delegated responder's certificate (to be checked too), if any."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509 import ocsp

    from singpy.signing.x509chain import is_ca, issued_by

    if not is_ca(issuer):
        raise OcspError("signer's certificates can only belong to a CA")
    url = _ocsp_url(cert)
    request = ocsp.OCSPRequestBuilder().add_certificate(cert, issuer, hashes.SHA1()).build()  # noqa: S303 (RFC 6960)
    try:
        response = ocsp.load_der_ocsp_response(_post(url, request.public_bytes(serialization.Encoding.DER)))
    except ValueError as e:
        raise OcspError(f"OCSP response err: {e}") from None
    if response.response_status != ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise OcspError(f"OCSP response err: {response.response_status.name.lower()}")
    # RFC 6960 4.2.2.2 (and Apptainer's verify_ocsp.go): the issuer itself, or a responder it delegated to: a
    # certificate it issued for OCSP signing alone, never the one asked about (its key's holder would vouch for it)
    delegated = next((c for c in response.certificates
                      if issued_by(c, issuer) and _ocsp_signing(c) and c.serial_number != cert.serial_number), None)
    if not (_signed_by(response, issuer) or (delegated is not None and _signed_by(response, delegated))):
        raise OcspError("OCSP response err: bad signature on embedded certificate")
    if response.serial_number != cert.serial_number:
        raise OcspError("OCSP response err: no response matching the supplied certificate")
    now = datetime.datetime.now(datetime.UTC)
    next_update = response.next_update_utc
    if response.this_update_utc > now or (next_update is not None and next_update < now):
        raise OcspError("unreliable OCSP response")
    status = response.certificate_status
    if status == ocsp.OCSPCertStatus.REVOKED:
        raise OcspError(f"certificate revoked at '{response.revocation_time_utc}'. Revocation reason code: "
                        f"'{response.revocation_reason.name if response.revocation_reason else 0}'")
    if status != ocsp.OCSPCertStatus.GOOD:
        raise OcspError("status unknown. certificate cannot be trusted")
    return delegated


def _ocsp_signing(cert: Certificate) -> bool:
    """Whether `cert`'s extended key usage names OCSP signing (a delegated responder's mark)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (x509.ExtensionNotFound, ValueError):
        return False
    return ExtendedKeyUsageOID.OCSP_SIGNING in usage


def _check(cert: Certificate, pool: dict[bytes, Certificate], depth: int) -> None:
    ski, aki = _key_ids(cert)
    if not aki or ski == aki:
        return  # self-signed: nothing to ask (Apptainer skips it too)
    issuer = pool.get(aki)
    if issuer is None:
        raise OcspError(f"cannot find issuer '{cert.issuer.rfc4514_string()}'")
    responder = _query(cert, issuer)  # a responder the issuer delegated to is asked about too, unless it says not to
    if responder is not None and depth < 4 and not any(e.oid.dotted_string == NO_CHECK_OID
                                                       for e in responder.extensions):
        _check(responder, pool, depth + 1)


def check_chain(chain: list[Certificate]) -> None:
    """Ask the responders about every certificate of a verified chain (leaf first); OcspError if one is not good."""
    pool = {_key_ids(c)[0]: c for c in chain}
    for cert in chain:
        try:
            _check(cert, pool, 0)
        except OcspError as e:
            raise OcspError(f"OCSP verification has failed: {e.message}") from None

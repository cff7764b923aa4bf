"""`singpy verify` with OCSP (a real responder of the test's own PKI), signing with locked keys whose passphrase
comes on stdin, and Apptainer's deprecated id flags; as test_sign_verify.py, every test runs as root and as the
test user with its own keyring directory and images.
"""
from __future__ import annotations

import http.server
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.signing_cases import (
    assert_one_fatal,
    fresh_place,
    keys_env,
    new_pgp_key,
    own,
    unsigned_sif,
)


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    return fresh_place(singpy, workdir, request)


class _Pki:
    """A root (Ed25519), an intermediate (ECDSA) and a code-signing leaf (RSA), whose OCSP responder is this test's."""

    def __init__(self, directory: Path, ocsp_url: str) -> None:
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
        from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        self.revoked: set[int] = set()
        self.forged = False  # the leaf's status answered by the holder of the leaf's key, signed with it
        self.keys: dict[str, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey] = {
            "root": ed25519.Ed25519PrivateKey.generate(), "intermediate": ec.generate_private_key(ec.SECP256R1()),
            "leaf": rsa.generate_private_key(65537, 2048)}
        self.certs: dict[str, x509.Certificate] = {}
        for name, issuer in (("root", "root"), ("intermediate", "root"), ("leaf", "intermediate")):
            public = self.keys[name].public_key()
            builder = (x509.CertificateBuilder()
                       .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test {name}")]))
                       .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"test {issuer}")]))
                       .public_key(public).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(hours=1))
                       .not_valid_after(now + datetime.timedelta(days=1))
                       .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
                       .add_extension(x509.BasicConstraints(ca=name != "leaf", path_length=None), critical=True)
                       .add_extension(x509.AuthorityInformationAccess([x509.AccessDescription(
                           AuthorityInformationAccessOID.OCSP, x509.UniformResourceIdentifier(ocsp_url))]),
                           critical=False))
            if name != "root":
                builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.keys[issuer].public_key()), critical=False)
            if name == "leaf":
                builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                                                critical=False)
            algorithm = None if issuer == "root" else _sha256()
            self.certs[name] = builder.sign(self.keys[issuer], algorithm)  # type: ignore[arg-type]
            (directory / f"{name}.pem").write_bytes(self.certs[name].public_bytes(serialization.Encoding.PEM))
        (directory / "leaf-private.pem").write_bytes(self.keys["leaf"].private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (directory / "leaf-private.pem").chmod(0o644)

    def answer(self, request_der: bytes) -> bytes:
        """The OCSP response its issuer signs for the certificate asked about."""
        import datetime

        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509 import ocsp

        serial = ocsp.load_der_ocsp_request(request_der).serial_number
        name = next(n for n, c in self.certs.items() if c.serial_number == serial)
        issuer = {"intermediate": "root", "leaf": "intermediate"}[name]
        now = datetime.datetime.now(datetime.UTC)
        revoked = serial in self.revoked
        if self.forged and name == "leaf":  # "good", signed by the leaf's key, the leaf's certificate embedded
            forged = ocsp.OCSPResponseBuilder().add_response(
                cert=self.certs[name], issuer=self.certs[issuer], algorithm=hashes.SHA1(),
                cert_status=ocsp.OCSPCertStatus.GOOD, this_update=now - datetime.timedelta(minutes=1),
                next_update=now + datetime.timedelta(hours=1), revocation_time=None, revocation_reason=None,
            ).responder_id(ocsp.OCSPResponderEncoding.HASH, self.certs[name]).certificates([self.certs[name]])
            return forged.sign(self.keys[name], hashes.SHA256()).public_bytes(
                serialization.Encoding.DER)
        builder = ocsp.OCSPResponseBuilder().add_response(
            cert=self.certs[name], issuer=self.certs[issuer], algorithm=hashes.SHA1(),
            cert_status=ocsp.OCSPCertStatus.REVOKED if revoked else ocsp.OCSPCertStatus.GOOD,
            this_update=now - datetime.timedelta(minutes=1), next_update=now + datetime.timedelta(hours=1),
            revocation_time=now - datetime.timedelta(minutes=5) if revoked else None, revocation_reason=None,
        ).responder_id(ocsp.OCSPResponderEncoding.HASH, self.certs[issuer])
        algorithm = None if issuer == "root" else _sha256()
        return builder.sign(self.keys[issuer], algorithm).public_bytes(serialization.Encoding.DER)  # type: ignore[arg-type]


def _sha256() -> object:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


@pytest.fixture
def responder(place: Path) -> Iterator[tuple[_Pki, http.server.ThreadingHTTPServer]]:
    """An OCSP responder on 127.0.0.1 (a free port: nothing shared with another run), and the PKI it answers for."""
    from tests.support.registry_http import serving

    pki: list[_Pki] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = pki[0].answer(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/ocsp-response")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as server:
        pki.append(_Pki(place, f"http://127.0.0.1:{server.server_address[1]}/"))
        yield pki[0], server


def _ocsp_verify(singpy: Singpy, place: Path, image: Path) -> subprocess.CompletedProcess[str]:
    return singpy.run("verify", "--certificate", str(place / "leaf.pem"), "--certificate-intermediates",
                      str(place / "intermediate.pem"), "--certificate-roots", str(place / "root.pem"), "--ocsp-verify",
                      str(image), env=keys_env(singpy, place))


def test_ocsp_verify_asks_the_responders(singpy: Singpy, place: Path,
                                         responder: tuple[_Pki, http.server.ThreadingHTTPServer]) -> None:
    pki, _server = responder
    image = unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(place / "leaf-private.pem"), str(image), env=keys_env(singpy, place))
    result = _ocsp_verify(singpy, place, image)
    assert result.returncode == 0, result.stderr
    assert "Signing certificate: CN=test leaf <- CN=test intermediate <- CN=test root" in result.stdout
    pki.revoked.add(pki.certs["leaf"].serial_number)
    assert_one_fatal(_ocsp_verify(singpy, place, image), "OCSP verification has failed: certificate revoked")
    pki.revoked = {pki.certs["intermediate"].serial_number}
    assert_one_fatal(_ocsp_verify(singpy, place, image), "OCSP verification has failed: certificate revoked")
    # A revoked leaf's key in other hands: "good", signed with that key, is no answer (RFC 6960 4.2.2.2)
    pki.revoked, pki.forged = {pki.certs["leaf"].serial_number}, True
    assert_one_fatal(_ocsp_verify(singpy, place, image),
                     "OCSP verification has failed: OCSP response err: bad signature on embedded certificate")


def test_ocsp_verify_without_a_responder_fails(singpy: Singpy, place: Path,
                                               responder: tuple[_Pki, http.server.ThreadingHTTPServer]) -> None:
    _pki, server = responder
    image = unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(place / "leaf-private.pem"), str(image), env=keys_env(singpy, place))
    server.shutdown()
    server.server_close()
    assert_one_fatal(_ocsp_verify(singpy, place, image), "OCSP verification has failed: OCSP Send Request err")


def _locked_gpg_key(singpy: Singpy, place: Path, passphrase: str) -> str:
    """A passphrase-protected key made by GnuPG (pysequoia makes no locked keys), as the user's only secret key."""
    import tempfile

    home = tempfile.mkdtemp(prefix="singpy-gpg-")  # short: gpg-agent's socket path must fit
    env = {"GNUPGHOME": home, "PATH": "/usr/bin:/bin"}
    gpg = ["gpg", "-q", "--batch", "--pinentry-mode", "loopback", "--passphrase", passphrase]
    try:
        subprocess.run([*gpg, "--quick-gen-key", "Locked <locked@example.org>", "ed25519", "sign", "never"], env=env,
                       check=True, capture_output=True)
        secret = subprocess.run([*gpg, "--export-secret-keys"], env=env, check=True, capture_output=True).stdout
        public = subprocess.run([*gpg, "--export"], env=env, check=True, capture_output=True).stdout
        listing = subprocess.run(["gpg", "--with-colons", "--list-keys"], env=env, check=True, capture_output=True,
                                 text=True).stdout
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    for name, data in (("pgp-secret", secret), ("pgp-public", public)):
        (place / "keys" / name).write_bytes(data)
        (place / "keys" / name).chmod(0o600)
        own(singpy, place / "keys" / name)
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


@pytest.mark.skipif(not shutil.which("gpg") or not shutil.which("gpgconf"), reason="needs GnuPG to make a locked key")
def test_locked_pgp_key_passphrase_from_stdin(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    fingerprint = _locked_gpg_key(singpy, place, "open sesame")
    before = image.read_bytes()
    assert_one_fatal(singpy.run("sign", str(image), env=keys_env(singpy, place), input="wrong\n"), "wrong passphrase")
    assert image.read_bytes() == before
    result = singpy.run("sign", str(image), env=keys_env(singpy, place), input="open sesame\n")
    assert result.returncode == 0, result.stderr
    assert "Enter key passphrase" in result.stdout and "open sesame" not in result.stdout + result.stderr
    assert f"Fingerprint: {fingerprint}" in singpy.ok("verify", str(image), env=keys_env(singpy, place))


def test_deprecated_id_flags_still_work(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    new_pgp_key(singpy, place, ["Old <old@example.org>"])
    result = singpy.run("sign", "--id", "1", str(image), env=keys_env(singpy, place))
    assert result.returncode == 0 and "WARNING: --id is deprecated, use '--sif-id'" in result.stderr
    out = singpy.ok("verify", "--id", "1", str(image), env=keys_env(singpy, place))
    assert "1   |1       |NONE    |FS\n" in out and "2   |1" not in out
    result = singpy.run("verify", "--groupid", "1", str(image), env=keys_env(singpy, place))
    assert "WARNING: --groupid is deprecated" in result.stderr and "object 2: object not signed" in result.stderr

"""`singpy sign` and `singpy verify` on Apptainer's own signed images (tests/data/sif-trust) and on images singpy signs.

The golden images, keys and certificates are the apptainer/sif and Apptainer test data (their
provenance: tests/data/sif-trust/README.md). Every test runs as root and as the test user, with its
own keyring directory (APPTAINER_KEYSDIR) and its own copies of the images.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.conftest import assert_one_fatal as assert_fatal_line

TRUST = Path(__file__).resolve().parent.parent / "data" / "sif-trust"
GOLDEN_FINGERPRINT = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"
GOLDEN_SIGNER = "Unit Test <unit@test.com>"
SIFTOOL = shutil.which("siftool")


def assert_one_fatal(result: subprocess.CompletedProcess[str], message: str) -> None:
    """One FATAL line (after Apptainer's INFO lines saying which key material is used), no traceback; on stdout at
    most the passphrase question."""
    kept = "".join(line for line in result.stderr.splitlines(keepends=True) if not line.startswith("INFO:"))
    out = "".join(line for line in result.stdout.splitlines(keepends=True) if not line.startswith("Enter "))
    assert_fatal_line(subprocess.CompletedProcess(result.args, result.returncode, out, kept), message)


def _own(singpy: Singpy, path: Path) -> Path:
    os.chown(path, singpy.uid, singpy.gid)
    return path


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of this profile's user for one test: its keyring (keys/) and its images."""
    name: str = request.node.name.replace("[", "-").replace("]", "").replace("/", "_")[:80]
    path = workdir / "sign-verify" / name  # the test's ID names the profile
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    path.parent.chmod(0o755)
    _own(singpy, path)
    (path / "keys").mkdir(mode=0o700)
    _own(singpy, path / "keys")
    (path / "etc").mkdir(mode=0o755)  # this test's configuration: no global keyring unless the test writes one
    shutil.copyfile(Path(__file__).resolve().parents[2] / "etc" / "singpy.conf", path / "etc" / "singpy.conf")
    return path


def _env(singpy: Singpy, place: Path) -> dict[str, str]:
    return singpy.env(APPTAINER_KEYSDIR=str(place / "keys"), SINGPY_CONFIG=str(place / "etc" / "singpy.conf"))


def _copy(singpy: Singpy, place: Path, name: str) -> Path:
    target = place / name
    shutil.copyfile(TRUST / name, target)
    _own(singpy, target)
    return target


def _trust_golden_key(singpy: Singpy, place: Path) -> None:
    """The golden signer's public key in the user's keyring, binary as Apptainer writes it."""
    import pysequoia

    cert = pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())
    (place / "keys" / "pgp-public").write_bytes(bytes(cert))  # bytes(): the public part only
    _own(singpy, place / "keys" / "pgp-public")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _object(path: Path, object_id: int) -> tuple[int, int]:
    """(offset, size) of an object, as the reference siftool reports it would be overkill: read the descriptor."""
    from singpy.image.sif import read_sif

    desc = next(d for d in read_sif(path).descriptors if d.id == object_id)
    return desc.offset, desc.size


def test_verifies_apptainers_pgp_signed_image_and_names_the_signer(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-pgp.sif")
    _trust_golden_key(singpy, place)
    result = singpy.run("verify", str(image), env=_env(singpy, place))
    assert result.returncode == 0, result.stderr
    assert f"[LOCAL]            Signing entity: {GOLDEN_SIGNER}\n" in result.stdout
    assert f"Fingerprint: {GOLDEN_FINGERPRINT}\n" in result.stdout
    assert "1   |1       |NONE    |FS\n2   |1       |NONE    |FS\n" in result.stdout
    assert f"Verified signature(s) from image '{image}'" in result.stderr


def test_verify_json_is_apptainers(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-pgp.sif")
    _trust_golden_key(singpy, place)
    document = json.loads(singpy.ok("verify", "--json", str(image), env=_env(singpy, place)))
    signer = {"Partition": "FS", "Name": GOLDEN_SIGNER, "Fingerprint": GOLDEN_FINGERPRINT.lower(), "KeyLocal": True,
              "KeyCheck": True, "DataCheck": True}
    assert document == {"Signatures": 1, "SignerKeys": [{"Signer": signer}, {"Signer": signer}]}


def test_unknown_signer_fails(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-pgp.sif")
    result = singpy.run("verify", str(image), env=_env(singpy, place))
    assert result.returncode == 255
    assert "signature made by unknown entity" in result.stdout
    assert f"[UNKNOWN]          Fingerprint: {GOLDEN_FINGERPRINT}" in result.stdout
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert fatal == ["FATAL:   Failed to verify container: integrity: signature object 3 not valid: openpgp: "
                     "signature made by unknown entity"]


@pytest.mark.parametrize("key", ["ed25519-public.pem", "rsa-public.pem"])
def test_verifies_apptainers_dsse_image_with_a_public_key(singpy: Singpy, place: Path, key: str) -> None:
    image = _copy(singpy, place, "one-group-signed-dsse.sif")
    out = singpy.ok("verify", "--key", str(TRUST / key), str(image), env=_env(singpy, place))
    assert f"Signing key: {TRUST / key}" in out
    assert "Key ID: SHA256:" in out and "2   |1       |NONE    |FS\n" in out


def test_dsse_image_with_a_key_that_did_not_sign_fails(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-dsse.sif")
    result = singpy.run("verify", "--key", str(TRUST / "ecdsa-public.pem"), str(image), env=_env(singpy, place))
    assert result.returncode == 255
    assert "FATAL:   Failed to verify container: integrity: signature object 3 not valid: dsse: verify envelope " \
           "failed" in result.stderr


def test_a_signature_nested_thousands_deep_is_one_fatal_line(singpy: Singpy, place: Path) -> None:
    """A signature object of `[[[[…` (Python's JSON parser recurses): not recognized, no traceback."""
    from singpy.signing import sifsig

    image = _copy(singpy, place, "one-group-signed-dsse.sif")
    signature = sifsig.load(str(image)).signatures_of_group(1)[0]
    with image.open("r+b") as handle:
        handle.seek(signature.offset)
        handle.write(b"[" * signature.size)
    result = singpy.run("verify", "--key", str(TRUST / "ecdsa-public.pem"), str(image), env=_env(singpy, place))
    assert result.returncode == 255 and "Traceback" not in result.stderr, result.stderr
    assert "FATAL:   Failed to verify container: integrity: signature format not recognized" in result.stderr


def test_verifies_apptainers_dsse_image_with_a_certificate_chain(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-dsse.sif")
    out = singpy.ok("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-intermediates",
                    str(TRUST / "intermediate.pem"), "--certificate-roots", str(TRUST / "root.pem"), str(image),
                    env=_env(singpy, place))
    assert "[CERTIFICATE]      Signing certificate: CN=leaf,O=Apptainer,C=US <- CN=intermediate,O=Apptainer,C=US " \
           "<- CN=root,O=Apptainer,C=US" in out


def test_certificate_without_its_intermediate_is_refused(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "one-group-signed-dsse.sif")
    result = singpy.run("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-roots",
                        str(TRUST / "root.pem"), str(image), env=_env(singpy, place))
    assert_one_fatal(result, "certificate signed by unknown authority")


def test_legacy_signature_needs_legacy_insecure(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, place, "two-groups-signed-legacy.sif")
    _trust_golden_key(singpy, place)
    result = singpy.run("verify", str(image), env=_env(singpy, place))
    assert_one_fatal(result, "signature not found for object group 1")
    out = singpy.ok("verify", "--legacy-insecure", str(image), env=_env(singpy, place))
    assert f"Fingerprint: {GOLDEN_FINGERPRINT}" in out and "2   |1       |NONE    |FS\n" in out
    assert "1   |1" not in out  # the legacy signature covers object 2 alone


def _tamper(image: Path, where: str) -> None:
    from singpy.image.sif import DESCRIPTOR

    if where == "partition":
        offset, _ = _object(image, 2)
        _flip(image, offset + 10)
    elif where == "descriptor":  # a byte of object 1's name, inside the signed descriptor fields
        _flip(image, 4096 + 73 + 2)
        assert DESCRIPTOR.size == 585
    else:  # in the signature object: inside the signed metadata (PGP) or the signature value (DSSE)
        offset, size = _object(image, 3)
        data = image.read_bytes()[offset:offset + size]
        marker = data.index(b'"sig":"') + 20 if b'"sig":"' in data else data.index(b"objectDigest") + 30
        _flip(image, offset + marker)


@pytest.mark.parametrize("where", ["partition", "descriptor", "signature"])
@pytest.mark.parametrize("kind", ["pgp", "dsse"])
def test_tampered_image_fails(singpy: Singpy, place: Path, kind: str, where: str) -> None:
    image = _copy(singpy, place, f"one-group-signed-{kind}.sif")
    _trust_golden_key(singpy, place)
    key = ["--key", str(TRUST / "ed25519-public.pem")] if kind == "dsse" else []
    singpy.ok("verify", *key, str(image), env=_env(singpy, place))
    _tamper(image, where)
    result = singpy.run("verify", *key, str(image), env=_env(singpy, place))
    assert result.returncode == 255, result.stdout
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and "Failed to verify container: integrity:" in fatal[0], result.stderr
    expected = {"partition": "data object integrity compromised: 2",
                "descriptor": "data object descriptor integrity compromised: 1"}.get(where, "not valid")
    assert expected in fatal[0]
    assert "Traceback" not in result.stderr


def _unsigned_sif(singpy: Singpy, place: Path) -> Path:
    """A two-object SIF made by the reference siftool: what singpy signs must be Apptainer's format."""
    assert SIFTOOL, "siftool (Debian's golang-github-apptainer-sif) is needed"
    image = place / "unsigned.sif"
    (place / "part1").write_bytes(b"\xfa\xce\xfe\xed" * 1024)
    (place / "part2").write_bytes(os.urandom(8192))
    subprocess.run([SIFTOOL, "new", str(image)], check=True, capture_output=True)
    for part, parttype in (("part1", "2"), ("part2", "3")):
        subprocess.run([SIFTOOL, "add", "--datatype", "4", "--parttype", parttype, "--partfs", "4", "--partarch", "2",
                        "--groupid", "1", str(image), str(place / part)], check=True, capture_output=True)
    return _own(singpy, image)


def _new_pgp_key(singpy: Singpy, place: Path, names: list[str]) -> list[str]:
    """Fresh OpenPGP keys in this user's secret and public keyrings (as `key newpair` would write them)."""
    import pysequoia

    tsks = [pysequoia.Tsk.generate(name, profile=pysequoia.Profile.RFC4880, cipher_suite=pysequoia.CipherSuite.Cv25519)
            for name in names]
    for filename, parts in (("pgp-secret", [bytes(t) for t in tsks]),
                            ("pgp-public", [bytes(t.extract_certificate()) for t in tsks])):
        path = place / "keys" / filename
        path.write_bytes(b"".join(parts))
        path.chmod(0o600)
        _own(singpy, path)
    return [str(t.extract_certificate().fingerprint).upper() for t in tsks]


def _siftool_list(image: Path) -> str:
    assert SIFTOOL
    done = subprocess.run([SIFTOOL, "list", str(image)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pgp_sign_then_verify(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    first, second = _new_pgp_key(singpy, place, ["First <first@example.org>", "Second <second@example.org>"])
    result = singpy.run("sign", "--keyidx", "1", str(image), env=_env(singpy, place))
    assert result.returncode == 0, result.stderr
    assert f"Signature created and applied to image '{image}'" in result.stderr
    assert "3    |NONE    |1   (G) |" in _siftool_list(image) and "Signature (SHA-256)" in _siftool_list(image)
    out = singpy.ok("verify", str(image), env=_env(singpy, place))
    assert "Signing entity: Second <second@example.org>\n" in out and f"Fingerprint: {second}\n" in out
    assert first not in out
    _flip(image, _object(image, 2)[0])
    assert singpy.run("verify", str(image), env=_env(singpy, place)).returncode == 255


def test_pgp_sign_picks_a_key_on_stdin(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    _first, second = _new_pgp_key(singpy, place, ["First <first@example.org>", "Second <second@example.org>"])
    result = singpy.run("sign", str(image), env=_env(singpy, place), input="1\n")
    assert result.returncode == 0, result.stderr
    assert "0) U: First <first@example.org>" in result.stdout and "Enter # of private key to use" in result.stdout
    assert f"Fingerprint: {second}" in singpy.ok("verify", str(image), env=_env(singpy, place))


def test_sign_one_object(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    _new_pgp_key(singpy, place, ["Solo <solo@example.org>"])
    singpy.ok("sign", "--sif-id", "2", str(image), env=_env(singpy, place))
    out = singpy.ok("verify", "--sif-id", "2", str(image), env=_env(singpy, place))
    assert "2   |1       |NONE    |FS\n" in out and "1   |1" not in out
    result = singpy.run("verify", str(image), env=_env(singpy, place))  # the group as a whole is not signed
    assert result.returncode == 255 and "object 1: object not signed" in result.stderr


def _pem_pair(place: Path, kind: str, password: bytes | None = None) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
    if kind == "rsa":
        key = rsa.generate_private_key(65537, 2048)
    elif kind == "ecdsa":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        key = ed25519.Ed25519PrivateKey.generate()
    encryption = (serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    private, public = place / f"{kind}-private.pem", place / f"{kind}-public.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    private.chmod(0o644)  # the test user must read it; not a real secret
    return private, public


@pytest.mark.parametrize("kind", ["ed25519", "rsa", "ecdsa"])
def test_dsse_sign_then_verify(singpy: Singpy, place: Path, kind: str) -> None:
    image = _unsigned_sif(singpy, place)
    private, public = _pem_pair(place, kind)
    singpy.ok("sign", "--key", str(private), str(image), env=_env(singpy, place))
    assert "Signature (SHA-256)" in _siftool_list(image)
    out = singpy.ok("verify", "--key", str(public), str(image), env=_env(singpy, place))
    assert f"Signing key: {public}" in out and "1   |1       |NONE    |" in out
    other = _pem_pair(_mkdir(place / "other"), "ed25519")[1]
    assert singpy.run("verify", "--key", str(other), str(image), env=_env(singpy, place)).returncode == 255


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


def test_encrypted_pem_passphrase_from_stdin(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    private, public = _pem_pair(place, "ed25519", password=b"correct horse")
    before = image.read_bytes()
    result = singpy.run("sign", "--key", str(private), str(image), env=_env(singpy, place), input="wrong\n")
    assert_one_fatal(result, "wrong passphrase")
    assert image.read_bytes() == before  # nothing written
    singpy.ok("sign", "--key", str(private), str(image), env=_env(singpy, place), input="correct horse\n")
    singpy.ok("verify", "--key", str(public), str(image), env=_env(singpy, place))


def test_sign_without_a_secret_key_changes_nothing(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    before = image.read_bytes()
    assert_one_fatal(singpy.run("sign", str(image), env=_env(singpy, place)), "keyring is empty")
    assert_one_fatal(singpy.run("sign", "--keyidx", "3", str(image), env=_env(singpy, place)), "keyring is empty")
    assert image.read_bytes() == before


def test_unsigned_image_and_bad_inputs_are_one_fatal_line(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    env = _env(singpy, place)
    assert_one_fatal(singpy.run("verify", str(image), env=env), "signature not found for object group 1")
    assert_one_fatal(singpy.run("verify", str(place / "missing.sif"), env=env), "missing.sif")
    assert_one_fatal(singpy.run("verify", "--key", str(place / "part1"), str(image), env=env),
                     "Failed to load key material")
    (place / "keys" / "pgp-public").write_bytes(b"\x99\x01garbage")
    _own(singpy, place / "keys" / "pgp-public")
    assert_one_fatal(singpy.run("verify", str(image), env=env), "not an OpenPGP keyring")


def test_global_keyring_beside_the_configuration(singpy: Singpy, place: Path) -> None:
    """`--config DIR/singpy.conf` reads DIR/global-pgp-public (root-owned, as an admin installs it)."""
    import pysequoia

    image = _copy(singpy, place, "one-group-signed-pgp.sif")
    confdir = place / "site"
    confdir.mkdir(mode=0o755)
    shutil.copyfile(place / "etc" / "singpy.conf", confdir / "singpy.conf")
    cert = pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())
    (confdir / "global-pgp-public").write_bytes(bytes(cert))
    out = singpy.ok("--config", str(confdir / "singpy.conf"), "verify", str(image), env=_env(singpy, place))
    assert f"[GLOBAL]           Signing entity: {GOLDEN_SIGNER}\n" in out
    assert "signature made by unknown entity" in singpy.run("verify", str(image), env=_env(singpy, place)).stdout


def test_signing_with_apptainers_test_keys_verifies_as_its_golden_image(singpy: Singpy, place: Path) -> None:
    """What singpy signs with Apptainer's RSA test key verifies with that key and with its certificate chain."""
    image = _unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(TRUST / "rsa-private.pem"), str(image), env=_env(singpy, place))
    singpy.ok("verify", "--key", str(TRUST / "rsa-public.pem"), str(image), env=_env(singpy, place))
    out = singpy.ok("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-intermediates",
                    str(TRUST / "intermediate.pem"), "--certificate-roots", str(TRUST / "root.pem"), str(image),
                    env=_env(singpy, place))
    assert "Signing certificate: CN=leaf,O=Apptainer,C=US" in out
    result = singpy.run("verify", "--key", str(TRUST / "ed25519-public.pem"), str(image), env=_env(singpy, place))
    assert result.returncode == 255 and "dsse: verify envelope failed" in result.stderr


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
                      str(image), env=_env(singpy, place))


def test_ocsp_verify_asks_the_responders(singpy: Singpy, place: Path,
                                         responder: tuple[_Pki, http.server.ThreadingHTTPServer]) -> None:
    pki, _server = responder
    image = _unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(place / "leaf-private.pem"), str(image), env=_env(singpy, place))
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
    image = _unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(place / "leaf-private.pem"), str(image), env=_env(singpy, place))
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
        _own(singpy, place / "keys" / name)
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


@pytest.mark.skipif(not shutil.which("gpg") or not shutil.which("gpgconf"), reason="needs GnuPG to make a locked key")
def test_locked_pgp_key_passphrase_from_stdin(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    fingerprint = _locked_gpg_key(singpy, place, "open sesame")
    before = image.read_bytes()
    assert_one_fatal(singpy.run("sign", str(image), env=_env(singpy, place), input="wrong\n"), "wrong passphrase")
    assert image.read_bytes() == before
    result = singpy.run("sign", str(image), env=_env(singpy, place), input="open sesame\n")
    assert result.returncode == 0, result.stderr
    assert "Enter key passphrase" in result.stdout and "open sesame" not in result.stdout + result.stderr
    assert f"Fingerprint: {fingerprint}" in singpy.ok("verify", str(image), env=_env(singpy, place))


def test_deprecated_id_flags_still_work(singpy: Singpy, place: Path) -> None:
    image = _unsigned_sif(singpy, place)
    _new_pgp_key(singpy, place, ["Old <old@example.org>"])
    result = singpy.run("sign", "--id", "1", str(image), env=_env(singpy, place))
    assert result.returncode == 0 and "WARNING: --id is deprecated, use '--sif-id'" in result.stderr
    out = singpy.ok("verify", "--id", "1", str(image), env=_env(singpy, place))
    assert "1   |1       |NONE    |FS\n" in out and "2   |1" not in out
    result = singpy.run("verify", "--groupid", "1", str(image), env=_env(singpy, place))
    assert "WARNING: --groupid is deprecated" in result.stderr and "object 2: object not signed" in result.stderr

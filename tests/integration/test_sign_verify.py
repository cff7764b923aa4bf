"""`singpy sign` and `singpy verify` on Apptainer's own signed images (tests/data/sif-trust) and on images singpy signs.

The golden images, keys and certificates are the apptainer/sif and Apptainer test data (their
provenance: tests/data/sif-trust/README.md). Every test runs as root and as the test user, with its
own keyring directory (APPTAINER_KEYSDIR) and its own copies of the images (tests/support/signing_cases.py).
OCSP, locked keys and the deprecated flags are in test_sign_verify_ocsp.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.signing_cases import (
    GOLDEN_FINGERPRINT,
    GOLDEN_SIGNER,
    SIFTOOL,
    TRUST,
    assert_one_fatal,
    fresh_place,
    golden_copy,
    keys_env,
    new_pgp_key,
    own,
    trust_golden_key,
    unsigned_sif,
)


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    return fresh_place(singpy, workdir, request)


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
    image = golden_copy(singpy, place, "one-group-signed-pgp.sif")
    trust_golden_key(singpy, place)
    result = singpy.run("verify", str(image), env=keys_env(singpy, place))
    assert result.returncode == 0, result.stderr
    assert f"[LOCAL]            Signing entity: {GOLDEN_SIGNER}\n" in result.stdout
    assert f"Fingerprint: {GOLDEN_FINGERPRINT}\n" in result.stdout
    assert "1   |1       |NONE    |FS\n2   |1       |NONE    |FS\n" in result.stdout
    assert f"Verified signature(s) from image '{image}'" in result.stderr


def test_verify_json_is_apptainers(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "one-group-signed-pgp.sif")
    trust_golden_key(singpy, place)
    document = json.loads(singpy.ok("verify", "--json", str(image), env=keys_env(singpy, place)))
    signer = {"Partition": "FS", "Name": GOLDEN_SIGNER, "Fingerprint": GOLDEN_FINGERPRINT.lower(), "KeyLocal": True,
              "KeyCheck": True, "DataCheck": True}
    assert document == {"Signatures": 1, "SignerKeys": [{"Signer": signer}, {"Signer": signer}]}


def test_unknown_signer_fails(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "one-group-signed-pgp.sif")
    result = singpy.run("verify", str(image), env=keys_env(singpy, place))
    assert result.returncode == 255
    assert "signature made by unknown entity" in result.stdout
    assert f"[UNKNOWN]          Fingerprint: {GOLDEN_FINGERPRINT}" in result.stdout
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert fatal == ["FATAL:   Failed to verify container: integrity: signature object 3 not valid: openpgp: "
                     "signature made by unknown entity"]


@pytest.mark.parametrize("key", ["ed25519-public.pem", "rsa-public.pem"])
def test_verifies_apptainers_dsse_image_with_a_public_key(singpy: Singpy, place: Path, key: str) -> None:
    image = golden_copy(singpy, place, "one-group-signed-dsse.sif")
    out = singpy.ok("verify", "--key", str(TRUST / key), str(image), env=keys_env(singpy, place))
    assert f"Signing key: {TRUST / key}" in out
    assert "Key ID: SHA256:" in out and "2   |1       |NONE    |FS\n" in out


def test_dsse_image_with_a_key_that_did_not_sign_fails(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "one-group-signed-dsse.sif")
    result = singpy.run("verify", "--key", str(TRUST / "ecdsa-public.pem"), str(image), env=keys_env(singpy, place))
    assert result.returncode == 255
    assert "FATAL:   Failed to verify container: integrity: signature object 3 not valid: dsse: verify envelope " \
           "failed" in result.stderr


def test_a_signature_nested_thousands_deep_is_one_fatal_line(singpy: Singpy, place: Path) -> None:
    """A signature object of `[[[[…` (Python's JSON parser recurses): not recognized, no traceback."""
    from singpy.signing import sifsig

    image = golden_copy(singpy, place, "one-group-signed-dsse.sif")
    signature = sifsig.load(str(image)).signatures_of_group(1)[0]
    with image.open("r+b") as handle:
        handle.seek(signature.offset)
        handle.write(b"[" * signature.size)
    result = singpy.run("verify", "--key", str(TRUST / "ecdsa-public.pem"), str(image), env=keys_env(singpy, place))
    assert result.returncode == 255 and "Traceback" not in result.stderr, result.stderr
    assert "FATAL:   Failed to verify container: integrity: signature format not recognized" in result.stderr


def test_verifies_apptainers_dsse_image_with_a_certificate_chain(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "one-group-signed-dsse.sif")
    out = singpy.ok("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-intermediates",
                    str(TRUST / "intermediate.pem"), "--certificate-roots", str(TRUST / "root.pem"), str(image),
                    env=keys_env(singpy, place))
    assert "[CERTIFICATE]      Signing certificate: CN=leaf,O=Apptainer,C=US <- CN=intermediate,O=Apptainer,C=US " \
           "<- CN=root,O=Apptainer,C=US" in out


def test_certificate_without_its_intermediate_is_refused(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "one-group-signed-dsse.sif")
    result = singpy.run("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-roots",
                        str(TRUST / "root.pem"), str(image), env=keys_env(singpy, place))
    assert_one_fatal(result, "certificate signed by unknown authority")


def test_legacy_signature_needs_legacy_insecure(singpy: Singpy, place: Path) -> None:
    image = golden_copy(singpy, place, "two-groups-signed-legacy.sif")
    trust_golden_key(singpy, place)
    result = singpy.run("verify", str(image), env=keys_env(singpy, place))
    assert_one_fatal(result, "signature not found for object group 1")
    out = singpy.ok("verify", "--legacy-insecure", str(image), env=keys_env(singpy, place))
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
    image = golden_copy(singpy, place, f"one-group-signed-{kind}.sif")
    trust_golden_key(singpy, place)
    key = ["--key", str(TRUST / "ed25519-public.pem")] if kind == "dsse" else []
    singpy.ok("verify", *key, str(image), env=keys_env(singpy, place))
    _tamper(image, where)
    result = singpy.run("verify", *key, str(image), env=keys_env(singpy, place))
    assert result.returncode == 255, result.stdout
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and "Failed to verify container: integrity:" in fatal[0], result.stderr
    expected = {"partition": "data object integrity compromised: 2",
                "descriptor": "data object descriptor integrity compromised: 1"}.get(where, "not valid")
    assert expected in fatal[0]
    assert "Traceback" not in result.stderr


def _siftool_list(image: Path) -> str:
    assert SIFTOOL
    done = subprocess.run([SIFTOOL, "list", str(image)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pgp_sign_then_verify(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    first, second = new_pgp_key(singpy, place, ["First <first@example.org>", "Second <second@example.org>"])
    result = singpy.run("sign", "--keyidx", "1", str(image), env=keys_env(singpy, place))
    assert result.returncode == 0, result.stderr
    assert f"Signature created and applied to image '{image}'" in result.stderr
    assert "3    |NONE    |1   (G) |" in _siftool_list(image) and "Signature (SHA-256)" in _siftool_list(image)
    out = singpy.ok("verify", str(image), env=keys_env(singpy, place))
    assert "Signing entity: Second <second@example.org>\n" in out and f"Fingerprint: {second}\n" in out
    assert first not in out
    _flip(image, _object(image, 2)[0])
    assert singpy.run("verify", str(image), env=keys_env(singpy, place)).returncode == 255


def test_pgp_sign_picks_a_key_on_stdin(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    _first, second = new_pgp_key(singpy, place, ["First <first@example.org>", "Second <second@example.org>"])
    result = singpy.run("sign", str(image), env=keys_env(singpy, place), input="1\n")
    assert result.returncode == 0, result.stderr
    assert "0) U: First <first@example.org>" in result.stdout and "Enter # of private key to use" in result.stdout
    assert f"Fingerprint: {second}" in singpy.ok("verify", str(image), env=keys_env(singpy, place))


def test_sign_one_object(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    new_pgp_key(singpy, place, ["Solo <solo@example.org>"])
    singpy.ok("sign", "--sif-id", "2", str(image), env=keys_env(singpy, place))
    out = singpy.ok("verify", "--sif-id", "2", str(image), env=keys_env(singpy, place))
    assert "2   |1       |NONE    |FS\n" in out and "1   |1" not in out
    result = singpy.run("verify", str(image), env=keys_env(singpy, place))  # the group as a whole is not signed
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
    image = unsigned_sif(singpy, place)
    private, public = _pem_pair(place, kind)
    singpy.ok("sign", "--key", str(private), str(image), env=keys_env(singpy, place))
    assert "Signature (SHA-256)" in _siftool_list(image)
    out = singpy.ok("verify", "--key", str(public), str(image), env=keys_env(singpy, place))
    assert f"Signing key: {public}" in out and "1   |1       |NONE    |" in out
    other = _pem_pair(_mkdir(place / "other"), "ed25519")[1]
    assert singpy.run("verify", "--key", str(other), str(image), env=keys_env(singpy, place)).returncode == 255


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


def test_encrypted_pem_passphrase_from_stdin(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    private, public = _pem_pair(place, "ed25519", password=b"correct horse")
    before = image.read_bytes()
    result = singpy.run("sign", "--key", str(private), str(image), env=keys_env(singpy, place), input="wrong\n")
    assert_one_fatal(result, "wrong passphrase")
    assert image.read_bytes() == before  # nothing written
    singpy.ok("sign", "--key", str(private), str(image), env=keys_env(singpy, place), input="correct horse\n")
    singpy.ok("verify", "--key", str(public), str(image), env=keys_env(singpy, place))


def test_sign_without_a_secret_key_changes_nothing(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    before = image.read_bytes()
    assert_one_fatal(singpy.run("sign", str(image), env=keys_env(singpy, place)), "keyring is empty")
    assert_one_fatal(singpy.run("sign", "--keyidx", "3", str(image), env=keys_env(singpy, place)), "keyring is empty")
    assert image.read_bytes() == before


def test_unsigned_image_and_bad_inputs_are_one_fatal_line(singpy: Singpy, place: Path) -> None:
    image = unsigned_sif(singpy, place)
    env = keys_env(singpy, place)
    assert_one_fatal(singpy.run("verify", str(image), env=env), "signature not found for object group 1")
    assert_one_fatal(singpy.run("verify", str(place / "missing.sif"), env=env), "missing.sif")
    assert_one_fatal(singpy.run("verify", "--key", str(place / "part1"), str(image), env=env),
                     "Failed to load key material")
    (place / "keys" / "pgp-public").write_bytes(b"\x99\x01garbage")
    own(singpy, place / "keys" / "pgp-public")
    assert_one_fatal(singpy.run("verify", str(image), env=env), "not an OpenPGP keyring")


def test_global_keyring_beside_the_configuration(singpy: Singpy, place: Path) -> None:
    """`--config DIR/singpy.conf` reads DIR/global-pgp-public (root-owned, as an admin installs it)."""
    import pysequoia

    image = golden_copy(singpy, place, "one-group-signed-pgp.sif")
    confdir = place / "site"
    confdir.mkdir(mode=0o755)
    shutil.copyfile(place / "etc" / "singpy.conf", confdir / "singpy.conf")
    cert = pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())
    (confdir / "global-pgp-public").write_bytes(bytes(cert))
    out = singpy.ok("--config", str(confdir / "singpy.conf"), "verify", str(image), env=keys_env(singpy, place))
    assert f"[GLOBAL]           Signing entity: {GOLDEN_SIGNER}\n" in out
    assert "signature made by unknown entity" in singpy.run("verify", str(image), env=keys_env(singpy, place)).stdout


def test_signing_with_apptainers_test_keys_verifies_as_its_golden_image(singpy: Singpy, place: Path) -> None:
    """What singpy signs with Apptainer's RSA test key verifies with that key and with its certificate chain."""
    image = unsigned_sif(singpy, place)
    singpy.ok("sign", "--key", str(TRUST / "rsa-private.pem"), str(image), env=keys_env(singpy, place))
    singpy.ok("verify", "--key", str(TRUST / "rsa-public.pem"), str(image), env=keys_env(singpy, place))
    out = singpy.ok("verify", "--certificate", str(TRUST / "leaf.pem"), "--certificate-intermediates",
                    str(TRUST / "intermediate.pem"), "--certificate-roots", str(TRUST / "root.pem"), str(image),
                    env=keys_env(singpy, place))
    assert "Signing certificate: CN=leaf,O=Apptainer,C=US" in out
    result = singpy.run("verify", "--key", str(TRUST / "ed25519-public.pem"), str(image), env=keys_env(singpy, place))
    assert result.returncode == 255 and "dsse: verify envelope failed" in result.stderr

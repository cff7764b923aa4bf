"""singpy.signing on Apptainer's golden signed images: the signed metadata byte for byte, and `signer_fingerprints`
(the question the execution control list and `Fingerprints:` ask), against real keyring files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from singpy.errors import SingpyError
from singpy.signing import sifsig, verify

TRUST = Path(__file__).resolve().parent.parent / "data" / "sif-trust"
GOLDEN = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"


def test_metadata_is_what_apptainer_signed() -> None:
    image = sifsig.load(str(TRUST / "one-group-signed-pgp.sif"))
    signed = image.read(image.signatures_of_group(1)[0])
    ours = sifsig.image_metadata(image, 1, image.group_objects(1))
    assert b"\n" + ours + b"\n" in signed  # the clear-signed text is exactly our JSON


def test_signature_descriptor_names_hash_and_signer() -> None:
    image = sifsig.load(str(TRUST / "one-group-signed-pgp.sif"))
    assert sifsig.signature_metadata(image.signatures_of_group(1)[0]) == ("sha256", bytes.fromhex(GOLDEN))
    dsse_image = sifsig.load(str(TRUST / "one-group-signed-dsse.sif"))
    assert sifsig.signature_metadata(dsse_image.signatures_of_group(1)[0]) == ("sha256", b"")


@pytest.fixture
def keyrings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty user keyring directory and configuration directory, for this test alone."""
    keys, conf = tmp_path / "keys", tmp_path / "conf"
    keys.mkdir()
    conf.mkdir()
    monkeypatch.setenv("APPTAINER_KEYSDIR", str(keys))
    for name in ("SINGPY_KEYSDIR", "SINGULARITY_SYPGPDIR"):
        monkeypatch.delenv(name, raising=False)
    return keys, conf


def _golden_public(into: Path) -> None:
    import pysequoia

    into.write_bytes(bytes(pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())))


def test_signer_fingerprints_from_either_keyring(keyrings: tuple[Path, Path]) -> None:
    keys, conf = keyrings
    image = str(TRUST / "one-group-signed-pgp.sif")
    assert verify.signer_fingerprints(image, config_dir=str(conf)) == []  # signed, by no key we know
    _golden_public(conf / "global-pgp-public")
    assert verify.signer_fingerprints(image, config_dir=str(conf)) == [GOLDEN]
    (conf / "global-pgp-public").unlink()
    _golden_public(keys / "pgp-public")
    assert verify.signer_fingerprints(image, config_dir=str(conf)) == [GOLDEN]
    assert verify.signer_fingerprints(image, config_dir=str(conf), global_only=True) == []


def test_signer_fingerprints_legacy_and_unsigned(keyrings: tuple[Path, Path]) -> None:
    _keys, conf = keyrings
    _golden_public(conf / "global-pgp-public")
    legacy = str(TRUST / "two-groups-signed-legacy.sif")
    assert verify.signer_fingerprints(legacy, config_dir=str(conf)) == []  # no current signature
    assert verify.signer_fingerprints(legacy, legacy=True, config_dir=str(conf)) == [GOLDEN]
    assert verify.signer_fingerprints(str(TRUST / "one-group-signed-dsse.sif"), config_dir=str(conf)) == []


@pytest.mark.parametrize(("offset_of", "message"), [
    (lambda image: image.by_id(2).offset, "data object integrity compromised: 2"),
    (lambda image: 4096 + 73, "descriptor integrity compromised: 1"),
    (lambda image: image.by_id(3).offset + 200, "integrity"),
])
def test_signer_fingerprints_raises_on_a_tampered_image(keyrings: tuple[Path, Path], tmp_path: Path,
                                                        offset_of: object, message: str) -> None:
    _keys, conf = keyrings
    _golden_public(conf / "global-pgp-public")
    copy = tmp_path / "image.sif"
    shutil.copyfile(TRUST / "one-group-signed-pgp.sif", copy)
    offset = offset_of(sifsig.load(str(copy)))  # type: ignore[operator]
    data = bytearray(copy.read_bytes())
    data[offset] ^= 0x01
    copy.write_bytes(bytes(data))
    with pytest.raises(SingpyError, match=message):
        verify.signer_fingerprints(str(copy), config_dir=str(conf))


@pytest.mark.parametrize("payload", [b"not json", b'{"version":1}', b'{"version":1,"header":{"digest":"sha256:00"},'
                                     b'"objects":[1,"x"]}', b'{"version":1,"header":{"digest":"md5:00"},"objects":[]}'])
def test_validly_signed_garbage_metadata_is_one_error(tmp_path: Path, payload: bytes) -> None:
    """A signature that verifies over metadata that is not what Apptainer writes: refused, never a crash."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from singpy.image import sif, sifwrite
    from singpy.signing import dsse

    copy = tmp_path / "image.sif"
    shutil.copyfile(TRUST / "one-group-signed-dsse.sif", copy)
    sifwrite.delete_object(copy, 3)
    key = ed25519.Ed25519PrivateKey.generate()
    sifwrite.add_object(copy, sifwrite.SifObject(datatype=sif.DATA_SIGNATURE, data=dsse.sign_envelope(payload, key),
                                                 group=0, link=1, link_is_group=True, extra=sifsig.signature_extra(1)))
    material = verify.KeyMaterial(keys=(dsse.PublicKey(key.public_key(), "test"),))
    with pytest.raises(sifsig.IntegrityError, match="integrity: "):
        verify.verify(str(copy), material)


def _primary_body(cert: object) -> bytes:
    from pysequoia.packet import PacketPile, Tag

    return bytes(next(packet for packet in PacketPile.from_bytes(bytes(cert))  # type: ignore[call-overload]
                      if packet.tag == Tag.PublicKey).body)


@pytest.mark.parametrize(("profile", "bits"), [("golden", 2048), ("RFC4880", 263), ("RFC9580", 256)])
def test_key_bit_length_is_go_cryptos(profile: str, bits: int) -> None:
    """`key list`'s "Length (in bits)" as Apptainer's go-crypto counts it: RSA the modulus, a legacy EdDSA key the
    MPI of its prefixed point (263), a v6 Ed25519 key its size (256)."""
    import warnings

    import pysequoia

    from singpy.signing import keystore

    if profile == "golden":
        cert = pysequoia.Cert.from_file(str(TRUST / "private.asc"))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            cert = pysequoia.Cert.generate("Bits <bits@example.org>", profile=getattr(pysequoia.Profile, profile))
    assert keystore.bit_length(_primary_body(cert)) == bits
    assert keystore.describe(0, cert).endswith(f"    Length (in bits):  {bits}\n")


@pytest.mark.parametrize("body", [b"", b"\x04\x00\x00\x00\x00\x01\x08", b"\x05" + bytes(10), b"\x04\0\0\0\0\x63\0\x10"])
def test_a_key_body_that_says_too_little_has_no_bit_length(body: bytes) -> None:
    from singpy.signing import keystore

    assert keystore.bit_length(body) == 0

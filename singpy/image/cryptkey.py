"""The key material of encrypted images, as Apptainer's pkg/util/cryptkey handles it.

Where it comes from (Apptainer's getEncryptionMaterial, in its order of
precedence): --pem-path, --passphrase (asked on the terminal), then the
variables ENCRYPTION_PEM_PATH, ENCRYPTION_PEM_DATA and ENCRYPTION_PASSPHRASE
(APPTAINER_, SINGULARITY_ or SINGPY_ prefixed).

What it unlocks: a gocryptfs filesystem whose password is the passphrase
itself, or, with an RSA key, a random password stored in the SIF encrypted
with the public key (RSA-OAEP with SHA-256, in chunks, wrapped in an ASN.1
OCTET STRING in a PEM "MESSAGE" block: a Cryptographic Message object linked
to the primary partition, format PEM, message RSA-OAEP).

The secret never enters a plan or a file: the plan names where it came from
(`KeyInfo.source`), and the bytes stay in this process (`hold`, `held`), passed
to gocryptfs on a pipe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.record import Record

PASSPHRASE, PEM = "passphrase", "pem"
FORMAT_PEM = 2  # the SIF's FormatPEM and MessageRSAOAEP (apptainer/sif pkg/sif/descriptor.go)
MESSAGE_RSA_OAEP = 0x200
_HASH_SIZE = 32  # SHA-256: each OAEP chunk holds key size - 2 * 32 - 2 bytes
_PREFIXES = ("APPTAINER_", "SINGULARITY_", "SINGPY_")
_held: dict[str, bytes] = {}
# gocryptfs's own limit; the key is written to a helper's pipe before the helper reads it, which a pipe's
# 64 KiB would block, and a line of stdin is read no further than this
MAX_PASSPHRASE = 2048


class KeyInfo(Record):
    """Which key, described without its secret (what a plan or a log may show)."""

    format: str  # PASSPHRASE or PEM
    source: str  # where it came from: "--passphrase", "APPTAINER_ENCRYPTION_PASSPHRASE", a PEM file's path
    path: str = ""  # PEM: the key file ("" with ENCRYPTION_PEM_DATA)


def _variable(env: Mapping[str, str], suffix: str) -> tuple[str, str] | None:
    for prefix in _PREFIXES:
        if f"{prefix}{suffix}" in env:
            return f"{prefix}{suffix}", env[f"{prefix}{suffix}"]
    return None


def material(env: Mapping[str, str], *, prompt: bool, pem_path: str, public: bool) -> KeyInfo | None:
    """The key asked for, if any; its secret held in this process. `public`: a build's (RSA public) key."""
    if pem_path:
        _load_pem(pem_path, public=public)  # a bad key is refused before anything starts (Apptainer #4173)
        return KeyInfo(format=PEM, source=pem_path, path=os.path.abspath(pem_path))
    if prompt:
        return _hold(KeyInfo(format=PASSPHRASE, source="--passphrase"), _ask())
    if (found := _variable(env, "ENCRYPTION_PEM_PATH")) is not None:
        _load_pem(found[1], public=public)
        return KeyInfo(format=PEM, source=found[0], path=os.path.abspath(found[1]))
    if (found := _variable(env, "ENCRYPTION_PEM_DATA")) is not None:
        return _hold(KeyInfo(format=PEM, source=found[0]), found[1].encode())
    if (found := _variable(env, "ENCRYPTION_PASSPHRASE")) is not None:
        if not found[1]:
            raise ImageError(f"{found[0]} is empty: an encrypted image needs a passphrase")
        return _hold(KeyInfo(format=PASSPHRASE, source=found[0]), _bounded(found[1].encode(), found[0]))
    return None


def _hold(key: KeyInfo, secret: bytes) -> KeyInfo:
    _held[key.source] = secret
    return key


def held(key: KeyInfo) -> bytes:
    """The secret of a KeyInfo made by `material` in this process (a passphrase, or PEM data)."""
    return _held[key.source]


def _ask() -> bytes:
    """The passphrase from the terminal, not echoed; without one, a line of stdin (as Apptainer's prompt)."""
    import sys

    prompt = "Enter encryption passphrase: "
    if sys.stdin is None:  # descriptor 0 closed (singpy.cli.main reopens it on /dev/null: an empty answer)
        raise ImageError("cannot use an empty passphrase for an encrypted container")
    try:
        if sys.stdin.isatty():
            import getpass

            answer = getpass.getpass(prompt)
        else:
            sys.stderr.write(prompt)
            answer = sys.stdin.readline(MAX_PASSPHRASE + 2).rstrip("\n")
            sys.stderr.write("\n")
    except (EOFError, OSError, UnicodeDecodeError):
        answer = ""
    if not answer:
        raise ImageError("cannot use an empty passphrase for an encrypted container")
    return _bounded(answer.encode(), "the passphrase")


def _bounded(secret: bytes, source: str) -> bytes:
    if len(secret) > MAX_PASSPHRASE:
        raise ImageError(f"{source} is longer than {MAX_PASSPHRASE} bytes, the most gocryptfs takes")
    return secret


def _pem_bytes(key: KeyInfo | str) -> tuple[bytes, str]:
    from singpy.host.hostfiles import read_text

    if isinstance(key, str):
        return read_text(key, what="the PEM key file", error=ImageError).encode(), key
    if key.path:
        return read_text(key.path, what="the PEM key file", error=ImageError).encode(), key.path
    return held(key), key.source


def _load_pem(key: KeyInfo | str, *, public: bool):  # type: ignore[no-untyped-def]
    """An RSA key in Apptainer's PEM forms (PKCS#1; a SubjectPublicKeyInfo or PKCS#8 too)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    data, shown = _pem_bytes(key)
    kind = "public" if public else "private"
    try:
        loaded = (serialization.load_pem_public_key(data) if public
                  else serialization.load_pem_private_key(data, password=None))
    except (ValueError, TypeError) as error:
        reason = ("passphrase protected PEM files are not supported" if b"ENCRYPTED" in data
                  else f"not an RSA {kind} key in PEM format ({console.escape(str(error).split('.')[0])})")
        raise ImageError(f"invalid encryption {kind} key {shown}: {reason}") from None
    if not isinstance(loaded, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        raise ImageError(f"invalid encryption {kind} key {shown}: not an RSA key")
    return loaded


def encrypt_password(key: KeyInfo, password: bytes) -> bytes:
    """The Cryptographic Message a PEM-encrypted SIF carries: `password` for the RSA public key's owner."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    public = _load_pem(key, public=True)
    step = public.key_size // 8 - 2 * _HASH_SIZE - 2
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    sealed = b"".join(public.encrypt(password[i:i + step], oaep) for i in range(0, len(password), step))
    return _pem_message(sealed)


def decrypt_password(key: KeyInfo, message: bytes, image: str) -> bytes:
    """The gocryptfs password sealed in `message` (the SIF's), opened with the RSA private key."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    private = _load_pem(key, public=False)
    sealed = _read_pem_message(message, image)
    step = private.key_size // 8
    oaep = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    try:
        return b"".join(private.decrypt(sealed[i:i + step], oaep) for i in range(0, len(sealed), step))
    except ValueError:
        raise ImageError(f"can't decrypt {image}: the key {key.source} is not the one it was encrypted for") from None


def _pem_message(data: bytes) -> bytes:
    """Go's asn1.Marshal([]byte) (an OCTET STRING) in a PEM block of type MESSAGE (cryptkey.savePEMMessage)."""
    import base64

    n = len(data)
    length = bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes(
        (n.bit_length() + 7) // 8, "big")
    body = base64.b64encode(b"\x04" + length + data).decode()
    lines = [body[i:i + 64] for i in range(0, len(body), 64)]
    return ("-----BEGIN MESSAGE-----\n" + "\n".join(lines) + "\n-----END MESSAGE-----\n").encode()


def _read_pem_message(message: bytes, image: str) -> bytes:
    import base64
    import binascii

    bad = ImageError(f"can't decrypt {image}: its encrypted key is not a PEM message")
    text = message.decode("ascii", errors="replace")
    begin, end = text.find("-----BEGIN MESSAGE-----"), text.find("-----END MESSAGE-----")
    if begin < 0 or end < begin:
        raise bad
    try:
        der = base64.b64decode("".join(text[begin + 23:end].split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad from None
    if len(der) < 2 or der[0] != 0x04:
        raise bad
    n, at = der[1], 2
    if n & 0x80:
        width = n & 0x7F
        n, at = int.from_bytes(der[2:2 + width], "big"), 2 + width
    if at + n != len(der):
        raise bad
    return der[at:]

"""Apptainer's OpenPGP keyrings, read and written (internal/pkg/sypgp), on Sequoia (pysequoia): no packet code here.

    ~/.apptainer/keys/pgp-public     the user's public keys (binary keyring, mode 0600, directory 0700);
    ~/.apptainer/keys/pgp-secret     the user's secret keys (mode 0600, never anything else);
    DIR/global-pgp-public            the site's public keys (root's, 0644), DIR being the directory of the
                                     configuration in use (`--config DIR/singpy.conf`): the keys whose
                                     signatures the execution control list (singpy.signing.ecl) accepts.

Where they are and how they are read is singpy.signing.keyring's (`--keysdir` names another directory). A
keyring is rewritten whole: a new file, created with its final mode, renamed over the old one, so a reader
never sees half of it and a secret key is never readable by others, not even for a moment. Keys come from
others (files, keyservers): they are parsed by Sequoia, and their user IDs escaped before they are shown
(singpy.console.escape).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from singpy.errors import SingpyError

if TYPE_CHECKING:
    from pysequoia import Cert, Tsk

PUBLIC, SECRET, GLOBAL_PUBLIC = "pgp-public", "pgp-secret", "global-pgp-public"  # as singpy.signing.keyring
BITS = (2048, 3072, 4096)  # the RSA sizes Sequoia's cipher suites offer


class KeystoreError(SingpyError):
    """A keyring that can't be read or written, a key that is not there or not valid OpenPGP."""


class Keyring:
    """The files of one keyring: the user's pair, or the global public one (`global_`)."""

    def __init__(self, directory: str, *, global_: bool = False) -> None:
        self.directory = directory
        self.global_ = global_

    @property
    def public_path(self) -> str:
        return os.path.join(self.directory, GLOBAL_PUBLIC if self.global_ else PUBLIC)

    @property
    def secret_path(self) -> str:
        if self.global_:
            raise KeystoreError("the global keyring holds public keys only")
        return os.path.join(self.directory, SECRET)

    def public_mode(self) -> int:
        return 0o644 if self.global_ else 0o600  # every user verifies with the global keys


def user_keyring(env: Mapping[str, str], keysdir: str = "") -> Keyring:
    """The user's keyring: `--keysdir`, else where singpy.signing.keyring (Apptainer's syfs) says."""
    from singpy.signing import keyring

    return Keyring(os.path.abspath(keysdir or keyring.keys_dir(env)))


def global_keyring(env: Mapping[str, str]) -> Keyring:
    """The public keyring beside the configuration in use (`--config` sets SINGPY_CONFIG: singpy.cli.main)."""
    from singpy.signing import keyring

    return Keyring(keyring.config_dir(env), global_=True)


def _read(path: str) -> bytes:
    from singpy.signing import keyring

    try:
        return keyring.read_bytes(path)
    except keyring.KeyringError as error:
        raise KeystoreError(str(error)) from None


def parse(data: bytes, where: str) -> tuple[list[Cert], list[Tsk]]:
    """The public certificates and secret keys in `data` (binary or ASCII-armored, one or many)."""
    import pysequoia
    from pysequoia.packet import PacketPile, Tag

    if not data.strip():
        return [], []
    try:
        packets = list(PacketPile.from_bytes(data))
        groups: list[list[object]] = []
        for packet in packets:  # a transferable key starts at its primary key packet (RFC 9580 10.1)
            if packet.tag in (Tag.PublicKey, Tag.SecretKey):
                groups.append([])
            elif not groups:
                raise ValueError("the data does not start with a key")
            groups[-1].append(packet)
        secrets = [pysequoia.Tsk.from_packets(group) for group in groups  # type: ignore[arg-type]
                   if group[0].tag == Tag.SecretKey]  # type: ignore[attr-defined]
        publics = [pysequoia.Cert.from_packets(group) for group in groups  # type: ignore[arg-type]
                   if group[0].tag == Tag.PublicKey]  # type: ignore[attr-defined]
    except (ValueError, TypeError, RuntimeError) as error:
        raise KeystoreError(f"{where} holds no valid OpenPGP key: {_first_line(error)}") from None
    return [*publics, *(tsk.extract_certificate() for tsk in secrets)], secrets


def _first_line(error: BaseException) -> str:
    from singpy.console import escape

    return escape(str(error).splitlines()[0] if str(error) else type(error).__name__)


def load_public(keyring: Keyring) -> list[Cert]:
    publics, _ = parse(_read(keyring.public_path), keyring.public_path)
    return publics


def load_secret(keyring: Keyring) -> list[Tsk]:
    _, secrets = parse(_read(keyring.secret_path), keyring.secret_path)
    return secrets


def fingerprint(key: Cert | Tsk) -> str:
    """The primary key's fingerprint as Apptainer prints it: 40 uppercase hex digits."""
    cert = key.extract_certificate() if hasattr(key, "extract_certificate") else key
    return str(cert.fingerprint).upper()


def matches(key: Cert | Tsk, query: str) -> bool:
    """A fingerprint (40 hex digits) or a key ID (its last 16), with or without 0x, any case."""
    query = query.upper().removeprefix("0X")
    return len(query) in (16, 40) and fingerprint(key).endswith(query)


def merged(existing: Sequence[Cert], new: Iterable[Cert]) -> list[Cert]:
    """`existing` with `new` added; a key already there gets the new one's signatures and user IDs merged in."""
    out = list(existing)
    for cert in new:
        index = next((i for i, old in enumerate(out) if fingerprint(old) == fingerprint(cert)), None)
        if index is None:
            out.append(cert)
        else:
            out[index] = out[index].merge(cert)
    return out


def store_public(keyring: Keyring, certs: Sequence[Cert]) -> None:
    write(keyring.public_path, b"".join(bytes(cert) for cert in certs), keyring.public_mode())


def store_secret(keyring: Keyring, keys: Sequence[Tsk]) -> None:
    write(keyring.secret_path, b"".join(bytes(key) for key in keys), 0o600)


def write(path: str, data: bytes, mode: int) -> None:
    """The file replaced whole by `data`, created with `mode` (its directory made 0700 if missing)."""
    from singpy.host.cachefiles import publish

    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        publish(path, data, mode=mode, durable=True)  # 0600 until written, O_EXCL | O_NOFOLLOW
    except OSError as error:
        raise KeystoreError(f"can't write the keyring {path}: {error.strerror}") from None


def describe(index: int, cert: Cert) -> str:
    """One key as `singpy key list` shows it (Apptainer's printEntity)."""
    from pysequoia.packet import PacketPile, Tag

    from singpy.console import escape

    pad = " " * len(f"{index})")
    users = [escape(str(user)) for user in cert.user_ids] or ["(none)"]
    lines = [f"{index}){' ' if index < 10 else ''} User:              {users[0]}",
             *(f"{pad}  User:              {user}" for user in users[1:])]
    primary = next(packet for packet in PacketPile.from_bytes(bytes(cert)) if packet.tag == Tag.PublicKey)
    created = primary.key_created
    lines += [f"{pad}  Creation time:     {created:%Y-%m-%d %H:%M:%S %z}" if created else "",
              f"{pad}  Fingerprint:       {fingerprint(cert)}",
              f"{pad}  Length (in bits):  {bit_length(bytes(primary.body))}"]
    return "\n".join(line for line in lines if line) + "\n"


# The key algorithms (RFC 9580 9.1) whose public key starts with an MPI (RSA, ElGamal, DSA), with a curve OID
# then an MPI (ECDH, ECDSA, EdDSALegacy), and those of a fixed size (X25519, X448, Ed25519, Ed448: bytes).
_FIRST_MPI = {1, 2, 3, 16, 17}
_OID_THEN_MPI = {18, 19, 22}
_FIXED_BYTES = {25: 32, 26: 56, 27: 32, 28: 57}


def bit_length(body: bytes) -> int:
    """The public key's length in bits as Apptainer prints it (go-crypto's PublicKey.BitLength: the first MPI's
    bit count, the curve point's for ECC keys, the key size for the fixed-size ones); 0 when it can't tell.

    Sequoia parsed the packet and exposes its body, not this number: it is read from the body's fields (version,
    creation time, algorithm, [v6: material length], then the algorithm's key material), never trusted beyond
    its length."""
    if len(body) < 6 or body[0] not in (4, 6):
        return 0
    algorithm, start = body[5], 6 if body[0] == 4 else 10
    if algorithm in _FIXED_BYTES:
        return _FIXED_BYTES[algorithm] * 8
    if algorithm in _OID_THEN_MPI and len(body) > start:
        start += 1 + body[start]
    elif algorithm not in _FIRST_MPI:
        return 0
    return int.from_bytes(body[start:start + 2], "big") if len(body) >= start + 2 else 0


def generate(user_id: str, bits: int, passphrase: str = "") -> Tsk:
    """A new key pair: an RSA primary key of `bits` (Apptainer's default 4096) that signs and certifies, with an
    encryption subkey; protected by `passphrase` when one is given (then made by gpg: see `_gpg_generate`)."""
    import pysequoia

    suites = {2048: pysequoia.CipherSuite.RSA2k, 3072: pysequoia.CipherSuite.RSA3k, 4096: pysequoia.CipherSuite.RSA4k}
    if bits not in suites:
        raise KeystoreError(f"unsupported key bit length {bits}: choose 2048, 3072 or 4096")
    if passphrase:
        _, secrets = parse(_gpg_generate(user_id, bits, passphrase), "the key gpg made")
        if len(secrets) != 1:
            raise KeystoreError("gpg did not export the one secret key it was asked to make")
        return secrets[0]
    return pysequoia.Tsk.generate(user_id, cipher_suite=suites[bits])


def _gpg_generate(user_id: str, bits: int, passphrase: str) -> bytes:
    """A passphrase-protected secret key, made by the host's gpg: Sequoia's Python bindings (pysequoia 0.1.35)
    can't encrypt secret keys. In a private GnuPG home of its own (0700, under TMPDIR), the passphrase on a pipe,
    never in argv; the home and its agent are gone when this returns, however it ends."""
    import shutil
    import subprocess
    import tempfile

    from singpy.host.hostfiles import which

    path = os.environ.get("PATH", "/usr/bin:/bin")
    gpg, gpgconf = which("gpg", path), which("gpgconf", path)
    if gpg is None or gpgconf is None:
        raise KeystoreError("a passphrase-protected key is made by gpg, which is not installed (apt-get install "
                            "gnupg): install it, or leave the passphrase empty")
    home = tempfile.mkdtemp(prefix="singpy-gpg-")
    base = [gpg, "--homedir", home, "--batch", "--no-tty", "--quiet", "--pinentry-mode", "loopback",
            "--passphrase-fd", "0"]

    def run(*args: str) -> bytes:
        done = subprocess.run([*base, *args], input=passphrase.encode() + b"\n", capture_output=True,
                              timeout=600, check=False)
        if done.returncode != 0:
            said = _first_line(RuntimeError(done.stderr.decode(errors="replace").strip()))
            raise KeystoreError(f"gpg could not make the key: {said}")
        return done.stdout

    try:
        run("--quick-generate-key", user_id, f"rsa{bits}", "sign,cert", "never")
        listing = run("--with-colons", "--list-secret-keys").decode()
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        run("--quick-add-key", fingerprint, f"rsa{bits}", "encr", "never")
        return run("--export-secret-keys", fingerprint)
    finally:
        subprocess.run([gpgconf, "--homedir", home, "--kill", "all"], capture_output=True, timeout=60, check=False)
        shutil.rmtree(home, ignore_errors=True)


def read_file(path: str) -> bytes:
    """A key file named by the user: bounded, never a FIFO or device (b"" when it does not exist)."""
    return _read(path)


def needs_passphrase(key: Tsk) -> bool:
    try:
        key.signer(None)
    except (ValueError, TypeError, RuntimeError):
        return True
    return False


def check_passphrase(key: Tsk, passphrase: str) -> None:
    """KeystoreError unless `passphrase` unlocks the signing key."""
    try:
        key.signer(passphrase)
    except (ValueError, TypeError, RuntimeError) as error:
        raise KeystoreError(f"wrong passphrase for key {fingerprint(key)}: {_first_line(error)}") from None

"""OpenPGP clear-signed messages: signing with Sequoia (pysequoia), verifying with the host's `gpgv`.

Why two tools: Sequoia's policy checks that the signing key was valid *when it signed*, and
Apptainer's own test key (apptainer/sif `test/keys/private.asc`) got its user ID
self-signature two years after the golden images were signed, so Sequoia rejects images that
Apptainer (Go's openpgp) and GnuPG accept; pysequoia 0.1.35 exposes no policy or time to relax
it. `gpgv` (GnuPG's verify-only tool, in Debian's base system) accepts them as Apptainer does,
reads a plain keyring file, keeps no state and never starts an agent. Keys are read and
signatures made with pysequoia (no OpenPGP packet code of singpy's own, no gpg-agent).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import NamedTuple

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from pysequoia import Cert, Tsk

CLEARSIGN_BEGIN = b"-----BEGIN PGP SIGNED MESSAGE-----"
_STATUS = "[GNUPG:] "
_GPGV_TIMEOUT = 60


class PgpError(SingpyError):
    """An OpenPGP signature could not be made or checked."""


class UnknownSignerError(PgpError):
    """No key given made the signature."""

    keyid = ""  # the signature's issuer key ID (16 hex digits), as gpgv names it: what a keyserver is asked for


class PgpResult(NamedTuple):
    fingerprint: str  # the signing key's primary fingerprint, uppercase hex
    plaintext: bytes  # what it signed


def is_clearsigned(data: bytes) -> bool:
    return data.lstrip().startswith(CLEARSIGN_BEGIN)


def _gpgv() -> str:
    from singpy.host.hostfiles import which

    path = which("gpgv", os.environ.get("PATH") or "/usr/bin:/bin")
    if not path:
        raise PgpError("gpgv not found in PATH: it is needed to verify OpenPGP signatures",
                       hint="install GnuPG's gpgv (Debian, Ubuntu: apt install gpgv)")
    return path


def _status(stderr: bytes) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith(_STATUS):
            word, _, rest = line[len(_STATUS):].partition(" ")
            found.setdefault(word, rest.split())
    return found


def verify_clearsigned(message: bytes, certs: list[Cert]) -> PgpResult:
    """Check a clear-signed message against `certs`; PgpError says unknown signer or bad signature."""
    with tempfile.TemporaryDirectory(prefix="singpy-gpgv-") as home:
        keyring = os.path.join(home, "keyring.gpg")
        with open(keyring, "wb") as f:
            for cert in certs:
                f.write(bytes(cert))  # bytes() of a Cert is its public part, binary
        signed = os.path.join(home, "message.asc")
        with open(signed, "wb") as f:
            f.write(message)
        argv = [_gpgv(), "--homedir", home, "--keyring", keyring, "--status-fd", "2", "--output", "-", signed]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=_GPGV_TIMEOUT,
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PgpError(f"can't run gpgv: {e}") from None
    status = _status(done.stderr)
    if "VALIDSIG" in status and "GOODSIG" in status and done.returncode == 0:
        return PgpResult(status["VALIDSIG"][-1].upper(), done.stdout)
    if "BADSIG" in status:
        raise PgpError("openpgp: invalid signature: hash tag doesn't match")
    if "NO_PUBKEY" in status or ("ERRSIG" in status and status["ERRSIG"][-1:] == ["9"]):
        unknown = UnknownSignerError("openpgp: signature made by unknown entity")
        unknown.keyid = (status.get("NO_PUBKEY") or status.get("ERRSIG") or [""])[0].upper()
        raise unknown
    if "NODATA" in status:
        raise PgpError("clearsigned message not found")
    raise PgpError("openpgp: signature not valid")


def secret_part(cert: Cert) -> Tsk:
    """The secret key material of a certificate read from a secret keyring."""
    tsk = cert.secrets
    if tsk is None:
        raise PgpError(f"key {str(cert.fingerprint).upper()} has no secret key material")
    return tsk


def clearsign(data: bytes, tsk: Tsk, passphrase: str | None = None) -> bytes:
    """A clear-signed message of `data` by a secret key (decrypted with `passphrase` if it is locked)."""
    from pysequoia import SignatureMode, sign

    try:
        signer = tsk.signer(passphrase)
    except (RuntimeError, ValueError):
        raise PgpError("can't unlock the secret key: wrong passphrase" if passphrase is not None
                       else "the secret key is locked: a passphrase is needed") from None
    try:
        return bytes(sign(signer, data, mode=SignatureMode.CLEAR))
    except (RuntimeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PgpError(f"can't sign: {reason}") from None


def needs_passphrase(tsk: Tsk) -> bool:
    """Whether the secret key is locked (getting a signer without a passphrase fails)."""
    try:
        tsk.signer()
    except (RuntimeError, ValueError):
        return True
    return False

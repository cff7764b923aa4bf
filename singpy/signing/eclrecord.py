"""Verdicts of the execution control list, recorded so that the next launch of the same image skips the verification.

Verifying a signed SIF on every launch (singpy.signing.verify: the SIF and OpenPGP code, the keyring parsed by
pysequoia, a `gpgv` run) costs tens of milliseconds; an active ECL pays it before every exec. A launch that the
ECL allowed leaves a record, and a later launch that finds the same record and the same image content is
allowed without verifying again. What the record is keyed by, and recomputed on every launch:

- its name: a digest of the ECL file's bytes, the global keyring's bytes, the configuration directory, the
  image's real path (dirpath rules) and singpy's version: a change to any of them is another record;
- its content: the digest of the whole image file as it was when it was verified (header, descriptors, signed
  objects and signatures: every byte), compared with the image's digest computed again now, and a time after
  which it no longer counts (a day at most, earlier if a signer's key expires before).

Only an allowed launch is recorded: every refusal (no signature, a tampered object, a wrong or unknown signer,
a blacklisted key, a dirpath rule) is decided in full every time. The records live in the caller's own cache
(`SINGPY_CACHEDIR`...`/ecl-verdicts`; root's is root's), checked with cachefiles.check_owned (no component
writable by anyone else) before one is believed, and a file is believed only if it is the caller's or root's.
What a record can and cannot let someone skip is in docs/security.md ("Execution control list").

`allowed` is the launch's first question (singpy.launch.launch): it reads the ECL file as the full check does
(singpy.signing.eclfile) and the global keyring's bytes, and hashes the image, importing neither the rules
(singpy.signing.ecl, tomllib) nor the verification (pysequoia, gpgv). The hash is the builtin BLAKE2 (hashlib's
OpenSSL costs 2 ms to load; it is used for images of 8 MiB and more, where its speed pays for it), read through
a 64 KiB buffer.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from _hashlib import _HashObject
    from collections.abc import Sequence

SUBDIR = "ecl-verdicts"
MAX_AGE = 24 * 3600  # seconds a record counts at most: what the key does not cover (gpgv, the clock) is rechecked
_TAG = b"singpy-ecl-verdict-1"
_OPENSSL_FROM = 8 << 20  # images at least this big are hashed with OpenSSL's SHA-256, faster than BLAKE2 here
_CHUNK = 64 << 10  # a buffer that stays in the CPU cache: 1 MiB ones cost 1 ms more per MiB (page faults)


def _blake2b(digest_size: int = 32) -> _HashObject:
    try:
        from _blake2 import blake2b
    except ImportError:  # an interpreter without the builtin module: hashlib's
        from hashlib import blake2b
    return blake2b(digest_size=digest_size)


def record_name(config_dir: str, ecl_text: bytes, keyring: bytes, image: str) -> str:
    """The record's file name: every input of the verdict except the image's content (each length-prefixed)."""
    from singpy import __version__

    digest = _blake2b()
    for part in (_TAG, __version__.encode(), os.fsencode(config_dir), ecl_text, keyring, os.fsencode(image)):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def image_digest(path: str) -> str:
    """"ALGORITHM:HEX" of every byte of the image file ("" if it can't be read whole: then nothing is recorded)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        digest: _HashObject
        if os.fstat(fd).st_size >= _OPENSSL_FROM:
            import hashlib

            name, digest = "sha256", hashlib.sha256()
        else:
            name, digest = "blake2b", _blake2b()
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while True:
            count = os.readv(fd, [buffer])
            if not count:
                break
            digest.update(view[:count])
        return f"{name}:{digest.hexdigest()}"
    except OSError:
        return ""
    finally:
        os.close(fd)


def allowed(image: str, config_path: str, records: str) -> bool:
    """Whether a record in `records` (the caller's cache) lets this launch skip the ECL check (False: do it).

    The ECL file is read and checked as the full check reads it (singpy.signing.eclfile: an untrusted file is the
    same EclError), but not parsed: its bytes name the record."""
    import time

    from singpy.signing.eclfile import path_for, read_trusted

    path = path_for(config_path)
    data = read_trusted(path)
    real = os.path.realpath(image)
    verdicts = open_for(records, path, data, real)
    return verdicts is not None and verdicts.allows(real, time.time())


def open_for(records: str, ecl_path: str, ecl_text: bytes, image: str) -> Verdicts | None:
    """The record of this ECL (its bytes), its global keyring and this image path (real) in `records`; None when the
    keyring can't be read (the full check will say why)."""
    from singpy.errors import SingpyError
    from singpy.signing import keyring

    config_dir = os.path.dirname(ecl_path)
    keyring_path = keyring.global_public_path(config_dir)
    try:
        keys = keyring.read_bytes(keyring_path, roots_only=True)  # as the full check reads it
    except SingpyError:
        return None
    name = record_name(config_dir, ecl_text, keys, image)
    return Verdicts(os.path.join(records, SUBDIR), name, keyring_path, keys)


class Verdicts:
    """The caller's records in `directory`, for one (ECL, keyring, configuration, image path)."""

    def __init__(self, directory: str, name: str, keyring_path: str, keyring: bytes) -> None:
        self.directory = directory
        self.path = os.path.join(directory, name)
        self.keyring_path, self.keyring = keyring_path, keyring  # the global keyring the name was computed from
        self.digest = ""  # the image's digest, once computed in this launch

    def _trusted_directory(self) -> bool:
        """Whether the directory passes check_owned (False: records are neither believed nor written)."""
        from singpy.errors import SingpyError
        from singpy.host.cachefiles import check_owned

        try:
            check_owned(self.directory, what="ECL verdict directory")
        except SingpyError:
            return False
        return True

    def allows(self, image: str, now: float) -> bool:
        """Whether a record says this image, byte for byte, was allowed, and still counts at `now`."""
        from singpy.host.cachefiles import read_private

        data = read_private(self.path, 1024)
        if data is None or not self._trusted_directory():
            return False
        fields = data.decode("ascii", "replace").split("\0")
        if len(fields) != 3 or fields[0] != _TAG.decode():
            return False
        try:
            until = float(fields[2])
        except ValueError:
            return False
        if not now < until <= now + MAX_AGE:
            return False
        self.digest = image_digest(image)
        return bool(self.digest) and self.digest == fields[1]

    def before_verifying(self, image: str) -> None:
        """The image's digest as it is before the verification reads it (if the record lookup did not compute it)."""
        if not self.digest:
            self.digest = image_digest(image)

    def remember(self, image: str, now: float, expirations: Sequence[float]) -> None:
        """Record an allowed image, if it is still the file it was before the verification read it (an image
        rewritten meanwhile is not recorded); expired records of the directory go. Failing to write is no error."""
        if not self.digest or image_digest(image) != self.digest:
            return
        until = min([now + MAX_AGE, *expirations])
        if until <= now:
            return
        from singpy.errors import SingpyError
        from singpy.host.cachefiles import make_private_dirs, publish

        try:
            make_private_dirs(self.directory, what="ECL verdict directory")
            publish(self.path, "\0".join((_TAG.decode(), self.digest, repr(until))).encode())
        except (OSError, SingpyError):
            return
        _prune(self.directory, now, keep=os.path.basename(self.path))


def _prune(directory: str, now: float, *, keep: str) -> None:
    """Remove records older than MAX_AGE (their ECL or keyring changed since, or their image went)."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name != keep and entry.is_file(follow_symlinks=False) and \
                        entry.stat(follow_symlinks=False).st_mtime < now - MAX_AGE:
                    os.unlink(entry.path)
    except OSError:
        pass

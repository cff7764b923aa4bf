"""Recorded ECL verdicts (singpy.signing.eclrecord): what names a record, what its content must match, how long
it counts, and what is never recorded."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from singpy.signing import eclrecord

BASE = ("/etc/site", b"activated = true\n", b"KEYRING", "/images/a.sif")


@pytest.mark.parametrize("changed", range(4))
def test_every_input_but_the_content_names_another_record(changed: int) -> None:
    other = list(BASE)
    other[changed] = other[changed] + ("x" if isinstance(other[changed], str) else b"x")  # type: ignore[operator]
    assert eclrecord.record_name(*BASE) == eclrecord.record_name(*BASE)
    assert eclrecord.record_name(*other) != eclrecord.record_name(*BASE)  # type: ignore[arg-type]


def test_the_inputs_are_length_prefixed() -> None:
    """Moving a byte from one input to the next must not give the same name."""
    assert eclrecord.record_name("/a", b"bc", b"", "/i") != eclrecord.record_name("/a", b"b", b"c", "/i")


def _image(tmp_path: Path, size: int = 3 << 20) -> Path:
    image = tmp_path / "image.sif"
    image.write_bytes(os.urandom(size))
    return image


@pytest.mark.parametrize("size", [1 << 20, 9 << 20])  # BLAKE2 below 8 MiB, OpenSSL's SHA-256 from there
def test_the_image_digest_covers_every_byte(tmp_path: Path, size: int) -> None:
    image = _image(tmp_path, size)
    before = eclrecord.image_digest(str(image))
    assert before.startswith("blake2b:" if size < (8 << 20) else "sha256:")
    with image.open("r+b") as stream:
        stream.seek(size - 1)
        last = stream.read(1)
        stream.seek(size - 1)
        stream.write(bytes([last[0] ^ 1]))
    assert eclrecord.image_digest(str(image)) not in ("", before)
    assert eclrecord.image_digest(str(tmp_path / "missing")) == ""


def _verdicts(tmp_path: Path) -> eclrecord.Verdicts:
    directory = tmp_path / "cache" / eclrecord.SUBDIR
    return eclrecord.Verdicts(str(directory), eclrecord.record_name(*BASE), "/etc/site/global-pgp-public", b"K")


def test_a_remembered_image_is_allowed_until_it_changes(tmp_path: Path) -> None:
    image, now = _image(tmp_path), time.time()
    first = _verdicts(tmp_path)
    first.before_verifying(str(image))
    first.remember(str(image), now, [])
    assert _verdicts(tmp_path).allows(str(image), now + 1)
    data = image.read_bytes()
    image.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit changed (a fixed byte was the same 1 time in 256)
    assert not _verdicts(tmp_path).allows(str(image), now + 1)


def test_a_record_counts_a_day_at_most_and_not_past_a_signers_expiry(tmp_path: Path) -> None:
    image, now = _image(tmp_path), time.time()
    verdicts = _verdicts(tmp_path)
    verdicts.before_verifying(str(image))
    verdicts.remember(str(image), now, [now + 60])
    assert _verdicts(tmp_path).allows(str(image), now + 59)
    assert not _verdicts(tmp_path).allows(str(image), now + 61)
    verdicts.remember(str(image), now, [])
    assert _verdicts(tmp_path).allows(str(image), now + eclrecord.MAX_AGE - 1)
    assert not _verdicts(tmp_path).allows(str(image), now + eclrecord.MAX_AGE + 1)
    assert not _verdicts(tmp_path).allows(str(image), now - 3600)  # made "in the future": a moved clock, or forged


def test_an_image_rewritten_during_the_verification_or_an_expired_key_is_not_recorded(tmp_path: Path) -> None:
    image, now = _image(tmp_path), time.time()
    verdicts = _verdicts(tmp_path)
    verdicts.before_verifying(str(image))
    image.write_bytes(os.urandom(1 << 20))  # what was verified is not what was hashed first
    verdicts.remember(str(image), now, [])
    verdicts.before_verifying(str(image))
    fresh = _verdicts(tmp_path)
    fresh.before_verifying(str(image))
    fresh.remember(str(image), now, [now - 1])  # a signer's key expired already
    assert not Path(verdicts.path).exists()
    assert not _verdicts(tmp_path).allows(str(image), now)


def test_old_records_are_pruned_when_a_new_one_is_written(tmp_path: Path) -> None:
    image, now = _image(tmp_path), time.time()
    directory = tmp_path / "cache" / eclrecord.SUBDIR
    directory.mkdir(parents=True, mode=0o700)
    stale, recent = directory / ("0" * 64), directory / ("1" * 64)
    for path in (stale, recent):
        path.write_bytes(b"old")
    os.utime(stale, (now - eclrecord.MAX_AGE - 10, now - eclrecord.MAX_AGE - 10))
    verdicts = _verdicts(tmp_path)
    verdicts.before_verifying(str(image))
    verdicts.remember(str(image), now, [])
    assert sorted(os.listdir(directory)) == sorted([recent.name, os.path.basename(verdicts.path)])

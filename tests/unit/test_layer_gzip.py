"""A gzip layer's decompressor: python-isal's igzip where it is installed (issue 31, "Big pulls"), else the
stdlib's gzip; both give the same bytes, and every bad stream is one ImageError naming the layer."""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile
import zlib

import pytest

from singpy.errors import ImageError
from singpy.oci import streams


def tar_of(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("payload")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


PAYLOAD = tar_of(os.urandom(150_000) + b"compressible " * 20_000)
GOOD = gzip.compress(PAYLOAD)


def bad_crc() -> bytes:
    """The deflate data intact, the trailer's CRC-32 wrong: only the check at the end can tell."""
    crc = (zlib.crc32(PAYLOAD) ^ 1).to_bytes(4, "little")
    return GOOD[:-8] + crc + GOOD[-4:]


@pytest.fixture(params=["isal", "stdlib"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "stdlib":
        monkeypatch.setitem(sys.modules, "isal", None)  # an import of it fails, as where it is not installed
    else:
        pytest.importorskip("isal")
    return str(request.param)


def opened(blob: bytes) -> streams.Readable:
    return streams.open_layer(io.BytesIO(blob), source="layer sha256:abc of test")


def read_all(blob: bytes) -> bytes:
    layer, parts = opened(blob), []
    while data := layer.read(streams.CHUNK):
        parts.append(data)
    return b"".join(parts)


def test_isal_inflates_where_it_is_installed(decoder: str) -> None:
    layer = opened(GOOD)
    assert isinstance(layer, streams._Decompressed)
    kind = type(layer.reader)
    if decoder == "isal":
        from isal import igzip

        assert kind is igzip.GzipFile
    else:
        assert kind is gzip.GzipFile


def test_both_give_the_same_bytes(decoder: str) -> None:
    assert read_all(GOOD) == PAYLOAD
    two_members = gzip.compress(PAYLOAD[:10_240]) + gzip.compress(PAYLOAD[10_240:])
    assert read_all(two_members) == PAYLOAD


@pytest.mark.parametrize("blob", [
    pytest.param(GOOD[:-5000], id="truncated"),
    pytest.param(GOOD[:-4], id="no-size-in-trailer"),
    pytest.param(GOOD[:12] + bytes(x ^ 0x55 for x in GOOD[12:4000]) + GOOD[4000:], id="corrupt-deflate"),
    pytest.param(bad_crc(), id="bad-crc"),
    pytest.param(b"\x1f\x8b\x08\x00" + os.urandom(5000), id="random"),
    pytest.param(GOOD + b"\x1f\x8b garbage after the member", id="garbage-after"),
])
def test_a_bad_stream_is_one_image_error(decoder: str, blob: bytes) -> None:
    with pytest.raises(ImageError) as raised:
        read_all(blob)
    message = str(raised.value)
    assert message.startswith("can't extract layer sha256:abc of test: its gzip data is corrupt or truncated (")
    assert "\n" not in message

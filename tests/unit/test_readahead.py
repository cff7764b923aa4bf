"""singpy.oci.readahead: a layer's stream read ahead on a thread gives the same bytes, errors and end."""

from __future__ import annotations

import gzip
import io
import threading

import pytest

from singpy.errors import ImageError
from singpy.oci.readahead import AHEAD, ReadAhead
from singpy.oci.streams import CHUNK, VerifyingReader, open_layer


def _read_all(ahead: ReadAhead, size: int) -> bytes:
    parts = []
    while data := ahead.read(size):
        assert len(data) <= size
        parts.append(data)
    return b"".join(parts)


@pytest.mark.parametrize("size", [1, 511, 65536, CHUNK, 3 * CHUNK])
def test_same_bytes_whatever_the_read_size(size: int) -> None:
    data = bytes(range(256)) * (3 * CHUNK // 256 + 7)
    stream = io.BytesIO(data) if size > 1 else io.BytesIO(data[:100_000])
    with ReadAhead(stream) as ahead:
        assert _read_all(ahead, size) == stream.getvalue()
        assert ahead.read(10) == b""  # the end stays the end


def test_read_all_and_zero() -> None:
    with ReadAhead(io.BytesIO(b"x" * (CHUNK + 5))) as ahead:
        assert ahead.read(0) == b""
        assert ahead.read() == b"x" * (CHUNK + 5)


def test_a_digest_mismatch_reaches_the_reader() -> None:
    import hashlib

    data = b"layer bytes" * 100_000
    wrong = "sha256:" + hashlib.sha256(b"other").hexdigest()
    layer = open_layer(VerifyingReader(io.BytesIO(gzip.compress(data)), wrong), source="layer L")
    with ReadAhead(layer) as ahead, pytest.raises(ImageError, match="digest mismatch"):
        _read_all(ahead, 65536)


def test_a_corrupt_layer_reaches_the_reader_and_again() -> None:
    packed = bytearray(gzip.compress(b"y" * 3 * CHUNK))
    packed[len(packed) // 2] ^= 0xFF
    layer = open_layer(io.BytesIO(bytes(packed)), source="layer L")
    with ReadAhead(layer) as ahead:
        with pytest.raises(ImageError, match="layer L"):
            _read_all(ahead, 65536)
        with pytest.raises(ImageError, match="layer L"):
            ahead.read(1)


class _Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


def test_a_reader_that_stops_early_stops_the_thread_and_bounds_what_is_held() -> None:
    stream = _Counting(b"z" * 100 * CHUNK)
    before = threading.active_count()
    with ReadAhead(stream) as ahead:
        assert ahead.read(10) == b"z" * 10
        thread = ahead.thread
    assert not thread.is_alive()  # joined: nothing reads the stream after the block
    assert threading.active_count() == before
    assert stream.reads <= AHEAD + 3  # it read ahead a few chunks, not the whole stream

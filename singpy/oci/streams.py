"""What a layer is read through: its digest checked, its compression undone, its tar headers bounded.

A layer is a tar archive, gzip- or zstd-compressed or plain ([1] OCI
image-spec layer.md), and untrusted input: every failure here is one
ImageError naming the layer (`source`), bounded in time and memory whatever
the input (a corrupt or truncated stream, a PAX header that claims gigabytes).

[1] https://github.com/opencontainers/image-spec/blob/main/layer.md
"""

from __future__ import annotations

import gzip
import hashlib
import re
import tarfile
import zlib
from typing import Protocol

from singpy.errors import ImageError

CHUNK = 1 << 20  # bytes copied at once: a file of a layer is one read and one write when it fits
_MAX_EXTENDED = 1 << 20  # a PAX or GNU long-name header larger than this is hostile (tarfile reads it whole)
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_DIGEST = re.compile(r"(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})\Z")
_EXTENDED_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)


class Readable(Protocol):
    """What a layer is read from: a file, a download, a decompressor."""

    def read(self, size: int = -1, /) -> bytes: ...


DRAIN = 1 << 20  # decompressed bytes read past a layer's tar end marker


def drain(stream: Readable) -> None:
    """Read a little past a tar's end marker (a gzip stream's checksum is at its very end), never all that
    follows it: a few KiB of zstd can inflate to gigabytes of zeros there. The digest is checked on the
    compressed blob, which the caller reads to its end without inflating it."""
    left = DRAIN
    while left > 0:
        data = stream.read(min(left, CHUNK))
        if not data:
            return
        left -= len(data)


class VerifyingReader:
    """A stream whose bytes are hashed as they are read; at its end, a digest mismatch is an ImageError.

    The end is when `read` returns nothing, `finish()` is called, or the
    reader leaves a `with` block without an error (which reads what is left:
    a decompressor may stop before the end of its input). `size`, when
    given, bounds the stream: a byte more is an error at once.
    """

    def __init__(self, stream: Readable, digest: str, *, source: str | None = None, size: int | None = None) -> None:
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ImageError(f"unsupported digest {str(digest)[:80]!r} of {source or 'a blob'}")
        self.stream = stream
        self.digest = digest
        self.source = source or f"blob {digest}"
        self.size = size
        algorithm, self._expected = digest.split(":", 1)
        self._hash = hashlib.new(algorithm)
        self._count = 0
        self._done = False

    def read(self, size: int = -1, /) -> bytes:
        if self._done:
            return b""
        data = self.stream.read(size)
        if data:
            self._count += len(data)
            if self.size is not None and self._count > self.size:
                raise ImageError(f"{self.source} is larger than the {self.size} bytes its descriptor says")
            self._hash.update(data)
        elif size != 0:
            self._check()
        return data

    def finish(self) -> None:
        """Read what is left and check the digest (once)."""
        while not self._done:
            self.read(CHUNK)

    def _check(self) -> None:
        self._done = True
        if self.size is not None and self._count != self.size:
            raise ImageError(f"{self.source} is truncated: {self._count} of {self.size} bytes")
        actual = self._hash.hexdigest()
        if actual != self._expected:
            algorithm = self.digest.split(":", 1)[0]
            raise ImageError(f"digest mismatch for {self.source}: its data has digest {algorithm}:{actual}")

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> VerifyingReader:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        try:
            if kind is None:
                self.finish()
        finally:
            self.close()


class _Prefixed:
    """`head` (already read to see what the stream is) followed by the rest of `stream`."""

    def __init__(self, head: bytes, stream: Readable) -> None:
        self.head = head
        self.stream = stream

    def read(self, size: int = -1, /) -> bytes:
        if not self.head:
            return self.stream.read(size)
        if size < 0:
            data, self.head = self.head + self.stream.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data

    def readinto(self, buffer: bytearray | memoryview, /) -> int:
        """What isal's decompressor reads with (the stdlib's calls `read`)."""
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _Decompressed:
    """A decompressor's output; its errors become one ImageError naming the layer."""

    def __init__(self, reader: Readable, kind: str, source: str, errors: tuple[type[BaseException], ...]) -> None:
        self.reader = reader
        self.kind = kind
        self.source = source
        self.errors = errors

    def read(self, size: int = -1, /) -> bytes:
        try:
            return self.reader.read(size)
        except ImageError:
            raise
        except self.errors as error:
            raise ImageError(f"can't extract {self.source}: its {self.kind} data is corrupt or truncated "
                             f"({reason(error)})") from None


def open_layer(stream: Readable, *, source: str = "the layer") -> Readable:
    """The tar archive in layer `stream`, decompressed as its first bytes say: gzip, zstd, or none."""
    head = b""
    while len(head) < tarfile.BLOCKSIZE:
        try:
            data = stream.read(tarfile.BLOCKSIZE - len(head))
        except OSError as error:
            raise ImageError(f"can't read {source}: {error.strerror or reason(error)}") from None
        if not data:
            break
        head += data
    joined = _Prefixed(head, stream)
    if head.startswith(_GZIP):
        reader, errors = gzip_reader(joined)
        return _Decompressed(reader, "gzip", source, errors)
    if head.startswith(_ZSTD):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(joined, read_size=1 << 17,  # type: ignore[arg-type]
                                                            read_across_frames=True, closefd=False)
        return _Decompressed(reader, "zstd", source, (zstandard.ZstdError, OSError))
    if _is_tar(head):
        return joined
    if not head:
        raise ImageError(f"can't extract {source}: it is empty")
    raise ImageError(f"can't extract {source}: it is not a tar archive, gzip- or zstd-compressed "
                     f"(it starts with bytes {head[:8].hex()})")


def gzip_reader(stream: Readable) -> tuple[Readable, tuple[type[BaseException], ...]]:
    """A gzip decompressor of `stream`, and the errors it raises on bad data: python-isal's igzip where it is
    installed (a pyproject dependency: it inflates at twice zlib's speed, issue 31, "Big pulls"), else gzip."""
    try:
        from isal import igzip, isal_zlib
    except ImportError:
        return (gzip.GzipFile(fileobj=stream, mode="rb"),  # type: ignore[call-overload]
                (OSError, EOFError, zlib.error))
    isal_error: type[BaseException] = isal_zlib.error  # type: ignore[assignment]  # the stubs say an instance
    reader: Readable = igzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[no-untyped-call]
    return reader, (OSError, EOFError, isal_error, zlib.error)


def _is_tar(head: bytes) -> bool:
    if len(head) < tarfile.BLOCKSIZE:
        return False
    if head == bytes(tarfile.BLOCKSIZE):  # an empty archive: the end marker only
        return True
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")  # checks the header's checksum
    except tarfile.HeaderError:
        return False
    return True


def reason(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if len(text) < 200 else text[:200] + "..."


class BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a PAX or GNU long-name header's data whole into memory: a hostile one that claims
    terabytes must be refused before that."""

    __slots__ = ()

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED_TYPES and self.size > _MAX_EXTENDED:
            raise tarfile.HeaderError(f"an extended header of {self.size} bytes")
        if self.type == tarfile.XGLTYPE:  # global headers add up, for the rest of the archive
            held = sum(len(key) + len(value) for key, value in tarfile_.pax_headers.items())
            if held + self.size > _MAX_EXTENDED:
                raise tarfile.HeaderError("global extended headers of over 1 MiB")
        return super()._proc_member(tarfile_)  # type: ignore[misc, no-any-return]


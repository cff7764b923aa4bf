"""A blob downloaded to a file: resumed, verified, and its progress reported as the bytes arrive.

A blob goes to TARGET.partial, opened for appending (hashed as it arrives, on a
thread beside the reads for a large one): a cut download (this
run's or an earlier one's) is resumed with `Range: bytes=N-`, the bytes
already there hashed first; a server that answers 200 instead of 206 (or
416) restarts it from zero; tries in a row that bring no byte beyond the
furthest one had are bounded (a registry that ignores Range and cuts every
answer short fails the pull). It is fsynced once (its writeback started every
32 MB on the way, so that fsync is short) and renamed to TARGET only once
verified; a mismatch removes it. The requests are the client's: the registry client
(singpy.oci.registry, which imports this module when it fetches a blob), or singpy.oci.quickget's
anonymous one. Neither http.client nor singpy.oci.transport is imported here: the quick client's
download loads neither (their errors can only come from a client that loaded them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable

from singpy.errors import ImageError
from singpy.image.tools import start_thread
from singpy.oci.regerrors import CantWrite, DigestMismatch, detail
from singpy.oci.retries import backoff

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    import http.client
    import mmap
    from typing import Any, Protocol, TypeGuard

    Buffer = bytearray | mmap.mmap  # a chunk's memory: the reader's own, or one of _HashThread's

    from singpy.oci.limits import Limits
    from singpy.oci.transport import TransportError

    class Response(Protocol):
        """What a download reads of an answer (http.client.HTTPResponse, or singpy.oci.quickget's)."""

        status: int
        reason: str

        def getheader(self, name: str) -> str | None: ...

        def readinto(self, buffer: Buffer) -> int: ...

    class Connections(Protocol):
        """What a download asks of the client's connections (singpy.oci.transport.Transport)."""

        def discard(self, url: str, response: Any, *, limit: int = ...) -> None: ...

        def close_connection(self, url: str) -> None: ...

    class Client(Protocol):
        """What a download asks of the registry client (singpy.oci.registry.Registry)."""

        host: str
        limits: Limits
        sleep: Callable[[float], None]

        @property
        def transport(self) -> Connections: ...

        def request(self, method: str, path: str, headers: dict[str, str], range_from: int = 0,
                    document: bool = True) -> tuple[Any, str]: ...

        def blob_path(self, digest: str) -> str: ...

        def blob_name(self, digest: str) -> str: ...

        def error_body(self, response: Any, url: str) -> bytes: ...

        def raise_for(self, status: int, body: bytes, url: str, what: str, reason: str | None) -> None: ...

        def unreachable(self, error: TransportError) -> ImageError: ...

CHUNK = 1 << 20  # bytes per read of a blob: few Python calls per MB
_ROOM_HINT = "set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a directory on a filesystem with room"
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW


def _hasher(algorithm: str) -> Any:
    """A new hash object (hashlib is imported when a digest is computed: not for a HEAD request)."""
    import hashlib

    return hashlib.new(algorithm)


def fetch_blob(client: Client, digest: str, target: str, *, size: int | None,
               progress: Callable[[int], None] | None = None, durable: bool = True) -> None:
    """Download blob `digest` to `target` (atomically, verified), resuming `target`.partial if there is one.

    `progress(n)` is called with the byte count of each chunk as it arrives, once at the start with the
    bytes a resumed partial file already holds, and with a negative count when a download restarts
    from zero (so a running sum is always the bytes held). `durable`: fsynced before the rename (its
    writeback started on the way); without it, the caller's record of the file must let a later reader
    notice a crash that tore it (singpy.oci.store.seal_sif's `unsynced`).
    """
    partial = f"{target}.partial"
    try:
        fd = os.open(partial, _FILE_FLAGS, 0o644)
    except OSError as error:
        raise CantWrite(f"can't write {partial}: {error.strerror}") from None
    try:
        download = Download(client, digest, fd, partial, size, progress)
        download.durable = durable
        download.run()
        if durable:
            os.fsync(fd)
    except OSError as error:  # writing: reading failures are TransportErrors, handled in run()
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        if full:
            _remove(partial)  # the space goes back; a resume would fail the same way
        raise CantWrite(f"can't write {partial}: {error.strerror}", hint=_ROOM_HINT if full else None) from None
    finally:
        os.close(fd)
    try:
        os.rename(partial, target)
    except OSError as error:
        raise CantWrite(f"can't rename {partial} to {target}: {error.strerror}") from None


class Download:
    """One blob into an open .partial file: the state a resume needs, and the loop."""

    def __init__(self, registry: Client, digest: str, fd: int, partial: str, size: int | None,
                 progress: Callable[[int], None] | None) -> None:
        self.registry = registry
        self.digest = digest
        self.algorithm, _, self.expected = digest.partition(":")
        self.fd = fd
        self.partial = partial
        self.size = size
        self.progress = progress or _ignore
        self.hasher = _hasher(self.algorithm)
        self.held = 0  # bytes in the file, all hashed
        self.source = registry.host  # who sent the bytes (named in a mismatch)
        self.fresh = True  # every byte held came from this download (no partial file of an earlier run)
        self.furthest = 0  # the most bytes held at any time: only bytes beyond it are progress
        self.durable = True  # to be fsynced at the end: its writeback is started on the way

    def run(self) -> None:
        self._hash_existing()
        self.fresh = self.held == 0
        self.furthest = self.held
        tries, limit = 0, self.registry.limits.retries
        while True:
            if self.size is not None and self.held >= self.size:
                if self._verified():
                    return
                if self.fresh:
                    self._mismatch()
                self._restart()  # a partial file from an earlier run that was wrong: one fresh download
                self.fresh = True
                continue
            try:
                complete = self._one_request()
            except Exception as error:
                if not _is_transport_error(error):
                    raise
                tries = self._tried(tries)
                if not error.retriable or tries >= limit:
                    raise self.registry.unreachable(error) from None
                self.registry.sleep(backoff(tries - 1 if tries else 0))
                continue
            if complete is None:  # the server ignored or refused the Range: from zero again
                self._restart()
                self.fresh = True
                continue
            if self.size is not None and self.held < self.size:  # the body ended early: go on from there
                tries = self._tried(tries)
                if tries >= limit:
                    raise ImageError(f"blob {self.digest} from {self.source} ends after {self.held} of its "
                                     f"{self.size} bytes, {limit} times in a row (the limit is SINGPY_PULL_RETRIES)")
                if tries:
                    self.registry.sleep(backoff(tries - 1))
                continue
            if self._verified():
                return
            if self.fresh:
                self._mismatch()
            self._restart()
            self.fresh = True

    def _tried(self, tries: int) -> int:
        """The count of tries in a row without progress, after one more: a restart from zero (a registry that
        ignores Range) brings bytes, but none beyond the furthest already had, so it is not progress."""
        if self.held > self.furthest:
            self.furthest = self.held
            return 0
        return tries + 1

    def _one_request(self) -> bool | None:
        """One GET from `held` on; True when the body ended, None when the download must restart from zero."""
        registry = self.registry
        response, url = registry.request("GET", registry.blob_path(self.digest), {}, range_from=self.held,
                                          document=False)
        self.source = netloc(url)
        status = response.status
        if self.held and status == 416:  # the partial may already be whole (the size was not known)
            registry.transport.discard(url, response)
            if self._verified():
                return True
            if self.fresh:  # the registry's blob ends before its announced size, and is not the one asked for
                self._mismatch()
            return None
        if self.held and status == 200:
            registry.transport.discard(url, response, limit=0)
            return None
        if self.held and status == 206:
            if _range_start(response.getheader("Content-Range") or "") != self.held:
                registry.transport.discard(url, response, limit=0)
                return None
        elif status != 200:
            body = registry.error_body(response, url)
            registry.raise_for(status, body, url, registry.blob_name(self.digest), response.reason)
            raise ImageError(f"registry {self.source} answered HTTP {status} for {registry.blob_name(self.digest)}"
                             f"{detail(body)}")
        self._stream(response, url)
        return True

    def _stream(self, response: Response, url: str) -> None:
        hashing = _HashThread(self.hasher) if self.size is None or self.size > _THREAD_FROM else None
        buffer: Buffer = bytearray(CHUNK) if hashing is None else hashing.free_buffer()
        fd, progress = self.fd, self.progress
        limit = self.size
        try:
            while True:
                try:
                    count = response.readinto(buffer)
                except Exception as error:
                    if not _is_read_error(error):
                        raise
                    self.registry.transport.close_connection(url)
                    from singpy.oci.transport import _failure

                    raise _failure(netloc(url), error, connecting=False) from None
                if not count:
                    return
                with memoryview(buffer) as view:
                    chunk = view[:count]
                    written = 0
                    while written < count:  # an OSError here is the disk's: fetch_blob names the file
                        written += os.write(fd, chunk[written:])
                    chunk.release()
                if hashing is not None:
                    hashing.add(buffer, count)
                    buffer = hashing.free_buffer()
                else:
                    with memoryview(buffer) as view:
                        self.hasher.update(view[:count])
                self.held += count
                progress(count)
                if self.durable and hashing is not None and self.held >= hashing.flushed + _FLUSH_EVERY:
                    _start_writeback(fd)
                    hashing.flushed = self.held
                if limit is not None and self.held > limit:  # more than announced: stop here, it can't verify
                    self.registry.transport.close_connection(url)
                    return
        finally:
            if hashing is not None:
                hashing.finish()  # every chunk written is hashed (a resume hashes on from here)


    def _hash_existing(self) -> None:
        """Hash what an earlier download left in the partial file."""
        size = os.fstat(self.fd).st_size
        if not size:
            return
        with open(self.partial, "rb", buffering=0) as existing:
            buffer = bytearray(CHUNK)
            while True:
                count = existing.readinto(buffer)
                if not count:
                    break
                with memoryview(buffer) as view:
                    self.hasher.update(view[:count])
                self.held += count
        self.progress(self.held)

    def _verified(self) -> bool:
        return bool(self.hasher.copy().hexdigest() == self.expected)

    def _restart(self) -> None:
        os.ftruncate(self.fd, 0)
        self.progress(-self.held)
        self.held = 0
        self.hasher = _hasher(self.algorithm)

    def _mismatch(self) -> None:
        _remove(self.partial)
        raise DigestMismatch(f"digest mismatch for blob {self.digest} from {self.source}: the download was discarded")


_THREAD_FROM = 8 * CHUNK  # bytes of a blob from which it is hashed on a thread of its own
_BUFFERS = 8  # chunks in flight: one being read, the others waiting for (or in) the hash
_FLUSH_EVERY = 32 * CHUNK  # bytes written between two writeback starts of a large download


class _HashThread:
    """Hashes the chunks of a download on a thread of its own while the next ones are read and written.

    hashlib releases the GIL while it hashes a large buffer, so the hash (~0.5 s for 200 MB of sha256) runs
    beside the reads instead of after each one. A buffer goes back to the reader once hashed; `finish` waits
    for the last one and ends the thread (a launch after a pull must be single-threaded: unshare refuses).
    """

    def __init__(self, hasher: Any) -> None:
        import _queue  # the C queue: `queue` costs its import (~4 ms under load) for nothing used here
        import threading  # its join waits for the thread's end itself (unshare after a pull needs one thread)

        self.hasher = hasher
        self.flushed = 0  # bytes of the download whose writeback was started so far
        self.todo: _queue.SimpleQueue[tuple[Buffer, int] | None] = _queue.SimpleQueue()
        self.free: _queue.SimpleQueue[Buffer] = _queue.SimpleQueue()
        self.made = 0  # buffers made so far (at most _BUFFERS)
        self.error: BaseException | None = None  # what ended the thread: raised on the reader's side
        self.thread = threading.Thread(target=self._run, name="singpy-hash", daemon=True)
        start_thread(self.thread)

    def free_buffer(self) -> Buffer:
        """A buffer the hash is done with; a new one while fewer than _BUFFERS exist and none is free.

        Made on demand, as anonymous maps: `bytearray(CHUNK)` would zero 8 MiB up front (~5-10 ms
        under load) that the reads overwrite anyway; a map's pages are the kernel's zero pages until read into.
        """
        import _queue
        import mmap

        if self.made < _BUFFERS:
            try:
                return self.free.get_nowait()
            except _queue.Empty:
                self.made += 1
                return mmap.mmap(-1, CHUNK)
        buffer = self.free.get()
        self._raise_error()
        return buffer

    def add(self, buffer: Buffer, count: int) -> None:
        self._raise_error()
        self.todo.put((buffer, count))

    def finish(self) -> None:
        self.todo.put(None)
        self.thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            while (item := self.todo.get()) is not None:
                buffer, count = item
                with memoryview(buffer) as view:
                    self.hasher.update(view[:count])
                self.free.put(buffer)
        except BaseException as error:  # the reader raises it (else threading would print a traceback and the
            self.error = error  # reader wait for a buffer forever): its FATAL is the main thread's
            self.free.put(bytearray())  # wakes a reader waiting in free_buffer, which raises the error


def _start_writeback(fd: int) -> None:
    """Have the kernel start writing the file's dirty pages now, without waiting for them (measured: a pull of
    200 MB with an fdatasync every 32 MB took 0.38 s, with this 0.34 s, with no sync at all 0.29 s), so that the
    one fsync at the end (fetch_blob) finds little left to write. POSIX_FADV_DONTNEED starts the writeback of
    dirty pages (asynchronously) and drops only the clean ones; a kernel that ignores it costs the fsync alone."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _is_transport_error(error: Exception) -> TypeGuard[TransportError]:
    """Whether `error` is a singpy.oci.transport.TransportError (only a client that loaded it raises one)."""
    transport = sys.modules.get("singpy.oci.transport")
    return transport is not None and isinstance(error, transport.TransportError)


def _is_read_error(error: Exception) -> TypeGuard[OSError | http.client.HTTPException]:
    """Whether a failed read of a body raised `error`: an OSError, or one of http.client's where it is loaded."""
    client = sys.modules.get("http.client")
    return isinstance(error, (OSError, client.HTTPException) if client is not None else OSError)


def netloc(url: str) -> str:
    """HOST[:PORT] of an http(s) URL, as transport.Origin names it (no default port, no user info)."""
    scheme, _, rest = url.partition("://")
    host = rest.partition("/")[0].partition("?")[0].rpartition("@")[2]
    return host.removesuffix(":443" if scheme == "https" else ":80")


def _ignore(count: int) -> None:
    pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _range_start(content_range: str) -> int | None:
    """N of "bytes N-M/TOTAL" (None when it is not that)."""
    unit, _, spec = content_range.strip().partition(" ")
    start = spec.partition("-")[0]
    return int(start) if unit.lower() == "bytes" and start.isascii() and start.isdigit() and len(start) < 20 else None

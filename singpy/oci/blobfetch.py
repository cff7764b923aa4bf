"""A blob downloaded to a file: resumed, verified, and its progress reported as the bytes arrive.

A blob goes to TARGET.partial, opened for appending (hashed as it arrives, on a
thread beside the reads for a large one): a cut download (this
run's or an earlier one's) is resumed with `Range: bytes=N-`, the bytes
already there hashed first; a server that answers 200 instead of 206 (or
416) restarts it from zero; tries in a row that bring no byte beyond the
furthest one had are bounded (a registry that ignores Range and cuts every
answer short fails the pull). It is fsynced once (its writeback started every
32 MB on the way, so that fsync is short) and renamed to TARGET only once
verified; a mismatch removes it. The requests are the registry client's
(singpy.oci.registry, which imports this module when it fetches a blob).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
from collections.abc import Callable

from singpy.errors import ImageError
from singpy.oci.regerrors import CantWrite, DigestMismatch, detail
from singpy.oci.retries import backoff
from singpy.oci.transport import Origin, TransportError, _failure

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any, Protocol

    from singpy.oci.limits import Limits
    from singpy.oci.transport import Transport

    class Client(Protocol):
        """What a download asks of the registry client (singpy.oci.registry.Registry)."""

        host: str
        limits: Limits
        transport: Transport
        sleep: Callable[[float], None]

        def request(self, method: str, path: str, headers: dict[str, str], range_from: int = 0,
                    document: bool = True) -> tuple[http.client.HTTPResponse, str]: ...

        def blob_path(self, digest: str) -> str: ...

        def blob_name(self, digest: str) -> str: ...

        def error_body(self, response: http.client.HTTPResponse, url: str) -> bytes: ...

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
               progress: Callable[[int], None] | None = None) -> None:
    """Download blob `digest` to `target` (atomically, verified), resuming `target`.partial if there is one.

    `progress(n)` is called with the byte count of each chunk as it arrives, once at the start with the
    bytes a resumed partial file already holds, and with a negative count when a download restarts
    from zero (so a running sum is always the bytes held).
    """
    partial = f"{target}.partial"
    try:
        fd = os.open(partial, _FILE_FLAGS, 0o644)
    except OSError as error:
        raise CantWrite(f"can't write {partial}: {error.strerror}") from None
    try:
        Download(client, digest, fd, partial, size, progress).run()
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
            except TransportError as error:
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
        self.source = Origin(url).netloc
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

    def _stream(self, response: http.client.HTTPResponse, url: str) -> None:
        hashing = _HashThread(self.hasher) if self.size is None or self.size > _THREAD_FROM else None
        buffer = bytearray(CHUNK)
        fd, progress = self.fd, self.progress
        limit = self.size
        try:
            while True:
                if hashing is not None:
                    buffer = hashing.free_buffer()
                try:
                    count = response.readinto(buffer)
                except (OSError, http.client.HTTPException) as error:
                    self.registry.transport.close_connection(url)
                    raise _failure(Origin(url).netloc, error, connecting=False) from None
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
                else:
                    with memoryview(buffer) as view:
                        self.hasher.update(view[:count])
                self.held += count
                progress(count)
                if hashing is not None and self.held >= hashing.flushed + _FLUSH_EVERY:
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
        import queue
        import threading

        self.hasher = hasher
        self.flushed = 0  # bytes of the download whose writeback was started so far
        self.todo: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(_BUFFERS):
            self.free.put(bytearray(CHUNK))
        self.thread = threading.Thread(target=self._run, name="singpy-hash", daemon=True)
        self.thread.start()

    def free_buffer(self) -> bytearray:
        return self.free.get()

    def add(self, buffer: bytearray, count: int) -> None:
        self.todo.put((buffer, count))

    def finish(self) -> None:
        self.todo.put(None)
        self.thread.join()

    def _run(self) -> None:
        while (item := self.todo.get()) is not None:
            buffer, count = item
            with memoryview(buffer) as view:
                self.hasher.update(view[:count])
            self.free.put(buffer)


def _start_writeback(fd: int) -> None:
    """Have the kernel start writing the file's dirty pages now, without waiting for them (measured: a pull of
    200 MB with an fdatasync every 32 MB took 0.38 s, with this 0.34 s, with no sync at all 0.29 s), so that the
    one fsync at the end (fetch_blob) finds little left to write. POSIX_FADV_DONTNEED starts the writeback of
    dirty pages (asynchronously) and drops only the clean ones; a kernel that ignores it costs the fsync alone."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _ignore(count: int) -> None:
    pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _range_start(content_range: str) -> int | None:
    """N of "bytes N-M/TOTAL" (None when it is not that)."""
    unit, _, spec = content_range.strip().partition(" ")
    start = spec.partition("-")[0]
    return int(start) if unit.lower() == "bytes" and start.isdigit() and len(start) < 20 else None

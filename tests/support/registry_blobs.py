"""The blob host of the redirecting test registries: an S3-like redirect target serving the registry's storage.

A Python http.server on a thread of this process, on 127.0.0.2 (another "host" for the client's redirect rules)
and a port the kernel chose. tests.support.registry re-exports every public name here.

BlobHost (registry.blob_host; http://127.0.0.2:PORT; serves files of the registry's storage)
    url, host, requests -> list[BlobRequest] (method, path, digest, headers lower-case, status;
    .authorization and .range properties), requests_for(digest)
    Any request with an Authorization header: 400 with an S3-like XML error (and recorded).
    Range requests ("bytes=N-", "bytes=N-M") get 206.
    stall(digest, after=N) -> Stall: the next GET of that blob sends its headers (full Content-Length) and
        the first N bytes of its body (of the requested range, for a Range request), then holds the
        connection open until `stall.release()`, then closes it with the rest unsent. `stall.reached`
        (threading.Event) is set once the N bytes are flushed. Later requests are served normally: a resume
        shows up in requests_for(digest)[-1].range == "bytes=N-".
        Use a blob unique to the test (a layer of its own): the busybox layer is shared by many images.
    fail(digest, status=503, times=1, headers={"Retry-After": "1"}) -> the next `times` GETs of that blob
        get `status` with `headers` (for retry tests; HEAD requests are not failed).
    The fixtures release every stall at teardown.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from tests.support.registry_http import Handler, serve, shutdown

BLOB_HOST_ADDRESS = "127.0.0.2"  # another loopback address: another "host" for the client's redirect rules
STALL_LIMIT = 300.0  # a stalled response is abandoned after this long even if no test releases it


class BlobRequest:
    """One request the blob host got (headers with lower-case names)."""

    def __init__(self, *, method: str, path: str, digest: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.digest, self.headers = method, path, digest, headers
        self.status = 0

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    def __repr__(self) -> str:
        return f"BlobRequest({self.method} {self.digest or self.path} range={self.range} status={self.status})"


class Stall:
    """A blob response held after `after` bytes until release() (see BlobHost.stall)."""

    def __init__(self, digest: str, after: int) -> None:
        self.digest, self.after = digest, after
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class BlobHost:
    """Serves the files of a registry's storage on 127.0.0.2 like S3 serves pre-signed URLs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._requests: list[BlobRequest] = []
        self._stalls: dict[str, Stall] = {}
        self._all_stalls: list[Stall] = []
        self._failures: dict[str, tuple[int, int, dict[str, str]]] = {}
        self._server, self._thread = serve(BLOB_HOST_ADDRESS, _BlobHandler, self)
        self.port = self._server.server_address[1]
        self.host = f"{BLOB_HOST_ADDRESS}:{self.port}"
        self.url = f"http://{self.host}"

    def __repr__(self) -> str:
        return f"BlobHost({self.url})"

    @property
    def requests(self) -> list[BlobRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, digest: str) -> list[BlobRequest]:
        return [request for request in self.requests if request.digest == digest]

    def stall(self, digest: str, after: int) -> Stall:
        stall = Stall(digest, after)
        with self._lock:
            self._stalls[digest] = stall
            self._all_stalls.append(stall)
        return stall

    def fail(self, digest: str, status: int = 503, times: int = 1, headers: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._failures[digest] = (status, times, dict(headers if headers is not None else {"Retry-After": "1"}))

    def record(self, request: BlobRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def take_stall(self, digest: str) -> Stall | None:
        with self._lock:
            return self._stalls.pop(digest, None)

    def take_failure(self, digest: str) -> tuple[int, dict[str, str]] | None:
        with self._lock:
            if digest not in self._failures:
                return None
            status, times, headers = self._failures[digest]
            if times <= 1:
                del self._failures[digest]
            else:
                self._failures[digest] = (status, times - 1, headers)
            return status, headers

    def stop(self) -> None:
        with self._lock:
            for stall in self._all_stalls:
                stall.release()
        shutdown(self._server, self._thread)


_S3_AUTH_ERROR = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code><Message>Only one '
                  b"auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string "
                  b"parameter or the Authorization header should be specified</Message></Error>")


class _BlobHandler(Handler):
    def do_GET(self) -> None:
        self._blob()

    def do_HEAD(self) -> None:
        self._blob()

    def _blob(self) -> None:
        owner: BlobHost = self.server.owner
        path = urllib.parse.urlsplit(self.path).path
        request = BlobRequest(method=self.command, path=path, digest=_digest_of(path),
                              headers=self.lowered_headers())
        owner.record(request)
        if request.authorization is not None:
            request.status = 400
            self.send_body(400, _S3_AUTH_ERROR, "application/xml")
            return
        failure = owner.take_failure(request.digest) if self.command == "GET" else None
        if failure is not None:
            request.status = failure[0]
            self.send_body(failure[0], b"<Error><Code>SlowDown</Code></Error>", "application/xml", failure[1])
            return
        target = (owner.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(owner.root.resolve()) or not target.is_file():
            request.status = 404
            self.send_body(404, b"<Error><Code>NoSuchKey</Code></Error>", "application/xml")
            return
        data = target.read_bytes()
        status, start, end = _byte_range(request.range, len(data))
        request.status = status
        if status == 416:
            self.send_body(416, b"", headers={"Content-Range": f"bytes */{len(data)}"})
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        stall = owner.take_stall(request.digest) if self.command == "GET" else None
        if stall is None:
            self.wfile.write(data[start:end])
            return
        self.wfile.write(data[start:start + stall.after])
        self.wfile.flush()
        stall.reached.set()
        stall.released.wait(STALL_LIMIT)
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _digest_of(path: str) -> str:
    """The digest a storage path names: .../blobs/sha256/ab/abcdef.../data -> sha256:abcdef..."""
    parts = path.strip("/").split("/")
    if len(parts) >= 5 and parts[-1] == "data" and parts[-5] == "blobs":
        return f"{parts[-4]}:{parts[-2]}"
    return ""


def _byte_range(header: str | None, size: int) -> tuple[int, int, int]:
    """(status, start, end) for a Range header of the forms bytes=N- and bytes=N-M."""
    if not header or not header.startswith("bytes=") or "," in header:
        return 200, 0, size
    first, _, last = header[len("bytes="):].partition("-")
    try:
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return 200, 0, size
    if start >= size or start >= end:
        return 416, 0, 0
    return 206, start, end

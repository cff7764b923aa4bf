"""An anonymous registry's manifest and blob GETs without http.client: the fast path of `pull oras://`.

A pull of a SIF stored with ORAS is three requests and a download. Through singpy.oci.registry they
cost the import of http.client (with `email`, `urllib.parse`, `socket`, `ssl`: ~20 ms of a ~0.3 s pull of
200 MB); this client speaks the same HTTP/1.1 on the C socket module (and `_ssl`, verified as a pull
verifies: singpy.oci.tlsconf.quick_context), one connection per request, for what it handles exactly:

* a registry asked directly and anonymously (no --docker-login, no proxy variable, nothing in
  registries.conf for the image: the conditions of singpy.oci.quickhead), so no credentials exist here
  and none can follow a redirect;
* 200 (206 for a resumed download) with a Content-Length and no Transfer-Encoding, and 416;
* redirects (a blob served by object storage on another host), to http(s) URLs, never HTTPS to HTTP.

Anything else raises `Fallback` before a byte of a body is used, and the caller asks the full client,
which applies all its rules (a 401 challenge and credentials, retries, proxies, its error messages) and
resumes whatever this one left in the download's `.partial` file (singpy.oci.blobfetch hashes it again).
Every wait is bounded as the full client bounds it: connect and TLS handshake by CONNECT_TIMEOUT, a
document (a manifest, the headers of a blob's answer) by SINGPY_PULL_DOCUMENT_TIMEOUT, a body by the
low-speed rule (singpy.oci.limits.Meter): a registry too slow is the same Unreachable error.
"""

from __future__ import annotations

import _socket
import time
from collections.abc import Callable, Mapping

from singpy.errors import ImageError
from singpy.oci.limits import Limits, Meter, TooSlow
from singpy.oci.ref import Reference, valid_digest, valid_tag

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

    from singpy.oci.manifest import Manifest
    from singpy.oci.transport import TransportError

HEADER_LIMIT = 64 << 10  # bytes of an answer's status line and headers (a registry sends ~500)
MAX_REDIRECTS = 10  # as singpy.oci.registry
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


class _Socket(_socket.socket):
    """A socket `_ssl` can wrap: it keeps a weak reference to it (as singpy.oci.quickhead's)."""

    __slots__ = ("__weakref__",)


class Fallback(Exception):
    """The full client must do this (the reason is for `-d`); nothing of the answer was used."""


def open_quick(ref: Reference, *, https: bool, login: bool, env: Mapping[str, str], home: str) -> QuickRegistry | None:
    """The quick client of `ref`'s registry where it may speak for the full one (see the module); else None."""
    from singpy.oci import mirrors, quickhead

    if login or any(env.get(name) for name in _PROXY_VARIABLES):
        return None
    if quickhead.split_endpoint(ref.endpoint, https=https)[0] is None or not mirrors.is_direct(ref, env=env, home=home):
        return None
    return QuickRegistry(ref, https=https, env=env)


class QuickRegistry:
    """The requests singpy.oci.oras makes of a registry (`manifest`, `fetch_blob`), and what
    singpy.oci.blobfetch asks of a client (blobfetch.Client), on `_socket`."""

    def __init__(self, ref: Reference, *, https: bool, env: Mapping[str, str]) -> None:
        self.ref = ref
        self.host = ref.endpoint
        self.base = f"{'https' if https else 'http'}://{ref.endpoint}"
        self.env = env
        self.limits = Limits.from_env(env)
        self.sleep: Callable[[float], None] = time.sleep
        self.open: _Response | None = None  # the answer whose connection is still open
        self.durable = False  # a blob is not fsynced: singpy.oci.oras seals it `unsynced` (store.seal_sif)

    @property
    def transport(self) -> QuickRegistry:
        return self  # blobfetch asks the transport to discard answers and close connections

    def manifest(self, reference: str) -> Manifest:
        """The manifest or index `reference` names, verified as the full client verifies it."""
        from singpy.oci.manifest import ACCEPT, MANIFEST_LIMIT, verified_manifest

        if not (valid_tag(reference) or valid_digest(reference)):
            raise Fallback("a reference the full client must name")  # and say what is wrong with it
        response, url = self.request("GET", f"/v2/{self.ref.repository}/manifests/{reference}", {"Accept": ACCEPT})
        if response.status != 200 or response.length > MANIFEST_LIMIT:
            self.discard(url, response)
            raise Fallback(f"the manifest's answer is HTTP {response.status} of {response.length} bytes")
        try:
            data = response.read_all()
        finally:
            self.close_connection(url)
        content_type = (response.getheader("Content-Type") or "").partition(";")[0].strip().lower()
        sent = (response.getheader("Docker-Content-Digest") or "").strip()
        separator = "@" if valid_digest(reference) else ":"
        image = f"image docker://{self.ref.registry}/{self.ref.repository}{separator}{reference}"
        return verified_manifest(reference, data, content_type, sent, host=self.host, image=image)

    def fetch_blob(self, digest: str, target: str, *, size: int | None,
                   progress: Callable[[int], None] | None = None) -> None:
        """As Registry.fetch_blob (resumed, verified, atomic); Fallback leaves `target`.partial to resume."""
        from singpy.oci import blobfetch

        if size is None or not valid_digest(digest):
            raise Fallback("a blob of unknown size")  # a short body could not be told from a whole one
        try:
            blobfetch.fetch_blob(self, digest, target, size=size, progress=progress, durable=self.durable)
        finally:
            self.close_connection("")

    def request(self, method: str, path: str, headers: dict[str, str], range_from: int = 0,
                document: bool = True) -> tuple[_Response, str]:
        """`method path` (redirects followed) and the final answer with its headers read, and its URL."""
        url = self.base + path
        for _ in range(MAX_REDIRECTS + 1):
            response = self._exchange(method, url, headers, range_from)
            if response.status not in _REDIRECTS:
                return response, url
            self.discard(url, response)
            url = _redirected(url, response.getheader("Location") or "")
        raise Fallback(f"more than {MAX_REDIRECTS} redirects")

    def _exchange(self, method: str, url: str, headers: dict[str, str], range_from: int) -> _Response:
        from singpy import __version__

        scheme, _, rest = url.partition("://")
        netloc, _, target = rest.partition("/")
        lines = [f"{method} /{target} HTTP/1.1", f"Host: {netloc.removesuffix(':443' if scheme == 'https' else ':80')}",
                 f"User-Agent: singpy/{__version__}", "Accept-Encoding: identity", "Connection: close",
                 *(f"{name}: {value}" for name, value in headers.items())]
        if range_from:
            lines.append(f"Range: bytes={range_from}-")
        request = "\r\n".join([*lines, "", ""]).encode("ascii")
        connection = _Connection(netloc, https=scheme == "https", env=self.env, registry=self.ref.registry,
                                 limits=self.limits)
        try:
            response = connection.exchange(request)
        except BaseException:
            connection.close()
            raise
        self.open = response
        return response

    def blob_path(self, digest: str) -> str:
        return f"/v2/{self.ref.repository}/blobs/{digest}"

    def blob_name(self, digest: str) -> str:
        return f"blob {digest} of docker://{self.ref.registry}/{self.ref.repository}"

    def error_body(self, response: Any, url: str) -> bytes:
        self.discard(url, response)
        return b""

    def raise_for(self, status: int, body: bytes, url: str, what: str, reason: str | None) -> None:
        raise Fallback(f"HTTP {status} for {what}")  # a challenge, a missing blob, an error: the full client's

    def unreachable(self, error: TransportError) -> ImageError:
        raise AssertionError("the quick client raises no TransportError")  # blobfetch calls it for those only

    def discard(self, url: str, response: Any, *, limit: int = 0) -> None:
        response.close()  # one connection per request: nothing to keep

    def close_connection(self, url: str) -> None:
        if self.open is not None:
            self.open.close()
            self.open = None


def _redirected(url: str, location: str) -> str:
    """The URL a redirect from `url` names; Fallback for one the full client must judge (and refuse)."""
    location = location.strip()
    if not location or not location.isascii() or not location.isprintable() or " " in location:
        raise Fallback("a redirect without a usable Location")
    if location.startswith("/") and not location.startswith("//"):
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.partition('/')[0]}{location}"
    scheme = location.partition("://")[0]
    if scheme not in ("http", "https") or (scheme == "http" and url.startswith("https:")):
        raise Fallback(f"a redirect to {location[:60]!r}")  # relative, another scheme, HTTPS to HTTP: refused there
    return location


class _Connection:
    """One connection for one request: connect (and TLS), send, read the answer's head."""

    def __init__(self, netloc: str, *, https: bool, env: Mapping[str, str], registry: str, limits: Limits) -> None:
        self.netloc, self.https, self.env, self.registry = netloc, https, env, registry
        self.limits = limits
        self.sock: Any = None
        self.tls: Any = None

    def exchange(self, request: bytes) -> _Response:
        from singpy.oci import quickhead

        host, port = quickhead.split_endpoint(self.netloc, https=self.https)
        if host is None:
            raise Fallback(f"an address the full client must read: {self.netloc[:60]!r}")
        deadline = time.monotonic() + self.limits.document_timeout
        try:
            self._connect(host, port, deadline)
            if self.https:
                self._wrap(host, deadline)
            self._send(request, deadline)
            status, reason, headers, rest = self._head(deadline)
        except TooSlow as error:
            raise self.too_slow(str(error)) from None
        except TimeoutError:
            raise self.too_slow("no data within the read timeout") from None
        except OSError as error:  # a reset, a TLS failure...: the full client retries it or says what it is
            raise Fallback(f"{type(error).__name__}: {error}") from None
        return _Response(self, status, reason, headers, rest)

    def _connect(self, host: str, port: int, deadline: float) -> None:
        """A TCP connection to the first address of `host` that accepts one (as socket.create_connection);
        a name that does not resolve, or no address that accepts: Fallback (the full client says so)."""
        try:
            addresses = _socket.getaddrinfo(host.encode("ascii"), port, 0, _socket.SOCK_STREAM)
        except _socket.gaierror as error:
            raise Fallback(f"{host}: {error}") from None
        for family, kind, proto, _, address in addresses:
            self.sock = _Socket(family, kind, proto)
            self.sock.settimeout(_left(deadline, _connect_timeout()))
            try:
                self.sock.connect(address)
                self.sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)  # the request leaves at once
                return
            except TimeoutError:
                raise TooSlow("the connection timed out") from None
            except OSError as error:
                self.close()
                failure = error
        raise Fallback(f"can't connect to {self.netloc}: {failure if addresses else 'no address'}")

    def too_slow(self, reason: str) -> ImageError:
        from singpy.oci.regerrors import Unreachable

        return Unreachable(f"{self.netloc} (for registry {self.registry}) is too slow: {reason}")

    def _wrap(self, host: str, deadline: float) -> None:
        from singpy.oci.tlsconf import host_ca_files, quick_context

        context = quick_context(self.env, host_ca_files(self.netloc.removesuffix(":443")))
        self.sock.settimeout(_left(deadline, _connect_timeout()))
        try:
            tls = context._wrap_socket(self.sock, False, host)  # type: ignore[attr-defined]  # not in typeshed
        except (AttributeError, TypeError) as error:  # another Python's _ssl: the full client (through `ssl`)
            raise Fallback(f"_ssl: {error}") from None
        tls.do_handshake()
        self.tls = tls

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self.sock.settimeout(_left(deadline, _read_timeout()))
            view = view[self.tls.write(view) if self.tls is not None else self.sock.send(view):]

    def _head(self, deadline: float) -> tuple[int, str, dict[str, str], bytes]:
        """Status, reason, headers (lower-case names; a repeated one: Fallback) and the body's first bytes."""
        received = b""
        while b"\r\n\r\n" not in received:
            if len(received) > HEADER_LIMIT:
                raise Fallback(f"more than {HEADER_LIMIT} bytes of headers")
            self.sock.settimeout(_left(deadline, _read_timeout()))
            chunk = self.recv(65536)
            if not chunk:
                raise Fallback("the connection closed before the end of the headers")
            received += chunk
        head, _, rest = received.partition(b"\r\n\r\n")
        try:
            status_line, *lines = head.decode("ascii").split("\r\n")
        except UnicodeDecodeError:
            raise Fallback("non-ASCII headers") from None
        version, _, status_reason = status_line.partition(" ")
        code, _, reason = status_reason.partition(" ")
        if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
            raise Fallback(f"status line {status_line[:40]!r}")
        headers: dict[str, str] = {}
        for line in lines:
            name, colon, value = line.partition(":")
            name = name.strip().lower()
            if not colon or not name or name in headers or line[:1] in (" ", "\t"):
                raise Fallback(f"a header line the full client must judge: {line[:40]!r}")
            headers[name] = value.strip()
        return int(code), reason, headers, rest

    def recv(self, size: int) -> bytes:
        return bytes(self.tls.read(size)) if self.tls is not None else bytes(self.sock.recv(size))

    def recv_into(self, view: memoryview) -> int:
        return int(self.tls.read(len(view), view) if self.tls is not None else self.sock.recv_into(view))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _Response:
    """An answer's status and headers, and its body read by `readinto` (as http.client.HTTPResponse's)."""

    def __init__(self, connection: _Connection, status: int, reason: str, headers: dict[str, str],
                 first: bytes) -> None:
        self.connection, self.status, self.reason, self.headers = connection, status, reason, headers
        self.pending = first  # body bytes that came with the headers
        length = headers.get("content-length", "")
        if status in _REDIRECTS or status == 416:
            self.length = 0  # not read: the connection is closed
        elif "transfer-encoding" in headers or not (length.isdigit() and length.isascii() and len(length) < 19):
            connection.close()
            raise Fallback(f"HTTP {status} without a plain Content-Length")  # chunked, close-delimited
        else:
            self.length = int(length)
        self.left = self.length
        self.meter = Meter(connection.limits, document=False)

    def getheader(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def readinto(self, buffer: Any) -> int:
        """Up to len(buffer) bytes of the body; 0 at its end, or where the connection ends early (the caller
        asks again from there, as after a cut download). A registry too slow is an Unreachable error."""
        if self.left <= 0 or self.connection.sock is None:
            return 0
        want = min(len(buffer), self.left)
        if self.pending:
            count = min(want, len(self.pending))
            buffer[:count] = self.pending[:count]
            self.pending = self.pending[count:]
        else:
            count = self._receive(buffer, want)
        self.left -= count
        return count

    def _receive(self, buffer: Any, want: int) -> int:
        connection = self.connection
        with memoryview(buffer) as view:
            while True:
                connection.sock.settimeout(self.meter.tick(_read_timeout()))
                try:
                    count = connection.recv_into(view[:want])
                except TimeoutError:
                    count = 0
                except OSError:  # a reset: the body ends here
                    connection.close()
                    return 0
                else:
                    if not count:
                        connection.close()
                        return 0
                try:
                    self.meter.check(count)
                except TooSlow as error:
                    connection.close()
                    raise connection.too_slow(str(error)) from None
                if count:
                    return count

    def read_all(self) -> bytes:
        """The whole body (a document: bounded by the caller's length check and the document deadline)."""
        deadline = time.monotonic() + self.connection.limits.document_timeout
        parts, buffer = [], bytearray(65536)
        while (count := self.readinto(buffer)) > 0:
            parts.append(bytes(buffer[:count]))
            if time.monotonic() > deadline:
                raise self.connection.too_slow("the answer took longer than SINGPY_PULL_DOCUMENT_TIMEOUT")
        if self.left:
            raise Fallback("the body ended early")
        return b"".join(parts)

    def close(self) -> None:
        self.connection.close()


def _left(deadline: float, most: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TooSlow("the answer took longer than SINGPY_PULL_DOCUMENT_TIMEOUT")
    return min(most, left)


def _connect_timeout() -> float:
    from singpy.oci.quickhead import CONNECT_TIMEOUT

    return CONNECT_TIMEOUT


def _read_timeout() -> float:
    from singpy.oci.quickhead import READ_TIMEOUT

    return READ_TIMEOUT

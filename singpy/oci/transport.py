"""HTTP(S) connections for the registry client: TLS, proxies, timeouts, one connection per thread and host.

Standard library only (http.client, ssl): a pull needs a handful of request
kinds, and the libraries tried failed on registries users have (oras-py 0.2.43:
Basic-challenge registries, no resume; python-dxf 12.1.1: no credentials over
plain HTTP, manifests without `mediaType`). What this module decides:

* TLS verifies against the system CA store *plus* `SSL_CERT_FILE` and
  `SSL_CERT_DIR` from the environment given (OpenSSL alone would use them
  instead of the system store), plus `/etc/containers/certs.d/HOST[:PORT]/*.crt`
  and `/etc/docker/certs.d/HOST[:PORT]/*.crt` as podman and Docker do;
* proxies come from `https_proxy`/`HTTPS_PROXY`, `http_proxy`/`HTTP_PROXY`
  (then `all_proxy`), except for hosts `no_proxy` names (exact hosts, domain
  suffixes with or without a leading dot, IPs and CIDR ranges, `host:port`,
  `*`); https goes through a CONNECT tunnel, plain http by absolute URLs;
* a connect (TCP, then a proxy's CONNECT and the TLS handshake) takes at most
  CONNECT_TIMEOUT seconds each, and a read waits at most READ_TIMEOUT seconds
  for data, so that a dead peer never hangs a pull;
* every byte of an answer is read through the request's `limits.Meter`: one
  that trickles (a few bytes now and then, which no read timeout catches) is
  stopped by the low-speed rule, a small document by its total deadline;
* each thread has its own keep-alive connection per (scheme, host, port): the
  layer threads of one pull never share a socket.

Failures become `TransportError`s carrying the host, a reason a user can read
and whether trying again may help (a reset or a timeout may; a refused
connection, an unknown host or a bad certificate will not).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from urllib.parse import unquote, urlsplit

from singpy.errors import ImageError
from singpy.image.tools import start_thread
from singpy.oci.limits import Limits, Meter, TooSlow
from singpy.oci.tlsconf import host_ca_files, tls_context

CONNECT_TIMEOUT = 30.0  # seconds for a TCP connect (and a TLS handshake)
# Seconds a read may wait for the next bytes before the connection is taken for dead (and the request
# tried again): under limits.STALL_TIMEOUT, so that a dead connection is retried while a trickle (bytes,
# but too few) fails on the low-speed rule.
READ_TIMEOUT = 30.0


class TransportError(Exception):
    """A request could not be made or its response not read."""

    def __init__(self, host: str, reason: str, *, retriable: bool, tls: bool = False, malformed: bool = False,
                 slow: bool = False) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason
        self.retriable = retriable
        self.slow = slow  # a time limit of singpy.oci.limits was reached (the message names its variable)
        self.tls = tls  # a certificate or handshake problem (the message hints at SSL_CERT_FILE, --no-https)
        self.malformed = malformed  # the peer answered, but not in HTTP


class Origin:
    """scheme, host (no brackets) and port of a URL, with its path and query as the request target."""

    __slots__ = ("scheme", "host", "port", "target")

    def __init__(self, url: str) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise TransportError(url[:100], "malformed URL", retriable=False) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(url[:100], "not an http(s) URL", retriable=False)
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    @property
    def key(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class _Proxy:
    __slots__ = ("host", "port", "authorization")

    def __init__(self, host: str, port: int, authorization: str | None) -> None:
        self.host, self.port, self.authorization = host, port, authorization


_SEND_SLICE = 256 << 10  # bytes of a request body sent under one timeout


class _Watched:
    """A connected socket whose reads are watched by the meter of the request under way.

    http.client reads an answer through `sock.makefile("rb")`: ours counts every byte as it comes, so
    that a trickle is caught between two reads whatever the buffering above. Its reads wait at most a
    tick (a quarter of the shortest limit) at a time, so that a limit is noticed at most a tick late,
    and the socket's timeout is set once per request, not per read (a read is the hot loop of a pull).
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.meter: Meter | None = None
        self.tick = READ_TIMEOUT
        self.readers = 0  # answers still reading: http.client closes the connection before a closing answer's body
        self.closing = False

    def watch(self, meter: Meter) -> None:
        self.meter = meter
        self.tick = meter.tick(READ_TIMEOUT)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        self.readers += 1
        return io.BufferedReader(_MeteredReader(self))

    def close(self) -> None:
        """Closed once no answer reads from it any more (as socket.makefile's files keep a socket open)."""
        self.closing = True
        if self.readers == 0:
            self.sock.close()

    def reader_closed(self) -> None:
        self.readers -= 1
        if self.closing and self.readers == 0:
            self.sock.close()

    def sendall(self, data: bytes) -> None:
        # A plain socket's sendall bounds the *whole* send by its timeout (a 32 MiB upload chunk over a link
        # slower than ~1 MB/s failed as "no data"): in slices, the timeout bounds a stall, as ssl's send loop does.
        self.sock.settimeout(READ_TIMEOUT)
        view = memoryview(data)
        for start in range(0, len(view), _SEND_SLICE):
            self.sock.sendall(view[start:start + _SEND_SLICE])
        self.sock.settimeout(self.tick)  # for the answer

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


class _MeteredReader(io.RawIOBase):
    def __init__(self, watched: _Watched) -> None:
        self.watched = watched

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.watched.reader_closed()
        super().close()

    def readinto(self, buffer: object) -> int:
        watched = self.watched
        meter, sock = watched.meter, watched.sock
        if meter is None:
            return sock.recv_into(buffer)  # type: ignore[arg-type]
        waited = 0.0
        while True:
            try:
                count = sock.recv_into(buffer)  # type: ignore[arg-type]
            except TimeoutError:
                meter.check(0)  # a window or the deadline is over: TooSlow
                waited += watched.tick
                if waited >= READ_TIMEOUT:  # not a byte for that long: the connection is taken for dead
                    raise
                continue
            meter.check(count)
            return count


class _ConnectWatch:
    """Shuts the socket down when a proxy's CONNECT answer or a TLS handshake outlasts CONNECT_TIMEOUT.

    Both read with the socket's timeout per read, which a peer sending one byte now and then never reaches.
    """

    def __init__(self) -> None:
        self.timer: threading.Timer | None = None
        self.fired = False

    def create_connection(self, address: tuple[str, int], timeout: float,
                          source_address: tuple[str, int] | None = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source_address)
        self.timer = threading.Timer(CONNECT_TIMEOUT, self._fire, (sock,))
        self.timer.daemon = True
        start_thread(self.timer)
        return sock

    def _fire(self, sock: socket.socket) -> None:
        self.fired = True
        with contextlib.suppress(OSError):  # already closed: nothing to wake
            sock.shutdown(socket.SHUT_RDWR)

    def connect(self, connection: http.client.HTTPConnection, connect: Callable[[], None]) -> None:
        connection._create_connection = self.create_connection  # type: ignore[attr-defined]
        try:
            connect()
        except (OSError, http.client.HTTPException):  # a CONNECT answer cut by the watch is a BadStatusLine
            if self.fired:
                raise TooSlow(f"the connection was not ready within {CONNECT_TIMEOUT:g} s") from None
            raise
        finally:
            if self.timer is not None:
                self.timer.cancel()
        connection.sock.settimeout(READ_TIMEOUT)  # the connect had CONNECT_TIMEOUT; reads get their own limit
        connection.sock = _Watched(connection.sock)


class _HTTPConnection(http.client.HTTPConnection):
    proxy: _Proxy | None = None  # plain http through a proxy: requests name absolute URLs

    def connect(self) -> None:
        _ConnectWatch().connect(self, super().connect)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        _ConnectWatch().connect(self, super().connect)


class _Slot:
    """This thread's connection to one origin, and its last response (which must be finished before reuse)."""

    __slots__ = ("connection", "response")

    def __init__(self, connection: http.client.HTTPConnection) -> None:
        self.connection = connection
        self.response: http.client.HTTPResponse | None = None


class Transport:
    """Sends requests; thread-safe (each thread has connections of its own)."""

    def __init__(self, env: Mapping[str, str], limits: Limits | None = None) -> None:
        from singpy import __version__

        self._env = dict(env)
        self.limits = limits or Limits()
        self._agent = f"singpy/{__version__}"
        self._local = threading.local()
        self._contexts: dict[tuple[str, ...], ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []  # every connection made, for close()

    def request(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None = None, *,
                document: bool = True) -> http.client.HTTPResponse:
        """Send one request and return the response, its headers read (the caller reads or discards the body).

        The answer is read under the low-speed rule; with `document` (a manifest, a token...) its whole body
        must also come within the document deadline, else only its headers (a blob may take hours).
        """
        origin = Origin(url)
        for attempt in (1, 2):
            slot, reused = self._slot(origin)
            connection = slot.connection
            try:
                if connection.sock is None:
                    connection.connect()
            except (OSError, http.client.HTTPException, UnicodeError) as error:  # UnicodeError: a name IDNA refuses
                self._drop(origin)
                failure = _failure(origin.netloc, error, connecting=True)
                proxy = self._proxy_for(origin)
                if proxy is not None:
                    failure.reason += f" (through proxy {proxy.host}:{proxy.port})"
                raise failure from None
            target, all_headers = origin.target, {"User-Agent": self._agent, **headers}
            proxy = connection.proxy if isinstance(connection, _HTTPConnection) else None
            if proxy is not None:  # plain http through a proxy: the absolute URL
                target = f"http://{origin.netloc}{origin.target}"
                if proxy.authorization:
                    all_headers["Proxy-Authorization"] = proxy.authorization
            meter = Meter(self.limits, document=True)
            if isinstance(connection.sock, _Watched):
                connection.sock.watch(meter)
            try:
                connection.request(method, target, body=body, headers=all_headers)
                slot.response = connection.getresponse()
                if not document:
                    meter.deadline = None
                return slot.response
            except (OSError, http.client.HTTPException) as error:
                self._drop(origin)
                # A keep-alive connection the server closed while idle fails at once: one fresh try is normal.
                if reused and attempt == 1 and isinstance(error, _STALE):
                    continue
                raise _failure(origin.netloc, error, connecting=False) from None
        raise AssertionError("unreachable")

    def discard(self, url: str, response: http.client.HTTPResponse, *, limit: int = 1 << 16) -> None:
        """Finish a response whose body is not wanted: a short one is read (the connection is kept), else closed."""
        if response.isclosed():
            return
        try:
            if response.length is not None and response.length <= limit:  # bytes left (0 for HEAD, 204, 304)
                response.read()
                return
        except (OSError, http.client.HTTPException):
            pass
        self.close_connection(url)

    def close_connection(self, url: str) -> None:
        """Close this thread's connection to the origin of `url` (after a body left unread or a failure)."""
        self._drop(Origin(url))

    def close(self) -> None:
        """Close every connection (of every thread): call when no request is under way any more."""
        with self._lock:
            connections, self._all = self._all, []
        for connection in connections:
            connection.close()

    def _pool(self) -> dict[tuple[str, str, int], _Slot]:
        pool: dict[tuple[str, str, int], _Slot] | None = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = {}
        return pool

    def _slot(self, origin: Origin) -> tuple[_Slot, bool]:
        """This thread's slot for `origin`, and whether its connection is an open one used before."""
        pool = self._pool()
        slot = pool.get(origin.key)
        if slot is not None and slot.response is not None and not slot.response.isclosed():
            self._drop(origin)  # a body was left unread (an exception between request and read): start afresh
            slot = None
        if slot is not None:
            return slot, slot.connection.sock is not None
        slot = pool[origin.key] = _Slot(self._new_connection(origin, self._proxy_for(origin)))
        with self._lock:
            self._all.append(slot.connection)
        return slot, False

    def _new_connection(self, origin: Origin, proxy: _Proxy | None) -> http.client.HTTPConnection:
        host, port = (proxy.host, proxy.port) if proxy is not None else (origin.host, origin.port)
        if origin.scheme == "http":
            plain = _HTTPConnection(host, port, timeout=CONNECT_TIMEOUT)
            plain.proxy = proxy
            return plain
        connection = _HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT, context=self._context(origin.netloc))
        if proxy is not None:
            tunnel_headers = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
            connection.set_tunnel(origin.host, origin.port, headers=tunnel_headers)
        return connection

    def _drop(self, origin: Origin) -> None:
        slot = self._pool().pop(origin.key, None)
        if slot is None:
            return
        slot.connection.close()
        with self._lock:
            if slot.connection in self._all:
                self._all.remove(slot.connection)

    def _context(self, netloc: str) -> ssl.SSLContext:
        """One context for all hosts without CA files of their own (loading the system store takes ~10 ms)."""
        extra = host_ca_files(netloc)
        with self._lock:
            context = self._contexts.get(extra)
            if context is None:
                context = self._contexts[extra] = tls_context(self._env, extra)
            return context

    def _proxy_for(self, origin: Origin) -> _Proxy | None:
        return proxy_for(origin.scheme, origin.host, origin.port, self._env)


_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _failure(host: str, error: OSError | http.client.HTTPException | UnicodeError, *,
             connecting: bool) -> TransportError:
    """What went wrong, in words, and whether another try may help."""
    if isinstance(error, UnicodeError):  # the IDNA codec refused the name (a label of over 63 characters)
        return TransportError(host, "not a valid host name", retriable=False)
    if isinstance(error, TooSlow):
        return TransportError(host, str(error), retriable=False, slow=True)
    if isinstance(error, ssl.SSLCertVerificationError):
        return TransportError(host, f"TLS certificate not trusted: {error.verify_message or error.reason}",
                              retriable=False, tls=True)
    if connecting and isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        # The server hung up in the handshake: it closed, as a registry going down does; no certificate involved.
        return TransportError(host, "the connection was closed by the server during the TLS handshake",
                              retriable=True)
    if isinstance(error, ssl.SSLError):
        reason = (error.reason or str(error)).replace("_", " ").lower()
        return TransportError(host, f"TLS failed: {reason}", retriable=not connecting and "EOF" in str(error),
                              tls=connecting)
    if isinstance(error, socket.gaierror):
        return TransportError(host, (error.strerror or "unknown host").lower(), retriable=False)
    if isinstance(error, TimeoutError):
        return TransportError(host, "connection timed out" if connecting else "no data for "
                              f"{READ_TIMEOUT:.0f} s", retriable=not connecting)
    if isinstance(error, http.client.IncompleteRead):
        return TransportError(host, "the connection closed in the middle of a response", retriable=True)
    if isinstance(error, _STALE):
        return TransportError(host, "the connection was closed by the server", retriable=True)
    if isinstance(error, http.client.HTTPException):
        detail = "".join(char if char.isprintable() else "?" for char in str(error)[:100])
        return TransportError(host, f"{type(error).__name__}: {detail}", retriable=False, malformed=True)
    reason = error.strerror or str(error) or type(error).__name__
    return TransportError(host, reason[:200].lower() if error.strerror else reason[:200], retriable=False)


def proxy_for(scheme: str, host: str, port: int, env: Mapping[str, str]) -> _Proxy | None:
    """The proxy for a request to scheme://host:port, from the environment (None: connect directly)."""
    names = ("https_proxy", "HTTPS_PROXY") if scheme == "https" else ("http_proxy", "HTTP_PROXY")
    value = next((env[name] for name in (*names, "all_proxy", "ALL_PROXY") if env.get(name)), "")
    if not value or bypasses_proxy(host, port, env.get("no_proxy") or env.get("NO_PROXY") or ""):
        return None
    text = value.strip()
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urlsplit(text)
        proxy_port = parts.port
    except ValueError:
        raise ImageError(f"malformed proxy URL {value[:100]!r} in the environment") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImageError(f"unsupported proxy {value[:100]!r}: singpy talks to HTTP proxies (http://HOST:PORT)")
    authorization = None
    if parts.username is not None:
        import base64

        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    # An https:// proxy URL is spoken to in plain HTTP (CONNECT), as Python's urllib and pip do.
    return _Proxy(parts.hostname, proxy_port or (443 if parts.scheme == "https" else 80), authorization)


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Does `no_proxy` (curl's syntax: hosts, .domains, IPs, CIDRs, host:port, '*') exclude host:port?"""
    import ipaddress

    host = host.lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port: int | None = None
        if entry.startswith("["):  # [v6]:port
            inside, _, rest = entry[1:].partition("]")
            entry = inside
            if rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit():
                entry_port = int(rest[1:])
        elif entry.count(":") == 1:
            name, _, digits = entry.partition(":")
            if digits.isascii() and digits.isdigit():
                entry, entry_port = name, int(digits)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.removeprefix("*").lstrip(".").rstrip(".")
        if entry and (host == entry or host.endswith(f".{entry}")):
            return True
    return False

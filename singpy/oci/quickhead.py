"""The check of a cached tag (has it moved?) in one HEAD request, without loading the HTTP client.

`singpy exec docker://X:TAG` (and `oras://`) of a cached image asks the registry one thing: the digest
its tag names now. singpy.oci.registry would ask it through http.client, whose import (with `email`,
`urllib.parse` and `socket`) costs more than the rest of the run; this module sends that one request
itself, on the C socket module (over TLS: singpy.oci.quicktls), and reads the answer's status line and
headers. It answers only what it is sure of: a 200 with a valid Docker-Content-Digest. Every
other case is left to the full client (`None`): a challenge (401: credentials, tokens), a redirect,
another status, a malformed or oversized answer, a proxy in the environment, a dropped connection (which
the full client tries again). The rules stay the client's:

* TLS verifies as a pull does (singpy.oci.tlsconf: the system store, SSL_CERT_FILE/DIR, certs.d);
  plain HTTP only where the pull would use it (--no-https, a registry named insecure is never asked here:
  the caller asks only when registries.conf changes nothing for the image, singpy.oci.mirrors.is_direct);
* no credentials are sent (an anonymous answer of 200 is the registry's answer to everyone);
* every wait is bounded: the connect and the TLS handshake by transport.CONNECT_TIMEOUT, a read by
  transport.READ_TIMEOUT, the whole answer by SINGPY_PULL_DOCUMENT_TIMEOUT, its headers by HEADER_LIMIT
  bytes. A registry too slow, or a host that can't be resolved or reached, is an Unreachable error (with
  the full client's words), so that the cached image still runs with a warning and no wait is repeated.

The request can be sent ahead (`send`, then `expect`: singpy.oci.tagcheck, as soon as the command line is
parsed): the connection is opened, the TLS handshake begun and the request sent as far as they go without
waiting, and `cached_top` later waits for the rest of the same exchange instead of making one. The launcher
imports and prepares meanwhile: the registry's side (its handshake, its time to answer) overlaps it, and over
TLS so does OpenSSL's own work where it runs in a helper process (singpy.oci.quicktls.threaded; a Python
thread, a forked child and a C thread were measured before it, docs/pull.md "Speed"). Nothing is decided
before the answer: a moved tag is seen on this run, as before.
"""

from __future__ import annotations

import _socket
import time

from singpy.oci.limits import Limits
from singpy.oci.ref import Reference, valid_digest, valid_tag

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

HEADER_LIMIT = 64 << 10  # bytes of a HEAD answer's status line and headers (a registry sends ~500)
CONNECT_TIMEOUT = 30.0  # as singpy.oci.transport's (not imported: it loads http.client)
READ_TIMEOUT = 30.0
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


class _Socket(_socket.socket):
    """A socket `_ssl` can wrap: it keeps a weak reference to it (socket.socket, this class's sibling, has the
    same slot; importing `socket` for it would cost its enums)."""

    __slots__ = ("__weakref__",)


class _Undecided(Exception):
    """The full client must ask (the reason is for `-d`)."""


def cached_top(ref: Reference, reference: str, *, login: bool, https: bool, env: Mapping[str, str],
               home: str) -> str | None:
    """What the registry names `reference` now, asked here where the full client would ask the image's own
    registry anonymously (no --docker-login, nothing in registries.conf for it); None: ask the full client."""
    if login:
        return None
    early = _PENDING.pop(_key(ref, reference, https), None)
    if early is not None:  # sent ahead under the same conditions (tagcheck.send_ahead)
        return early.answer()
    if not _direct(ref, env, home):
        return None
    return tag_digest(ref, reference, https=https, env=env)


def tag_digest(ref: Reference, reference: str, *, https: bool, env: Mapping[str, str]) -> str | None:
    """The digest `ref`'s registry gives `reference` (a tag, or a digest) now; None: the full client must ask."""
    host, port = _askable(ref, reference, https=https, env=env)
    if host is None:
        return None
    deadline = time.monotonic() + Limits.from_env(env).document_timeout
    return _decided(ref, reference, lambda: _exchange(host, port, _request(ref, reference, https=https), https=https,
                                                     env=env, deadline=deadline, endpoint=ref.endpoint))


def _direct(ref: Reference, env: Mapping[str, str], home: str) -> bool:
    """Whether registries.conf leaves `ref` to its own registry (singpy.oci.mirrors parses it only where a file
    may define an entry: on most hosts none does)."""
    from singpy.oci import regfiles

    if regfiles.define_nothing(env, home):
        return True
    from singpy.oci import mirrors

    return mirrors.is_direct(ref, env=env, home=home)


def _askable(ref: Reference, reference: str, *, https: bool, env: Mapping[str, str]) -> tuple[str | None, int]:
    """host and port to ask; (None, 0) where the full client must (a proxy, an odd name or endpoint)."""
    if any(env.get(name) for name in _PROXY_VARIABLES) or not (valid_tag(reference) or valid_digest(reference)):
        return None, 0  # proxies (and no_proxy) are the full client's, and so is saying what is wrong with a name
    return split_endpoint(ref.endpoint, https=https)


def _decided(ref: Reference, reference: str, exchange: Callable[[], bytes]) -> str | None:
    """The digest in the head `exchange` returns; None (said with -d) where the full client must ask."""
    from singpy import console

    try:
        digest = digest_of(exchange())
        console.debug(f"quick check of {ref.endpoint}/{ref.repository}:{reference}: {digest}")
        return digest
    except _Undecided as undecided:
        console.debug(f"quick tag check of {ref}: {undecided}; asking with the full client")
        return None


def send(ref: Reference, reference: str, *, https: bool, env: Mapping[str, str], home: str) -> _Early | None:
    """The check `cached_top` would make, begun now (an `_Early`: connecting, the TLS handshake begun, nothing
    asked yet); None where cached_top would not make it. `expect` it, or `close` it."""
    host, port = _askable(ref, reference, https=https, env=env)
    if host is None or not _direct(ref, env, home):
        return None
    early = _Early(ref, reference, https=https, env=env, host=host, port=port)
    early.begin()
    return early


def expect(early: _Early) -> None:
    """The request of `early` (from `send`) sent as far as it goes now; `cached_top` takes its answer."""
    from singpy import console

    early.advance()
    _PENDING[_key(early.ref, early.reference, early.https)] = early
    console.debug(f"tag check of {early.ref.endpoint}/{early.ref.repository}:{early.reference} sent ahead")


def abandon() -> None:
    """Close every check sent ahead that nobody asked for (an error came first)."""
    while _PENDING:
        _PENDING.popitem()[1].close()


def _key(ref: Reference, reference: str, https: bool) -> tuple[str, str, str, bool]:
    return ref.endpoint, ref.repository, reference, https


_PENDING: dict[tuple[str, str, str, bool], _Early] = {}  # by what they ask


class _Redo(Exception):
    """The early connection failed before anything was asked: ask again from the start (tag_digest), which
    tries every address and says what is wrong in the full client's words."""


class _Early:
    """One HEAD request sent ahead: each step (connect, TLS handshake, request) goes as far as it can without
    waiting (`begin`, `advance`); `answer` waits for the rest as _exchange waits (same deadline, same errors)."""

    def __init__(self, ref: Reference, reference: str, *, https: bool, env: Mapping[str, str], host: str,
                 port: int) -> None:
        self.ref, self.reference, self.https, self.env, self.host, self.port = ref, reference, https, env, host, port
        self.deadline = time.monotonic() + Limits.from_env(env).document_timeout
        self.unsent = memoryview(_request(ref, reference, https=https))
        self.sock: Any = None
        self.tls: Any = None  # the _ssl object over sock
        self.threaded: Any = None  # or the whole TLS exchange in a helper process (singpy.oci._tlscheck)
        self.connecting = self.shaking = self.redo = False

    def begin(self) -> None:
        """Connecting (to the first address), the TLS ClientHello sent; nothing asked yet."""
        try:
            family, kind, proto, _, address = _socket.getaddrinfo(self.host.encode("ascii"), self.port, 0,
                                                                  _socket.SOCK_STREAM)[0]
            self.sock = _Socket(family, kind, proto)
            self.sock.setblocking(False)
            error = self.sock.connect_ex(address)
            if error not in (0, _EINPROGRESS):
                raise _Redo(f"connect: error {error}")
            self.connecting = error != 0
            self.sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)  # as _connect, for the same reason
            if self.https:
                from singpy.oci import quicktls  # over TLS only: a plain-HTTP check loads nothing more

                self.threaded = quicktls.threaded(self.sock.fileno(), self.host, bytes(self.unsent), self.ref.endpoint,
                                                  self.env, left=self.deadline - time.monotonic(),
                                                  waits=(CONNECT_TIMEOUT, READ_TIMEOUT), limit=HEADER_LIMIT)
                if self.threaded is not None:
                    return
                self.tls, self.shaking = quicktls.tls_object(self.sock, self.host, self.ref.endpoint, self.env), True
            self._step(send=False)
        except Exception:  # anything: asked again from the start, where it is said as tag_digest says it
            self._fail()

    def advance(self) -> None:
        """The handshake and the request, as far as the registry's answers so far allow."""
        if self.threaded is not None and not self.redo:
            self.threaded.go()
            return
        self._step(send=True)

    def _step(self, *, send: bool) -> None:
        if self.redo:
            return
        would_block: tuple[type[BaseException], ...] = (BlockingIOError, InterruptedError)
        if self.https:
            from singpy.oci import quicktls

            would_block += quicktls.ssl_waits()
        try:
            if self.connecting:
                if self.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR):
                    raise _Redo("connect failed")
                self.sock.getpeername()  # OSError (ENOTCONN) while the connection is still being made
                self.connecting = False
            if self.shaking:
                self.tls.do_handshake()
                self.shaking = False
            while send and self.unsent:
                self.unsent = self.unsent[(self.tls.write if self.https else self.sock.send)(self.unsent):]
        except would_block:
            return  # the registry's turn: the rest waits for `answer`
        except OSError as error:
            if self.connecting and getattr(error, "errno", None) == _ENOTCONN:
                return
            self._fail()
        except Exception:
            self._fail()

    def answer(self) -> str | None:
        """What tag_digest would answer, from this exchange."""
        if not self.redo:
            try:
                return _decided(self.ref, self.reference, self._threaded_head if self.threaded else self._head)
            except _Redo:
                pass
        return tag_digest(self.ref, self.reference, https=self.https, env=self.env)

    def _head(self) -> bytes:
        endpoint = self.ref.endpoint
        try:
            if self.connecting:
                self._connected()
            self.sock.settimeout(_left(self.deadline, CONNECT_TIMEOUT, endpoint))
            if self.shaking:
                self.tls.do_handshake()
            stream: Any = self.sock
            if self.https:
                from singpy.oci import quicktls

                stream = quicktls.TLSStream(self.sock, self.tls)
            stream.settimeout(_left(self.deadline, READ_TIMEOUT, endpoint))
            stream.sendall(bytes(self.unsent))
            return _read_head(stream, self.deadline, endpoint)
        except TimeoutError:
            raise _too_slow(endpoint, "no data within the read timeout") from None
        except OSError as error:  # as _exchange: the full client retries it or says what it is
            raise _Undecided(f"{type(error).__name__}: {error}") from None
        finally:
            self.close()

    def _threaded_head(self) -> bytes:
        """_head's answer from the exchange in the helper (its errors mapped as _head maps them)."""
        try:
            received: bytes = self.threaded.result()
        except TimeoutError as error:
            raise _too_slow(self.ref.endpoint, str(error)) from None
        except ConnectionError as error:
            raise _Redo(str(error)) from None
        except OSError as error:  # TLS, the certificate...: the full client asks and says what is wrong
            raise _Undecided(f"TLS: {error}") from None
        finally:
            self.close()
        head, end, _ = received.partition(b"\r\n\r\n")
        if not end:  # as _read_head
            too_long = len(received) > HEADER_LIMIT
            raise _Undecided(f"more than {HEADER_LIMIT} bytes of headers" if too_long else
                             "the connection closed before the end of the headers")
        return head

    def _connected(self) -> None:
        """Wait for the connection begun (at most CONNECT_TIMEOUT); _Redo if it failed."""
        import select

        _, writable, _ = select.select([], [self.sock], [], _left(self.deadline, CONNECT_TIMEOUT, self.ref.endpoint))
        if not writable:
            raise _too_slow(self.ref.endpoint, "the connection timed out")
        if self.sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR):
            raise _Redo("connect failed")
        self.connecting = False

    def _fail(self) -> None:
        self.close()
        self.redo = True

    def close(self) -> None:
        if self.threaded is not None:  # its thread stopped and joined before the socket it uses is closed
            self.threaded.close()
        if self.sock is not None:
            self.sock.close()


_EINPROGRESS, _ENOTCONN = 115, 107  # Linux's errno values (`errno` is not imported for two numbers)


def split_endpoint(endpoint: str, *, https: bool) -> tuple[str | None, int]:
    """host and port of HOST[:PORT] or [V6][:PORT]; (None, 0) for anything else."""
    default = 443 if https else 80
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    else:
        host, _, port_text = endpoint.partition(":")
    if not host or (port_text and not (port_text.isdigit() and port_text.isascii() and 0 < int(port_text) < 65536)):
        return None, 0
    if not host.isascii() or any(char in host for char in "/@ \t\r\n"):
        return None, 0  # an IDN or anything odd: the full client's
    return host, int(port_text) if port_text else default


def _request(ref: Reference, reference: str, *, https: bool) -> bytes:
    from singpy import __version__
    from singpy.oci.manifest import ACCEPT

    netloc = ref.endpoint.removesuffix(":443" if https else ":80")  # as http.client names it
    lines = [f"HEAD /v2/{ref.repository}/manifests/{reference} HTTP/1.1", f"Host: {netloc}",
             f"User-Agent: singpy/{__version__}", f"Accept: {ACCEPT}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("ascii")


def _exchange(host: str, port: int, request: bytes, *, https: bool, env: Mapping[str, str], deadline: float,
              endpoint: str) -> bytes:
    """The status line and headers the registry answers `request` with (the body of a HEAD is empty)."""
    sock: Any = _connect(host, port, deadline, endpoint)
    try:
        if https:
            sock = _wrap(sock, host, endpoint, env, deadline)
        sock.settimeout(_left(deadline, READ_TIMEOUT, endpoint))
        sock.sendall(request)
        return _read_head(sock, deadline, endpoint)
    except TimeoutError:  # a wait of READ_TIMEOUT (or CONNECT_TIMEOUT for the handshake) with no byte
        raise _too_slow(endpoint, "no data within the read timeout") from None
    except OSError as error:  # a reset, a TLS failure...: the full client retries it or says what it is
        raise _Undecided(f"{type(error).__name__}: {error}") from None
    finally:
        sock.close()


def _connect(host: str, port: int, deadline: float, endpoint: str) -> _socket.socket:
    """A TCP connection to the first address of `host` that accepts one (as socket.create_connection)."""
    from singpy.oci.regerrors import Unreachable

    try:
        addresses = _socket.getaddrinfo(host.encode("ascii"), port, 0, _socket.SOCK_STREAM)
    except _socket.gaierror as error:
        reason = (error.strerror or "unknown host").lower()
        raise Unreachable(f"can't reach registry {endpoint}: {reason}") from None
    failure: OSError | None = None
    for family, kind, proto, _, address in addresses:
        sock = _Socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline, CONNECT_TIMEOUT, endpoint))
            sock.connect(address)
            # As http.client: the request leaves at once (Nagle would hold it, after the TLS handshake's last
            # message, for the server's delayed ACK: ~40 ms).
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            return sock
        except OSError as error:
            sock.close()
            if isinstance(error, TimeoutError):
                raise _too_slow(endpoint, "the connection timed out") from None
            failure = error
    reason = (failure.strerror or str(failure)).lower() if failure is not None else "no address"
    raise Unreachable(f"can't reach registry {endpoint}: {reason}")


def _wrap(sock: _socket.socket, host: str, endpoint: str, env: Mapping[str, str], deadline: float) -> Any:
    """TLS on `sock`, verified as singpy.oci.transport verifies (the handshake bounded by CONNECT_TIMEOUT;
    an SSLError, an OSError, goes to the full client, which says what is wrong with the certificate).

    On `_ssl` itself (singpy.oci.tlsconf.quick_context): what `ssl.SSLSocket` adds is Python around the same
    calls; the C object verifies the chain and, given server_hostname, the name or IP address (OpenSSL's
    X509_VERIFY_PARAM host check) during do_handshake, bounded by the socket's timeout as every read is.
    """
    from singpy.oci import quicktls

    sock.settimeout(_left(deadline, CONNECT_TIMEOUT, endpoint))
    try:
        tls = quicktls.tls_object(sock, host, endpoint, env)
    except (AttributeError, TypeError) as error:  # another Python's _ssl: the full client (through `ssl`)
        raise _Undecided(f"_ssl: {error}") from None
    tls.do_handshake()
    return quicktls.TLSStream(sock, tls)


def _read_head(sock: _socket.socket, deadline: float, endpoint: str) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        if len(received) > HEADER_LIMIT:
            raise _Undecided(f"more than {HEADER_LIMIT} bytes of headers")
        sock.settimeout(_left(deadline, READ_TIMEOUT, endpoint))
        chunk = sock.recv(4096)
        if not chunk:
            raise _Undecided("the connection closed before the end of the headers")
        received += chunk
    return received.partition(b"\r\n\r\n")[0]


def digest_of(head: bytes) -> str | None:
    """The Docker-Content-Digest of a 200 answer's head (status line and headers); _Undecided otherwise."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise _Undecided("non-ASCII headers") from None
    status_line, *headers = text.split("\r\n")
    version, _, rest = status_line.partition(" ")
    status = rest.partition(" ")[0]  # "200", exactly: not "2000"
    if not version.startswith("HTTP/1.") or status != "200":
        raise _Undecided(f"status {status_line[:40]!r}")
    if any(line[:1] in (" ", "\t") for line in headers):  # a folded line: http.client would not read it so
        raise _Undecided("a folded header line")
    found = [value.strip() for name, _, value in (line.partition(":") for line in headers)
             if name.lower() == "docker-content-digest"]
    if len(found) != 1 or not valid_digest(found[0]):
        raise _Undecided("no single valid Docker-Content-Digest")
    return found[0]


def _left(deadline: float, most: float, endpoint: str) -> float:
    """Seconds the next wait may take: at most `most`, never past the answer's deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _too_slow(endpoint, "the answer took longer than SINGPY_PULL_DOCUMENT_TIMEOUT")
    return min(most, left)


def _too_slow(endpoint: str, reason: str) -> Exception:
    from singpy.oci.regerrors import Unreachable

    return Unreachable(f"registry {endpoint} is too slow: {reason}")

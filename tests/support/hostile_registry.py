"""A hostile registry for the tests: crafted answers over HTTP and HTTPS, and a log of every request.

Two Python http.servers on threads of this process, on 127.0.0.1 and ports the kernel chose: `https`
(a self-signed CA made by tests.support.registry.make_tls; singpy is told to trust it with
SSL_CERT_FILE=ca_file) and `http` (plain). Both serve the same repositories; each repository is added
with an image (tests.support.oci.Image) and a SCENARIO saying how to misbehave:

    honest            the distribution protocol, Range requests answered with 206
    cut-no-range      layer blobs: Range ignored, every answer cut at half its Content-Length
    trickle-headers   manifests (GET and HEAD): the status line and headers sent one byte per `interval`
    trickle-manifest  manifests: the headers at once, the body one byte per `interval`
    trickle-blob      layer blobs: the body one byte per `interval`
    silent-blob       layer blobs: the headers, then nothing until the client or the server goes
    nested-manifest   the manifest is `depth` nested JSON arrays
    nested-error      manifests: `status` (404 or 500) with an error body of `depth` (5000) nested objects
    nested-token      401 with a Bearer realm on this server's scheme, whose token answer is nested JSON
    realm-http        401 with a Bearer realm on the *plain* http server (for the https registry)
    redirect-http     manifests (GET, HEAD) answered 307 to the same path on the plain http server
    redirect-http-blob   layer blobs answered 307 to the plain http server
    redirect-http-token  401 with an https Bearer realm, which answers 302 to the http realm
    redirect-other-host  layer blobs answered 307 to https://localhost:PORT/elsewhere/... (another host name,
                      same server; /elsewhere/ answers without asking for credentials, as blob storage does)
    odd-digits        manifests: the first GET answered 503 with `Retry-After: ²` (a digit to str.isdigit, not to
                      int()), the next ones 200 with `Content-Length: ²` and the body up to the connection's end

Every scenario except `honest` and the nested ones asks for credentials first: a request without
`Authorization` gets 401 (Basic, or the scenario's Bearer challenge); the credentials are USERNAME and
PASSWORD (`docker_config()` writes them as a ~/.docker/config.json). The redirect targets on the plain
server serve the honest answer, so a client that follows them would succeed: a refusal is singpy's.

    registry = HostileRegistry(directory)       # started; registry.stop() ends it (slow answers too)
    registry.add("cut/x", image, "cut-no-range")
    registry.ref("cut/x")                        # docker://127.0.0.1:HTTPS_PORT/cut/x:latest
    registry.ref("cut/x", secure=False)          # the plain http server's (pull with --no-https)
    registry.seen(scheme="http")                 # [Seen(scheme, method, path, headers), ...]

`fixture_hostile_registry` (session-scoped, registered by tests/conftest.py's plugin list or imported by a
test module as `hostile_registry`) starts one per session in WORKDIR/registries/hostile-XXXX.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.oci import Image
from tests.support.registry import make_tls

USERNAME, PASSWORD = "mallory-victim", "s3cret-never-in-clear"
SCENARIOS = frozenset((
    "honest", "cut-no-range", "trickle-headers", "trickle-manifest", "trickle-blob", "silent-blob",
    "nested-manifest", "nested-error", "nested-token", "realm-http", "redirect-http", "redirect-http-blob",
    "redirect-http-token", "redirect-other-host", "odd-digits"))
_OPEN = frozenset(("honest", "nested-manifest", "nested-error", "odd-digits"))  # no credentials asked for
_BEARER = frozenset(("nested-token", "realm-http", "redirect-http-token"))


class Seen:
    """One request as it arrived: the server's scheme, method, path and headers (names lower-case)."""

    def __init__(self, scheme: str, method: str, path: str, headers: dict[str, str]) -> None:
        self.scheme, self.method, self.path, self.headers = scheme, method, path, headers

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")

    def __repr__(self) -> str:
        return f"Seen({self.scheme} {self.method} {self.path} auth={self.authorization is not None})"


class _Repository:
    def __init__(self, image: Image, scenario: str, params: dict[str, Any]) -> None:
        self.image, self.scenario, self.params = image, scenario, params
        self.lock = threading.Lock()
        self.blobs = {digest: data for digest, data in image.blobs()}


class HostileRegistry:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca_file, cert_file, key_file = make_tls(directory / "tls")
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._repositories: dict[str, _Repository] = {}
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._servers = [_start(self, None), _start(self, context)]
        self.http_port = self._servers[0][0].server_address[1]
        self.https_port = self._servers[1][0].server_address[1]

    def add(self, name: str, image: Image, scenario: str = "honest", **params: Any) -> None:
        """Serve `image` as repository `name` (tag "latest"), misbehaving as `scenario` says.

        params: interval (s between trickled bytes, 0.2), depth (nesting, 100000), status (nested-error, 404).
        """
        assert scenario in SCENARIOS, scenario
        with self._lock:
            self._repositories[name] = _Repository(image, scenario, params)

    def host(self, secure: bool = True) -> str:
        return f"127.0.0.1:{self.https_port if secure else self.http_port}"

    def ref(self, name: str, *, secure: bool = True) -> str:
        return f"docker://{self.host(secure)}/{name}:latest"

    def seen(self, *, scheme: str | None = None, path_part: str = "") -> list[Seen]:
        with self._lock:
            return [seen for seen in self._seen if (scheme is None or seen.scheme == scheme)
                    and path_part in seen.path]

    def docker_config(self, secure: bool = True) -> dict[str, Any]:
        pair = base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
        return {"auths": {self.host(secure): {"auth": pair}}}

    def record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    def repository(self, name: str) -> _Repository | None:
        with self._lock:
            return self._repositories.get(name)

    def stop(self) -> None:
        """Every answer under way ends (trickles and silences wait on `stopping`), then the servers."""
        self.stopping.set()
        for server, thread in self._servers:
            server.shutdown()
            server.server_close()
            thread.join(10)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: HostileRegistry
    context: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        if self.context is not None:  # the handshake happens in the handler's thread: a slow client blocks nobody
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: clients that hang up on a hostile answer are what the tests make happen."""


def _start(owner: HostileRegistry, context: ssl.SSLContext | None) -> tuple[_Server, threading.Thread]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.owner, server.context = owner, context
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name=f"hostile-{'https' if context else 'http'}")
    thread.start()
    return server, thread


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30  # a client that goes silent does not hold a thread for ever

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the owner records what matters."""

    @property
    def owner(self) -> HostileRegistry:
        return self.server.owner

    @property
    def scheme(self) -> str:
        return "https" if self.server.context is not None else "http"

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    # --- dispatch ------------------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        headers = {key.lower(): value for key, value in self.headers.items()}
        self.owner.record(Seen(self.scheme, self.command, self.path, headers))
        path = self.path.partition("?")[0]
        if path.startswith("/token/"):
            return self._token(path.removeprefix("/token/"))
        if path == "/v2/" or path == "/v2":
            return self._send(200, b"{}")
        name, kind, reference = _split(path)
        repository = self.owner.repository(name) if name else None
        if repository is None:
            return self._send(404, b'{"errors": [{"code": "NAME_UNKNOWN", "message": "unknown"}]}')
        scenario = repository.scenario
        if (self.scheme == "http" and scenario != "honest") or self.path.startswith("/elsewhere/"):
            return self._honest(repository, kind, reference)  # downgrade and other-host targets: no questions asked
        if scenario not in _OPEN and not self._authorized(name, scenario):
            return None
        handler = None if scenario == "honest" else getattr(self, "_" + scenario.replace("-", "_"), None)
        if handler is None or not handler(repository, kind, reference, path):
            self._honest(repository, kind, reference)
        return None

    def _authorized(self, name: str, scenario: str) -> bool:
        given = self.headers.get("Authorization") or ""
        basic = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
        if scenario in _BEARER:
            if given == f"Bearer token-for-{name}":
                return True
            realm_scheme, port = ("http", self.owner.http_port) if scenario == "realm-http" else \
                ("https", self.owner.https_port)
            realm = f"{realm_scheme}://127.0.0.1:{port}/token/{name}"
            challenge = f'Bearer realm="{realm}",service="hostile",scope="repository:{name}:pull"'
        else:
            if given == basic:
                return True
            challenge = 'Basic realm="hostile"'
        self._send(401, b'{"errors": [{"code": "UNAUTHORIZED", "message": "log in"}]}',
                   {"WWW-Authenticate": challenge})
        return False

    def _token(self, name: str) -> None:
        repository = self.owner.repository(name)
        if repository is None:
            return self._send(404, b"{}")
        if repository.scenario == "redirect-http-token" and self.scheme == "https":
            return self._send(302, b"", {"Location": f"http://127.0.0.1:{self.owner.http_port}{self.path}"})
        if repository.scenario == "nested-token":
            return self._send(200, _nested(repository.params.get("depth", 100000), "object"))
        return self._send(200, json.dumps({"token": f"token-for-{name}", "expires_in": 300}).encode())

    # --- the honest answers --------------------------------------------------------------------------------------

    def _honest(self, repository: _Repository, kind: str, reference: str) -> None:
        image = repository.image
        if kind == "manifests":
            if reference not in ("latest", image.digest):
                return self._send(404, b'{"errors": [{"code": "MANIFEST_UNKNOWN", "message": "unknown"}]}')
            return self._send(200, image.data, {"Docker-Content-Digest": image.digest}, content_type=image.media_type)
        data = repository.blobs.get(reference)
        if kind != "blobs" or data is None:
            return self._send(404, b'{"errors": [{"code": "BLOB_UNKNOWN", "message": "unknown"}]}')
        start = _range_start(self.headers.get("Range"), len(data))
        if start:
            return self._send(206, data[start:], {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"},
                              content_type="application/octet-stream")
        return self._send(200, data, content_type="application/octet-stream")

    # --- the scenarios (each returns False to give the honest answer instead) ------------------------------------

    def _layer(self, repository: _Repository, kind: str, reference: str) -> bytes | None:
        """The data of a layer blob (not the config: the pull must get as far as the layers)."""
        if kind != "blobs" or reference == repository.image.config_digest:
            return None
        return repository.blobs.get(reference)

    def _cut_no_range(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        data = self._layer(repository, kind, reference)
        if data is None:
            return False
        self._head(200, len(data), content_type="application/octet-stream")
        self._write(data[:len(data) // 2])
        self.close_connection = True  # and the rest never comes
        return True

    def _trickle_headers(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests":
            return False
        image = repository.image
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: {image.media_type}\r\nContent-Length: {len(image.data)}\r\n"
                f"Docker-Content-Digest: {image.digest}\r\nX-Padding: {'p' * 4000}\r\n\r\n").encode()
        if self._trickle(head, repository) and self.command != "HEAD":
            self._write(image.data)
        self.close_connection = True
        return True

    def _trickle_manifest(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests" or self.command == "HEAD":
            return False
        image = repository.image
        self._head(200, len(image.data), {"Docker-Content-Digest": image.digest}, content_type=image.media_type)
        self._trickle(image.data, repository)
        self.close_connection = True
        return True

    def _trickle_blob(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        data = self._layer(repository, kind, reference)
        if data is None:
            return False
        self._head(200, len(data), content_type="application/octet-stream")
        self._trickle(data, repository)
        self.close_connection = True
        return True

    def _silent_blob(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        data = self._layer(repository, kind, reference)
        if data is None:
            return False
        self._head(200, len(data), content_type="application/octet-stream")
        self._wait_for_hangup()
        self.close_connection = True
        return True

    def _nested_manifest(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests":
            return False
        body = _nested(repository.params.get("depth", 100000), "array")
        self._send(200, body, content_type="application/vnd.oci.image.manifest.v1+json")
        return True

    def _nested_error(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests":
            return False
        # 5000 levels: 35 KB, within what singpy reads of an error body (64 KiB), deep enough for a RecursionError
        self._send(repository.params.get("status", 404), _nested(repository.params.get("depth", 5000), "object"))
        return True

    def _odd_digits(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests" or self.command != "GET":
            return False
        with repository.lock:
            first = not repository.params.get("answered")
            repository.params["answered"] = True
        if first:
            self._send(503, b"{}", {"Retry-After": "\u00b2"})
            return True
        image = repository.image
        self.send_response(200)
        for key, value in (("Content-Type", image.media_type), ("Content-Length", "\u00b2"),
                           ("Docker-Content-Digest", image.digest), ("Connection", "close")):
            self.send_header(key, value)
        self.end_headers()
        self._write(image.data)
        self.close_connection = True
        return True

    def _redirect_http(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if kind != "manifests":
            return False
        self._send(307, b"", {"Location": f"http://127.0.0.1:{self.owner.http_port}{self.path}"})
        return True

    def _redirect_http_blob(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if self._layer(repository, kind, reference) is None:
            return False
        self._send(307, b"", {"Location": f"http://127.0.0.1:{self.owner.http_port}{self.path}"})
        return True

    def _redirect_other_host(self, repository: _Repository, kind: str, reference: str, path: str) -> bool:
        if self._layer(repository, kind, reference) is None:
            return False
        self._send(307, b"", {"Location": f"https://localhost:{self.owner.https_port}/elsewhere{self.path}"})
        return True

    # --- writing -------------------------------------------------------------------------------------------------

    def _head(self, status: int, length: int, headers: dict[str, str] | None = None, *,
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, *,
              content_type: str = "application/json") -> None:
        self._head(status, len(body), headers, content_type=content_type)
        if self.command != "HEAD":
            self._write(body)

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client hung up: what a well-behaved client does to a hostile answer
            self.close_connection = True
            return False
        return True

    def _trickle(self, data: bytes, repository: _Repository) -> bool:
        """`data` one byte per interval; False when the client hung up or the server stops first."""
        interval = repository.params.get("interval", 0.2)
        for position in range(len(data)):
            if self.owner.stopping.wait(interval) or not self._write(data[position:position + 1]):
                return False
        return True

    def _wait_for_hangup(self) -> None:
        """Hold the connection, sending nothing, until the client closes it or the server stops."""
        self.connection.settimeout(0.1)
        while not self.owner.stopping.is_set():
            try:
                if not self.connection.recv(1):
                    return
            except TimeoutError:
                continue
            except (OSError, ssl.SSLError):
                return


def _split(path: str) -> tuple[str, str, str]:
    """("repo/name", "manifests" or "blobs", REFERENCE) of /v2/repo/name/KIND/REFERENCE (or /elsewhere/v2/...)."""
    path = path.removeprefix("/elsewhere")
    if not path.startswith("/v2/"):
        return "", "", ""
    for kind in ("manifests", "blobs"):
        name, found, reference = path[4:].rpartition(f"/{kind}/")
        if found:
            return name, kind, reference
    return "", "", ""


def _range_start(header: str | None, size: int) -> int:
    if not header or not header.startswith("bytes=") or not header[6:].rstrip("-").isdigit():
        return 0
    start = int(header[6:].rstrip("-"))
    return start if start < size else 0


def _nested(depth: int, kind: str) -> bytes:
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"errors": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


@contextlib.contextmanager
def start_hostile_registry(directory: Path) -> Iterator[HostileRegistry]:
    registry = HostileRegistry(directory)
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session", name="hostile_registry")
def fixture_hostile_registry(workdir: Path) -> Iterator[HostileRegistry]:
    base = workdir / "registries"
    base.mkdir(exist_ok=True)
    base.chmod(0o755)
    directory = Path(tempfile.mkdtemp(prefix="hostile-", dir=base))
    directory.chmod(0o755)
    with start_hostile_registry(directory) as registry:
        yield registry

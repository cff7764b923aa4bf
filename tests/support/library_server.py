"""A strict Sylabs library for the tests, over real HTTP(S) on 127.0.0.1, backed by real files.

No library server can be installed from the package registries this machine reaches, so this one was
written from the client's source: github.com/apptainer/container-library-client (client/api.go, pull.go,
push.go, search.go, version.go, restclient.go) and Apptainer's internal/pkg/remote/endpoint (service
discovery, token check) and internal/pkg/client/library/user.go. It serves the routes that client calls,
answers as it expects ({"data": ...}; errors {"error": {"code", "message"}}), and refuses what the real
service refuses:

* a request carrying a token that is not one of `tokens` (401), a write without a token (401), an entity
  created for someone else or a container written in someone else's entity (403);
* an image, tag or architecture it does not have (404: tags are per architecture);
* an upload whose bytes are not the size and sha256 announced, tags set for another architecture than the
  SIF's (400).

Image files are not served by the library: `GET v1/imagefile/...` answers 303 with a presigned URL of a
second server on another port ("object storage"), which checks the signature and expiry and, as S3 does,
refuses a request that carries an Authorization header besides (400): a client that sends the library's
token there fails. Uploads go there too (`POST v2/imagefile/ID` gives the presigned PUT URL; a large file
goes in parts: tests.support.library_uploads).

    with start_library(tmp_path, tokens={"TOKEN": "alice"}, tls=False) as library:
        library.url          http://127.0.0.1:PORT (the endpoint: remote add NAME 127.0.0.1:PORT --insecure)
        library.host         127.0.0.1:PORT (library://HOST/entity/collection/container)
        library.store        tests.support.library_store.LibraryStore: store.add(sif, "e/c/k", ("tag",))
        library.requests     [(method, path, authorization or "")] the library received
        library.object_requests  the same for object storage
        library.ca_file      the CA to trust (SSL_CERT_FILE) with tls=True
        library.stall        seconds object storage pauses halfway through a file (library.stalled: it did)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.library_store import LibraryStore
from tests.support.registry_http import Handler, Server, shutdown
from tests.support.registry_tls import make_tls

API_VERSION = "2.0.0-alpha.2"
SIGNATURE_LIFETIME = 300


class LibraryServer:
    def __init__(self, root: Path, tokens: dict[str, str], tls: bool) -> None:
        self.store = LibraryStore(root / "store")
        self.tokens = tokens
        self.key = os.urandom(32)
        self.requests: list[tuple[str, str, str]] = []
        self.object_requests: list[tuple[str, str, str]] = []
        self.uploads: dict[str, dict[str, Any]] = {}  # image id -> the announced size and sha256
        self.multipart_offered = True  # POST v2/imagefile/ID/_multipart answers (else 404: single uploads)
        self.part_size = 64 << 20  # the part size it announces (a test makes it small)
        self.multiparts: dict[str, dict[str, Any]] = {}  # upload id -> its parts (tests.support.library_uploads)
        self.refuse_part = 0  # object storage refuses this part number (500)
        self.stall = 0.0  # seconds object storage pauses in the middle of a file
        self.stalled = threading.Event()  # set when it does
        self.context: ssl.SSLContext | None = None
        self.ca_file: str | None = None
        if tls:
            self.ca_file, cert, key = make_tls(root / "tls")
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(cert, key)
        self.scheme = "https" if tls else "http"
        self._servers = [self._serve(LibraryHandler), self._serve(ObjectHandler)]
        self.port = self._servers[0][0].server_address[1]
        self.object_port = self._servers[1][0].server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{self.scheme}://{self.host}"
        self.object_url = f"{self.scheme}://127.0.0.1:{self.object_port}"

    def _serve(self, handler: type[Handler]) -> tuple[Server, threading.Thread]:
        server = Server(("127.0.0.1", 0), handler)
        server.owner = self
        if self.context is not None:
            server.socket = self.context.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        return server, thread

    def stop(self) -> None:
        for server, thread in self._servers:
            shutdown(server, thread)

    def ref(self, path: str, tag: str = "latest") -> str:
        return f"library://{self.host}/{path}:{tag}"

    def sign(self, action: str, name: str) -> str:
        """A presigned URL of object storage for `action` on `name`."""
        expires = str(int(time.time()) + SIGNATURE_LIFETIME)
        signature = hmac.new(self.key, f"{action} {name} {expires}".encode(), hashlib.sha256).hexdigest()
        kind = {"GET": "objects", "PUT": "uploads", "PART": "parts"}[action]
        return f"{self.object_url}/{kind}/{name}?X-Expires={expires}&X-Signature={signature}"

    def signed(self, action: str, name: str, query: dict[str, list[str]]) -> bool:
        expires, signature = query.get("X-Expires", [""])[0], query.get("X-Signature", [""])[0]
        wanted = hmac.new(self.key, f"{action} {name} {expires}".encode(), hashlib.sha256).hexdigest()
        return expires.isdigit() and int(expires) >= time.time() and hmac.compare_digest(signature, wanted)


class _Base(Handler):
    server: Server

    @property
    def library(self) -> LibraryServer:
        owner: LibraryServer = self.server.owner
        return owner

    def fail(self, status: int, message: str) -> None:
        self.send_body(status, json.dumps({"error": {"code": status, "message": message}}).encode())

    def answer(self, data: Any, status: int = 200) -> None:
        self.send_body(status, json.dumps({"data": data}).encode())

    def body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class LibraryHandler(_Base):
    """The library API (and the endpoint's service discovery, token check and user service)."""

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    def do_PUT(self) -> None:
        self.route("PUT")

    def do_DELETE(self) -> None:
        self.route("DELETE")

    def route(self, method: str) -> None:
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        authorization = self.headers.get("Authorization") or ""
        self.library.requests.append((method, path, authorization))
        user = self.user(authorization)
        if user is None:
            self.fail(401, "invalid or expired token")
            return
        if method != "GET" and not user:
            self.fail(401, "authentication required")
            return
        with self.library.store.lock:
            self.dispatch(method, path, query, user)

    def user(self, authorization: str) -> str | None:
        """"" when anonymous, the token's user, or None for a token the library does not know."""
        if not authorization:
            return ""
        scheme, _, token = authorization.partition(" ")
        return self.library.tokens.get(token) if scheme == "Bearer" else None

    def dispatch(self, method: str, path: str, query: dict[str, list[str]], user: str) -> None:
        from tests.support.library_uploads import ROUTES

        for route_method, prefix, function in ROUTES:
            if method == route_method and (path == prefix or (prefix.endswith("/") and path.startswith(prefix))):
                function(self, path.removeprefix(prefix), query, user)
                return
        self.fail(404, f"no route {method} {path}")


class ObjectHandler(_Base):
    """Object storage: presigned GET of a file, presigned PUT of an upload; no other credential accepted."""

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        name = parts.path.removeprefix("/objects/")
        self.library.object_requests.append(("GET", parts.path, self.headers.get("Authorization") or ""))
        if self.headers.get("Authorization"):
            self.fail(400, "Only one auth mechanism allowed")
            return
        if not parts.path.startswith("/objects/") or not self.library.signed("GET", name, parse_qs(parts.query)):
            self.fail(403, "signature does not match or has expired")
            return
        path = self.library.store.object_path(name)
        if not path.is_file():
            self.fail(404, "no such key")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        with open(path, "rb") as handle:
            if self.library.stall:  # half the file, then a pause (a test interrupts the client meanwhile)
                self.wfile.write(handle.read(path.stat().st_size // 2))
                self.wfile.flush()
                self.library.stalled.set()
                time.sleep(self.library.stall)
            while chunk := handle.read(1 << 20):
                self.wfile.write(chunk)

    def do_PUT(self) -> None:
        from tests.support.library_uploads import store_part, store_upload

        parts = urlsplit(self.path)
        kind, _, name = parts.path.lstrip("/").partition("/")
        self.library.object_requests.append(("PUT", parts.path, self.headers.get("Authorization") or ""))
        data = self.body()
        if self.headers.get("Authorization"):
            self.fail(400, "Only one auth mechanism allowed")
        elif kind == "uploads" and self.library.signed("PUT", name, parse_qs(parts.query)):
            store_upload(self, name, data)
        elif kind == "parts" and self.library.signed("PART", name, parse_qs(parts.query)):
            store_part(self, name, data)
        else:
            self.fail(403, "signature does not match or has expired")


@contextmanager
def start_library(root: Path, *, tokens: dict[str, str] | None = None, tls: bool = False) -> Iterator[LibraryServer]:
    """A library and its object storage, stopped when the block ends."""
    root.mkdir(parents=True, exist_ok=True)
    server = LibraryServer(root, tokens or {}, tls)
    try:
        yield server
    finally:
        server.stop()

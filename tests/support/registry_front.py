"""Servers that sit before or beside the test registry (tests/support/registry.py) and do what a registry
never does by itself: `Front`, a small reverse proxy that misbehaves on request (answers 503, sends a schema 1
manifest, garbage, a generic Content-Type, cuts a blob short), and `ForwardProxy`, an HTTP proxy (CONNECT and
absolute URLs) for the http(s)_proxy tests. Both run in the test's process, on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import http.server
import select
import socket
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self

    from tests.support.registry import RegistryServer


class Seen:
    """A request a server of this module received."""

    def __init__(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.headers = method, path, headers


class _Threaded(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: Any = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet: a client that hangs up on a huge or garbage answer is what some tests do on purpose."""


class _Served:
    """A server of this module on 127.0.0.1 (its `host`), served by a thread from `with` to its end."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = _Threaded(("127.0.0.1", 0), handler)
        self._server.owner = self
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class Front(_Served):
    """A reverse proxy before `upstream` that misbehaves on request (rules used in order, each once)."""

    def __init__(self, upstream: RegistryServer) -> None:
        self.upstream = upstream
        self.https = False
        self.requests: list[Seen] = []
        self.drop_range = False  # forward blob requests without their Range header (a server without ranges)
        self._rules: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        super().__init__(_FrontHandler)
        self.port = self._server.server_address[1]

    def answer(self, path_part: str, status: int, body: bytes, headers: Mapping[str, str],
               *, chunked: bool = False) -> None:
        with self._lock:
            self._rules.append((path_part, "answer", (status, body, dict(headers), chunked)))

    def raw(self, path_part: str, data: bytes) -> None:
        with self._lock:
            self._rules.append((path_part, "raw", data))

    def rewrite(self, path_part: str, headers: Mapping[str, str], *, times: int = 1) -> None:
        with self._lock:
            self._rules.extend([(path_part, "rewrite", dict(headers))] * times)

    def take(self, path: str) -> tuple[str, Any] | None:
        with self._lock:
            for position, (part, kind, value) in enumerate(self._rules):
                if part in path:
                    del self._rules[position]
                    return kind, value
            return None

    def record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Threaded

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def _handle(self) -> None:
        front: Front = self.server.owner
        headers = {key.lower(): value for key, value in self.headers.items()}
        front.record(Seen(self.command, self.path, headers))
        rule = front.take(self.path)
        if rule is not None and rule[0] == "raw":
            self.wfile.write(rule[1])
            self.close_connection = True
            return
        if rule is not None and rule[0] == "answer":
            status, body, extra, chunked = rule[1]
            self.send_response(status)
            for key, value in extra.items():
                self.send_header(key, value)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for start in range(0, len(body), 65536):
                    piece = body[start:start + 65536]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return
        self._forward(front, headers, rule[1] if rule is not None else {})

    def _forward(self, front: Front, headers: dict[str, str], rewrite: dict[str, str]) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", front.upstream.port, timeout=60)
        sent = {key: value for key, value in headers.items() if key not in ("host", "connection")}
        if front.drop_range and "/blobs/" in self.path:
            sent.pop("range", None)
        upstream.request(self.command, self.path, headers=sent)
        answer = upstream.getresponse()
        body = answer.read()
        upstream.close()
        self.send_response(answer.status)
        replaced = {key.lower() for key in rewrite}
        for key, value in answer.getheaders():
            if key.lower() not in replaced | {"content-length", "connection", "transfer-encoding"}:
                self.send_header(key, value)
        for key, value in rewrite.items():
            if value:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class ForwardProxy(_Served):
    """An HTTP proxy: CONNECT tunnels and absolute-URL requests; records request lines and Proxy-Authorization."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.authorizations: list[str] = []
        super().__init__(_ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Threaded

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _note(self) -> None:
        proxy: ForwardProxy = self.server.owner
        proxy.lines.append(self.requestline)
        if self.headers.get("Proxy-Authorization"):
            proxy.authorizations.append(self.headers["Proxy-Authorization"])

    def do_CONNECT(self) -> None:
        self._note()
        host, _, port = self.path.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=30) as upstream:
            self.send_response(200, "Connection established")
            self.end_headers()
            self.wfile.flush()
            _relay(self.connection, upstream)
        self.close_connection = True

    def do_GET(self) -> None:
        self._note()
        from urllib.parse import urlsplit

        parts = urlsplit(self.path)
        upstream = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=60)
        sent = {key: value for key, value in self.headers.items()
                if key.lower() not in ("proxy-authorization", "connection", "host")}
        upstream.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=sent)
        answer = upstream.getresponse()
        body = answer.read()
        upstream.close()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _relay(client_side: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    sockets = [client_side, upstream]
    while True:
        readable, _, _ = select.select(sockets, [], [], 30)
        if not readable:
            return
        for sock in readable:
            try:
                data = sock.recv(65536)
                if not data:
                    return
                (upstream if sock is client_side else client_side).sendall(data)
            except OSError:
                return

"""The small HTTP servers of the tests' helpers (registries, a library, a keyserver, an OCSP responder):
a quiet threaded server and handler base, started on a free port and stopped when the test is done."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class Server(http.server.ThreadingHTTPServer):
    """A threaded HTTP server whose handlers reach the object that owns it as `server.owner`."""

    daemon_threads = True
    block_on_close = False  # a stalled handler must not hold up shutdown (stalls are released first anyway)
    owner: Any = None


class Handler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1, no log lines, and the two helpers every handler uses."""

    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: what matters is recorded by the owner."""

    def send_body(self, status: int, body: bytes, content_type: str = "application/json",
                  headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def lowered_headers(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}


def serve(address: str, handler: type[http.server.BaseHTTPRequestHandler],
          owner: object) -> tuple[Server, threading.Thread]:
    """A Server on `address` and a port the kernel chose, serving on a daemon thread."""
    server = Server((address, 0), handler)
    server.owner = owner
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name=f"{type(owner).__name__}-{server.server_address[1]}")
    thread.start()
    return server, thread


def shutdown(server: Server, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(10)


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], address: str = "127.0.0.1",
            owner: object = None) -> Iterator[Server]:
    """A Server on `address` (a free port: nothing shared with another run) until the block ends."""
    server, thread = serve(address, handler, owner)
    try:
        yield server
    finally:
        shutdown(server, thread)

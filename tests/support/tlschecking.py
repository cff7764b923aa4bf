"""What the TLS check's tests share (tests/unit/test_tlscheck*.py): the answer and request of a check, a TLS
server answering it, a connect under way as quickhead hands it over, a check started, the helper processes a
process has, and the settings the helper's context is made with."""

from __future__ import annotations

import importlib
import os
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.answering import Answering

DIGEST = "sha256:" + "ab" * 32
OK = f"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode()
REQUEST = b"HEAD /v2/some/image/manifests/v1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT = 0x4, 0x20


def _module() -> Any:
    """singpy.oci._tlscheck (the test modules skip where make setup did not build it)."""
    return importlib.import_module("singpy.oci._tlscheck")


def answering(tls_files: tuple[str, str, str]) -> Iterator[Answering]:
    """A TLS server on 127.0.0.1 with the test CA's certificate, answering OK; stopped afterwards."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files[1], tls_files[2])
    started = Answering(OK, tls=context)
    yield started
    started.stop()


def connecting(port: int) -> socket.socket:
    """A socket whose connect() to 127.0.0.1:port is under way, as quickhead hands it over."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))
    return sock


def start(sock: socket.socket, *, host: bytes = b"127.0.0.1", cert_file: str = "", extra: bytes = b"",
          timeout: float = 5.0, left: float = 10.0) -> Any:
    return _module().start(sock.fileno(), host, REQUEST, cert_file.encode(), b"", extra, timeout, timeout, left,
                           64 << 10)


def helpers(pid: int | str = "self") -> list[int]:
    """The helper processes that are children of process `pid` (this one by default)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue  # a thread (a test server's) gone meanwhile
        for child in children:
            try:
                if os.readlink(f"/proc/{child}/exe") == _module().helper():
                    found.append(int(child))
            except OSError:
                pass  # gone meanwhile
    return found


def settings() -> dict[str, Any]:
    """What `_tlscheck_helper settings` says its context is made with."""
    done = subprocess.run([_module().helper(), "settings"], capture_output=True, text=True, check=True, timeout=30)
    values: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition(" ")
        values[name] = value.split(":") if name == "ciphers" else int(value)
    return values

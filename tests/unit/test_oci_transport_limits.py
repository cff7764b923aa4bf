"""singpy.oci.transport against peers that send a byte now and then: no read timeout catches them, the limits do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from singpy.oci import transport
from singpy.oci.limits import Limits
from singpy.oci.transport import Transport, TransportError


@pytest.fixture
def trickler() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that sends one byte every 0.1 s: of `HTTP/1.1 200 OK...`, or of a TLS record."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=trickle, args=(client,), daemon=True).start()

    def trickle(client: socket.socket) -> None:
        with client:
            client.settimeout(5)
            first = client.recv(1)  # a TLS ClientHello starts with 0x16: answer with a record that never ends
            data = b"\x16\x03\x03\x40\x00" if first == b"\x16" else b"HTTP/1.1 200 OK\r\nX-Slow: "
            for byte in data + b"x" * 10000:
                if stop.wait(0.1):
                    return
                try:
                    client.sendall(bytes([byte]))
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def test_a_proxy_that_trickles_its_connect_answer_ends_at_the_connect_timeout(
        trickler: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT", 1.0)
    started = time.monotonic()
    with pytest.raises(TransportError, match="not ready within 1 s") as caught:
        Transport({"https_proxy": f"http://127.0.0.1:{trickler}"}).request("GET", "https://registry.invalid/v2/", {})
    assert caught.value.slow and not caught.value.retriable
    assert time.monotonic() - started < 5


def test_a_trickled_tls_handshake_ends_at_the_connect_timeout(trickler: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT", 1.0)
    started = time.monotonic()
    # Python's ssl bounds a whole handshake by the socket's timeout, and our watch fires at the same moment:
    # either may win the race, and either ends it.
    with pytest.raises(TransportError, match="not ready within 1 s|connection timed out") as caught:
        Transport({}).request("GET", f"https://127.0.0.1:{trickler}/v2/", {})
    assert not caught.value.retriable
    assert time.monotonic() - started < 5


def test_trickled_headers_end_at_the_document_deadline(trickler: int) -> None:
    limits = Limits(low_speed=1, stall_timeout=1.0, document_timeout=1.0)  # 10 bytes/s pass the low-speed rule
    started = time.monotonic()
    with pytest.raises(TransportError, match="took more than 1 s.*SINGPY_PULL_DOCUMENT_TIMEOUT") as caught:
        Transport({}, limits).request("GET", f"http://127.0.0.1:{trickler}/v2/", {})
    assert caught.value.slow and not caught.value.retriable
    assert time.monotonic() - started < 5


def test_trickled_headers_of_a_blob_end_on_the_low_speed_rule(trickler: int) -> None:
    limits = Limits(low_speed=100, stall_timeout=0.5, document_timeout=60.0)
    started = time.monotonic()
    with pytest.raises(TransportError, match="fewer than 50 bytes arrived in 0.5 s"):
        Transport({}, limits).request("GET", f"http://127.0.0.1:{trickler}/v2/", {}, document=False)
    assert time.monotonic() - started < 5


def test_a_large_body_to_a_slow_reader_is_bounded_per_stall_not_in_total(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain socket's sendall bounds the whole send by its timeout: a push chunk to a registry reading at
    ~1 MB/s failed after READ_TIMEOUT however steadily it read. Here: 1 s, a reader at ~3 MB/s, 8 MiB."""
    monkeypatch.setattr(transport, "READ_TIMEOUT", 1.0)
    sender, reader = socket.socketpair()
    received = []

    def read_slowly() -> None:
        with reader:
            while chunk := reader.recv(64 << 10):
                received.append(len(chunk))
                time.sleep(0.02)

    thread = threading.Thread(target=read_slowly, daemon=True)
    thread.start()
    watched = transport._Watched(sender)
    watched.sendall(b"x" * (8 << 20))
    sender.close()
    thread.join(30)
    assert sum(received) == 8 << 20

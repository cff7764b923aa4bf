"""singpy.oci._tlscheck: a cached tag's HEAD request over TLS in a helper process (issue 31).

The helper must verify as `_ssl` verifies (the same context, the same trust), ask nothing before it is told
to, end every wait at the caller's limits, take none of the terminal's signals, and be gone (killed and reaped)
once its answer is read, its check closed or its context released: the launch that follows would leave it to
the container's program as a child it never made. Real TLS servers on 127.0.0.1 (tests.support.answering) with
a CA made for the test (tests.support.registry_tls). The helper's life (signals, contexts prepared ahead,
forks, its launcher's end) is in test_tlscheck_helper.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.answering import Answering
from tests.support.registry_tls import make_tls
from tests.support.tlschecking import (
    OK,
    REQUEST,
    X509_CHECK_FLAG_NEVER_CHECK_SUBJECT,
    X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS,
    answering,
    connecting,
    helpers,
    settings,
    start,
)

_tlscheck: Any = pytest.importorskip("singpy.oci._tlscheck", reason="the C extension is built by make setup")
if _tlscheck.helper() is None:
    pytest.skip("the helper program is built by make setup (OpenSSL's headers)", allow_module_level=True)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(tls_files: tuple[str, str, str]) -> Iterator[Answering]:
    yield from answering(tls_files)


def test_the_context_is_the_one_ssl_makes_for_a_client() -> None:
    """The options, verify flags, host flags and ciphers of `ssl.SSLContext(PROTOCOL_TLS_CLIENT)` in this very
    interpreter; the minimum version TLS 1.2 (Debian's _ssl leaves it to OpenSSL's configuration, which says the
    same; others set TLS 1.2)."""
    ours, theirs = settings(), ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert ours["options"] == int(theirs.options)
    assert ours["verify_flags"] == int(theirs.verify_flags)
    assert ours["ciphers"] == [cipher["name"] for cipher in theirs.get_ciphers()]
    assert ours["hostflags"] & X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS
    assert not ours["hostflags"] & X509_CHECK_FLAG_NEVER_CHECK_SUBJECT  # hostname_checks_common_name, as theirs
    assert theirs.hostname_checks_common_name
    assert ours["minimum_version"] == ssl.TLSVersion.TLSv1_2 >= theirs.minimum_version


@pytest.mark.parametrize("host", [b"127.0.0.1", b"localhost"])
def test_a_trusted_registry_answers_once_told_to_go(server: Answering, tls_files: tuple[str, str, str],
                                                    host: bytes) -> None:
    sock = connecting(server.port)
    try:
        check = start(sock, host=host, cert_file=tls_files[0])
        time.sleep(0.2)
        assert server.requests == []  # connected, the handshake done: nothing asked before `go`
        check.go()
        assert check.result() == OK
        check.close()
    finally:
        sock.close()
    assert server.requests == [REQUEST]


def test_a_registry_ca_from_certs_d_is_trusted(server: Answering, tls_files: tuple[str, str, str]) -> None:
    """The registry's own CA files (certs.d/HOST:PORT/*.crt), handed over NUL-separated, as quickhead does."""
    sock = connecting(server.port)
    try:
        check = start(sock, extra=tls_files[1].encode() + b"\0" + tls_files[0].encode())  # a certificate, the CA
        check.go()
        assert check.result() == OK
    finally:
        sock.close()


@pytest.mark.parametrize(("host", "cert_file", "reason"), [
    (b"127.0.0.1", "", "certificate verify failed: unable to get local issuer certificate"),
    (b"registry.example", "CA", "certificate verify failed: hostname mismatch"),
    (b"127.0.0.2", "CA", "certificate verify failed: IP address mismatch"),
])
def test_an_untrusted_or_misnamed_certificate_is_refused_before_anything_is_asked(
        server: Answering, tls_files: tuple[str, str, str], host: bytes, cert_file: str, reason: str) -> None:
    sock = connecting(server.port)
    try:
        check = start(sock, host=host, cert_file=tls_files[0] if cert_file else "")
        check.go()
        with pytest.raises(OSError, match=reason):
            check.result()
    finally:
        sock.close()
    assert server.requests == []


def test_a_missing_ca_file_is_an_error_for_the_full_client(server: Answering, tmp_path: Path) -> None:
    sock = connecting(server.port)
    try:
        check = start(sock, cert_file=str(tmp_path / "absent.crt"))
        check.go()
        with pytest.raises(OSError, match="SSL_CERT_FILE"):
            check.result()
    finally:
        sock.close()


def test_a_refused_connection_is_asked_again_from_the_start() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    sock = connecting(port)
    try:
        with pytest.raises(ConnectionError, match="connect: Connection refused"):
            start(sock).result()
    finally:
        sock.close()


def test_a_silent_server_ends_at_the_wait_limit_and_close_stops_at_once() -> None:
    """A listener that accepts and never answers the handshake: the wait ends at the limit given (TimeoutError,
    quickhead's "too slow"); with long limits, close() ends the helper at once and nothing is left running."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        sock = connecting(port)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="the connection timed out"):
            start(sock, timeout=0.5).result()
        assert 0.4 < time.monotonic() - started < 3
        sock.close()
        sock = connecting(port)
        check = start(sock, timeout=60, left=120)
        time.sleep(0.2)
        assert len(helpers()) == 1  # the check's helper, waiting
        started = time.monotonic()
        check.close()
        assert time.monotonic() - started < 1
        assert helpers() == []  # killed and reaped before close() returned
        sock.close()
    finally:
        listener.close()


def test_the_answers_deadline_bounds_every_wait() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    sock = connecting(listener.getsockname()[1])
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="SINGPY_PULL_DOCUMENT_TIMEOUT"):
            start(sock, timeout=30, left=0.5).result()
        assert time.monotonic() - started < 3
    finally:
        sock.close()
        listener.close()


def test_a_helper_that_never_answers_is_not_waited_for_past_the_deadline() -> None:
    """A helper stopped (SIGSTOP) before it could answer: result() still ends a second after the answer's
    deadline, and the helper is killed and reaped."""
    listener = socket.create_server(("127.0.0.1", 0))
    sock = connecting(listener.getsockname()[1])
    try:
        check = start(sock, timeout=30, left=0.5)
        (helper,) = helpers()
        os.kill(helper, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="SINGPY_PULL_DOCUMENT_TIMEOUT"):
            check.result()
        assert time.monotonic() - started < 4
        assert helpers() == []
    finally:
        sock.close()
        listener.close()


_INTERRUPTED = """
import json, os, socket, subprocess, sys, time
sys.path.insert(0, {root!r})
from singpy.oci import _tlscheck
listener = socket.create_server(("127.0.0.1", 0))  # accepts, never answers the handshake
sock = socket.socket()
sock.setblocking(False)
sock.connect_ex(listener.getsockname())
check = _tlscheck.start(sock.fileno(), b"127.0.0.1", b"HEAD / HTTP/1.1\\r\\n\\r\\n", b"", b"", b"", 20.0, 20.0, 30.0,
                        65536)
subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -INT {{os.getpid()}}"])
started = time.monotonic()
try:
    check.result()
except KeyboardInterrupt:
    print("KeyboardInterrupt", time.monotonic() - started)
helpers = []
for child in open(f"/proc/self/task/{{os.getpid()}}/children").read().split():
    try:
        if os.readlink(f"/proc/{{child}}/exe") == _tlscheck.helper():
            helpers.append(child)
    except OSError:
        pass  # sh, ended
print(json.dumps(helpers), flush=True)
"""


def test_ctrl_c_ends_the_wait_for_an_answer_at_once() -> None:
    """A registry that never answers, and Ctrl-C: the wait ends at once with KeyboardInterrupt (as `_ssl`'s
    waits end), not at its limit 20 s later, and the helper is killed and reaped. In a process of its own:
    SIGINT is sent to it, with this test's server in it."""
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED.format(root=root)], capture_output=True, text=True,
                          timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("KeyboardInterrupt"), (done.stdout, done.stderr)
    assert float(lines[0].split()[1]) < 5
    assert json.loads(lines[1]) == []  # no helper among the script's children: killed and reaped


class Dripping:
    """A TCP relay to 127.0.0.1:`port` that passes what the server sends `step` bytes every `interval` seconds
    (a registry sending its handshake a few bytes at a time)."""

    def __init__(self, port: int, *, step: int = 100, interval: float = 0.2) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target, self.step, self.interval = port, step, interval
        self.stopping = threading.Event()
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        try:
            client, _ = self.listener.accept()
            with client, socket.create_connection(("127.0.0.1", self.target)) as upstream:
                threading.Thread(target=self._pass, args=(client, upstream), daemon=True).start()
                while not self.stopping.is_set() and (data := upstream.recv(self.step)):
                    client.sendall(data)
                    self.stopping.wait(self.interval)
        except OSError:
            pass  # the client gave up (closed), or stop() came first

    @staticmethod
    def _pass(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # either side closed

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()


def test_a_handshake_sent_a_few_bytes_at_a_time_ends_at_the_connect_limit(server: Answering,
                                                                           tls_files: tuple[str, str, str]) -> None:
    """The handshake as a whole within the connect limit, as `_ssl` bounds one call: a server whose bytes each
    come within the limit, but whose whole handshake takes longer (here ~10 x 0.2 s against 1 s), is too slow."""
    relay = Dripping(server.port)
    sock = connecting(relay.port)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="the connection timed out"):
            start(sock, cert_file=tls_files[0], timeout=1.0, left=30).result()
        assert time.monotonic() - started < 4
    finally:
        sock.close()
        relay.stop()


@pytest.mark.parametrize("host", [b"", b".localhost"])
def test_an_empty_name_or_one_that_starts_with_a_dot_is_not_checked(server: Answering,
                                                                    tls_files: tuple[str, str, str],
                                                                    host: bytes) -> None:
    """Names `_ssl` refuses as server_hostname: OpenSSL would take ".localhost" for any name under localhost.
    The helper ends without asking: the check is asked again through `_ssl` (ConnectionError), which refuses
    them too."""
    sock = connecting(server.port)
    try:
        check = start(sock, host=host, cert_file=tls_files[0])
        check.go()
        with pytest.raises(ConnectionError, match="ended without an answer"):
            check.result()
    finally:
        sock.close()
    assert server.requests == []

"""singpy.oci._tlscheck's helper process over its life (issue 31): it takes none of the terminal's signals, a
context prepared ahead is taken only by a check with the same trust and released when unused, a forked child
leaves the parent's helper alone, it dies with its launcher, and none is started on a standard descriptor left
closed. As test_tlscheck.py: real TLS servers on 127.0.0.1 with a CA made for the test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
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
    answering,
    connecting,
    helpers,
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


def test_the_helper_takes_none_of_the_terminals_signals() -> None:
    """The helper is in the launcher's process group: a Ctrl-C, Ctrl-Z or hang-up there is the launcher's to act
    on (it kills the helper when it is done with it); the helper ignores them, blocks nothing, and ends with
    close() all the same."""
    listener = socket.create_server(("127.0.0.1", 0))
    sock = connecting(listener.getsockname()[1])
    try:
        check = start(sock, timeout=60, left=120)
        time.sleep(0.2)
        (helper,) = helpers()
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{helper}/status").read_text().splitlines())
        ignored = int(status["SigIgn"], 16)
        for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP,
                       signal.SIGPIPE):
            assert ignored & 1 << (number - 1), number
        assert int(status["SigBlk"], 16) == 0
        for number in (signal.SIGINT, signal.SIGTSTP, signal.SIGHUP):
            os.kill(helper, number)
        time.sleep(0.1)
        assert helpers() == [helper] and state(helper) not in ("T", "Z")  # neither stopped nor ended by them
        check.close()
        assert helpers() == []
    finally:
        sock.close()
        listener.close()


def test_a_context_prepared_ahead_is_taken_by_the_next_check(server: Answering,
                                                             tls_files: tuple[str, str, str]) -> None:
    """`prepare` (as soon as the command line names an image) starts the helper, which makes its context at once;
    the check started next is handed to it: nothing is left once the answer is read."""
    _tlscheck.prepare()
    _tlscheck.prepare()  # one at a time: this one is the same
    assert _tlscheck.pending() and len(helpers()) == 1
    sock = connecting(server.port)
    try:
        check = start(sock, cert_file=tls_files[0])
        assert not _tlscheck.pending() and len(helpers()) == 1  # handed to the check: the same helper
        check.go()
        assert check.result() == OK
        _tlscheck.release()  # nothing to release: the check took it
    finally:
        sock.close()
    assert helpers() == []
    assert server.requests == [REQUEST]


@pytest.mark.parametrize(("prepared", "checked", "answer"), [
    ("CA", "CA", "OK"),  # the variables' trust loaded ahead, and taken
    ("CA", "", "certificate verify failed: unable to get local issuer certificate"),  # never more than asked
    ("", "CA", "OK"),  # too little: a context of its own
    ("absent", "CA", "OK"),  # a failure ahead is not the check's when it asks for other files
    ("absent", "absent", "SSL_CERT_FILE"),  # the same, the same error as without one ahead
])
def test_a_context_prepared_with_the_variables_trust_is_taken_only_for_the_same_variables(
        server: Answering, tls_files: tuple[str, str, str], tmp_path: Path, prepared: str, checked: str,
        answer: str) -> None:
    """`prepare(SSL_CERT_FILE, SSL_CERT_DIR)` loads their trust ahead too (~0.7 ms of the check's path); a check
    started with other values must not trust what the prepared context does: it makes its own."""
    files = {"": "", "CA": tls_files[0], "absent": str(tmp_path / "absent.crt")}
    _tlscheck.prepare(files[prepared].encode(), b"")
    sock = connecting(server.port)
    try:
        check = start(sock, cert_file=files[checked])
        assert not _tlscheck.pending()  # handed to the check, taken or not
        check.go()
        if answer == "OK":
            assert check.result() == OK
        else:
            with pytest.raises(OSError, match=answer):
                check.result()
    finally:
        sock.close()
    assert helpers() == []
    assert [request for request in server.requests if request] == ([REQUEST] if answer == "OK" else [])


def test_a_context_prepared_for_another_ca_directory_is_not_taken(server: Answering, tls_files: tuple[str, str, str],
                                                                   tmp_path: Path) -> None:
    """SSL_CERT_DIR compared whole: a prepared context that loaded a directory holding the CA (and one more)
    is no context for a check whose SSL_CERT_DIR names only the directory without it."""
    trusted, empty = tmp_path / "trusted", tmp_path / "empty"
    trusted.mkdir()
    empty.mkdir()
    ca = Path(tls_files[0])
    name = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(ca)], capture_output=True, text=True,
                          check=True).stdout.strip()  # the name OpenSSL looks a CA up by in a directory
    (trusted / f"{name}.0").write_bytes(ca.read_bytes())
    _tlscheck.prepare(b"", f"{empty}:{trusted}".encode())
    sock = connecting(server.port)
    try:
        check = _tlscheck.start(sock.fileno(), b"127.0.0.1", REQUEST, b"", str(empty).encode(), b"", 5.0, 5.0, 10.0,
                                64 << 10)
        check.go()
        with pytest.raises(OSError, match="unable to get local issuer certificate"):
            check.result()
    finally:
        sock.close()
    sock = connecting(server.port)
    try:  # and the directory does trust it when it is the check's
        check = _tlscheck.start(sock.fileno(), b"127.0.0.1", REQUEST, b"", f"{empty}:{trusted}".encode(), b"", 5.0,
                                5.0, 10.0, 64 << 10)
        check.go()
        assert check.result() == OK
    finally:
        sock.close()


def test_a_context_prepared_and_not_used_is_released(server: Answering, tls_files: tuple[str, str, str]) -> None:
    _tlscheck.prepare()
    _tlscheck.release()
    assert not _tlscheck.pending()
    assert helpers() == []  # killed and reaped: no child of the launcher's left to the container's program
    sock = connecting(server.port)
    try:
        check = start(sock, cert_file=tls_files[0])  # a helper of its own, started for it
        check.go()
        assert check.result() == OK
    finally:
        sock.close()


def test_a_forked_child_neither_waits_for_nor_stops_the_parents_helper() -> None:
    """After fork() the check's helper is the parent's child alone: closing the check in the child returns at
    once, signals nothing and waits for nothing; the parent's helper still runs until the parent closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    sock = connecting(listener.getsockname()[1])
    try:
        check = start(sock, timeout=60, left=120)
        child = os.fork()
        if child == 0:
            check.close()
            os._exit(0)
        deadline = time.monotonic() + 5
        while (ended := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if ended[0] == 0:
            os.kill(child, 9)
            os.waitpid(child, 0)
        assert ended[0] == child and os.waitstatus_to_exitcode(ended[1]) == 0, "the child hung on the parent's helper"
        time.sleep(0.1)
        assert len(helpers()) == 1  # the parent's helper still waits: not stopped by the child
        check.close()
        assert helpers() == []
    finally:
        sock.close()
        listener.close()


# A launcher of its own: prepares, says its helper's pid, and leaves the way `_exit_now` does (no exit handlers).
_LAUNCHER = """
import os, sys
sys.path.insert(0, {root!r})
from singpy.oci import _tlscheck
{before}
_tlscheck.prepare()
print(_tlscheck.pending(), flush=True)
children = open(f"/proc/self/task/{{os.getpid()}}/children").read().split()
print(" ".join(children), flush=True)
os._exit(0)
"""


def test_the_helper_dies_with_its_launcher() -> None:
    """A launcher that dies (here: leaves without its exit handlers, as a kill would) takes its helper with it
    (PR_SET_PDEATHSIG): nothing of a run stays behind."""
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _LAUNCHER.format(root=root, before="")], capture_output=True,
                          text=True, check=True, timeout=30)
    pending, pids = done.stdout.splitlines()
    assert pending == "True" and len(pids.split()) == 1, done.stdout
    helper = int(pids)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{helper}") and not zombie(helper):
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{helper}") or zombie(helper)


def state(pid: int) -> str:
    """Process `pid`'s state letter (R, S, T, Z...), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def zombie(pid: int) -> bool:
    return state(pid) == "Z"


def test_no_helper_is_started_on_a_standard_descriptor_left_closed() -> None:
    """The console script may start the helper before singpy.cli.main reopens a closed descriptor 0, 1 or 2 on
    /dev/null: its socket pair must not take that number (the launcher's stdin would be the helper's socket)."""
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _LAUNCHER.format(root=root, before="os.close(0)")],
                          capture_output=True, text=True, check=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.stdout.splitlines() == ["False", ""], done.stdout

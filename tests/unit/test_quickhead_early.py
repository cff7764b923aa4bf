"""A cached tag's check sent ahead (singpy.oci.quickhead `send`/`expect`, singpy.oci.tagcheck; issue 31).

The connection is opened and the request sent before the launcher has finished importing; the answer is read
where the check is asked. It must answer exactly as the check made then would: the same digest, the same
"ask the full client", the same errors within the same deadline, and no request for an image that is not
cached. Real sockets on 127.0.0.1 answer as each case says (tests.support.answering).
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from singpy.oci import quickhead, quicktls, store, tagcheck
from singpy.oci.pull import PullOptions
from singpy.oci.ref import parse
from singpy.oci.regerrors import Unreachable
from tests.support.answering import Answering
from tests.support.registry_tls import make_tls

DIGEST = "sha256:" + "ab" * 32
OK = f"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode()
CHALLENGE = b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="r"\r\n\r\n'


@pytest.fixture
def home(tmp_path: Path) -> str:
    """A HOME whose registries.conf names nothing (the host's files are not read: it is the user's)."""
    conf = tmp_path / ".config" / "containers" / "registries.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# nothing\n")
    return str(tmp_path)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Answering]:
    answer, options = request.param
    started = Answering(answer, **options)
    yield started
    started.stop()


def environment(home: str, **extra: str) -> dict[str, str]:
    return {"HOME": home, "SINGPY_PULL_DOCUMENT_TIMEOUT": "1", **extra}


def ask_early(home: str, port: int, *, host: str = "127.0.0.1", https: bool = False, pause: float = 0.05,
              early_ok: bool = True, **extra: str) -> str | None:
    """The check sent ahead, `pause` seconds of other work, then asked for where the pull asks."""
    ref = parse(f"docker://{host}:{port}/some/image:v1")
    env = environment(home, **extra)
    early = quickhead.send(ref, "v1", https=https, env=env, home=home)
    assert early is not None
    quickhead.expect(early)
    time.sleep(pause)
    if early_ok:  # the exchange begun ahead goes on (no new connection made where it is asked)
        assert not early.redo
    return quickhead.cached_top(ref, "v1", login=False, https=https, env=env, home=home)


@pytest.mark.parametrize("server", [(OK, {}), (OK, {"step": 3, "interval": 0.01})], indirect=True)
@pytest.mark.parametrize("pause", [0.0, 0.05])
def test_a_200_with_a_digest_is_the_answer(home: str, server: Answering, pause: float) -> None:
    assert ask_early(home, server.port, pause=pause) == DIGEST
    assert len(server.requests) == 1
    assert server.requests[0].startswith(b"HEAD /v2/some/image/manifests/v1 HTTP/1.1\r\n")


@pytest.mark.parametrize("server", [
    (CHALLENGE, {}),
    (b"HTTP/1.1 200 OK\r\nDocker-Content-Digest: sha256:short\r\n\r\n", {}),
    (b"", {}),  # the registry closes the connection without a word
    (OK[:20], {}),  # ... or in the middle of its headers
], indirect=True)
def test_anything_else_is_left_to_the_full_client(home: str, server: Answering) -> None:
    started = time.monotonic()
    assert ask_early(home, server.port) is None
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("server", [(OK, {"interval": 0.3, "step": 1}), (b"", {"hold": True})], indirect=True)
def test_a_trickle_or_a_silence_ends_at_the_document_deadline(home: str, server: Answering) -> None:
    started = time.monotonic()
    with pytest.raises(Unreachable, match="is too slow"):
        ask_early(home, server.port)
    assert 0.9 <= time.monotonic() - started < 5


def test_a_refused_connection_is_unreachable_in_the_full_clients_words(home: str) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(Unreachable, match=f"can't reach registry 127.0.0.1:{port}: connection refused"):
        ask_early(home, port, early_ok=False)


@pytest.fixture(params=["helper", "_ssl"])
def tls_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The TLS exchange in a helper process (singpy.oci._tlscheck, built by make setup), or through `_ssl` on the
    launcher's thread as where that module was not built: both answer alike."""
    if request.param == "_ssl":
        monkeypatch.setattr(quicktls, "threaded", lambda *args, **keywords: None)
    else:
        helper()
    return str(request.param)


def helper() -> Any:
    """singpy.oci._tlscheck, where it and its helper program were built (else the test is skipped)."""
    module = pytest.importorskip("singpy.oci._tlscheck", reason="the C extension is built by make setup")
    if module.helper() is None:
        pytest.skip("the helper program is built by make setup (OpenSSL's headers)")
    return module


def children() -> set[str]:
    """This process's children (a helper left running would be one)."""
    return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())


def tls_answering(tls_files: tuple[str, str, str], answer: bytes = OK) -> Answering:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files[1], tls_files[2])
    return Answering(answer, tls=context)


@pytest.mark.parametrize("pause", [0.0, 0.05])
def test_over_tls_a_trusted_registry_answers(home: str, tls_files: tuple[str, str, str], pause: float,
                                            tls_backend: str) -> None:
    server = tls_answering(tls_files)
    try:
        assert ask_early(home, server.port, https=True, pause=pause, SSL_CERT_FILE=tls_files[0]) == DIGEST
        assert ask_early(home, server.port, host="localhost", https=True, pause=pause,
                         SSL_CERT_FILE=tls_files[0]) == DIGEST
    finally:
        server.stop()
    assert len(server.requests) == 2 and server.requests[0].startswith(b"HEAD /v2/some/image/manifests/v1 ")


def test_over_tls_an_untrusted_certificate_is_never_answered(home: str, tls_files: tuple[str, str, str],
                                                             tls_backend: str) -> None:
    """Without its CA the handshake fails (early or late): no request is sent, the full client asks again."""
    server = tls_answering(tls_files)
    try:
        assert ask_early(home, server.port, https=True, early_ok=False) is None
    finally:
        server.stop()
    assert server.requests == []


def test_nothing_is_asked_before_expect(home: str) -> None:
    """`send` connects (and would begin a handshake) but asks nothing: a check begun for an image that turns
    out not to be cached is closed without a request."""
    server = Answering(OK)
    try:
        ref = parse(f"docker://127.0.0.1:{server.port}/some/image:v1")
        early = quickhead.send(ref, "v1", https=False, env=environment(home), home=home)
        assert early is not None
        time.sleep(0.1)
        early.close()
        time.sleep(0.1)
    finally:
        server.stop()
    assert server.requests in ([], [b""])  # the connection closed, with nothing sent on it


def test_a_check_nobody_asked_for_is_closed(home: str) -> None:
    server = Answering(b"", hold=True)
    try:
        ref = parse(f"docker://127.0.0.1:{server.port}/some/image:v1")
        early = quickhead.send(ref, "v1", https=False, env=environment(home), home=home)
        assert early is not None
        quickhead.expect(early)
        tagcheck.settle()
        assert early.sock.fileno() == -1  # closed
        assert quickhead.cached_top(ref, "v1", login=False, https=False, env={"HOME": home, "http_proxy": "x"},
                                    home=home) is None  # not answered from the abandoned check
    finally:
        server.stop()


def test_only_a_cached_image_by_tag_is_checked_ahead(home: str, tmp_path: Path) -> None:
    """tagcheck.send_ahead: no check for an image the cache lacks, nor by digest, nor with --docker-login."""
    server = Answering(OK)
    cache = tmp_path / "cache"
    env = {**environment(home), "SINGPY_CACHEDIR": str(cache)}
    reference = f"docker://127.0.0.1:{server.port}/some/image:v1"
    try:
        assert not tagcheck.send_ahead(reference, PullOptions(https=False), env, home)
        assert not tagcheck.send_ahead(f"docker://127.0.0.1:{server.port}/some/image@{DIGEST}",
                                       PullOptions(https=False), env, home)
        remember_cached(str(cache), reference, env, home)
        assert not tagcheck.send_ahead(reference, PullOptions(https=False, login=True), env, home)
        assert server.requests in ([], [b""])
        assert tagcheck.send_ahead(reference, PullOptions(https=False), env, home)
        assert quickhead.cached_top(parse(reference), "v1", login=False, https=False, env=env,
                                    home=home) == DIGEST
    finally:
        tagcheck.settle()
        server.stop()
    assert len([request for request in server.requests if request]) == 1  # the one HEAD, sent ahead


def test_a_tls_context_prepared_for_an_image_the_cache_lacks_leaves_no_helper(home: str, tmp_path: Path) -> None:
    """tagcheck.prepare starts the check's helper as soon as the command line is parsed; send_ahead, finding
    nothing cached, releases it: killed and reaped, never left to the container's program as a child."""
    threaded = helper()
    reference = "docker://127.0.0.1:9/some/image:v1"
    env = {**environment(home), "SINGPY_CACHEDIR": str(tmp_path / "cache")}
    before = children()
    tagcheck.prepare(reference, PullOptions(), env)
    assert threaded.pending() and len(children() - before) == 1
    assert not tagcheck.send_ahead(reference, PullOptions(), env, home)
    assert not threaded.pending()  # released: its helper killed and reaped
    assert children() == before
    for text, options in ((reference, PullOptions(https=False)), (reference, PullOptions(login=True)),
                          (f"docker://127.0.0.1:9/some/image@{DIGEST}", PullOptions()),
                          ("/some/image.sif", PullOptions())):
        tagcheck.prepare(text, options, env)  # no check over TLS would come
        assert not threaded.pending(), text


def test_a_context_begun_early_is_kept_or_released_by_the_parsed_command_line(home: str, tmp_path: Path) -> None:
    """prepare_early (the console script and singpy.cli.main, before the parser loads) starts the helper on the
    first docker:// or oras:// word after a run, exec, shell or test word; unless a flag as written rules a check
    over TLS out. `prepare` with what the parser found then keeps it, or releases it, its helper killed and
    reaped."""
    threaded = helper()
    reference = "docker://127.0.0.1:9/some/image:v1"
    env = {**environment(home), "SINGPY_CACHEDIR": str(tmp_path / "cache")}
    before = children()
    try:
        for words in (["exec", "--no-https", reference, "true"], ["exec", "--nohttps", reference, "true"],
                      ["exec", "--docker-login", reference, "true"],
                      ["exec", f"docker://127.0.0.1:9/some/image@{DIGEST}", "true"],
                      ["exec", "/some/image.sif", "true"],
                      ["pull", reference], ["-d", "inspect", reference], [reference, "exec"]):
            tagcheck.prepare_early(words, env)
            assert not threaded.pending(), words
        tagcheck.prepare_early(["-d", "exec", "-B", "/a:/b", reference, "true"], env)
        assert threaded.pending() and len(children() - before) == 1
        tagcheck.prepare(reference, PullOptions(), env)  # the parser agrees: kept, for send_ahead
        assert threaded.pending()
        tagcheck.prepare(reference, PullOptions(https=False), env)  # it does not (a variable said --no-https)
        assert not threaded.pending()
        assert children() == before
    finally:
        tagcheck.release()


def remember_cached(cache: str, reference: str, env: dict[str, str], home: str) -> None:
    """A SIF in the cache for `reference`, sealed and remembered as a pull leaves it (its bytes do not matter
    here: the check only asks whether there is one)."""
    from singpy.oci import platform

    location = store.location(env, home)
    digest = "sha256:" + "cd" * 32
    store.ensure(location, store.SIFS)
    sif = store.sif_path(location, digest)
    Path(sif).write_bytes(b"SIF")
    store.seal_sif(sif, digest, {})
    store.remember(location, str(parse(reference)), str(platform.host_platform()), top=DIGEST, digest=digest)
    assert cache in location


def test_a_connection_that_is_never_accepted_ends_at_the_deadline(home: str) -> None:
    """A registry host that takes no new connection (here a listener whose backlog is full: the kernel drops
    the SYN) leaves the connection begun ahead pending; the wait for it ends at the document deadline."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # the backlog (0, so 1 on Linux) and then some: later SYNs are dropped
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(Unreachable, match="is too slow: the connection timed out"):
            ask_early(home, port, pause=0.0)
        assert 0.9 <= time.monotonic() - started < 5
    finally:
        for filler in fillers:
            filler.close()
        listener.close()

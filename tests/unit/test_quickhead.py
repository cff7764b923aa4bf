"""singpy.oci.quickhead (a cached tag's one HEAD request) and mirrors' cheap look at registries.conf (issue 31).

The requests go to real sockets on 127.0.0.1 that answer as the case says; the registries against real
registries are tests/integration/test_tag_check.py's.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.oci import mirrors, quickhead, regfiles, tlsconf
from singpy.oci.ref import parse
from singpy.oci.regerrors import Unreachable
from tests.support.answering import Answering
from tests.support.registry_tls import make_tls

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Answering]:
    answer, options = request.param
    started = Answering(answer, **options)
    yield started
    started.stop()


def ask(port: int, **env: str) -> str | None:
    ref = parse(f"docker://127.0.0.1:{port}/some/image:v1")
    return quickhead.tag_digest(ref, "v1", https=False, env={"SINGPY_PULL_DOCUMENT_TIMEOUT": "1", **env})


OK = f"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode()


@pytest.mark.parametrize("server", [(OK, {}), (OK, {"step": 3})], indirect=True)
def test_a_200_with_a_digest_is_the_answer(server: Answering) -> None:
    assert ask(server.port) == DIGEST
    request = server.requests[0].decode()
    assert request.startswith("HEAD /v2/some/image/manifests/v1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n" in request and "Authorization" not in request


@pytest.mark.parametrize("server", [
    (b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="r"\r\n\r\n', {}),
    (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere/\r\n\r\n", {}),
    (f"HTTP/1.1 200 OK\r\nDocker-Content-Digest: {DIGEST}\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode(), {}),
    (b"HTTP/1.1 200 OK\r\nDocker-Content-Digest: sha256:short\r\n\r\n", {}),
    (b"HTTP/1.1 200 OK\r\nX-Padding: " + b"p" * (quickhead.HEADER_LIMIT + 10) + b"\r\n\r\n", {}),
    (b"SSH-2.0-OpenSSH_9.2\r\n", {}),
    (f"HTTP/1.1 2000 OK\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode(), {}),  # not a 200
    (f"HTTP/1.1 200 OK\r\nX-A: b\r\n Docker-Content-Digest: {DIGEST}\r\n\r\n".encode(), {}),  # folded
    (f"HTTP/1.1 200 OK\r\nDocker-Content-Digest : {DIGEST}\r\n\r\n".encode(), {}),  # a space before ':'
], indirect=True)
def test_anything_else_is_left_to_the_full_client(server: Answering) -> None:
    assert ask(server.port) is None


@pytest.mark.parametrize("server", [(OK, {"interval": 0.3, "step": 1}), (b"", {"hold": True})], indirect=True)
def test_a_trickle_or_a_silence_ends_at_the_document_deadline(server: Answering) -> None:
    started = time.monotonic()
    with pytest.raises(Unreachable, match="is too slow"):
        ask(server.port)
    assert 0.9 <= time.monotonic() - started < 5


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """A CA and a certificate it signed for 127.0.0.1 / localhost (openssl)."""
    return make_tls(tmp_path_factory.mktemp("tls"))


def tls_answering(tls_files: tuple[str, str, str], answer: bytes = OK) -> Answering:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files[1], tls_files[2])
    return Answering(answer, tls=context)


def ask_tls(host: str, port: int, **env: str) -> str | None:
    ref = parse(f"docker://{host}:{port}/some/image:v1")
    return quickhead.tag_digest(ref, "v1", https=True, env={"SINGPY_PULL_DOCUMENT_TIMEOUT": "5", **env})


def test_over_tls_a_trusted_registry_answers(tls_files: tuple[str, str, str]) -> None:
    """The CA of SSL_CERT_FILE verifies the server, by IP address and by name (the integration tests show no
    `ssl` import: test_tag_check.py)."""
    server = tls_answering(tls_files)
    try:
        assert ask_tls("127.0.0.1", server.port, SSL_CERT_FILE=tls_files[0]) == DIGEST
        assert ask_tls("localhost", server.port, SSL_CERT_FILE=tls_files[0]) == DIGEST
    finally:
        server.stop()
    assert len(server.requests) == 2 and server.requests[0].startswith(b"HEAD /v2/some/image/manifests/v1 ")


def test_over_tls_an_untrusted_certificate_is_left_to_the_full_client(tls_files: tuple[str, str, str]) -> None:
    """Without its CA the handshake fails: no answer taken, and the full client (which says why) asks again."""
    server = tls_answering(tls_files)
    try:
        assert ask_tls("127.0.0.1", server.port) is None
    finally:
        server.stop()
    assert server.requests == []


def test_the_quick_context_verifies_as_a_pulls_context() -> None:
    """`_ssl`'s context and the pull's `ssl.SSLContext`: the same verification, versions and options."""
    quick, full = tlsconf.quick_context({}), tlsconf.tls_context({})
    assert quick.check_hostname and quick.verify_mode == ssl.CERT_REQUIRED
    assert (quick.options, quick.verify_flags, quick.minimum_version, quick.maximum_version) == (
        full.options, full.verify_flags, full.minimum_version, full.maximum_version)


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(Unreachable, match=f"can't reach registry 127.0.0.1:{port}: connection refused"):
        ask(port)


@pytest.mark.parametrize("variable", ["http_proxy", "HTTPS_PROXY", "all_proxy"])
def test_a_proxy_in_the_environment_is_the_full_clients(variable: str) -> None:
    with socket.socket() as unused:  # nothing listens: a connection attempt would raise
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert ask(port, **{variable: "http://proxy.invalid:3128"}) is None


@pytest.mark.parametrize(("endpoint", "https", "expected"), [
    ("registry.example:5000", True, ("registry.example", 5000)),
    ("registry.example", True, ("registry.example", 443)),
    ("registry.example", False, ("registry.example", 80)),
    ("[::1]:5000", False, ("::1", 5000)),
    ("[::1]", True, ("::1", 443)),
    ("host:99999", True, (None, 0)),
    ("host:5x", True, (None, 0)),
    ("bücher.example", True, (None, 0)),
])
def test_endpoints(endpoint: str, https: bool, expected: tuple[str | None, int]) -> None:
    assert quickhead.split_endpoint(endpoint, https=https) == expected


@pytest.mark.parametrize(("text", "parsed"), [
    ("# only comments\n\n   # indented\n", False),  # Debian's registries.conf
    ('[aliases]\n  "registry" = "docker.io/library/registry"\n  "fedora" = "registry.fedoraproject.org/f"\n',
     False),  # containers' shortnames.conf
    ('[[registry]]\nlocation = "mirror:5000"\n', True),
    ('registry = [{ location = "x" }]\n', True),
    ('unqualified-search-registries = ["docker.io"]\n', True),
    ('[registries.insecure]\nregistries = ["x"]\n', True),  # version 1
    ('"\\u0072egistry" = [{ location = "x" }]\n', True),  # an escape could spell it
    ('x = [\n["a"],\n]\nregistry = [{ location = "x" }]\n', True),  # a top-level value on several lines
    ('x = """\n[aliases]\n"""\n', True),
    ('short-name-mode = "enforcing"\n[aliases]\n"a" = "b"\n', False),
])
def test_only_files_that_may_define_registries_are_parsed(text: str, parsed: bool) -> None:
    assert regfiles.may_name_registries(text) is parsed


def test_a_mirror_in_registries_conf_turns_the_quick_check_off(tmp_path: Path) -> None:
    conf = tmp_path / "registries.conf"
    conf.write_text('[[registry]]\nlocation = "origin.example"\n[[registry.mirror]]\nlocation = "mirror.example"\n')
    env = {"CONTAINERS_REGISTRIES_CONF": str(conf), "HOME": str(tmp_path)}
    assert not regfiles.define_nothing(env, str(tmp_path))  # parsed by singpy.oci.mirrors
    assert not mirrors.is_direct(parse("docker://origin.example/a/b:v1"), env=env, home=str(tmp_path))
    assert mirrors.is_direct(parse("docker://other.example/a/b:v1"), env=env, home=str(tmp_path))
    assert quickhead.send(parse("docker://origin.example/a/b:v1"), "v1", https=True, env=env,
                          home=str(tmp_path)) is None  # not sent: the mirror is the full client's
    conf.write_text("# nothing\n")
    assert regfiles.define_nothing(env, str(tmp_path))  # not parsed at all
    assert mirrors.is_direct(parse("docker://origin.example/a/b:v1"), env=env, home=str(tmp_path))

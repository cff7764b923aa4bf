"""Two savings of a cached tag's check (issue 31): the quick check's trust without parsing the system bundle
when SSL_CERT_FILE names it (singpy.oci.quicktls.trust_env), and the cache looked up once a run
(singpy.oci.lookedup). Real TLS servers on 127.0.0.1 and a real cache directory."""

from __future__ import annotations

import _ssl
import os
import ssl
import subprocess
from pathlib import Path

import pytest

from singpy.oci import lookedup, quickhead, quicktls, store
from singpy.oci.ref import parse
from tests.support.answering import Answering
from tests.support.registry_tls import make_tls

DIGEST = "sha256:" + "ab" * 32
OK = f"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDocker-Content-Digest: {DIGEST}\r\n\r\n".encode()


@pytest.fixture
def system_bundle() -> str:
    _, bundle, _, directory = _ssl.get_default_verify_paths()
    if not (os.path.isfile(bundle) and os.path.isdir(directory)):
        pytest.skip("no system CA bundle with its hashed directory")
    return bundle


@pytest.fixture
def home(tmp_path: Path) -> str:
    conf = tmp_path / "home" / ".config" / "containers" / "registries.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# nothing\n")
    return str(tmp_path / "home")


def test_the_system_bundle_is_left_to_the_hashed_directory(system_bundle: str, tmp_path: Path) -> None:
    link = tmp_path / "bundle.pem"
    link.symlink_to(system_bundle)
    for named in (system_bundle, str(link)):
        trusted = quicktls.trust_env({"SSL_CERT_FILE": named, "SSL_CERT_DIR": "/x", "HOME": "/h"})
        assert trusted == {"SSL_CERT_DIR": "/x", "HOME": "/h"}
    private = tmp_path / "private-ca.pem"
    private.write_bytes(Path(system_bundle).read_bytes())  # the same bytes, but not the system's file
    for env in ({"SSL_CERT_FILE": str(private)}, {"HOME": "/h"}, {"SSL_CERT_FILE": ""}):
        assert quicktls.trust_env(env) == env


def tls_server(tmp_path: Path) -> tuple[Answering, str]:
    ca_file, cert, key = make_tls(tmp_path / "tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return Answering(OK, tls=context), ca_file


def ask(home: str, port: int, **env: str) -> str | None:
    ref = parse(f"docker://127.0.0.1:{port}/some/image:v1")
    return quickhead.tag_digest(ref, "v1", https=True, env={"HOME": home, "SINGPY_PULL_DOCUMENT_TIMEOUT": "2",
                                                            **env})


def test_with_the_system_bundle_the_trust_is_the_same(system_bundle: str, home: str, tmp_path: Path) -> None:
    """A CA in SSL_CERT_DIR still verifies the registry; a CA that is nowhere still fails the quick check
    (left to the full client, which refuses it), with no request sent."""
    server, ca_file = tls_server(tmp_path)
    cadir = tmp_path / "cadir"
    cadir.mkdir()
    (cadir / "ca.pem").write_bytes(Path(ca_file).read_bytes())
    subprocess.run(["openssl", "rehash", str(cadir)], check=True)
    try:
        assert ask(home, server.port, SSL_CERT_FILE=system_bundle, SSL_CERT_DIR=str(cadir)) == DIGEST
        assert ask(home, server.port, SSL_CERT_FILE=system_bundle) is None
    finally:
        server.stop()
    assert len(server.requests) == 1  # the trusted one


def remember(location: str, key: str, platform: str) -> str:
    digest = "sha256:" + "cd" * 32
    store.ensure(location, store.SIFS)
    sif = store.sif_path(location, digest)
    Path(sif).write_bytes(b"SIF")
    store.seal_sif(sif, digest, {})
    store.remember(location, key, platform, top=DIGEST, digest=digest)
    return sif


def test_the_cache_is_looked_up_once_a_run(home: str, tmp_path: Path) -> None:
    """The lookup the check sent ahead made (remember=True) is the one the pull takes, once; a lookup made to
    be remembered is always a new one (never an older remembered answer)."""
    location = store.location({"HOME": home, "SINGPY_CACHEDIR": str(tmp_path / "cache")}, home)
    key, platform = "127.0.0.1:5000/some/image:v1", "linux/amd64"
    record, found = lookedup.known(location, key, platform, remember=True)
    assert not record and found == ""
    sif = remember(location, key, platform)
    assert lookedup.known(location, key, platform, remember=True)[1] == sif  # new, not the remembered miss
    os.unlink(sif)
    record, found = lookedup.known(location, key, platform)  # the remembered lookup, taken (the SIF is gone)
    assert found == sif and record["top"] == DIGEST
    assert lookedup.known(location, key, platform) == (store.recall(location, key, platform), "")  # a new one


def test_long_references_never_share_a_record(home: str, tmp_path: Path) -> None:
    """A record's file name is cut to fit a file name, and ends with a digest of the whole reference and
    platform: two long references (or one on two platforms) that differ only past the cut keep their own."""
    location = store.location({"HOME": home, "SINGPY_CACHEDIR": str(tmp_path / "cache")}, home)
    repository = "127.0.0.1:5000/" + "ab/" * 60 + "image"
    first, second = f"{repository}@sha256:{'a' * 64}", f"{repository}@sha256:{'b' * 64}"
    remember(location, first, "linux/amd64")
    assert store.recall(location, first, "linux/amd64")["top"] == DIGEST
    assert store.recall(location, second, "linux/amd64") == {}
    assert store.recall(location, first, "linux/arm64") == {}
    assert all(len(name) <= 240 for name in os.listdir(f"{location}/{store.REFS}"))
    short = "127.0.0.1:5000/some/image:v1"
    remember(location, short, "linux/amd64")
    assert f"{location}/{store.REFS}/" + "127.0.0.1%3a5000%2fsome%2fimage%3av1%20linux%2famd64" in {
        f"{location}/{store.REFS}/{name}" for name in os.listdir(f"{location}/{store.REFS}")}  # short: readable

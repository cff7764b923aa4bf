"""A cached image named by tag (`docker://X:TAG`, `oras://X:TAG`) is checked with one HEAD request (issue 31).

singpy.oci.quickhead asks the registry what the tag names now without the HTTP client; what it can't answer
(a challenge, a certificate it doesn't trust...) goes to the full client. Whatever path answers, a user sees
the same: a moved tag runs the new image, a registry that can't be reached or is too slow runs the cached one
with a warning (and every wait ends), a refused credential or certificate is one FATAL line. Real registries
(docker-registry: plain, TLS, Basic, Bearer), as root and as the unprivileged user.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.answering import Answering
from tests.support.oci import Image, busybox_image, file
from tests.support.registry import RegistryServer, start_registry
from tests.support.registry_tls import OPENSSL, openssl
from tests.support.sifs import new_cache, siftool_sif

QUICK = "quick check of"  # the -d line of an answer singpy.oci.quickhead gave alone


def marked(text: str) -> Image:
    return busybox_image(extra=[file("marker", f"{text}\n")])


def credentials(registry: RegistryServer) -> dict[str, str]:
    if registry.username:
        return {"SINGPY_DOCKER_USERNAME": registry.username, "SINGPY_DOCKER_PASSWORD": registry.password}
    return {}


def flags(registry: RegistryServer) -> list[str]:
    return [] if registry.https else ["--no-https"]


def run_marker(singpy: Singpy, registry: RegistryServer, reference: str, env: dict[str, str]) -> tuple[str, str]:
    """What /marker holds in the image `reference` runs now, and the -d output of that run."""
    result = singpy.run("-d", "exec", *flags(registry), reference, "cat", "/marker", env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


@pytest.mark.parametrize("kind", ["plain", "tls", "basic", "token"])
def test_a_moved_tag_runs_the_new_image(singpy: Singpy, kind: str, request: pytest.FixtureRequest,
                                        workdir: Path) -> None:
    registry: RegistryServer = request.getfixturevalue(f"registry_{kind}")
    name = f"tagcheck/moved-{kind}-{singpy.profile}"
    registry.upload(marked("first"), name)
    reference = registry.ref(name)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"tag-moved-{kind}")),
                     SSL_CERT_FILE=registry.ca_file or "", **credentials(registry))
    assert run_marker(singpy, registry, reference, env)[0] == "first\n"
    output, debug = run_marker(singpy, registry, reference, env)  # cached: one HEAD request
    assert output == "first\n"
    # Anonymous registries answer the quick check; a challenge (Basic, Bearer) is the full client's.
    assert (QUICK in debug) == (kind in ("plain", "tls")), debug
    registry.upload(marked("second"), name)
    assert run_marker(singpy, registry, reference, env)[0] == "second\n"


def two_sifs(singpy: Singpy, workdir: Path) -> tuple[Path, Path]:
    """Two runnable SIFs that differ (the second has a data object more), readable by the profile's user."""
    folder = workdir / "tagcheck-sifs" / singpy.profile
    folder.mkdir(parents=True, exist_ok=True)
    first, second = folder / "first.sif", folder / "second.sif"
    shutil.copyfile(siftool_sif(workdir), first)
    shutil.copyfile(first, second)
    extra = folder / "extra.bin"
    extra.write_bytes(os.urandom(4096))
    subprocess.run(["siftool", "add", "--datatype", "7", str(second), str(extra)], check=True,
                   stdout=subprocess.DEVNULL)
    for path in (folder.parent, folder, first, second):
        path.chmod(0o755)
    return first, second


def test_a_moved_oras_tag_downloads_the_new_sif(singpy: Singpy, registry_plain: RegistryServer,
                                                workdir: Path) -> None:
    first, second = two_sifs(singpy, workdir)
    reference = f"oras://{registry_plain.host}/tagcheck/oras-{singpy.profile}:v1"
    cache = new_cache(singpy, workdir, "tag-oras")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    push_env = {**os.environ, "SINGPY_CACHEDIR": str(workdir / "tagcheck-push-cache")}
    subprocess.run([SINGPY, "-q", "push", "--no-https", str(first), reference], check=True, env=push_env)
    singpy.ok("exec", "--no-https", reference, "true", env=env)
    result = singpy.run("-d", "exec", "--no-https", reference, "true", env=env)
    assert result.returncode == 0 and QUICK in result.stderr, result.stderr
    assert sorted(path.name for path in (cache / "sif").glob("*.sif")) == [f"{sha256(first)}.sif"]
    subprocess.run([SINGPY, "-q", "push", "--no-https", str(second), reference], check=True, env=push_env)
    singpy.ok("exec", "--no-https", reference, "true", env=env)
    assert sorted(path.name for path in (cache / "sif").glob("*.sif")) == sorted(
        [f"{sha256(first)}.sif", f"{sha256(second)}.sif"])


def sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_untrusted_certificate_is_still_refused(singpy: Singpy, registry_tls: RegistryServer,
                                                   workdir: Path) -> None:
    """The quick check verifies as a pull does: without the CA, the cached image does not run."""
    name = f"tagcheck/untrusted-{singpy.profile}"
    registry_tls.upload(marked("tls"), name)
    cache = str(new_cache(singpy, workdir, "tag-untrusted"))
    assert registry_tls.ca_file
    singpy.ok("exec", registry_tls.ref(name), "true", env=singpy.env(SINGPY_CACHEDIR=cache,
                                                                      SSL_CERT_FILE=registry_tls.ca_file))
    result = singpy.run("exec", registry_tls.ref(name), "true", env=singpy.env(SINGPY_CACHEDIR=cache))
    assert_one_fatal(result, f"can't make a TLS connection to {registry_tls.host}")


def test_a_custom_ca_directory_is_trusted(singpy: Singpy, registry_tls: RegistryServer, workdir: Path) -> None:
    """SSL_CERT_DIR (a hashed directory, as `openssl rehash` makes it) verifies the quick check's TLS too."""
    assert registry_tls.ca_file
    name = f"tagcheck/cadir-{singpy.profile}"
    registry_tls.upload(marked("cadir"), name)
    ca_dir = workdir / "tagcheck-cadir" / singpy.profile
    ca_dir.mkdir(parents=True)
    shutil.copyfile(registry_tls.ca_file, ca_dir / "tests-ca.pem")
    subprocess.run([OPENSSL, "rehash", str(ca_dir)], check=True)
    for path in (ca_dir.parent, ca_dir):
        path.chmod(0o755)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "tag-cadir")), SSL_CERT_DIR=str(ca_dir))
    assert run_marker(singpy, registry_tls, registry_tls.ref(name), env)[0] == "cadir\n"
    output, debug = run_marker(singpy, registry_tls, registry_tls.ref(name), env)
    assert output == "cadir\n" and QUICK in debug, debug


def server_certificate(ca_file: str, folder: Path, name: str) -> tuple[Path, Path]:
    """A certificate for DNS:`name` alone, signed by the CA of `ca_file` (its key is ../ca.key: make_tls's)."""
    ca_key = Path(ca_file).parent.parent / "ca.key"
    key, csr, cert, extensions = (folder / f"{name}.{kind}" for kind in ("key", "csr", "crt", "ext"))
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    extensions.write_text(f"basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:{name}\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", ca_file, "-CAkey", str(ca_key), "-CAcreateserial",
            "-CAserial", str(folder / "ca.srl"), "-out", str(cert), "-days", "2", "-extfile", str(extensions))
    return cert, key


MOVED = (b"HTTP/1.1 200 OK\r\nDocker-Content-Digest: sha256:" + b"1" * 64
         + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")  # a tag moved: trusted, it would be pulled


def test_a_certificate_for_another_host_is_refused(singpy: Singpy, workdir: Path, tmp_path: Path) -> None:
    """The quick check verifies the registry's name, not only its CA: a certificate the same CA made for another
    host is refused (one FATAL line, as a pull says it), never taken for the registry's answer."""
    cache = str(new_cache(singpy, workdir, "tag-wronghost"))
    folder = workdir / "tagcheck-wronghost" / singpy.profile  # not tmp_path (0700): the user reads the CA
    folder.mkdir(parents=True)
    for path in (folder.parent, folder):
        path.chmod(0o755)
    with start_registry(folder / "registry", tls=True) as registry:
        assert registry.ca_file
        ca_file = registry.ca_file
        registry.upload(marked("cached"), "tagcheck/wronghost")
        reference = registry.ref("tagcheck/wronghost")
        env = singpy.env(SINGPY_CACHEDIR=cache, SSL_CERT_FILE=ca_file)
        singpy.ok("exec", reference, "true", env=env)
    cert, key = server_certificate(ca_file, tmp_path, "elsewhere.test")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    server = Answering(MOVED, port=int(registry.host.rpartition(":")[2]), tls=context)
    try:
        result = singpy.run("exec", reference, "cat", "/marker", env=env)
    finally:
        server.stop()
    assert_one_fatal(result, f"can't make a TLS connection to {registry.host}")
    assert "certificate" in result.stderr and server.requests == [], result.stderr


def test_wrong_credentials_are_still_refused(singpy: Singpy, registry_basic: RegistryServer, workdir: Path) -> None:
    name = f"tagcheck/refused-{singpy.profile}"
    registry_basic.upload(marked("basic"), name)
    reference = registry_basic.ref(name)
    cache = str(new_cache(singpy, workdir, "tag-refused"))
    singpy.ok("exec", "--no-https", reference, "true", env=singpy.env(SINGPY_CACHEDIR=cache,
                                                                       **credentials(registry_basic)))
    wrong = singpy.env(SINGPY_CACHEDIR=cache, SINGPY_DOCKER_USERNAME=registry_basic.username,
                       SINGPY_DOCKER_PASSWORD="not-it")
    assert_one_fatal(singpy.run("exec", "--no-https", reference, "true", env=wrong), "was refused")


@pytest.fixture
def cached_then_stalling(singpy: Singpy, workdir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[str, dict[str, str], Answering]]:
    """An image cached from a registry whose port then answers as request.param says ("silent", "trickle")."""
    cache = str(new_cache(singpy, workdir, f"tag-stalling-{request.param}"))
    env = singpy.env(SINGPY_CACHEDIR=cache, SINGPY_PULL_DOCUMENT_TIMEOUT="2", SINGPY_PULL_STALL_TIMEOUT="1",
                     SINGPY_PULL_LOW_SPEED="1", SINGPY_PULL_RETRIES="1")
    with start_registry(tmp_path / "registry") as registry:
        registry.upload(marked("cached"), "tagcheck/stalling")
        reference = registry.ref("tagcheck/stalling")
        singpy.ok("exec", "--no-https", reference, "true", env=env)
    port = int(registry.host.rpartition(":")[2])
    head = b"" if request.param == "silent" else b"HTTP/1.1 200 OK\r\nDocker-Content-Digest: sha256:" + b"0" * 64
    stalling = Answering(head, step=1, interval=0.3, hold=True, port=port)  # a registry gone slow
    try:
        yield reference, env, stalling
    finally:
        stalling.stop()


@pytest.mark.parametrize("cached_then_stalling", ["silent", "trickle"], indirect=True)
def test_a_registry_gone_slow_runs_the_cached_image_in_bounded_time(
        singpy: Singpy, cached_then_stalling: tuple[str, dict[str, str], Answering]) -> None:
    reference, env, _ = cached_then_stalling
    started = time.monotonic()
    result = singpy.run("exec", "--no-https", reference, "cat", "/marker", env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert (result.returncode, result.stdout) == (0, "cached\n"), result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:") and "too slow" in warnings[0], result.stderr
    assert 2 <= elapsed < 15, elapsed  # the document deadline (2 s) ended the wait, once


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_a_cached_tag_check_loads_no_http_client(singpy: Singpy, kind: str, request: pytest.FixtureRequest,
                                                 workdir: Path) -> None:
    """The point of the quick check (issue 31): http.client and email (~20 ms of imports) stay unloaded, and so
    does `ssl` (~9 ms); over TLS the exchange runs in singpy.oci._tlscheck's helper (built by make setup), so
    not even `_ssl` is loaded (where the helper was not built, the check uses `_ssl` alone)."""
    registry: RegistryServer = request.getfixturevalue(f"registry_{kind}")
    name = f"tagcheck/imports-{kind}-{singpy.profile}"
    registry.upload(marked("imports"), name)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"tag-imports-{kind}")),
                     SSL_CERT_FILE=registry.ca_file or "")
    singpy.ok("exec", *flags(registry), registry.ref(name), "true", env=env)
    result = singpy.run("exec", *flags(registry), registry.ref(name), "cat", "/marker",
                        env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0 and result.stdout == "imports\n", result.stderr
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "singpy.oci.quickhead" in imported  # the import log is there
    built = importlib.util.find_spec("singpy.oci._tlscheck") is not None
    threaded = built and importlib.import_module("singpy.oci._tlscheck").helper() is not None
    assert ("singpy.oci._tlscheck" in imported) == (kind == "tls" and built), sorted(imported)
    assert ("_ssl" in imported) == (kind == "tls" and not threaded), sorted(imported)
    assert not imported & {"http.client", "email.parser", "singpy.oci.transport", "ssl"}, sorted(imported)

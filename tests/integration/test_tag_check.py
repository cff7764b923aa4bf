"""A cached image named by tag (`docker://X:TAG`, `oras://X:TAG`) is checked with one HEAD request (issue 31).

singpy.oci.quickhead asks the registry what the tag names now without the HTTP client; what it can't answer
(a challenge, a certificate it doesn't trust...) goes to the full client. Whatever path answers, a user sees
the same: a moved tag runs the new image, a registry that can't be reached or is too slow runs the cached one
with a warning (and every wait ends), a refused credential or certificate is one FATAL line. Real registries
(docker-registry: plain, TLS, Basic, Bearer), as root and as the unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.oci import Image, busybox_image, file
from tests.support.registry import RegistryServer, start_registry
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


class Stalling:
    """A server on `port` that accepts, reads the request, then answers `head` one byte per `interval` (or,
    with no head, never): a registry gone slow after the image was cached."""

    def __init__(self, port: int, head: bytes, interval: float) -> None:
        self.listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.head, self.interval = head, interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        connections = []
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            connections.append(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()
        for connection in connections:
            connection.close()

    def _answer(self, connection: socket.socket) -> None:
        try:
            connection.recv(65536)
            for byte in self.head:
                if self.stopping.wait(self.interval):
                    return
                connection.sendall(bytes([byte]))
            self.stopping.wait()
        except OSError:
            return

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def cached_then_stalling(singpy: Singpy, workdir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[str, dict[str, str], Stalling]]:
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
    stalling = Stalling(port, head, 0.3)
    try:
        yield reference, env, stalling
    finally:
        stalling.stop()


@pytest.mark.parametrize("cached_then_stalling", ["silent", "trickle"], indirect=True)
def test_a_registry_gone_slow_runs_the_cached_image_in_bounded_time(
        singpy: Singpy, cached_then_stalling: tuple[str, dict[str, str], Stalling]) -> None:
    reference, env, _ = cached_then_stalling
    started = time.monotonic()
    result = singpy.run("exec", "--no-https", reference, "cat", "/marker", env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert (result.returncode, result.stdout) == (0, "cached\n"), result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:") and "too slow" in warnings[0], result.stderr
    assert 2 <= elapsed < 15, elapsed  # the document deadline (2 s) ended the wait, once


def test_a_cached_tag_check_loads_no_http_client(singpy: Singpy, registry_plain: RegistryServer,
                                                 workdir: Path) -> None:
    """The point of the quick check (issue 31): http.client and email (~20 ms of imports) stay unloaded."""
    name = f"tagcheck/imports-{singpy.profile}"
    registry_plain.upload(marked("imports"), name)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "tag-imports")))
    singpy.ok("exec", "--no-https", registry_plain.ref(name), "true", env=env)
    result = singpy.run("exec", "--no-https", registry_plain.ref(name), "cat", "/marker",
                        env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert result.returncode == 0 and result.stdout == "imports\n", result.stderr
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "singpy.oci.quickhead" in imported  # the import log is there
    assert not imported & {"http.client", "email.parser", "singpy.oci.transport", "ssl"}, sorted(imported)

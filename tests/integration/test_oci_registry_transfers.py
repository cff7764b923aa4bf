"""singpy.oci.registry against a real registry (Debian's docker-registry, tests/support/registry.py), when a
transfer does not go as planned: interrupted and stalled downloads resumed, answers retried, unreachable
registries and hosts named, and the http(s)_proxy variables (`ForwardProxy`, tests/support/registry_front.py).

Library-level, as test_oci_registry.py: the client is imported and driven in-process; `Front` misbehaves on
request before the real registry. Each test pushes images under repository names of its own.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from singpy.oci import transport
from singpy.oci.ref import parse
from singpy.oci.regerrors import Unreachable
from singpy.oci.registry import Registry
from singpy.oci.retries import MAX_TRIES
from singpy.oci.transport import bypasses_proxy
from tests.support.oci import busybox_image
from tests.support.registry_client import ALICE, assert_blob, big_layer, client, failure, fetch, unique_image
from tests.support.registry_front import ForwardProxy, Front

if TYPE_CHECKING:
    from tests.support.registry import RegistryServer


# --- interrupted downloads -----------------------------------------------------------------------------------------


def test_cut_download_resumes_with_range(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = big_layer()
    registry_redirect.upload(busybox_image(layers=[layer]), "resume/cut")
    stall = blob_host.stall(layer.digest, after=1 << 20)
    target = tmp_path / "blob"
    calls: list[int] = []
    errors: list[BaseException] = []
    with client(registry_redirect, "resume/cut", credentials=ALICE) as registry:
        def download() -> None:
            try:
                registry.fetch_blob(layer.digest, str(target), size=layer.size, progress=calls.append)
            except BaseException as error:  # handed to the test
                errors.append(error)

        thread = threading.Thread(target=download)
        thread.start()
        assert stall.reached.wait(30)
        time.sleep(0.2)
        assert Path(f"{target}.partial").exists()
        stall.release()  # the server closes the connection with the rest of the blob unsent
        thread.join(60)
    assert errors == []
    assert_blob(target, layer)
    assert sum(calls) == layer.size
    ranges = [request.range for request in blob_host.requests_for(layer.digest)]
    assert ranges == [None, f"bytes={1 << 20}-"]


def test_stalled_download_times_out_and_resumes(registry_redirect: RegistryServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    monkeypatch.setattr(transport, "READ_TIMEOUT", 1.0)
    layer = big_layer(3 << 20)
    registry_redirect.upload(busybox_image(layers=[layer]), "resume/stalled")
    # The first 1 MiB read completes; the second waits for bytes that do not come. What it got is lost with
    # the timeout (a read is all or nothing), so the download resumes after the first MiB.
    stall = blob_host.stall(layer.digest, after=(1 << 20) + (512 << 10))
    try:
        started = time.monotonic()
        with client(registry_redirect, "resume/stalled", credentials=ALICE) as registry:
            registry.fetch_blob(layer.digest, str(tmp_path / "blob"), size=layer.size)
        assert time.monotonic() - started < 20
    finally:
        stall.release()
    assert_blob(tmp_path / "blob", layer)
    assert [request.range for request in blob_host.requests_for(layer.digest)] == [None, f"bytes={1 << 20}-"]


def test_partial_file_from_an_earlier_run_is_resumed(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = big_layer()
    registry_redirect.upload(busybox_image(layers=[layer]), "resume/earlier")
    target = tmp_path / "blob"
    Path(f"{target}.partial").write_bytes(layer.data[:1234567])
    with client(registry_redirect, "resume/earlier", credentials=ALICE) as registry:
        calls = fetch(registry, layer, target)
    assert_blob(target, layer)
    assert calls[0] == 1234567 and sum(calls) == layer.size
    assert [request.range for request in blob_host.requests_for(layer.digest)] == ["bytes=1234567-"]


def test_partial_file_against_the_registry_itself(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = big_layer()
    registry_plain.upload(busybox_image(layers=[layer]), "resume/plain")
    target = tmp_path / "blob"
    Path(f"{target}.partial").write_bytes(layer.data[:(2 << 20) + 17])
    with Front(registry_plain) as front, client(front, "resume/plain") as registry:
        fetch(registry, layer, target)
        assert [request.headers.get("range") for request in front.requests if "/blobs/" in request.path] == \
            [f"bytes={(2 << 20) + 17}-"]
    assert_blob(target, layer)


def test_wrong_partial_file_is_downloaded_again(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = big_layer(1 << 20)
    registry_redirect.upload(busybox_image(layers=[layer]), "resume/wrong")
    target = tmp_path / "blob"
    Path(f"{target}.partial").write_bytes(b"not the start of this blob")
    with client(registry_redirect, "resume/wrong", credentials=ALICE) as registry:
        calls = fetch(registry, layer, target)
    assert_blob(target, layer)
    assert sum(calls) == layer.size and calls[0] == len(b"not the start of this blob")
    assert [request.range for request in blob_host.requests_for(layer.digest)] == [
        f"bytes={len(b'not the start of this blob')}-", None]


def test_complete_partial_file_needs_no_request(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = big_layer(1 << 20)
    registry_redirect.upload(busybox_image(layers=[layer]), "resume/complete")
    target = tmp_path / "blob"
    Path(f"{target}.partial").write_bytes(layer.data)
    with client(registry_redirect, "resume/complete", credentials=ALICE) as registry:
        fetch(registry, layer, target)
    assert_blob(target, layer)
    assert blob_host.requests_for(layer.digest) == []


def test_server_ignoring_range_restarts_from_zero(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = big_layer(1 << 20)
    registry_plain.upload(busybox_image(layers=[layer]), "resume/no-range")
    target = tmp_path / "blob"
    Path(f"{target}.partial").write_bytes(layer.data[:1000])
    with Front(registry_plain) as front, client(front, "resume/no-range") as registry:
        front.drop_range = True
        calls = fetch(registry, layer, target)
    assert_blob(target, layer)
    assert calls[0] == 1000 and -1000 in calls and sum(calls) == layer.size


# --- retries -------------------------------------------------------------------------------------------------------


def test_blob_503_with_retry_after_is_retried(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = big_layer(1 << 20)
    registry_redirect.upload(busybox_image(layers=[layer]), "retry/blob")
    blob_host.fail(layer.digest, 503, times=2, headers={"Retry-After": "1"})
    started = time.monotonic()
    with client(registry_redirect, "retry/blob", credentials=ALICE) as registry:
        fetch(registry, layer, tmp_path / "blob")
    assert time.monotonic() - started >= 2.0
    assert_blob(tmp_path / "blob", layer)
    assert [request.status for request in blob_host.requests_for(layer.digest)] == [503, 503, 200]


def test_manifest_429_and_5xx_are_retried(registry_plain: RegistryServer) -> None:
    image = unique_image()
    registry_plain.upload(image, "retry/manifest")
    with Front(registry_plain) as front:
        front.raw("/manifests/latest", b"")  # a connection closed without an answer
        front.answer("/manifests/latest", 429, b"slow down", {"Retry-After": "1"})
        front.answer("/manifests/latest", 502, b"", {"Retry-After": "0"})
        front.answer("/manifests/latest", 500, b"", {"Retry-After": "0"})
        with client(front, "retry/manifest") as registry:
            delays: list[float] = []

            def sleep(seconds: float) -> None:
                delays.append(seconds)
                time.sleep(seconds)

            registry.sleep = sleep
            assert registry.manifest("latest").digest == image.digest
    assert 0.5 <= delays[0] <= 1 and delays[1:] == [1.0, 0.0, 0.0]
    assert len([request for request in front.requests if "/manifests/" in request.path]) == 5


def test_retry_after_is_capped(registry_plain: RegistryServer) -> None:
    image = unique_image()
    registry_plain.upload(image, "retry/capped")
    with Front(registry_plain) as front:
        front.answer("/manifests/latest", 503, b"", {"Retry-After": "86400"})
        front.answer("/manifests/latest", 503, b"", {"Retry-After": "Wed, 21 Oct 2099 07:28:00 GMT"})
        front.answer("/manifests/latest", 503, b"", {"Retry-After": "soon"})
        with client(front, "retry/capped") as registry:
            delays: list[float] = []
            registry.sleep = delays.append  # recorded, not slept: the cap is what is tested
            assert registry.manifest("latest").digest == image.digest
    assert delays[:2] == [60.0, 60.0]
    assert 2.0 <= delays[2] <= 2.5  # unreadable: the third try's own backoff


def test_retries_end(registry_plain: RegistryServer) -> None:
    with Front(registry_plain) as front:
        for _ in range(MAX_TRIES):
            front.answer("/manifests/latest", 503, b'{"errors": [{"code": "UNAVAILABLE", "message": "down"}]}',
                         {"Retry-After": "0"})
        with client(front, "retry/ends") as registry:
            error = failure(lambda: registry.manifest("latest"))
    assert isinstance(error, Unreachable)
    assert error.message.startswith(f"registry {front.host} answered HTTP 503")
    assert "UNAVAILABLE: down" in error.message
    assert len([request for request in front.requests if "/manifests/" in request.path]) == MAX_TRIES


# --- unreachable ---------------------------------------------------------------------------------------------------


def test_unreachable_registry_is_named() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nobody listens there once the probe is closed
    registry = Registry(parse(f"docker://127.0.0.1:{port}/x/y"), env={}, credentials=None, https=False)
    started = time.monotonic()
    error = failure(lambda: registry.manifest("latest"))
    assert isinstance(error, Unreachable)
    assert error.message == f"can't reach registry 127.0.0.1:{port}: connection refused"
    assert time.monotonic() - started < 5


def test_unknown_host_is_named() -> None:
    registry = Registry(parse("docker://registry.nonexistent.invalid/x/y"), env={}, credentials=None)
    error = failure(lambda: registry.manifest("latest"))  # .invalid never resolves (RFC 6761)
    assert isinstance(error, Unreachable)
    assert error.message.startswith("can't reach registry registry.nonexistent.invalid: ")


# --- proxies -------------------------------------------------------------------------------------------------------


def test_http_proxy_and_no_proxy(registry_plain: RegistryServer) -> None:
    image = unique_image()
    registry_plain.upload(image, "proxy/plain")
    with ForwardProxy() as proxy:
        env = {"http_proxy": f"http://user:pw@{proxy.host}"}
        with client(registry_plain, "proxy/plain", env=env) as registry:
            assert registry.manifest("latest").digest == image.digest
        assert proxy.lines == [f"GET http://{registry_plain.host}/v2/proxy/plain/manifests/latest HTTP/1.1"]
        assert proxy.authorizations == ["Basic dXNlcjpwdw=="]
        for no_proxy in ("127.0.0.1", "localhost,127.0.0.0/8", "*", f"x.org, 127.0.0.1:{registry_plain.port}"):
            with client(registry_plain, "proxy/plain", env={**env, "no_proxy": no_proxy}) as registry:
                assert registry.manifest("latest").digest == image.digest
        assert len(proxy.lines) == 1


def test_https_proxy_tunnels(registry_tls: RegistryServer) -> None:
    image = unique_image()
    registry_tls.upload(image, "proxy/tls")
    assert registry_tls.ca_file is not None
    with ForwardProxy() as proxy:
        env = {"HTTPS_PROXY": proxy.host, "SSL_CERT_FILE": registry_tls.ca_file, "http_proxy": "http://unused:1"}
        with client(registry_tls, "proxy/tls", env=env) as registry:
            assert registry.manifest("latest").digest == image.digest
            assert registry.blob_bytes(image.config_digest) == image.config_data
    assert [line.rpartition(" ")[0] for line in proxy.lines] == [f"CONNECT {registry_tls.host}"]  # one, kept alive


def test_unreachable_proxy_is_named(registry_plain: RegistryServer) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with client(registry_plain, "proxy/none", env={"http_proxy": f"http://127.0.0.1:{port}"}) as registry:
        message = failure(lambda: registry.manifest("latest")).message
    assert message.startswith(f"can't reach registry {registry_plain.host}")


@pytest.mark.parametrize(("host", "port", "no_proxy", "bypass"), [
    ("registry.example.com", 443, "example.com", True),
    ("registry.example.com", 443, ".example.com", True),
    ("registry.example.com", 443, "*.example.com", True),
    ("example.com", 443, ".example.com", True),
    ("badexample.com", 443, "example.com", False),
    ("registry.example.com", 443, "other.org, example.com ", True),
    ("registry.example.com", 443, "example.com:5000", False),
    ("registry.example.com", 5000, "example.com:5000", True),
    ("10.1.2.3", 443, "10.0.0.0/8", True),
    ("10.1.2.3", 443, "10.1.2.3", True),
    ("11.1.2.3", 443, "10.0.0.0/8", False),
    ("::1", 443, "::1", True),
    ("::1", 5000, "[::1]:5000", True),
    ("host", 80, "*", True),
    ("host", 80, "", False),
    ("HOST.Example.COM", 80, "example.com", True),
])
def test_no_proxy_matching(host: str, port: int, no_proxy: str, bypass: bool) -> None:
    assert bypasses_proxy(host, port, no_proxy) is bypass

"""singpy.oci.registry against a real registry (Debian's docker-registry, tests/support/registry.py): manifests,
blobs, authentication, TLS and redirects; test_oci_registry_transfers.py has interrupted downloads, retries,
unreachable registries and proxies.

Library-level: the client is imported and driven in-process (the command line is tested elsewhere).
What a registry never does by itself (answer 503, send a schema 1 manifest, garbage, a generic
Content-Type) comes from `Front` (tests/support/registry_front.py), a small reverse proxy that sits before
the real registry and misbehaves on request. Each test pushes images under repository names of its own.
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from singpy.errors import ImageError
from singpy.oci.auth import Credentials
from singpy.oci.manifest import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST
from singpy.oci.regerrors import Unreachable
from singpy.oci.retries import MAX_TRIES
from tests.support.oci import Index, Layer, busybox_image, multiarch_index, sha256
from tests.support.registry_client import (
    ALICE,
    USERNAME,
    assert_blob,
    big_layer,
    client,
    failure,
    fetch,
    storage_file,
    unique_image,
)
from tests.support.registry_front import Front

if TYPE_CHECKING:
    from tests.support.registry import RegistryServer


# --- manifests -----------------------------------------------------------------------------------------------------


def test_manifest_by_tag_and_by_digest(registry_plain: RegistryServer) -> None:
    image = unique_image()
    registry_plain.upload(image, "manifests/by-tag")
    with client(registry_plain, "manifests/by-tag") as registry:
        by_tag = registry.manifest("latest")
        assert (by_tag.media_type, by_tag.digest, by_tag.data) == (OCI_MANIFEST, image.digest, image.data)
        assert by_tag.body == image.manifest
        assert not by_tag.is_index
        assert registry.manifest(image.digest) == by_tag
        assert registry.head_digest("latest") == image.digest


@pytest.mark.parametrize("docker", [False, True], ids=["oci-index", "docker-list"])
def test_index_then_platform_manifest(registry_plain: RegistryServer, docker: bool) -> None:
    index = multiarch_index(docker=docker)
    name = f"manifests/index-{int(docker)}"
    registry_plain.upload(index, name)
    with client(registry_plain, name) as registry:
        top = registry.manifest("latest")
        assert (top.media_type, top.digest, top.is_index) == (DOCKER_LIST if docker else OCI_INDEX, index.digest, True)
        assert [entry["digest"] for entry in top.body["manifests"]] == [item.digest for item in index.manifests]
        child = registry.manifest(top.body["manifests"][1]["digest"])
        assert child.media_type == (DOCKER_MANIFEST if docker else OCI_MANIFEST)
        assert child.data == index.manifests[1].data


def test_docker_v2_manifest(registry_plain: RegistryServer) -> None:
    image = unique_image(docker=True)
    registry_plain.upload(image, "manifests/docker-v2")
    with client(registry_plain, "manifests/docker-v2") as registry:
        manifest = registry.manifest("latest")
        assert (manifest.media_type, manifest.digest) == (DOCKER_MANIFEST, image.digest)
        config = registry.blob_bytes(manifest.body["config"]["digest"])
        assert json.loads(config)["rootfs"]["diff_ids"] == [layer.diff_id for layer in image.layers]


def without_media_type(index: Index) -> Index:
    index.manifest.pop("mediaType")
    index.data = json.dumps(index.manifest).encode()
    index.digest = sha256(index.data)
    return index


@pytest.mark.parametrize("content_type", [None, "application/json", "text/plain; charset=utf-8", ""])
def test_manifests_without_media_type(registry_plain: RegistryServer, content_type: str | None) -> None:
    """OCI lets `mediaType` out: the body says what it is, whatever Content-Type the server sends."""
    image = unique_image(media_type_field=False)
    index = without_media_type(multiarch_index(attestations=False))
    registry_plain.upload(image, "manifests/no-media-type")
    registry_plain.upload(index, "manifests/no-media-type", tag="index")
    with Front(registry_plain) as front:
        if content_type is not None:
            front.rewrite("/manifests/", {"Content-Type": content_type}, times=100)
        with client(front, "manifests/no-media-type") as registry:
            manifest = registry.manifest("latest")
            assert "mediaType" not in manifest.body
            assert (manifest.media_type, manifest.digest) == (OCI_MANIFEST, image.digest)
            top = registry.manifest("index")
            assert (top.media_type, top.digest, top.is_index) == (OCI_INDEX, index.digest, True)


def test_schema1_is_refused_by_name(registry_plain: RegistryServer) -> None:
    schema1 = json.dumps({"schemaVersion": 1, "name": "old/image", "tag": "latest", "architecture": "amd64",
                          "fsLayers": [{"blobSum": "sha256:" + "a" * 64}], "history": [], "signatures": []}).encode()
    with Front(registry_plain) as front:
        front.answer("/manifests/latest", 200, schema1,
                     {"Content-Type": "application/vnd.docker.distribution.manifest.v1+prettyjws"})
        front.answer("/manifests/latest", 200, schema1, {"Content-Type": "application/json"})
        with client(front, "old/image") as registry:
            for _ in range(2):
                message = failure(lambda: registry.manifest("latest")).message
                assert message == (f"image docker://{front.host}/old/image:latest has a Docker schema 1 manifest, a "
                                   "format deprecated since 2017 that singpy does not read")
        assert "application/vnd.docker.distribution.manifest.v2+json" in front.requests[0].headers["accept"]
        assert "application/vnd.oci.image.index.v1+json" in front.requests[0].headers["accept"]


@pytest.mark.parametrize(("body", "words"), [
    (b"[1, 2]", "not a JSON object"),
    (b"{not json", "not JSON"),
    (b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {}, "layers": []}',
     "config.mediaType is not a string"),
    (b'{"schemaVersion": 2, "config": {"mediaType": "x", "digest": "sha256:../../x", "size": 1}, "layers": []}',
     "config.digest"),
    (b'{"schemaVersion": 2, "config": {"mediaType": "x", "digest": "sha256:' + b"a" * 64 + b'", "size": -1}, '
     b'"layers": "everything"}', "config.size is not a non-negative integer"),
    (b'{"schemaVersion": 2, "config": {"mediaType": "x", "digest": "sha256:' + b"a" * 64 + b'", "size": 1}, '
     b'"layers": "everything"}', "'layers' is not a list"),
    (b'{"schemaVersion": 2, "manifests": [{"mediaType": "x", "digest": "sha256:' + b"a" * 64 +
     b'", "size": true}]}', "manifests[0].size is not a non-negative integer"),
    (b'{"schemaVersion": 2, "manifests": [{"mediaType": "x", "digest": "sha256:' + b"a" * 64 +
     b'", "size": 1, "platform": {"architecture": 5}}]}', "manifests[0].platform.architecture is not a string"),
    (b'{"schemaVersion": "2", "manifests": []}', "schemaVersion is 2, not 2"),
    (b'{"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.config.v1+json"}', "is not a container image"),
])
def test_malformed_manifests_are_one_error(registry_plain: RegistryServer, body: bytes, words: str) -> None:
    with Front(registry_plain) as front:
        front.answer("/manifests/latest", 200, body, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        with client(front, "bad/manifest") as registry:
            message = failure(lambda: registry.manifest("latest")).message
    assert words in message
    assert f"docker://{front.host}/bad/manifest:latest" in message


def test_huge_manifest_is_refused_without_reading_it_all(registry_plain: RegistryServer) -> None:
    with Front(registry_plain) as front:
        front.answer("/manifests/latest", 200, b"{" + b" " * (5 << 20) + b"}", {"Content-Type": OCI_MANIFEST})
        front.answer("/manifests/latest", 200, b"{" + b" " * (5 << 20) + b"}", {"Content-Type": OCI_MANIFEST},
                     chunked=True)
        with client(front, "bad/huge") as registry:
            for _ in range(2):
                assert "is larger than 4 MiB" in failure(lambda: registry.manifest("latest")).message


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\n" + b"X-Many: 1\r\n" * 200 + b"\r\n",
    b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 100000 + b"\r\n\r\n",
    b"SPAM\r\n\r\n",
    b"\x00\xff\xfe garbage",
])
def test_garbage_responses_are_one_error(registry_plain: RegistryServer, raw: bytes) -> None:
    with Front(registry_plain) as front:
        for _ in range(MAX_TRIES):
            front.raw("/manifests/latest", raw)
        with client(front, "bad/garbage") as registry:
            error = failure(lambda: registry.manifest("latest"))
    assert front.host in error.message


def test_unknown_tag_and_repository_name_reference_and_registry(registry_plain: RegistryServer) -> None:
    registry_plain.upload(unique_image(), "missing/known")
    with client(registry_plain, "missing/known") as registry:
        message = failure(lambda: registry.manifest("nope")).message
        assert message.startswith(f"image docker://{registry_plain.host}/missing/known:nope not found in registry "
                                  f"{registry_plain.host}")
        assert isinstance(failure(lambda: registry.manifest("nope")), ImageError)
        assert not isinstance(failure(lambda: registry.manifest("nope")), Unreachable)
        digest = "sha256:" + "0" * 64
        assert failure(lambda: registry.manifest(digest)).message.startswith(
            f"image docker://{registry_plain.host}/missing/known@{digest} not found in registry")
        assert failure(lambda: registry.head_digest("nope")).message.startswith(
            f"image docker://{registry_plain.host}/missing/known:nope not found")
        assert failure(lambda: registry.blob_bytes(digest)).message.startswith(
            f"blob {digest} of docker://{registry_plain.host}/missing/known not found in registry")
    with client(registry_plain, "missing/never-pushed") as registry:
        assert failure(lambda: registry.manifest("latest")).message.startswith(
            f"image docker://{registry_plain.host}/missing/never-pushed:latest not found in registry "
            f"{registry_plain.host}")


def test_manifest_digest_is_verified(registry_plain: RegistryServer) -> None:
    image, other = unique_image(), unique_image()
    registry_plain.upload(image, "verify/manifest")
    storage_file(registry_plain, image.digest).write_bytes(other.data)  # what the registry now serves for it
    with client(registry_plain, "verify/manifest") as registry:
        by_digest = failure(lambda: registry.manifest(image.digest)).message
        assert by_digest == (f"digest mismatch for manifest {image.digest} from {registry_plain.host}: it has "
                             f"{other.digest}")
        by_tag = failure(lambda: registry.manifest("latest")).message  # the registry's Docker-Content-Digest
        assert by_tag.startswith(f"digest mismatch for the manifest of image docker://{registry_plain.host}/"
                                 f"verify/manifest:latest from {registry_plain.host}: the registry says {image.digest}")


# --- blobs ---------------------------------------------------------------------------------------------------------


def test_blob_download(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = big_layer()
    image = busybox_image(layers=[layer])
    registry_plain.upload(image, "blobs/download")
    with client(registry_plain, "blobs/download") as registry:
        calls = fetch(registry, layer, tmp_path / "blob")
        assert_blob(tmp_path / "blob", layer)
        assert sum(calls) == layer.size and len(calls) >= 3 and all(call > 0 for call in calls)
        assert registry.blob_bytes(image.config_digest) == image.config_data
        registry.fetch_blob(layer.digest, str(tmp_path / "unknown-size"), size=None)
        assert_blob(tmp_path / "unknown-size", layer)


def test_blob_digest_mismatch_discards_the_download(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = big_layer(1 << 20)
    image = busybox_image(layers=[layer])
    registry_plain.upload(image, "blobs/mismatch")
    storage = storage_file(registry_plain, layer.digest)
    storage.write_bytes(secrets.token_bytes(layer.size))  # same size, other bytes
    storage_file(registry_plain, image.config_digest).write_bytes(b"{}" + b" " * (len(image.config_data) - 2))
    target = tmp_path / "blob"
    with client(registry_plain, "blobs/mismatch") as registry:
        message = failure(lambda: fetch(registry, layer, target)).message
        assert message == (f"digest mismatch for blob {layer.digest} from {registry_plain.host}: the download was "
                           "discarded")
        assert not target.exists() and not Path(f"{target}.partial").exists()
        assert list(tmp_path.iterdir()) == []
        message = failure(lambda: registry.blob_bytes(image.config_digest)).message
        assert message.startswith(f"digest mismatch for blob {image.config_digest} from {registry_plain.host}")


def test_a_blob_larger_than_announced_is_cut_short(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = big_layer(1 << 20)
    registry_plain.upload(busybox_image(layers=[layer]), "blobs/larger")
    with client(registry_plain, "blobs/larger") as registry:
        message = failure(lambda: registry.fetch_blob(layer.digest, str(tmp_path / "b"), size=1000)).message
    assert message.startswith(f"digest mismatch for blob {layer.digest}")
    assert list(tmp_path.iterdir()) == []


def test_parallel_downloads_share_one_token(registry_token: RegistryServer, tmp_path: Path) -> None:
    layers = [big_layer(1 << 20) for _ in range(6)]
    registry_token.upload(busybox_image(layers=layers), "public/parallel")
    assert registry_token.token_server is not None
    before = len(registry_token.token_server.requests)
    errors: list[BaseException] = []
    with client(registry_token, "public/parallel") as registry:
        def download(layer: Layer) -> None:
            try:
                registry.fetch_blob(layer.digest, str(tmp_path / layer.digest[7:]), size=layer.size)
            except BaseException as error:  # handed to the test
                errors.append(error)

        threads = [threading.Thread(target=download, args=(layer,)) for layer in layers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    for layer in layers:
        assert_blob(tmp_path / layer.digest[7:], layer)
    asked = registry_token.token_server.requests[before:]
    assert [(request.user, request.scopes) for request in asked] == [("", ["repository:public/parallel:pull"])]


# --- authentication ------------------------------------------------------------------------------------------------


def test_basic_auth(registry_basic: RegistryServer, tmp_path: Path) -> None:
    image = unique_image()
    registry_basic.upload(image, "basic/image")
    with client(registry_basic, "basic/image", credentials=ALICE) as registry:
        assert registry.manifest("latest").digest == image.digest
        registry.fetch_blob(image.layers[1].digest, str(tmp_path / "blob"), size=image.layers[1].size)
        assert_blob(tmp_path / "blob", image.layers[1])
    ref = f"docker://{registry_basic.host}/basic/image:latest"
    with client(registry_basic, "basic/image", credentials=Credentials(username=USERNAME, password="x")) as registry:
        error = failure(lambda: registry.manifest("latest"))
        assert error.message.startswith(f"access to {ref} denied by {registry_basic.host}: the password of "
                                        f"{USERNAME!r} was refused")
        assert "--docker-login" in error.message and "SINGPY_DOCKER_USERNAME" in error.message
    with client(registry_basic, "basic/image") as registry:
        error = failure(lambda: registry.manifest("latest"))
        assert error.message.startswith(f"access to {ref} denied by {registry_basic.host}: it needs credentials (")
        assert "--authfile" in error.message


def test_bearer_anonymous_and_with_credentials(registry_token: RegistryServer, tmp_path: Path) -> None:
    public, private = unique_image(), unique_image()
    registry_token.upload(public, "public/bearer")
    registry_token.upload(private, "private/bearer")
    server = registry_token.token_server
    assert server is not None
    before = len(server.requests)
    with client(registry_token, "public/bearer") as registry:
        assert registry.head_digest("latest") == public.digest
        assert registry.manifest("latest").digest == public.digest
        assert registry.blob_bytes(public.config_digest) == public.config_data
    with client(registry_token, "private/bearer") as registry:
        error = failure(lambda: registry.manifest("latest"))
        assert error.message.startswith(f"access to docker://{registry_token.host}/private/bearer:latest denied by "
                                        f"{registry_token.host}: an anonymous token does not allow pulling it")
        assert "--docker-login" in error.message
    with client(registry_token, "private/bearer", credentials=ALICE) as registry:
        assert registry.manifest("latest").digest == private.digest
        registry.fetch_blob(private.layers[1].digest, str(tmp_path / "blob"), size=private.layers[1].size)
        assert_blob(tmp_path / "blob", private.layers[1])
    with client(registry_token, "private/bearer", credentials=Credentials(username=USERNAME, password="no")) as r:
        error = failure(lambda: r.manifest("latest"))
        assert f"refused the credentials of {USERNAME!r} (" in error.message
    asked = [(request.scopes, request.status) for request in server.requests[before:]]
    assert asked == [(["repository:public/bearer:pull"], 200),  # one token for the manifest and the blob
                     (["repository:private/bearer:pull"], 200),  # granted nothing: the registry says 401
                     (["repository:private/bearer:pull"], 200),
                     (["repository:private/bearer:pull"], 401)]
    assert [request.user for request in server.requests[before:]][:3] == ["", "", USERNAME]
    assert all(request.headers.get("authorization", "").startswith("Basic ")
               for request in server.requests[before:][2:])


# --- TLS -----------------------------------------------------------------------------------------------------------


def test_tls_with_ssl_cert_file(registry_tls: RegistryServer, tmp_path: Path) -> None:
    image = unique_image()
    registry_tls.upload(image, "tls/image")
    assert registry_tls.ca_file is not None
    with client(registry_tls, "tls/image", env={"SSL_CERT_FILE": registry_tls.ca_file}) as registry:
        assert registry.manifest("latest").digest == image.digest
        registry.fetch_blob(image.layers[1].digest, str(tmp_path / "blob"), size=image.layers[1].size)
        assert_blob(tmp_path / "blob", image.layers[1])


def test_tls_with_ssl_cert_dir(registry_tls: RegistryServer, tmp_path: Path) -> None:
    import shutil
    import subprocess

    image = unique_image()
    registry_tls.upload(image, "tls/cert-dir")
    assert registry_tls.ca_file is not None
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(registry_tls.ca_file, certs / "ca.pem")
    subprocess.run(["openssl", "rehash", str(certs)], check=True, capture_output=True)  # OpenSSL's hash names
    with client(registry_tls, "tls/cert-dir", env={"SSL_CERT_DIR": f"/nonexistent:{certs}"}) as registry:
        assert registry.manifest("latest").digest == image.digest


def test_tls_without_the_ca_fails_naming_the_host(registry_tls: RegistryServer) -> None:
    with client(registry_tls, "tls/untrusted") as registry:
        error = failure(lambda: registry.manifest("latest"))
    assert error.message.startswith(f"can't make a TLS connection to {registry_tls.host}: TLS certificate not trusted")
    assert "SSL_CERT_FILE" in error.message and "--no-https" in error.message


def test_a_missing_ssl_cert_file_is_named(registry_tls: RegistryServer, tmp_path: Path) -> None:
    with client(registry_tls, "tls/x", env={"SSL_CERT_FILE": str(tmp_path / "none.pem")}) as registry:
        message = failure(lambda: registry.manifest("latest")).message
    assert message.startswith(f"can't load the CA certificates of SSL_CERT_FILE from {tmp_path / 'none.pem'}")


def test_https_to_a_plain_http_registry_hints_no_https(registry_plain: RegistryServer) -> None:
    with client(registry_plain, "tls/plain", https=True) as registry:
        error = failure(lambda: registry.manifest("latest"))
    assert error.message.startswith(f"can't make a TLS connection to {registry_plain.host}")
    assert "--no-https" in error.message


# --- redirects -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["basic", "token"])
def test_redirected_blobs_go_without_authorization(registry_redirect: RegistryServer,
                                                   registry_redirect_token: RegistryServer, tmp_path: Path,
                                                   kind: str) -> None:
    server = registry_redirect if kind == "basic" else registry_redirect_token
    assert server.blob_host is not None
    image = unique_image()
    name = "public/redirect" if kind == "token" else "redirect/image"
    server.upload(image, name)
    layer = image.layers[1]
    with client(server, name, credentials=ALICE) as registry:
        registry.fetch_blob(layer.digest, str(tmp_path / "blob"), size=layer.size)
        assert_blob(tmp_path / "blob", layer)
        assert registry.blob_bytes(image.config_digest) == image.config_data
    for digest in (layer.digest, image.config_digest):
        requests = server.blob_host.requests_for(digest)
        assert [(request.authorization, request.status) for request in requests] == [(None, 200)]


def test_same_origin_redirects_keep_authorization(registry_basic: RegistryServer, tmp_path: Path) -> None:
    image = unique_image()
    registry_basic.upload(image, "redirect/same-origin")
    layer = image.layers[1]
    with Front(registry_basic) as front:
        path = f"/v2/redirect/same-origin/blobs/{layer.digest}"
        front.answer(path, 307, b"", {"Location": f"{path}?moved=1"})
        with client(front, "redirect/same-origin", credentials=ALICE) as registry:
            assert registry.manifest("latest").digest == image.digest  # the 401 and Basic answer happen here
            registry.fetch_blob(layer.digest, str(tmp_path / "blob"), size=layer.size)
        blob_requests = [request for request in front.requests if "/blobs/" in request.path]
        assert [request.path for request in blob_requests] == [path, f"{path}?moved=1"]
        assert all(request.headers.get("authorization", "").startswith("Basic ") for request in blob_requests)
    assert_blob(tmp_path / "blob", layer)


@pytest.mark.parametrize(("location", "words"), [
    ("/v2/redirect/loop/blobs/LOOP", "redirected more than 10 times"),
    ("ftp://127.0.0.1/x", "which is not an http(s) URL"),
    ("", "sent a redirect without a usable Location"),
    ("http://[::1", "which is not an http(s) URL"),
])
def test_bad_redirects_are_one_error(registry_plain: RegistryServer, tmp_path: Path, location: str,
                                     words: str) -> None:
    digest = "sha256:" + "1" * 64
    with Front(registry_plain) as front:
        for _ in range(12):
            front.answer("/blobs/", 302, b"", {"Location": location.replace("LOOP", digest)} if location else {})
        with client(front, "redirect/loop") as registry:
            message = failure(lambda: registry.fetch_blob(digest, str(tmp_path / "b"), size=None)).message
    assert words in message
    assert not (tmp_path / "b").exists()


def test_unwritable_target_is_named(registry_plain: RegistryServer, tmp_path: Path) -> None:
    with client(registry_plain, "blobs/unwritable") as registry:
        message = failure(lambda: registry.fetch_blob("sha256:" + "2" * 64, str(tmp_path / "no/blob"),
                                                      size=None)).message
    assert message == f"can't write {tmp_path}/no/blob.partial: No such file or directory"


@pytest.mark.parametrize("digest", ["sha256:../../../etc/passwd", "md5:" + "0" * 32, "sha256:" + "A" * 64])
def test_bad_digests_never_reach_a_path(registry_plain: RegistryServer, tmp_path: Path, digest: str) -> None:
    with client(registry_plain, "blobs/bad-digest") as registry:
        assert "unsupported digest" in failure(lambda: registry.fetch_blob(digest, str(tmp_path / "b"),
                                                                           size=None)).message
        assert "unsupported digest" in failure(lambda: registry.blob_bytes(digest)).message
        assert "is neither a tag nor a sha256 digest" in failure(lambda: registry.manifest(digest)).message
    assert list(tmp_path.iterdir()) == []

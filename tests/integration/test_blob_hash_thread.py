"""A large blob is hashed on a thread beside its download (singpy.oci.blobfetch, issue 31): the same checks.

In-process against Debian's docker-registry (tests.support.registry): blobs over blobfetch._THREAD_FROM bytes
are verified, a wrong one is discarded, a cut one is resumed and verified whole, and no thread is left
behind (a launch after a pull unshares a user namespace, which a threaded process can't).
"""

from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.oci import blobfetch
from singpy.oci.auth import Credentials
from singpy.oci.ref import parse
from singpy.oci.registry import Registry
from tests.support.oci import Layer, busybox_image, file
from tests.support.registry import RegistryServer

SIZE = blobfetch._THREAD_FROM + (3 << 20) + 12345  # over the threshold, not a whole number of chunks


def layer_of(size: int = SIZE) -> Layer:
    return Layer([file("data/random", secrets.token_bytes(size))], compression="none")


def client(server: RegistryServer, name: str) -> Registry:
    credentials = Credentials(username=server.username, password=server.password) if server.username else None
    return Registry(parse(f"docker://{server.host}/{name}:latest"), env={}, credentials=credentials,
                    https=server.https)


def hash_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "singpy-hash"]


@pytest.mark.parametrize("size_known", [True, False])
def test_a_large_blob_is_verified_and_no_thread_stays(registry_plain: RegistryServer, tmp_path: Path,
                                                       size_known: bool) -> None:
    layer = layer_of()
    name = f"hashthread/ok-{'known' if size_known else 'unknown'}"  # repository names are lowercase
    registry_plain.upload(busybox_image(layers=[layer]), name)
    calls: list[int] = []
    with client(registry_plain, name) as registry:
        registry.fetch_blob(layer.digest, str(tmp_path / "blob"), size=layer.size if size_known else None,
                            progress=calls.append)
    assert (tmp_path / "blob").read_bytes() == layer.data
    assert sum(calls) == layer.size and not Path(f"{tmp_path}/blob.partial").exists()
    assert hash_threads() == []


def test_a_large_blob_with_other_bytes_is_discarded(registry_plain: RegistryServer, tmp_path: Path) -> None:
    layer = layer_of()
    registry_plain.upload(busybox_image(layers=[layer]), "hashthread/mismatch")
    hex_digest = layer.digest.removeprefix("sha256:")
    storage = registry_plain.storage / f"docker/registry/v2/blobs/sha256/{hex_digest[:2]}/{hex_digest}/data"
    storage.write_bytes(layer.data[:-1] + bytes([layer.data[-1] ^ 1]))  # the last byte differs
    with client(registry_plain, "hashthread/mismatch") as registry, pytest.raises(ImageError) as caught:
        registry.fetch_blob(layer.digest, str(tmp_path / "blob"), size=layer.size)
    assert caught.value.message.startswith(f"digest mismatch for blob {layer.digest}")
    assert list(tmp_path.iterdir()) == []
    assert hash_threads() == []


def test_a_cut_large_download_resumes_and_verifies(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layer = layer_of()
    registry_redirect.upload(busybox_image(layers=[layer]), "hashthread/cut")
    cut_at = blobfetch._THREAD_FROM + (1 << 20)  # both requests are hashed on a thread
    stall = blob_host.stall(layer.digest, after=cut_at)
    target = tmp_path / "blob"
    errors: list[BaseException] = []
    with client(registry_redirect, "hashthread/cut") as registry:
        def download() -> None:
            try:
                registry.fetch_blob(layer.digest, str(target), size=layer.size)
            except BaseException as error:  # handed to the test
                errors.append(error)

        thread = threading.Thread(target=download)
        thread.start()
        assert stall.reached.wait(30)
        time.sleep(0.2)
        stall.release()  # the connection closes with the rest unsent
        thread.join(60)
    assert errors == []
    assert target.read_bytes() == layer.data
    assert [request.range for request in blob_host.requests_for(layer.digest)] == [None, f"bytes={cut_at}-"]
    assert hash_threads() == []

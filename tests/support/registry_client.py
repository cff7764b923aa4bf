"""singpy.oci.registry's client as the library-level registry tests drive it (test_oci_registry.py and
test_oci_registry_transfers.py): a `Registry` for a test server, images and layers no other test has, and
checks of what a download left."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from singpy.errors import ImageError
from singpy.oci.auth import Credentials
from singpy.oci.ref import parse
from singpy.oci.registry import Registry
from tests.support.oci import Image, Layer, busybox_image, file

if TYPE_CHECKING:
    from tests.support.registry import RegistryServer
    from tests.support.registry_front import Front


USERNAME, PASSWORD = "alice", "wonderland"  # who may pull from the fixtures' registries with credentials
ALICE = Credentials(username=USERNAME, password=PASSWORD)


def client(server: RegistryServer | Front, name: str, *, credentials: Credentials | None = None,
           env: Mapping[str, str] | None = None, https: bool | None = None) -> Registry:
    ref = parse(f"docker://{server.host}/{name}:latest")
    return Registry(ref, env=dict(env or {}), credentials=credentials,
                    https=server.https if https is None else https)


def unique_image(**options: Any) -> Image:
    """busybox plus a layer no other test has (its blob is ours to corrupt, stall or fail)."""
    return busybox_image(extra=[file("etc/unique", secrets.token_hex(16) + "\n")], **options)


def big_layer(size: int = 3 << 20) -> Layer:
    """An uncompressed layer of `size` random bytes: several reads, worth resuming."""
    return Layer([file("data/random", secrets.token_bytes(size))], compression="none")


def storage_file(server: RegistryServer, digest: str) -> Path:
    hex_digest = digest.removeprefix("sha256:")
    return server.storage / f"docker/registry/v2/blobs/sha256/{hex_digest[:2]}/{hex_digest}/data"


def failure(action: Callable[[], object]) -> ImageError:
    with pytest.raises(ImageError) as caught:
        action()
    assert "\n" not in caught.value.message
    return caught.value


def fetch(registry: Registry, layer: Layer, target: Path) -> list[int]:
    """fetch_blob with its progress calls recorded."""
    calls: list[int] = []
    registry.fetch_blob(layer.digest, str(target), size=layer.size, progress=calls.append)
    return calls


def assert_blob(target: Path, layer: Layer) -> None:
    assert target.read_bytes() == layer.data
    assert not Path(f"{target}.partial").exists()
    assert target.stat().st_mode & 0o777 == 0o644 & ~current_umask()


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread, for a moment)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask in /proc/self/status")

"""Layers, images and indexes for the tests (blobs, configs, manifests, digests), and the busybox images.

Everything is deterministic: the same inputs give the same digests (gzip without a timestamp, entries with
fixed mtimes). tests.support.oci re-exports every public name and documents the API.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import zstandard

from tests.support.images import build_busybox_rootfs
from tests.support.oci_entries import Entry, file, tar_bytes, tree

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
             "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
             "none": "application/vnd.oci.image.layer.v1.tar"}
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = {"gzip": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "none": "application/vnd.docker.image.rootfs.diff.tar"}
IN_TOTO = "application/vnd.in-toto+json"
COMPRESSIONS = ("gzip", "zstd", "none")


def compress(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(data)
    if compression == "none":
        return data
    raise ValueError(f"unknown compression {compression!r}: use one of {COMPRESSIONS}")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()



# --- layers, images, indexes ----------------------------------------------------------------------------------------


class Layer:
    """A layer blob: the tar of `entries`, compressed. `raw(data, media_type)` makes any other blob a layer."""

    def __init__(self, entries: Iterable[Entry] = (), *, compression: str = "gzip") -> None:
        self.entries = tuple(entries)
        self.compression = compression
        self.tar = tar_bytes(self.entries)
        self.data = compress(self.tar, compression)
        self.diff_id = sha256(self.tar)
        self.digest = sha256(self.data)
        self.size = len(self.data)
        self._media_type: str | None = None

    @classmethod
    def raw(cls, data: bytes, media_type: str) -> Layer:
        """A blob that is not a tar (an in-toto statement): its diff_id is its digest."""
        layer = cls.__new__(cls)
        layer.entries, layer.compression, layer.tar, layer.data = (), "none", data, data
        layer.diff_id = layer.digest = sha256(data)
        layer.size = len(data)
        layer._media_type = media_type
        return layer

    def media_type(self, docker: bool = False) -> str:
        if self._media_type is not None:
            return self._media_type
        table = DOCKER_LAYER if docker else OCI_LAYER
        if self.compression not in table:
            raise ValueError(f"Docker v2 manifests have no {self.compression} layer media type")
        return table[self.compression]


class Image:
    """An image manifest, its config and its layers."""

    def __init__(self, layers: Sequence[Layer], *, architecture: str = "amd64", os: str = "linux",
                 variant: str = "", env: Sequence[str] | None = (DEFAULT_PATH,),
                 entrypoint: Sequence[str] | None = None, cmd: Sequence[str] | None = None,
                 labels: Mapping[str, str] | None = None, working_dir: str = "", user: str = "",
                 docker: bool = False, media_type_field: bool = True, config_extra: Mapping[str, Any] | None = None,
                 config_media_type: str | None = None, annotations: Mapping[str, str] | None = None,
                 descriptor_annotations: Mapping[str, str] | None = None,
                 platform: Mapping[str, str] | None = None) -> None:
        self.layers = tuple(layers)
        self.docker = docker
        container: dict[str, Any] = {}
        if env is not None:
            container["Env"] = list(env)
        if entrypoint is not None:
            container["Entrypoint"] = list(entrypoint)
        if cmd is not None:
            container["Cmd"] = list(cmd)
        if labels:
            container["Labels"] = dict(labels)
        if working_dir:
            container["WorkingDir"] = working_dir
        if user:
            container["User"] = user
        self.config: dict[str, Any] = {
            "created": "2023-11-14T22:13:20Z", "architecture": architecture, "os": os, "config": container,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in self.layers]},
            "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "tests/support/oci.py"}
                        for _ in self.layers],
        }
        if variant:
            self.config["variant"] = variant
        self.config.update(config_extra or {})
        self.config_data = canonical_json(self.config)
        self.config_digest = sha256(self.config_data)
        self.media_type = DOCKER_MANIFEST if docker else OCI_MANIFEST
        self.manifest: dict[str, Any] = {"schemaVersion": 2}
        if media_type_field:
            self.manifest["mediaType"] = self.media_type
        self.manifest["config"] = {"mediaType": config_media_type or (DOCKER_CONFIG if docker else OCI_CONFIG),
                                   "digest": self.config_digest, "size": len(self.config_data)}
        self.manifest["layers"] = [{"mediaType": layer.media_type(docker), "digest": layer.digest,
                                    "size": layer.size} for layer in self.layers]
        if annotations:
            self.manifest["annotations"] = dict(annotations)
        self.data = json.dumps(self.manifest, indent=2).encode()
        self.digest = sha256(self.data)
        self.size = len(self.data)
        self.platform = dict(platform) if platform is not None else {
            "architecture": architecture, "os": os, **({"variant": variant} if variant else {})}
        self.descriptor_annotations = dict(descriptor_annotations or {})

    def descriptor(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                                 "platform": self.platform}
        if self.descriptor_annotations:
            entry["annotations"] = self.descriptor_annotations
        return entry

    def blobs(self) -> Iterable[tuple[str, bytes]]:
        """Every blob this image needs, the manifest included (digest, bytes)."""
        for layer in self.layers:
            yield layer.digest, layer.data
        yield self.config_digest, self.config_data
        yield self.digest, self.data


class Index:
    """An OCI image index, or a Docker manifest list (docker=True), of images (or nested indexes)."""

    def __init__(self, manifests: Sequence[Image | Index], *, docker: bool = False,
                 annotations: Mapping[str, str] | None = None) -> None:
        self.manifests = tuple(manifests)
        self.docker = docker
        self.media_type = DOCKER_LIST if docker else OCI_INDEX
        self.manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": self.media_type,
                                         "manifests": [item.descriptor() for item in self.manifests]}
        if annotations:
            self.manifest["annotations"] = dict(annotations)
        self.data = json.dumps(self.manifest, indent=2).encode()
        self.digest = sha256(self.data)
        self.size = len(self.data)

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}

    def blobs(self) -> Iterable[tuple[str, bytes]]:
        for item in self.manifests:
            yield from item.blobs()
        yield self.digest, self.data


def attestation(image: Image) -> Image:
    """The attestation manifest buildkit adds to an index for `image` (platform unknown/unknown)."""
    statement = canonical_json({"_type": "https://in-toto.io/Statement/v0.1",
                                "predicateType": "https://spdx.dev/Document",
                                "subject": [{"name": "pkg:docker/test", "digest": {"sha256": image.digest[7:]}}],
                                "predicate": {"spdxVersion": "SPDX-2.3"}})
    layer = Layer.raw(statement, IN_TOTO)
    return Image([layer], architecture="unknown", os="unknown", env=None, config_extra={"config": {}},
                 descriptor_annotations={"vnd.docker.reference.digest": image.digest,
                                         "vnd.docker.reference.type": "attestation-manifest"},
                 platform={"architecture": "unknown", "os": "unknown"})


# --- busybox images ------------------------------------------------------------------------------------------------


@functools.cache
def busybox_entries() -> tuple[Entry, ...]:
    """A busybox-static root filesystem (tests.support.images) as root-owned entries, without /.singularity.d."""
    with tempfile.TemporaryDirectory(prefix="singpy-tests-oci-") as scratch:
        root = build_busybox_rootfs(Path(scratch) / "rootfs", runscript=None)
        return tuple(tree(root, exclude=(".singularity.d",)))


@functools.cache
def busybox_layer(compression: str = "gzip") -> Layer:
    return Layer(busybox_entries(), compression=compression)


def busybox_image(*, extra: Sequence[Entry] = (), layers: Sequence[Layer] = (), compression: str = "gzip",
                  **options: Any) -> Image:
    """busybox-static, then a layer of `extra` entries (if any), then `layers`; `options` go to Image."""
    stack = [busybox_layer(compression)]
    if extra:
        stack.append(Layer(extra, compression=compression))
    stack.extend(layers)
    return Image(stack, **options)


PLATFORMS = (("amd64", ""), ("arm64", "v8"))


def platform_marker(architecture: str, variant: str = "", os: str = "linux") -> str:
    """The content of /etc/platform-marker in multiarch_index's image for that platform."""
    return "/".join(part for part in (os, architecture, variant) if part) + "\n"


def multiarch_index(*, docker: bool = False, attestations: bool = True,
                    platforms: Sequence[tuple[str, str]] = PLATFORMS, **options: Any) -> Index:
    """An index (Docker list if docker=True) of busybox images, one per (architecture, variant), each with
    /etc/platform-marker naming its platform; attestation manifests after them (OCI only, as buildkit)."""
    images = [busybox_image(extra=[file("etc/platform-marker", platform_marker(arch, variant))],
                            architecture=arch, variant=variant, docker=docker, **options)
              for arch, variant in platforms]
    extras = [attestation(image) for image in images] if attestations and not docker else []
    return Index([*images, *extras], docker=docker)

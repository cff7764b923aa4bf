"""The `docker-archive:` transport without a layout: `docker save` manifest.json, made the manifest a registry serves.

`manifest.json` (`[{"Config", "RepoTags", "Layers"}]`) gives the files, from
which an image manifest is made as a registry would serve it (Docker v2
media types, each blob's sha256 computed from its content). Docker 25 and
later write an OCI layout into the archive instead, which singpy.oci.local
reads (a REPO:TAG then matched with `image_name`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from singpy.errors import ImageError
from singpy.oci.localfiles import CHUNK, Files, read_json
from singpy.oci.manifest import DOCKER_MANIFEST, MANIFEST_LIMIT, MAX_LAYERS

DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


def docker_manifest(files: Files, where: str, tag: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The image manifest a registry would serve for the image `tag` (REPO:TAG, @INDEX or None: the only one)
    names in manifest.json, and the archive member of each of its blobs, by digest."""
    images = _docker_images(files, where)
    if tag is not None and tag.startswith("@") and tag[1:].isascii() and tag[1:].isdigit():
        position = int(tag[1:])
        if position >= len(images):
            raise ImageError(f"no image {tag} in {where}: it holds {len(images)}")
        chosen = images[position]
    elif tag is not None:
        wanted = image_name(tag)
        found = [image for image in images if wanted in map(image_name, image["RepoTags"])]
        if not found:
            raise ImageError(f"no image {tag!r} in {where}: {_repo_tags(images)}")
        chosen = found[0]
    elif len(images) == 1:
        chosen = images[0]
    else:
        raise ImageError(f"{where} holds {len(images)} images: name one ({_repo_tags(images)})",
                         hint=f"add REPO:TAG or @INDEX to the reference: {where}:@0")
    return _synthesize(files, where, chosen)


def _docker_images(files: Files, where: str) -> list[dict[str, Any]]:
    data = files.read("manifest.json", MANIFEST_LIMIT, what="manifest.json")
    if data is None:
        raise ImageError(f"{where} is not a docker archive (no manifest.json)")
    images = read_json(data, f"{where}: manifest.json")
    if not isinstance(images, list) or not images:
        raise ImageError(f"{where}: malformed manifest.json (not a list of images)")
    for position, image in enumerate(images):
        problem = _docker_image_problem(image)
        if problem:
            raise ImageError(f"{where}: malformed manifest.json: image {position} {problem}")
        image["RepoTags"] = image.get("RepoTags") or []
    return images


def _synthesize(files: Files, where: str, image: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The image manifest a registry would serve for one manifest.json entry, and its blobs' members."""
    config = files.read(image["Config"], MANIFEST_LIMIT, what=f"config {image['Config']}")
    if config is None:
        raise ImageError(f"{where}: the image config {image['Config']} is missing")
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    members = {config_digest: image["Config"]}
    described: dict[str, tuple[str, int, str]] = {}  # a layer listed again is the same file: read once
    layers = []
    for name in image["Layers"]:
        if name not in described:
            described[name] = _describe_layer(files, where, name)
        digest, size, media_type = described[name]
        members[digest] = name
        layers.append({"mediaType": media_type, "size": size, "digest": digest})
    body = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": DOCKER_CONFIG, "size": len(config), "digest": config_digest},
            "layers": layers}
    return body, members


def _describe_layer(files: Files, where: str, name: str) -> tuple[str, int, str]:
    """(sha256 digest, size, media type by its magic bytes) of layer file `name`, read once."""
    stream = files.open(name, what=f"layer {name}")
    if stream is None:
        raise ImageError(f"{where}: the layer {name} is missing")
    hasher, size, head = hashlib.sha256(), 0, b""
    with stream:
        while chunk := stream.read(CHUNK):
            if size < 8:
                head = (head + chunk)[:8]
            hasher.update(chunk)
            size += len(chunk)
    media_type = DOCKER_LAYER_GZIP if head.startswith(b"\x1f\x8b") else \
        OCI_LAYER_ZSTD if head.startswith(b"\x28\xb5\x2f\xfd") else DOCKER_LAYER_TAR
    return f"sha256:{hasher.hexdigest()}", size, media_type


def image_name(text: str) -> str:
    """A docker image name in one spelling: "busybox" == "busybox:latest" == "docker.io/library/busybox:latest"."""
    name, at, digest = text.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and not at:
        name += ":latest"
    for prefix in ("docker.io/", "index.docker.io/"):
        name = name.removeprefix(prefix)
    if name.count("/") == 0 and "." not in name.split(":")[0]:
        name = f"library/{name}"
    return name + at + digest


def _docker_image_problem(image: object) -> str | None:
    if not isinstance(image, dict):
        return "is not an object"
    if not isinstance(image.get("Config"), str) or not image["Config"]:
        return "has no Config file"
    layers = image.get("Layers")
    if not isinstance(layers, list) or not all(isinstance(layer, str) and layer for layer in layers):
        return "has no list of Layers"
    if len(layers) > MAX_LAYERS:
        return f"lists {len(layers)} layers (singpy reads at most {MAX_LAYERS})"
    tags = image.get("RepoTags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(tag, str) for tag in tags)):
        return "has RepoTags that are not a list of names"
    return None


def _repo_tags(images: list[dict[str, Any]]) -> str:
    tags = [tag for image in images for tag in image["RepoTags"]]
    untagged = sum(1 for image in images if not image["RepoTags"])
    parts = [", ".join(tags)] if tags else []
    if untagged:
        parts.append(f"{untagged} without a name")
    return "it has " + "; ".join(parts)

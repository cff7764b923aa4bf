"""Manifests and indexes: their media types, the verified Manifest record, and the checks of their untrusted JSON.

Docker's schema 1 is refused by name; `mediaType` is taken from the body,
else from Content-Type, else inferred (`manifests` means an index, `layers` a
manifest: OCI lets `mediaType` out). Sizes are bounded (MANIFEST_LIMIT) and
every field used later is type-checked here, so a malformed manifest is one
ImageError, never a KeyError. An image lists at most MAX_LAYERS layers (docker
archives' manifest.json too, singpy.oci.dockerarchive).
"""

from __future__ import annotations

from singpy.errors import ImageError
from singpy.oci.limits import parse_json
from singpy.oci.ref import valid_digest
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
SCHEMA1_TYPES = ("application/vnd.docker.distribution.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v1+prettyjws")
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

MANIFEST_LIMIT = 4 << 20  # bytes of a manifest, an index or a config (real ones are a few KB)
# Layers one image may list, from a registry, a layout or an archive: Docker stacks at most 128 (its overlay2
# driver's depth), so many more is a hostile image, whose every layer would be fetched and applied in turn
# (4 MiB of manifest lists ~30000 layers; one 4 MiB blob listed that often is 120 GB to unpack).
MAX_LAYERS = 1000


def digest_hex(algorithm: str, data: bytes) -> str:
    """The hex digest of `data` (hashlib is imported when a digest is computed: not for a HEAD request)."""
    import hashlib

    return hashlib.new(algorithm, data).hexdigest()


class Manifest(Record):
    """A manifest or index as the registry sent it, verified."""

    media_type: str  # one of INDEX_TYPES or MANIFEST_TYPES
    digest: str  # "sha256:..." of `data`
    data: bytes  # the exact bytes (what the digest covers)
    body: dict[str, Any]  # the parsed JSON object, its descriptors type-checked

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


def verified_manifest(reference: str, data: bytes, content_type: str, sent_digest: str, *, host: str,
                      image: str) -> Manifest:
    """The manifest or index `data` (asked for as `reference`, from `host`; `image` names it), checked: its
    digest, its media type, and every field used later (a malformed one is an ImageError)."""
    from singpy.oci.regerrors import DigestMismatch

    algorithm = reference.partition(":")[0] if valid_digest(reference) else "sha256"
    digest = f"{algorithm}:{digest_hex(algorithm, data)}"
    if valid_digest(reference) and digest != reference:
        raise DigestMismatch(f"digest mismatch for manifest {reference} from {host}: it has {digest}")
    if valid_digest(sent_digest) and sent_digest.partition(":")[0] == algorithm and sent_digest != digest:
        raise DigestMismatch(f"digest mismatch for the manifest of {image} from {host}: the registry says "
                         f"{sent_digest}, the content has {digest}")
    body = parse_json(data, f"the manifest of {image} from {host}", limit=MANIFEST_LIMIT)
    if not isinstance(body, dict):
        raise ImageError(f"malformed manifest for {image} from {host}: not a JSON object")
    media_type = media_type_of(body, content_type)
    if media_type in SCHEMA1_TYPES:
        raise ImageError(f"{image} has a Docker schema 1 manifest, a format deprecated since 2017 that singpy "
                         "does not read", hint="push the image again with a current docker, podman or skopeo")
    if media_type not in INDEX_TYPES + MANIFEST_TYPES:
        raise ImageError(f"{image} is not a container image: its manifest is of type {media_type[:100]!r}")
    problem = manifest_problem(body, media_type)
    if problem:
        raise ImageError(f"malformed manifest for {image} from {host}: {problem}")
    return Manifest(media_type=media_type, digest=digest, data=data, body=body)


def media_type_of(body: dict[str, Any], content_type: str) -> str:
    """What the manifest is: its `mediaType`, else what its fields say (Content-Type picks Docker or OCI)."""
    declared = body.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    if body.get("schemaVersion") == 1 or "fsLayers" in body:
        return SCHEMA1_TYPES[0]
    if "manifests" in body:
        return content_type if content_type in INDEX_TYPES else OCI_INDEX
    if "layers" in body or "config" in body:
        return content_type if content_type in MANIFEST_TYPES else OCI_MANIFEST
    return content_type or "unknown"


def manifest_problem(body: dict[str, Any], media_type: str) -> str | None:
    """What is wrong with a parsed manifest or index of `media_type` (None when nothing is)."""
    version = body.get("schemaVersion")
    if version != 2 or isinstance(version, bool):
        return f"schemaVersion is {str(version)[:20]}, not 2"
    if media_type in INDEX_TYPES:
        return _descriptors_problem(body, "manifests")
    problem = descriptor_problem(body.get("config"))
    if problem:
        return f"config{problem}"
    layers = body.get("layers")
    if isinstance(layers, list) and len(layers) > MAX_LAYERS:
        return f"it lists {len(layers)} layers (singpy reads at most {MAX_LAYERS})"
    return _descriptors_problem(body, "layers")


def _descriptors_problem(body: dict[str, Any], key: str) -> str | None:
    """What is wrong with the list of descriptors `body[key]` (None when nothing is)."""
    items = body.get(key)
    if not isinstance(items, list):
        return f"'{key}' is not a list"
    for position, item in enumerate(items):
        problem = descriptor_problem(item)
        if problem:
            return f"{key}[{position}]{problem}"
    return None


def descriptor_problem(item: object) -> str | None:
    """What is wrong with an OCI descriptor (" is not an object", ".size is ..."), or None."""
    if not isinstance(item, dict):
        return " is not an object"
    if not isinstance(item.get("mediaType"), str):
        return ".mediaType is not a string"
    digest = item.get("digest")
    if not isinstance(digest, str) or not valid_digest(digest):
        return f".digest {str(digest)[:80]!r} is not a sha256 digest"
    size = item.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return ".size is not a non-negative integer"
    platform = item.get("platform")
    if platform is not None:
        if not isinstance(platform, dict):
            return ".platform is not an object"
        for key in ("architecture", "os", "variant", "os.version"):
            if key in platform and not isinstance(platform[key], str):
                return f".platform.{key} is not a string"
        features = platform.get("os.features", [])
        if not isinstance(features, list) or not all(isinstance(feature, str) for feature in features):
            return ".platform.os.features is not a list of strings"
    annotations = item.get("annotations")
    if annotations is not None and not (isinstance(annotations, dict)
                                        and all(isinstance(value, str) for value in annotations.values())):
        return ".annotations is not an object of strings"
    urls = item.get("urls")
    if urls is not None and not (isinstance(urls, list) and all(isinstance(url, str) for url in urls)):
        return ".urls is not a list of strings"
    return None

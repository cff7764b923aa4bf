"""Images on disk behind one interface (LocalSource): OCI layouts, their tar archives, `docker save` archives.

Each transport has its own module under this one: singpy.oci.ocidir (`oci:`),
singpy.oci.ociarchive (the tar of `oci-archive:` and `docker-archive:`),
singpy.oci.dockerarchive (a `docker save` manifest.json), all read in place
through singpy.oci.localfiles; this module reads the OCI layout they hold.

A `LocalSource` answers what singpy.oci.pull asks a Registry (`manifest`,
`blob_bytes`) plus `open_blob`, a stream of one blob:

* `oci:DIR[:TAG]`: an OCI image layout (image-spec image-layout.md):
  `oci-layout`, `index.json`, `blobs/ALG/HEX`. TAG is an entry's
  `org.opencontainers.image.ref.name`; without one, the only entry, or
  index.json itself when it lists platforms and no names (a multi-platform
  layout written without tags); several names and none given is an error
  that lists them;
* `oci-archive:FILE[:TAG]`: a tar of such a layout, read where it lies: the
  members are located once (headers only) and each blob is read from its
  offset, so nothing is extracted and several blobs can be read at once;
  a compressed archive is refused (it could only be read by unpacking it);
* `docker-archive:FILE[:REPO:TAG|:@INDEX]`: `docker save` / `podman save`
  output. Docker 25 and later write an OCI layout into it, which is read as
  above (a REPO:TAG is then matched against `io.containerd.image.name`);
  otherwise `manifest.json` (`[{"Config", "RepoTags", "Layers"}]`) gives the
  files, from which an image manifest is made as a registry would serve it
  (Docker v2 media types, each blob's sha256 computed from its content), its
  digest the sha256 of its canonical JSON.

Everything in them is untrusted. A member or blob name never reaches a host
path: blobs are named by validated digests only, opened below the layout
directory one component at a time with O_NOFOLLOW (a symbolic link anywhere
in `blobs/ALG/HEX`, or a FIFO or device there, is refused), and an
archive's names only index its own members (its links resolve to members,
never to files). JSON files are read up to 4 MiB and type-checked, and
every manifest and small blob is verified against its digest (the lead
wraps `open_blob` in singpy.oci.streams.VerifyingReader for layers).
Every problem is one ImageError naming the image.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, BinaryIO

from singpy.errors import ImageError
from singpy.oci.dockerarchive import docker_manifest, image_name
from singpy.oci.localfiles import Files, read_json
from singpy.oci.manifest import (
    DOCKER_MANIFEST,
    INDEX_TYPES,
    MANIFEST_LIMIT,
    MANIFEST_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    SCHEMA1_TYPES,
    Manifest,
    manifest_problem,
)
from singpy.oci.ociarchive import Archive
from singpy.oci.ocidir import Directory
from singpy.oci.ref import valid_digest

if TYPE_CHECKING:
    from singpy.oci.ref import Reference

REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"  # what docker save writes beside ref.name: the full image name
_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}


def open_source(ref: Reference) -> LocalSource:
    """The image store `ref` names (oci:, oci-archive: or docker-archive:), opened to read."""
    where = f"{ref.transport}:{ref.path}"
    if ref.transport == "oci":
        files: Files = Directory(ref.path, where)
    elif ref.transport in ("oci-archive", "docker-archive"):
        files = Archive(ref.path, where)
    else:
        raise ImageError(f"{ref} is not a local image (oci:, oci-archive: or docker-archive:)")
    return LocalSource(files, where=where, tag=ref.tag, docker=ref.transport == "docker-archive")


class LocalSource:
    """An OCI layout (a directory or a tar of one) or a docker archive, with a Registry's duck type."""

    def __init__(self, files: Files, *, where: str, tag: str | None, docker: bool) -> None:
        self.files = files
        self.where = where  # "oci-archive:/abs/x.tar": named in every message
        self.tag = tag
        self.docker = docker
        self.layout = files.size("index.json") is not None
        if not self.layout and not (docker and files.size("manifest.json") is not None):
            what = "a docker archive (no manifest.json or index.json)" if docker else \
                "an OCI image layout (no index.json)"
            raise ImageError(f"{where} is not {what}")
        if self.layout:
            self._check_layout_file()
        self._made: dict[str, Manifest] = {}  # manifests made here (docker archives, tag groups), by digest
        self._members: dict[str, str] = {}  # digest -> member, for blobs of a docker archive's manifest.json

    # --- the Registry duck type ---------------------------------------------------------------------------------

    def manifest(self, reference: str | None = None) -> Manifest:
        """The index or manifest `reference` names: a digest, a tag, or (None) the tag of the reference opened."""
        reference = self.tag if reference is None else reference
        if reference is not None and ":" in reference and reference.partition(":")[0] in _HASHES:
            return self._by_digest(reference)
        if self.layout:
            return self._from_index(reference or None)
        return self._from_docker_manifest(reference or None)

    def blob_bytes(self, digest: str, limit: int = MANIFEST_LIMIT) -> bytes:
        """A small blob (an image config), verified, at most `limit` bytes."""
        data = self.files.read(self._blob_name(digest), limit, what=f"blob {digest}")
        if data is None:
            raise ImageError(f"blob {digest} is missing from {self.where}")
        self._verify(digest, data, f"blob {digest}")
        return data

    def open_blob(self, digest: str) -> BinaryIO:
        """A stream of blob `digest` (a layer), read in place; the caller verifies what it reads."""
        stream = self.files.open(self._blob_name(digest), what=f"blob {digest}")
        if stream is None:
            raise ImageError(f"blob {digest} is missing from {self.where}")
        return stream

    # --- OCI layouts ------------------------------------------------------------------------------------------

    def _check_layout_file(self) -> None:
        """`oci-layout`, when there, must say it is a layout (image-layout.md); docker archives have one too."""
        data = self.files.read("oci-layout", MANIFEST_LIMIT, what="oci-layout")
        if data is None:
            return
        document = read_json(data, f"{self.where}: oci-layout")
        if not isinstance(document, dict) or not isinstance(document.get("imageLayoutVersion"), str):
            raise ImageError(f"{self.where}: malformed oci-layout file (no imageLayoutVersion)")

    def _index(self) -> tuple[bytes, dict[str, Any]]:
        data = self.files.read("index.json", MANIFEST_LIMIT, what="index.json")
        if data is None:
            raise ImageError(f"{self.where} is not an OCI image layout (no index.json)")
        body = read_json(data, f"{self.where}: index.json")
        if not isinstance(body, dict):
            raise ImageError(f"{self.where}: malformed index.json (not a JSON object)")
        problem = manifest_problem(body, OCI_INDEX)
        if problem:
            raise ImageError(f"{self.where}: malformed index.json: {problem}")
        return data, body

    def _from_index(self, tag: str | None) -> Manifest:
        data, index = self._index()
        entries: list[dict[str, Any]] = index["manifests"]
        if not entries:
            raise ImageError(f"{self.where} holds no image (its index.json lists none)")
        if tag is not None:
            chosen = self._tagged(entries, tag)
            if not chosen:
                raise ImageError(f"no image {tag!r} in {self.where}: {self._listing(entries)}")
            if len(chosen) == 1:
                return self._load(chosen[0]["digest"], chosen[0]["mediaType"])
            return self._group(chosen)  # one name, several platforms: an index of them, to choose from
        if len(entries) == 1:
            return self._load(entries[0]["digest"], entries[0]["mediaType"])
        if not any(_names(entry) for entry in entries) and all("platform" in entry for entry in entries):
            return self._whole_index(data, index)
        raise ImageError(f"{self.where} holds {len(entries)} images: name one ({self._listing(entries)})",
                         hint=f"add its tag to the reference: {self.where}:TAG")

    def _tagged(self, entries: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
        if self.docker and tag.startswith("@") and tag[1:].isascii() and tag[1:].isdigit():
            position = int(tag[1:])
            return [entries[position]] if position < len(entries) else []
        wanted = image_name(tag) if self.docker else tag
        return [entry for entry in entries
                if tag in _names(entry) or (self.docker and wanted in map(image_name, _names(entry)))]

    def _listing(self, entries: list[dict[str, Any]]) -> str:
        names = list(dict.fromkeys(name for entry in entries for name in _names(entry)[:1]))
        untagged = sum(1 for entry in entries if not _names(entry))
        parts = [", ".join(names)] if names else []
        if untagged:
            parts.append(f"{untagged} without a name")
        return "it has " + "; ".join(parts)

    def _whole_index(self, data: bytes, index: dict[str, Any]) -> Manifest:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        return Manifest(media_type=OCI_INDEX, digest=digest, data=data, body=index)

    def _group(self, entries: list[dict[str, Any]]) -> Manifest:
        return self._remember({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, OCI_INDEX)

    def _by_digest(self, digest: str) -> Manifest:
        if not valid_digest(digest):
            raise ImageError(f"{digest[:80]!r} is not a valid digest (sha256: and 64 lowercase hex digits)")
        if digest in self._made:
            return self._made[digest]
        declared = None
        if self.layout:
            declared = next((entry["mediaType"] for entry in self._index()[1]["manifests"]
                             if entry["digest"] == digest), None)
        return self._load(digest, declared)

    def _load(self, digest: str, declared: str | None) -> Manifest:
        """The manifest or index stored as blob `digest`, verified and type-checked as a registry's."""
        data = self.files.read(self._blob_name(digest), MANIFEST_LIMIT, what=f"manifest {digest}")
        if data is None:
            raise ImageError(f"manifest {digest} is missing from {self.where}")
        self._verify(digest, data, f"manifest {digest}")
        body = read_json(data, f"{self.where}: manifest {digest}")
        if not isinstance(body, dict):
            raise ImageError(f"{self.where}: malformed manifest {digest} (not a JSON object)")
        media_type = _media_type(body, declared)
        if media_type in SCHEMA1_TYPES:
            raise ImageError(f"{self.where}: manifest {digest} is a Docker schema 1 manifest, which singpy does "
                             "not read")
        if media_type not in INDEX_TYPES + MANIFEST_TYPES:
            raise ImageError(f"{self.where}: {digest} is not an image manifest (type {media_type[:100]!r})")
        problem = manifest_problem(body, media_type)
        if problem:
            raise ImageError(f"{self.where}: malformed manifest {digest}: {problem}")
        return Manifest(media_type=media_type, digest=digest, data=data, body=body)

    # --- docker archives without a layout (singpy.oci.dockerarchive) -----------------------------------------

    def _from_docker_manifest(self, tag: str | None) -> Manifest:
        body, members = docker_manifest(self.files, self.where, tag)
        self._members.update(members)
        return self._remember(body, DOCKER_MANIFEST)

    def _remember(self, body: dict[str, Any], media_type: str) -> Manifest:
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        manifest = Manifest(media_type=media_type, digest=f"sha256:{hashlib.sha256(data).hexdigest()}", data=data,
                            body=body)
        self._made[manifest.digest] = manifest
        return manifest

    # --- blobs ------------------------------------------------------------------------------------------------

    def _blob_name(self, digest: str) -> str:
        """Where blob `digest` is: a docker archive's remembered member, else blobs/ALG/HEX (digest checked)."""
        if not isinstance(digest, str) or not valid_digest(digest):
            raise ImageError(f"{self.where}: {str(digest)[:80]!r} is not a valid digest")
        member = self._members.get(digest)
        if member is not None:
            return member
        algorithm, _, encoded = digest.partition(":")
        return f"blobs/{algorithm}/{encoded}"

    def _verify(self, digest: str, data: bytes, what: str) -> None:
        algorithm, _, expected = digest.partition(":")
        found = _HASHES[algorithm](data).hexdigest()
        if found != expected:
            raise ImageError(f"digest mismatch for {what} in {self.where}: it has {algorithm}:{found}")


def _media_type(body: dict[str, Any], declared: str | None) -> str:
    found = body.get("mediaType")
    if isinstance(found, str) and found:
        return found
    if declared:
        return declared
    if body.get("schemaVersion") == 1 or "fsLayers" in body:
        return SCHEMA1_TYPES[0]
    return OCI_INDEX if "manifests" in body else OCI_MANIFEST


def _names(entry: dict[str, Any]) -> list[str]:
    """The names an index.json entry goes by: its ref.name, then (docker save) its full image name."""
    annotations = entry.get("annotations") or {}
    return [name for key in (REF_NAME, IMAGE_NAME) if isinstance(name := annotations.get(key), str) and name]

"""Images on disk: OCI layouts, their tar archives and `docker save` archives, read in place.

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
wraps `open_blob` in singpy.oci.layers.VerifyingReader for layers).
Every problem is one ImageError naming the image.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import posixpath
import stat
import tarfile
from typing import TYPE_CHECKING, Any, BinaryIO

from singpy.errors import ImageError
from singpy.hostfiles import kind_name
from singpy.oci.ref import valid_digest
from singpy.oci.registry import (
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

if TYPE_CHECKING:
    from singpy.oci.ref import Reference

REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"  # what docker save writes beside ref.name: the full image name
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_TAR = "application/vnd.docker.image.rootfs.diff.tar"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MAX_MEMBERS = 1 << 16  # members of an archive: real ones hold a few per layer
CHUNK = 1 << 20
_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
_MAX_LINKS = 16  # links followed from one archive member to another
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


def open_source(ref: Reference) -> LocalSource:
    """The image store `ref` names (oci:, oci-archive: or docker-archive:), opened to read."""
    where = f"{ref.transport}:{ref.path}"
    if ref.transport == "oci":
        files: _Files = _Directory(ref.path, where)
    elif ref.transport in ("oci-archive", "docker-archive"):
        files = _Archive(ref.path, where)
    else:
        raise ImageError(f"{ref} is not a local image (oci:, oci-archive: or docker-archive:)")
    return LocalSource(files, where=where, tag=ref.tag, docker=ref.transport == "docker-archive")


class LocalSource:
    """An OCI layout (a directory or a tar of one) or a docker archive, with a Registry's duck type."""

    def __init__(self, files: _Files, *, where: str, tag: str | None, docker: bool) -> None:
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
        document = _json(data, f"{self.where}: oci-layout")
        if not isinstance(document, dict) or not isinstance(document.get("imageLayoutVersion"), str):
            raise ImageError(f"{self.where}: malformed oci-layout file (no imageLayoutVersion)")

    def _index(self) -> tuple[bytes, dict[str, Any]]:
        data = self.files.read("index.json", MANIFEST_LIMIT, what="index.json")
        if data is None:
            raise ImageError(f"{self.where} is not an OCI image layout (no index.json)")
        body = _json(data, f"{self.where}: index.json")
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
        if self.docker and tag.startswith("@") and tag[1:].isdigit():
            position = int(tag[1:])
            return [entries[position]] if position < len(entries) else []
        wanted = _image_name(tag) if self.docker else tag
        return [entry for entry in entries
                if tag in _names(entry) or (self.docker and wanted in map(_image_name, _names(entry)))]

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
        body = _json(data, f"{self.where}: manifest {digest}")
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

    # --- docker archives without a layout --------------------------------------------------------------------

    def _from_docker_manifest(self, tag: str | None) -> Manifest:
        images = self._docker_images()
        if tag is not None and tag.startswith("@") and tag[1:].isdigit():
            position = int(tag[1:])
            if position >= len(images):
                raise ImageError(f"no image {tag} in {self.where}: it holds {len(images)}")
            chosen = images[position]
        elif tag is not None:
            wanted = _image_name(tag)
            found = [image for image in images if wanted in map(_image_name, image["RepoTags"])]
            if not found:
                raise ImageError(f"no image {tag!r} in {self.where}: {_repo_tags(images)}")
            chosen = found[0]
        elif len(images) == 1:
            chosen = images[0]
        else:
            raise ImageError(f"{self.where} holds {len(images)} images: name one ({_repo_tags(images)})",
                             hint=f"add REPO:TAG or @INDEX to the reference: {self.where}:@0")
        return self._synthesize(chosen)

    def _docker_images(self) -> list[dict[str, Any]]:
        data = self.files.read("manifest.json", MANIFEST_LIMIT, what="manifest.json")
        if data is None:
            raise ImageError(f"{self.where} is not a docker archive (no manifest.json)")
        images = _json(data, f"{self.where}: manifest.json")
        if not isinstance(images, list) or not images:
            raise ImageError(f"{self.where}: malformed manifest.json (not a list of images)")
        for position, image in enumerate(images):
            problem = _docker_image_problem(image)
            if problem:
                raise ImageError(f"{self.where}: malformed manifest.json: image {position} {problem}")
            image["RepoTags"] = image.get("RepoTags") or []
        return images

    def _synthesize(self, image: dict[str, Any]) -> Manifest:
        """The image manifest a registry would serve for one manifest.json entry; its blobs are remembered."""
        config = self.files.read(image["Config"], MANIFEST_LIMIT, what=f"config {image['Config']}")
        if config is None:
            raise ImageError(f"{self.where}: the image config {image['Config']} is missing")
        config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
        self._members[config_digest] = image["Config"]
        layers = []
        for name in image["Layers"]:
            digest, size, media_type = self._describe_layer(name)
            self._members[digest] = name
            layers.append({"mediaType": media_type, "size": size, "digest": digest})
        body = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                "config": {"mediaType": DOCKER_CONFIG, "size": len(config), "digest": config_digest},
                "layers": layers}
        return self._remember(body, DOCKER_MANIFEST)

    def _describe_layer(self, name: str) -> tuple[str, int, str]:
        """(sha256 digest, size, media type by its magic bytes) of layer file `name`, read once."""
        stream = self.files.open(name, what=f"layer {name}")
        if stream is None:
            raise ImageError(f"{self.where}: the layer {name} is missing")
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


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ImageError(f"{what} is nested too deeply") from None
    except ValueError:
        raise ImageError(f"{what} is not valid JSON") from None


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


def _image_name(text: str) -> str:
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


# --- where the files are ----------------------------------------------------------------------------------------


class _Files:
    """Named regular files of a layout directory or an archive. Names are relative ("blobs/sha256/HEX")."""

    def __init__(self, where: str) -> None:
        self.where = where

    def size(self, name: str) -> int | None:
        """The size of regular file `name`, None when there is none (anything else there: ImageError)."""
        raise NotImplementedError

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        raise NotImplementedError

    def read(self, name: str, limit: int, *, what: str) -> bytes | None:
        """The whole of `name`, None when missing; ImageError when it holds more than `limit` bytes."""
        stream = self.open(name, what=what)
        if stream is None:
            return None
        with stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise ImageError(f"{self.where}: {what} is too large (over {limit} bytes)")
        return data


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _Directory(_Files):
    """An OCI layout directory. The directory itself is the user's choice; below it nothing is followed."""

    def __init__(self, path: str, where: str) -> None:
        super().__init__(where)
        self.path = path
        fd = self._open_root(first=True)
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        self.identity = (info.st_dev, info.st_ino)

    def _open_root(self, *, first: bool = False) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageError(f"{self.where}: no such directory") from None
        except NotADirectoryError:
            raise ImageError(f"{self.where} is not a directory (an archive is read with oci-archive:)") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        if not first:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != self.identity:
                os.close(fd)
                raise ImageError(f"{self.where} was replaced while singpy read it")
        return fd

    def _open(self, name: str, what: str) -> int | None:
        """A descriptor of regular file `name`, opened component by component without following links."""
        *parents, last = name.split("/")
        current = self._open_root()
        try:
            for part in parents:
                try:
                    below = os.open(part, _DIRECTORY, dir_fd=current)
                except FileNotFoundError:
                    return None
                except OSError as error:
                    raise self._refused(part, what, error) from None
                os.close(current)
                current = below
            try:
                info = os.stat(last, dir_fd=current, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError as error:
                raise ImageError(f"can't read {what} in {self.where}: {error.strerror}") from None
            if not stat.S_ISREG(info.st_mode):
                raise ImageError(f"{self.where}: {what} ({name}) is {kind_name(info.st_mode)}, not a regular file: "
                                 "refused")
            try:
                fd = os.open(last, _FILE, dir_fd=current)
            except OSError as error:
                raise ImageError(f"can't read {what} in {self.where}: {error.strerror}") from None
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or not stat.S_ISREG(opened.st_mode):
                os.close(fd)
                raise ImageError(f"{self.where}: {name} changed while singpy read it")
            os.set_blocking(fd, True)
            return fd
        finally:
            os.close(current)

    def _refused(self, part: str, what: str, error: OSError) -> ImageError:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link, or a file is in the way
            return ImageError(f"{self.where}: {part} on the way to {what} is a symbolic link or not a directory: "
                              "refused")
        return ImageError(f"can't read {what} in {self.where}: {error.strerror}")

    def size(self, name: str) -> int | None:
        fd = self._open(name, name)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        fd = self._open(name, what)
        return None if fd is None else os.fdopen(fd, "rb")


class _Archive(_Files):
    """An uncompressed tar: its members located once from their headers, each read in place with pread()."""

    def __init__(self, path: str, where: str) -> None:
        super().__init__(where)
        self.path = path
        self.members: dict[str, tuple[int, int]] = {}  # name -> (offset of the data, size)
        self.links: dict[str, tuple[bool, str]] = {}  # name -> (symbolic?, target as written)
        fd = self._open_file()
        try:
            info = os.fstat(fd)
            self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            self._check_uncompressed(fd)
            self._index(fd)
        finally:
            os.close(fd)

    def _open_file(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageError(f"{self.where}: no such file") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ImageError(f"{self.where} is {kind_name(mode)}, not a tar archive")
        os.set_blocking(fd, True)
        return fd

    def _check_uncompressed(self, fd: int) -> None:
        head = os.pread(fd, 8, 0)
        for magic, name in _COMPRESSED:
            if head.startswith(magic):
                raise ImageError(f"{self.where} is a {name}-compressed archive: singpy reads uncompressed tar "
                                 "archives in place", hint=f"decompress it first (e.g. with {name} -d)")

    def _index(self, fd: int) -> None:
        handle = os.fdopen(os.dup(fd), "rb")
        try:
            with tarfile.open(fileobj=handle, mode="r:") as archive:
                for count, member in enumerate(archive, 1):
                    if count > MAX_MEMBERS:
                        raise ImageError(f"{self.where} has over {MAX_MEMBERS} members: not an image archive")
                    self._add(member)
        except tarfile.TarError as error:
            raise ImageError(f"{self.where} is not a tar archive ({error})") from None
        except (EOFError, ValueError, UnicodeError):
            raise ImageError(f"{self.where} is not a tar archive (truncated or malformed)") from None
        except OSError as error:
            raise ImageError(f"can't read {self.where}: {error.strerror}") from None
        finally:
            handle.close()

    def _add(self, member: tarfile.TarInfo) -> None:
        name = _member_name(member.name)
        if name is None:
            return
        if member.isreg() and not member.issparse():
            self.members[name] = (member.offset_data, member.size)
            self.links.pop(name, None)
        elif member.issym() or member.islnk():
            self.links[name] = (member.issym(), member.linkname)
            self.members.pop(name, None)
        else:  # directories, devices...: nothing an image reads
            self.members.pop(name, None)
            self.links.pop(name, None)

    def _resolve(self, name: str) -> tuple[int, int] | None:
        """The data of member `name`, links followed to other members (docker save links duplicate layers)."""
        for _ in range(_MAX_LINKS):
            if name in self.members:
                return self.members[name]
            link = self.links.get(name)
            if link is None:
                return None
            symbolic, target = link
            joined = posixpath.join(posixpath.dirname(name), target) if symbolic and not target.startswith("/") \
                else target
            resolved = _member_name(joined)
            if resolved is None:
                return None
            name = resolved
        raise ImageError(f"{self.where}: too many links from member to member")

    def size(self, name: str) -> int | None:
        found = self._resolve(name)
        return None if found is None else found[1]

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        found = self._resolve(name)
        if found is None:
            return None
        fd = self._open_file()
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != self.identity:
            os.close(fd)
            raise ImageError(f"{self.where} changed while singpy read it")
        offset, size = found
        return io.BufferedReader(_Slice(fd, offset, size), CHUNK)


def _member_name(name: str) -> str | None:
    """An archive member's name in one spelling ("./blobs//x" -> "blobs/x", "../x" -> "x"), None for the top.

    Names only index the archive's own members: a `..` stops at its top, as it is never a host path."""
    normal = posixpath.normpath("/" + name).lstrip("/")
    if not normal or normal == ".":
        return None
    return normal


class _Slice(io.RawIOBase):
    """Bytes [offset, offset + size) of a file, read with pread(): streams of one archive do not share a position."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        super().__init__()
        self.fd, self.offset, self.size, self.position = fd, offset, size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        data = os.pread(self.fd, wanted, self.offset + self.position)
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


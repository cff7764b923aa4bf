"""OCI images for the tests, written byte for byte by us: layouts, archives, and the layers inside them.

Nothing here talks to a registry (tests/support/registry.py pushes what this writes). Everything is
deterministic: the same inputs give the same digests (fixed mtimes, gzip without a timestamp).

Layer entries (`Entry` records, like tar members) are made with the helpers::

    file("etc/motd", "hello\\n", mode=0o644, uid=0, gid=0)    directory("home/user", uid=1000, gid=1000)
    symlink("bin/sh", "busybox")                            hardlink("bin/ls2", "bin/ls")  (target = member name)
    whiteout("etc/motd")        -> "etc/.wh.motd"           opaque("opt")  -> "opt/.wh..wh..opq"
    char_device("dev/null", 1, 3)    block_device("dev/loop9", 7, 9)    fifo("run/fifo")
    file("usr/bin/su", b"...", mode=0o4755)                 (setuid/setgid/sticky bits kept as given)
    tree(path, exclude=(".singularity.d",))                 (a directory on disk, hard links detected)

Names are written exactly as given: "../../etc/x", "/etc/abs" or a symlink followed by a file under it make
the hostile layers a safe extractor must refuse or contain.

Images and indexes::

    layer = Layer([file("a", "1")], compression="gzip")     # "gzip" (default), "zstd" or "none"
    Layer.raw(data, media_type)                            # any other blob as a layer (an in-toto statement)
    image = Image([busybox_layer(), layer], architecture="amd64", variant="", os="linux",
                  env=["PATH=/bin", "A=1"],  # default [DEFAULT_PATH]; None: no Env at all
                  entrypoint=["/bin/sh", "-c"], cmd=["echo hi"], labels={"k": "v"}, working_dir="/tmp",
                  user="1000:1000",
                  docker=False,              # True: Docker v2 schema2 media types (manifest, config v1, tar.gzip)
                  media_type_field=True,     # False: an OCI manifest without its "mediaType" field
                  config_extra={...},        # merged into the config JSON last (override anything)
                  annotations={...}, descriptor_annotations={...}, platform={...})  # manifest / index entry
    index = Index([image_amd64, image_arm64, attestation(image_amd64)], docker=False)   # True: manifest list
    attestation(image)                       # buildkit's attestation manifest for it (platform unknown/unknown,
                                             # vnd.docker.reference.type=attestation-manifest, in-toto layer)
    busybox_layer(compression="gzip")        # busybox-static (tests.support.images), root-owned, no
                                             # /.singularity.d; built once per process
    busybox_image(extra=[file("etc/x", "y")], layers=[...], compression="gzip", **Image options)
                                             # busybox layer + a layer of `extra` (if any) + `layers`
    multiarch_index(docker=False, attestations=True)   # amd64 + arm64/v8, each with /etc/platform-marker
                                                       # (platform_marker("arm64", "v8") == "linux/arm64/v8\n");
                                                       # both hold the host's busybox, so either one runs here

Layer: .entries, .tar (uncompressed), .diff_id, .data (the blob), .digest, .size, .media_type(docker=False).
Image: .layers, .config (dict), .config_data, .config_digest, .manifest (dict), .data, .digest, .size,
.media_type, .platform, .descriptor() (its entry in an index), .blobs(). Index: .manifests, .manifest, .data,
.digest, .size, .media_type, .descriptor(), .blobs().

Writers (each returns the path it wrote)::

    write_layout(dir, {"latest": image, "multi": index})   # OCI image layout; adds to an existing one;
                                                           # tags go in index.json's ref.name annotations
    write_oci_archive(file.tar, {"latest": image})         # a tar of such a layout
    write_docker_archive(file.tar, image, repo_tags=["test/busybox:latest"], layout_inside=False)
        # `docker save` format: manifest.json, <config hex>.json, <id>/layer.tar (uncompressed), repositories;
        # layout_inside=True: Docker 25's, with oci-layout + index.json + blobs/sha256 (layers uncompressed)

skopeo reads what these write (oci:, oci-archive:, docker-archive:), except Docker media types inside an OCI
layout (c/image accepts only OCI media types in index.json); umoci 0.4.7 unpacks layouts without zstd layers.
Files are written with the process umask; pytest's tmp_path is private (0700): put images the unprivileged
profile must read under conftest's `workdir`.

Digests are "sha256:<hex>" strings.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import zstandard

from singpy.record import Record
from tests.support.images import build_busybox_rootfs

MTIME = 1_700_000_000  # every entry's default modification time: digests do not depend on the clock
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
REF_NAME = "org.opencontainers.image.ref.name"
COMPRESSIONS = ("gzip", "zstd", "none")


# --- entries -------------------------------------------------------------------------------------------------------


class Entry(Record):
    """One tar member. kind: file, dir, symlink, hardlink, char, block, fifo. `link`: symlink target or the
    member name a hard link points to. `pax`: extra PAX header records (e.g. SCHILY.xattr.*)."""

    name: str
    kind: str = "file"
    content: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    link: str = ""
    major: int = 0
    minor: int = 0
    mtime: int = MTIME
    pax: tuple[tuple[str, str], ...] = ()


def file(name: str, content: bytes | str = b"", *, mode: int = 0o644, uid: int = 0, gid: int = 0,
         mtime: int = MTIME) -> Entry:
    data = content.encode() if isinstance(content, str) else content
    return Entry(name=name, kind="file", content=data, mode=mode, uid=uid, gid=gid, mtime=mtime)


def directory(name: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0, mtime: int = MTIME) -> Entry:
    return Entry(name=name, kind="dir", mode=mode, uid=uid, gid=gid, mtime=mtime)


def symlink(name: str, target: str, *, uid: int = 0, gid: int = 0, mtime: int = MTIME) -> Entry:
    return Entry(name=name, kind="symlink", link=target, mode=0o777, uid=uid, gid=gid, mtime=mtime)


def hardlink(name: str, target: str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    """A hard link to the earlier member `target` (a member name, as tar stores it)."""
    return Entry(name=name, kind="hardlink", link=target, mode=mode, uid=uid, gid=gid)


def whiteout(path: str) -> Entry:
    """Deletes `path` of the layers below: an empty file `.wh.NAME` next to it."""
    parent, _, base = path.rstrip("/").rpartition("/")
    return file(f"{parent}/.wh.{base}" if parent else f".wh.{base}")


def opaque(path: str) -> Entry:
    """Hides everything the layers below put in directory `path`."""
    return file(f"{path.rstrip('/')}/.wh..wh..opq")


def char_device(name: str, major: int, minor: int, *, mode: int = 0o666, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="char", major=major, minor=minor, mode=mode, uid=uid, gid=gid)


def block_device(name: str, major: int, minor: int, *, mode: int = 0o660, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="block", major=major, minor=minor, mode=mode, uid=uid, gid=gid)


def fifo(name: str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Entry:
    return Entry(name=name, kind="fifo", mode=mode, uid=uid, gid=gid)


def tree(root: Path, *, exclude: Iterable[str] = (), owner: tuple[int, int] | None = (0, 0),
         mtime: int | None = MTIME, prefix: str = "") -> list[Entry]:
    """The entries of a directory on disk, parents first, sorted; hard links become `hardlink` entries.

    `exclude`: top-level names left out. `owner`: (uid, gid) written for every entry, `mtime` likewise (None:
    as on disk). Modes, link targets and device numbers as on disk. Content is read now.
    """
    skipped = set(exclude)
    entries: list[Entry] = []
    seen: dict[tuple[int, int], str] = {}
    for current, dirs, files in os.walk(root):
        relative = os.path.relpath(current, root)
        if relative == ".":
            dirs[:] = [name for name in dirs if name not in skipped]
            files = [name for name in files if name not in skipped]
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(current, name)
            member = prefix + os.path.normpath(os.path.join(relative, name))
            entries.append(_from_disk(path, member, owner, mtime, seen))
    return entries


def _from_disk(path: str, member: str, owner: tuple[int, int] | None, mtime: int | None,
               seen: dict[tuple[int, int], str]) -> Entry:
    info = os.lstat(path)
    uid, gid = owner if owner is not None else (info.st_uid, info.st_gid)
    base = Entry(name=member, mode=stat.S_IMODE(info.st_mode), uid=uid, gid=gid,
                 mtime=int(info.st_mtime) if mtime is None else mtime)
    if stat.S_ISLNK(info.st_mode):
        return base.replace(kind="symlink", link=os.readlink(path), mode=0o777)
    if stat.S_ISDIR(info.st_mode):
        return base.replace(kind="dir")
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in seen:
        return base.replace(kind="hardlink", link=seen[key])
    seen[key] = member
    if stat.S_ISREG(info.st_mode):
        with open(path, "rb") as handle:
            return base.replace(kind="file", content=handle.read())
    if stat.S_ISFIFO(info.st_mode):
        return base.replace(kind="fifo")
    kind = "char" if stat.S_ISCHR(info.st_mode) else "block"
    return base.replace(kind=kind, major=os.major(info.st_rdev), minor=os.minor(info.st_rdev))


_TAR_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
              "hardlink": tarfile.LNKTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE,
              "fifo": tarfile.FIFOTYPE}


def tar_bytes(entries: Iterable[Entry]) -> bytes:
    """An uncompressed PAX tar of `entries`, in the order given, names as given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = _TAR_TYPES[entry.kind]
            info.mode = entry.mode
            info.uid, info.gid = entry.uid, entry.gid
            info.uname = info.gname = ""
            info.mtime = entry.mtime
            info.linkname = entry.link
            info.devmajor, info.devminor = entry.major, entry.minor
            info.pax_headers = dict(entry.pax)
            if entry.kind == "file":
                info.size = len(entry.content)
                archive.addfile(info, io.BytesIO(entry.content))
            else:
                archive.addfile(info)
    return buffer.getvalue()


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


# --- writers -------------------------------------------------------------------------------------------------------


def write_layout(path: Path, tags: Mapping[str, Image | Index] | None = None, *,
                 untagged: Sequence[Image | Index] = ()) -> Path:
    """An OCI image layout at `path` holding `tags` (name -> image or index); adds to an existing layout
    (a tag given again is replaced)."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    index_file = path / "index.json"
    index: dict[str, Any] = (json.loads(index_file.read_text()) if index_file.exists()
                             else {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    wanted = list((tags or {}).items())
    for item in [item for _, item in wanted] + list(untagged):
        for digest, data in item.blobs():
            target = blobs / digest.removeprefix("sha256:")
            if not target.exists():
                target.write_bytes(data)
    names = {name for name, _ in wanted}
    index["manifests"] = [entry for entry in index["manifests"]
                          if entry.get("annotations", {}).get(REF_NAME) not in names]
    for name, item in wanted:
        entry = item.descriptor()
        entry["annotations"] = {**entry.get("annotations", {}), REF_NAME: name}
        index["manifests"].append(entry)
    index["manifests"].extend(item.descriptor() for item in untagged)
    index_file.write_text(json.dumps(index, indent=2))
    return path


def write_oci_archive(path: Path, tags: Mapping[str, Image | Index]) -> Path:
    """`oci-archive:` format: a tar whose members are an OCI image layout (oci-layout, index.json, blobs/)."""
    with tempfile.TemporaryDirectory(prefix="singpy-tests-oci-", dir=path.parent) as scratch:
        layout = write_layout(Path(scratch) / "layout", tags)
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
            for name in ("oci-layout", "index.json", "blobs"):
                archive.add(layout / name, arcname=name)
    return path


def write_docker_archive(path: Path, image: Image, *, repo_tags: Sequence[str] = ("test/busybox:latest",),
                         layout_inside: bool = False) -> Path:
    """`docker save` output for `image`: uncompressed layer tars, as docker writes them."""
    members: list[tuple[str, bytes]] = []
    layer_paths: list[str] = []
    parent = ""
    for layer in image.layers:
        layer_id = hashlib.sha256(f"{parent}\n{layer.diff_id}".encode()).hexdigest()
        if layout_inside:
            layer_paths.append(f"blobs/sha256/{layer.diff_id.removeprefix('sha256:')}")
        else:
            layer_paths.append(f"{layer_id}/layer.tar")
            legacy = {"id": layer_id, **({"parent": parent} if parent else {}), "created": "2023-11-14T22:13:20Z"}
            members += [(f"{layer_id}/VERSION", b"1.0"), (f"{layer_id}/json", canonical_json(legacy)),
                        (f"{layer_id}/layer.tar", layer.tar)]
        parent = layer_id
    config_hex = image.config_digest.removeprefix("sha256:")
    config_name = f"blobs/sha256/{config_hex}" if layout_inside else f"{config_hex}.json"
    members.append((config_name, image.config_data))
    members.append(("manifest.json", json.dumps([{"Config": config_name, "RepoTags": list(repo_tags),
                                                  "Layers": layer_paths}]).encode()))
    repositories: dict[str, dict[str, str]] = {}
    for repo_tag in repo_tags:
        repository, _, tag = repo_tag.rpartition(":")
        repositories.setdefault(repository, {})[tag] = parent
    members.append(("repositories", json.dumps(repositories).encode()))
    if layout_inside:
        members += _docker_layout_members(image, repo_tags)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), MTIME, 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


def _docker_layout_members(image: Image, repo_tags: Sequence[str]) -> list[tuple[str, bytes]]:
    """Docker 25's `docker save`: an OCI layout next to manifest.json, layers stored uncompressed."""
    layers = [{"mediaType": OCI_LAYER["none"], "digest": layer.diff_id, "size": len(layer.tar)}
              for layer in image.layers]
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": image.config_digest, "size": len(image.config_data)},
                "layers": layers}
    data = json.dumps(manifest).encode()
    digest = sha256(data)
    members = [(f"blobs/sha256/{layer.diff_id.removeprefix('sha256:')}", layer.tar) for layer in image.layers]
    members.append((f"blobs/sha256/{digest.removeprefix('sha256:')}", data))
    entries = [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(data),
                "annotations": {"io.containerd.image.name": repo_tag, REF_NAME: repo_tag.rpartition(":")[2]}}
               for repo_tag in repo_tags]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
    return [*members, ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", json.dumps(index).encode())]

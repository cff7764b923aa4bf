"""The test images on disk: OCI image layouts, oci-archive tars and `docker save` archives, written byte for byte.

Each writer returns the path it wrote; tests.support.oci re-exports them and documents what they write.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.oci_entries import MTIME
from tests.support.oci_images import (
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER,
    OCI_MANIFEST,
    Image,
    Index,
    canonical_json,
    sha256,
)

REF_NAME = "org.opencontainers.image.ref.name"


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


def readable_layout(path: Path, tags: Mapping[str, Image | Index]) -> Path:
    """`write_layout`, readable by every profile's user (directories 0755, files 0644)."""
    write_layout(path, tags)
    for where, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chmod(os.path.join(where, name), 0o755 if name in dirs else 0o644)
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

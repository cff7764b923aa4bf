"""The data of the test library (tests.support.library_server): entities, collections, containers, images
and tags in memory, the image files on disk, as the Sylabs library models them.

Written from the client's source (github.com/apptainer/container-library-client, client/models.go and
client/response.go): the JSON fields are the ones that client reads. An image is a SIF file named by the
sha256 of its bytes (`sha256.HEX`), stored at `ROOT/objects/HEX`; its architecture is the one the SIF header
says (bytes 45-47, Go's arch code), unless a test seeds a lying library on purpose (`add(..., arch=)`).
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import threading
from pathlib import Path
from typing import Any

ARCHES = ("unknown", "386", "amd64", "arm", "arm64", "ppc64", "ppc64le", "mips", "mipsle", "mips64", "mips64le",
          "s390x", "riscv64", "loong64")


def sif_arch(path: Path) -> str:
    """The architecture a SIF's header names (what the real service reads), "unknown" for anything else."""
    with open(path, "rb") as handle:
        head = handle.read(48)
    code = head[45:48]
    if head[32:42].rstrip(b"\0") != b"SIF_MAGIC" or len(code) != 3 or not code[:2].isdigit():
        return "unknown"
    number = int(code[:2])
    return ARCHES[number] if number < len(ARCHES) else "unknown"


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class LibraryStore:
    """Everything the library knows; every method holds the lock (the server is threaded)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "objects").mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.entities: dict[str, dict[str, Any]] = {}  # by name
        self.collections: dict[str, dict[str, Any]] = {}  # by entity/collection
        self.containers: dict[str, dict[str, Any]] = {}  # by entity/collection/container
        self.images: dict[str, dict[str, Any]] = {}  # by id
        self._ids = itertools.count(1)

    def new_id(self, kind: str) -> str:
        return f"{kind}{next(self._ids):08x}"

    def object_path(self, hex_digest: str) -> Path:
        return self.root / "objects" / hex_digest

    # the models ---------------------------------------------------------------------------------------------

    def make_entity(self, name: str, owner: str) -> dict[str, Any]:
        entity = {"id": self.new_id("ent"), "name": name, "description": "No description", "collections": [],
                  "owner": owner, "size": 0, "quota": 0, "defaultPrivate": False, "customData": ""}
        self.entities[name] = entity
        return entity

    def make_collection(self, entity: dict[str, Any], name: str) -> dict[str, Any]:
        collection = {"id": self.new_id("col"), "name": name, "description": "No description",
                      "entity": entity["id"], "entityName": entity["name"], "containers": [], "private": False,
                      "size": 0, "customData": ""}
        self.collections[f"{entity['name']}/{name}"] = collection
        entity["collections"].append(collection["id"])
        return collection

    def make_container(self, collection: dict[str, Any], name: str) -> dict[str, Any]:
        container = {"id": self.new_id("con"), "name": name, "description": "No description",
                     "collection": collection["id"], "collectionName": collection["name"],
                     "entityName": collection["entityName"], "images": [], "imageTags": {}, "archTags": {},
                     "private": False, "readOnly": False, "size": 0, "downloadCount": 0, "stars": 0,
                     "fullDescription": "", "customData": ""}
        self.containers[f"{collection['entityName']}/{collection['name']}/{name}"] = container
        collection["containers"].append(container["id"])
        return container

    def make_image(self, container: dict[str, Any], hash_tag: str, description: str) -> dict[str, Any]:
        image = {"id": self.new_id("img"), "hash": hash_tag, "description": description,
                 "container": container["id"], "containerName": container["name"],
                 "collectionName": container["collectionName"], "entityName": container["entityName"],
                 "size": 0, "uploaded": False, "signed": False, "arch": "", "fingerprints": [], "customData": ""}
        self.images[image["id"]] = image
        container["images"].append(image["id"])
        return image

    def container_by_id(self, identifier: str) -> dict[str, Any] | None:
        return next((one for one in self.containers.values() if one["id"] == identifier), None)

    def owner_of(self, container: dict[str, Any]) -> str:
        return str(self.entities[container["entityName"]]["owner"])

    # what a pull asks ---------------------------------------------------------------------------------------

    def resolve(self, path: str, tag: str, arch: str) -> dict[str, Any] | None:
        """The uploaded image `path:tag` for `arch` (a tag is per architecture; a hash names one file)."""
        container = self.containers.get(path)
        if container is None:
            return None
        if tag.startswith("sha256."):
            found = next((self.images[one] for one in container["images"] if self.images[one]["hash"] == tag), None)
            return found if found is not None and (not arch or found["arch"] == arch) else None
        identifier = container["archTags"].get(arch or "amd64", {}).get(tag)
        image = self.images.get(identifier) if identifier else None
        return image if image is not None and image["uploaded"] else None

    def tags_of(self, image: dict[str, Any]) -> list[str]:
        container = self.container_by_id(image["container"])
        tags = container["archTags"].get(image["arch"], {}) if container else {}
        return sorted(tag for tag, identifier in tags.items() if identifier == image["id"])

    # seeding, for the tests ---------------------------------------------------------------------------------

    def add(self, sif: Path, path: str, tags: tuple[str, ...] = ("latest",), *, arch: str = "",
            owner: str = "") -> dict[str, Any]:
        """Put the file `sif` in the library as `path` (entity/collection/container) with `tags`. `arch`:
        what the library claims it is (default: what its header says)."""
        entity_name, collection_name, container_name = path.split("/")
        hex_digest = file_hash(sif)
        shutil.copyfile(sif, self.object_path(hex_digest))
        with self.lock:
            entity = self.entities.get(entity_name) or self.make_entity(entity_name, owner or entity_name)
            collection = self.collections.get(f"{entity_name}/{collection_name}") or \
                self.make_collection(entity, collection_name)
            container = self.containers.get(path) or self.make_container(collection, container_name)
            image = self.make_image(container, f"sha256.{hex_digest}", "No description")
            image.update(uploaded=True, size=sif.stat().st_size, arch=arch or sif_arch(sif))
            for tag in tags:
                container["archTags"].setdefault(image["arch"], {})[tag] = image["id"]
                container["imageTags"][tag] = image["id"]
            return image

"""What `singpy inspect` shows: labels, definition file, scripts, environment.

Apptainer keeps this metadata twice: as files under /.singularity.d in the
root filesystem, and, in SIFs it builds, as objects beside the partition
(a GenericJSON `inspect-metadata.json` holding
`{"data": {"attributes": {...}}, "type": "container"}`, a Deffile object,
and in Singularity 3.4-3.5 images a Labels object). The objects are read
without touching the partition; only what they lack is read from the root
filesystem, by unpacking /.singularity.d alone into a temporary directory
(no mount, so this works unprivileged and for any architecture).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from singpy.errors import ImageError
from singpy.plan import ImageSpec

FIELDS = ("labels", "deffile", "runscript", "startscript", "test", "helpfile", "environment")
_FILES = {"deffile": "Singularity", "runscript": "runscript", "startscript": "startscript", "test": "test",
          "helpfile": "runscript.help"}
_MAX_OBJECT = 16 << 20  # metadata objects are small; refuse to load a huge one into memory


def read_metadata(image: ImageSpec, env: Mapping[str, str]) -> dict[str, Any]:
    """The attributes of Apptainer's `inspect --json`, for a sandbox, SIF or squashfs image."""
    if image.kind == "sandbox":
        return read_tree(f"{image.path}/.singularity.d")
    attributes: dict[str, Any] = {}
    if image.kind == "sif":
        attributes, complete = _from_sif_objects(image.path)
        if complete:  # as Apptainer: what the build recorded is the image's metadata
            return attributes
    return {**_from_partition(image, env), **attributes}


def _from_sif_objects(path: str) -> tuple[dict[str, Any], bool]:
    """Attributes from the SIF's objects, and whether an inspect-metadata.json was among them."""
    from singpy.image import sif

    image = sif.read_sif(path)
    attributes: dict[str, Any] = {}
    recorded = image.find(sif.DATA_GENERIC_JSON, "inspect-metadata.json")
    for desc in recorded:
        document = _json(image.read_object(desc, max_size=_MAX_OBJECT), path)
        found = document.get("data", {}).get("attributes", {}) if isinstance(document, dict) else {}
        attributes.update({key: value for key, value in found.items() if key in FIELDS and value})
    for desc in image.find(sif.DATA_LABELS):
        labels = _json(image.read_object(desc, max_size=_MAX_OBJECT), path)
        if isinstance(labels, dict):
            attributes["labels"] = {**labels, **attributes.get("labels", {})}
    for desc in image.find(sif.DATA_DEFFILE)[:1]:
        attributes.setdefault("deffile", image.read_object(desc, max_size=_MAX_OBJECT).decode(errors="replace"))
    return attributes, bool(recorded)


def _json(data: bytes, path: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise ImageError(f"{path}: a metadata object is not valid JSON") from None


def read_tree(directory: str) -> dict[str, Any]:
    """Metadata from a root filesystem's /.singularity.d (missing files are left out)."""
    attributes: dict[str, Any] = {}
    try:
        with open(f"{directory}/labels.json") as handle:
            attributes["labels"] = json.load(handle)
    except (OSError, ValueError):
        pass
    for field, name in _FILES.items():
        try:
            with open(f"{directory}/{name}", errors="replace") as handle:
                attributes[field] = handle.read()
        except OSError:
            continue
    environment = {}
    try:
        names = sorted(name for name in os.listdir(f"{directory}/env") if name.endswith(".sh"))
    except OSError:
        names = []
    for name in names:
        try:
            with open(f"{directory}/env/{name}", errors="replace") as handle:
                environment[f"/.singularity.d/env/{name}"] = handle.read()
        except OSError:
            continue
    if environment:
        attributes["environment"] = environment
    return attributes


def _from_partition(image: ImageSpec, env: Mapping[str, str]) -> dict[str, Any]:
    import tempfile

    from singpy.image import cache, tools
    from singpy.image.detect import sif_partition

    part = sif_partition(image.path, check_arch=False) if image.kind == "sif" else image
    unsquashfs = tools.require_tool("unsquashfs", env, "read the metadata of a squashfs image")
    scratch = tempfile.mkdtemp(prefix="singpy-inspect-")
    try:
        tree = f"{scratch}/root"
        # Like the cache's extraction, minus /dev: only /.singularity.d is wanted here.
        options = ["-o", str(part.offset), "-d", tree, "-no-xattrs", "-q"]
        tools.run_tool([unsquashfs, *options, part.path, ".singularity.d"], label="Reading metadata",
                       failure=f"can't read the metadata of {image.path}")
        return read_tree(f"{tree}/.singularity.d")
    finally:
        cache.remove_tree(scratch)

"""What `singpy inspect` shows: labels, definition file, scripts, environment.

Apptainer keeps this metadata twice: as files under /.singularity.d in the
root filesystem, and, in SIFs it builds, as objects beside the partition
(a GenericJSON `inspect-metadata.json` holding
`{"data": {"attributes": {...}}, "type": "container"}`, a Deffile object,
and in Singularity 3.4-3.5 images a Labels object). The objects are read
without touching the partition; only what they lack is read from the root
filesystem, by unpacking the files of /.singularity.d that are read, and
nothing else, into a temporary directory (no mount, so this works
unprivileged and for any architecture; singpy.image.squashpick lists the
image first: a huge file or a link to a directory is never unpacked).

The image is untrusted input: its files are read through the one door
(singpy.mounts.rootpath), so a link is resolved inside the image and a
`runscript -> /etc/shadow` shows the image's /etc/shadow or nothing, never the
host's. A link that leads to nothing in the image, or to something that is
not a regular file (a FIFO, /dev/zero), is reported in a warning and left
out. The JSON objects are checked against the shape Apptainer writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from singpy import console
from singpy.constants import ENV_DIR, SINGULARITY_D
from singpy.errors import ImageError, PathError
from singpy.mounts.rootpath import Tree
from singpy.plan import ImageSpec

FIELDS = ("labels", "deffile", "runscript", "startscript", "test", "helpfile", "environment")
_FILES = {"deffile": "Singularity", "runscript": "runscript", "startscript": "startscript", "test": "test",
          "helpfile": "runscript.help"}
_MAX_OBJECT = 16 << 20  # metadata objects are small; refuse to load a huge one into memory
_LINK_ROUNDS = 4  # unsquashfs rounds to fetch what /.singularity.d links to (links to links included)


def read_metadata(image: ImageSpec, env: Mapping[str, str]) -> dict[str, Any]:
    """The attributes of Apptainer's `inspect --json`, for a sandbox, SIF or squashfs image."""
    if image.kind == "sandbox":
        return read_tree(image.path)
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
        document = _json(image.read_object(desc, max_size=_MAX_OBJECT), path, "inspect-metadata.json")
        attributes.update(_attributes(document, path))
    for desc in image.find(sif.DATA_LABELS):
        labels = _labels(_json(image.read_object(desc, max_size=_MAX_OBJECT), path, "labels object"),
                         f"{path}: the labels object")
        attributes["labels"] = {**labels, **attributes.get("labels", {})}
    for desc in image.find(sif.DATA_DEFFILE)[:1]:
        attributes.setdefault("deffile", image.read_object(desc, max_size=_MAX_OBJECT).decode(errors="replace"))
    return attributes, bool(recorded)


def sif_definition(path: str) -> str | None:
    """The definition file SIF `path` records as a data object (its first), None when it records none."""
    from singpy.image import sif

    image = sif.read_sif(path)
    for desc in image.find(sif.DATA_DEFFILE)[:1]:
        return image.read_object(desc, max_size=_MAX_OBJECT).decode(errors="replace")
    return None


def _json(data: bytes, path: str, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ImageError(f"{path}: the {what} is nested too deeply to be metadata") from None
    except ValueError:
        raise ImageError(f"{path}: the {what} is not valid JSON") from None


def _attributes(document: Any, path: str) -> dict[str, Any]:
    """data.attributes of an inspect-metadata.json, each field of the type Apptainer writes."""
    where = f"{path}: inspect-metadata.json"
    data = document.get("data", {}) if isinstance(document, dict) else None
    found = data.get("attributes", {}) if isinstance(data, dict) else None
    if not isinstance(found, dict):
        raise ImageError(f"{where} is malformed: data.attributes must be an object")
    attributes: dict[str, Any] = {}
    for key, value in found.items():
        if key not in FIELDS or not value:
            continue
        if key == "labels":
            attributes[key] = _labels(value, f"{where}: data.attributes.labels")
        elif key == "environment":
            attributes[key] = _environment(value, where)
        elif isinstance(value, str):
            attributes[key] = value
        else:
            raise ImageError(f"{where} is malformed: data.attributes.{key} must be a string")
    return attributes


def _labels(value: Any, where: str) -> dict[str, str]:
    """A JSON object of labels; numbers and booleans are shown as text, anything nested is refused."""
    if not isinstance(value, dict):
        raise ImageError(f"{where} must be an object of labels")
    labels = {}
    for key, text in value.items():
        if isinstance(text, (dict, list)):
            raise ImageError(f"{where}: label {key!r} must be a string")
        labels[str(key)] = text if isinstance(text, str) else json.dumps(text)
    return labels


def _environment(value: Any, where: str) -> dict[str, str]:
    """An object of env script path -> its text (Apptainer's pkg/inspect `Environment map[string]string`)."""
    if isinstance(value, dict) and all(isinstance(text, str) for text in value.values()):
        return {str(name): text for name, text in value.items()}
    raise ImageError(f"{where} is malformed: data.attributes.environment must be an object of strings")


META, _ENV = SINGULARITY_D, ENV_DIR


def read_tree(root: str, left_out: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Metadata from the /.singularity.d of image root `root` (missing files are left out; `left_out`: why
    the files of a partial copy were not unpacked, guest path -> reason, as singpy.image.squashpick notes)."""
    notes = left_out or {}
    with Tree(root) as image:
        attributes: dict[str, Any] = {}
        labels = _read(image, f"{META}/labels.json", notes)
        if labels is not None:
            try:
                attributes["labels"] = _labels(json.loads(labels), f"the image's {META}/labels.json")
            except (ValueError, RecursionError):
                console.warning(f"the image's {META}/labels.json is not valid JSON: labels left out")
            except ImageError as error:
                console.warning(f"{error.message}: labels left out")
        for field, name in _FILES.items():
            text = _read(image, f"{META}/{name}", notes)
            if text is not None:
                attributes[field] = text.decode(errors="replace")
        environment = {}
        for guest in _env_scripts(image, notes):
            text = _read(image, guest, notes)
            if text is not None:
                environment[guest] = text.decode(errors="replace")
        if environment:
            attributes["environment"] = environment
        return attributes


def _wanted(image: Tree) -> list[str]:
    """Every file of /.singularity.d that metadata is read from."""
    return [f"{META}/labels.json", *(f"{META}/{name}" for name in _FILES.values()), *_env_scripts(image, {})]


def _is_read(path: str) -> bool:
    """Whether inspect reads guest `path` of /.singularity.d (or needs it to reach those it reads)."""
    directory, name = path.rsplit("/", 1)
    if path in (META, _ENV) or directory == _ENV and name.endswith(".sh"):
        return True
    return directory == META and (name == "labels.json" or name in _FILES.values())


def _env_scripts(image: Tree, notes: Mapping[str, str]) -> list[str]:
    try:
        names = {*image.listdir(_ENV), *_noted_names(notes, _ENV)}  # those left out too, to say so
    except PathError as error:
        console.warning(f"can't read the image's {_ENV}: {error.message}")
        return []
    return [f"{_ENV}/{name}" for name in sorted(names) if name.endswith(".sh")]


def _noted_names(notes: Mapping[str, str], directory: str) -> list[str]:
    if not notes:  # a tree that is the image itself (a sandbox, a build's): nothing was left out
        return []
    from singpy.image.squashpick import noted_names

    return noted_names(notes, directory)


def _read(image: Tree, guest: str, notes: Mapping[str, str]) -> bytes | None:
    """A metadata file of the image, or None (with a warning when a link or a special file is in the way, or
    `notes` say why it was not unpacked)."""
    try:
        data = image.read(guest, limit=_MAX_OBJECT)
    except PathError as error:
        console.warning(f"left out the image's {guest}: {error.message}")
        return None
    if data is not None:
        return data
    if notes:
        from singpy.image.squashpick import left_out

        if (why := left_out(image, guest, notes)) is not None:
            console.warning(f"left out the image's {guest}: {why}")
            return None
    if (target := _dangling(image, guest)) is not None:
        console.warning(f"left out the image's {guest}: it is a link to {target}, which is not in the image")
    return None


def _dangling(image: Tree, guest: str) -> str | None:
    """Where `guest` leads when it is a link to nothing in the image (None otherwise, or when it leads nowhere)."""
    try:
        return image.dangling(guest)
    except PathError:
        return None


def _from_partition(image: ImageSpec, env: Mapping[str, str]) -> dict[str, Any]:
    """Metadata read from the squashfs: the files of /.singularity.d that are read, then what their links lead to."""
    import tempfile

    from singpy.image import cache, tools
    from singpy.image.detect import sif_partition
    from singpy.image.squashpick import Picker

    part = sif_partition(image.path, check_arch=False) if image.kind == "sif" else image
    unsquashfs = tools.require_tool("unsquashfs", env, "read the metadata of a squashfs image")
    scratch = tempfile.mkdtemp(prefix="singpy-inspect-")
    try:
        picker = Picker(unsquashfs, part, f"{scratch}/root", limit=_MAX_OBJECT, label="Reading metadata",
                        failure=f"can't read the metadata of {image.path}")
        picker.fetch(picker.survey(META, _is_read))
        tried: set[str] = set()
        for _ in range(_LINK_ROUNDS):  # a link to a link: one more file each round
            with Tree(picker.tree) as unpacked:
                targets = {target for guest in _wanted(unpacked) if (target := _dangling(unpacked, guest))}
            if not targets - tried:
                break
            # Each listed alone first: a target that is a directory (`runscript -> /usr`) is never unpacked.
            picker.fetch(picker.find(sorted(targets - tried)))
            tried |= targets
        return read_tree(picker.tree, picker.notes)
    finally:
        cache.remove_tree(scratch)

"""An image's SCIF apps (/scif/apps/NAME/scif), for `inspect --list-apps`/`--app` and `run-help --app`.

Apptainer lists as apps the directories of /scif/apps that hold a `scif`
directory, sorted by name, and reads an app's help from
/scif/apps/NAME/scif/runscript.help. A sandbox is read in place; from a SIF
or squashfs image only the files read of `scif/apps/*/scif` are unpacked
(listed first by singpy.image.squashpick: a huge file is never unpacked), as
singpy.image.metadata unpacks those of /.singularity.d, so this works
unprivileged and for any architecture.

Everything here is the image's own text, untrusted: it is read through the
one door (singpy.mounts.rootpath.Tree, links resolved inside the image), and
an app name that is not a plain file name is left out.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from singpy import console
from singpy.constants import SCIF_APPS
from singpy.errors import PathError, UsageError
from singpy.mounts.rootpath import Tree
from singpy.plan import ImageSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import Any

_MAX_HELP = 16 << 20  # a help text is small; never load a huge file into memory


def list_apps(image: ImageSpec, env: Mapping[str, str]) -> list[str]:
    """The names of the image's SCIF apps, sorted (Apptainer's `inspect --list-apps`)."""
    with _apps_root(image, env) as (root, _), Tree(root) as tree:
        return _apps(tree)


def app_file(image: ImageSpec, app: str, name: str, env: Mapping[str, str]) -> str | None:
    """The text of /scif/apps/APP/scif/NAME (one of the files inspect reads: _APP_FILES, labels.json), None when
    the image has no such file."""
    check_app_name(app)
    with _apps_root(image, env) as (root, notes), Tree(root) as tree:
        return _read(tree, f"{SCIF_APPS}/{app}/scif/{name}", notes)


# Each app's files as `inspect --all` reads them (Apptainer's inspect.go: the attribute each file is)
_APP_FILES = (("runscript", "runscript"), ("startscript", "startscript"), ("test", "test"),
              ("runscript.help", "helpfile"))
_READ = frozenset({*(file for file, _ in _APP_FILES), "labels.json", "env"})  # what is unpacked of an app's scif
_ENV_SCRIPTS = ("9*-environment.sh",)  # an app's (Apptainer reads 10-docker*.sh of /.singularity.d only)


def app_attributes(image: ImageSpec, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Every app with its attributes, as Apptainer's inspect document has them (data.attributes.apps: its
    AppAttributes, empty ones left out): labels (labels.json), runscript, startscript, test, helpfile
    (runscript.help) and environment (env/9*-environment.sh, by their path)."""
    with _apps_root(image, env) as (root, notes), Tree(root) as tree:
        return {name: _attributes_of(tree, name, notes) for name in _apps(tree)}


def _attributes_of(tree: Tree, name: str, notes: Mapping[str, str]) -> dict[str, Any]:
    scif = f"{SCIF_APPS}/{name}/scif"
    attributes: dict[str, Any] = {}
    for file, key in _APP_FILES:
        text = _text(tree, f"{scif}/{file}", notes)
        if text:
            attributes[key] = text
    labels = _app_labels(tree, f"{scif}/labels.json", notes)
    if labels:
        attributes["labels"] = labels
    environment = {}
    for entry in sorted(_listdir(tree, f"{scif}/env", notes)):
        if _is_env_script(entry):
            text = _text(tree, f"{scif}/env/{entry}", notes)
            if text:
                environment[f"{scif}/env/{entry}"] = text
    if environment:
        attributes["environment"] = environment
    return attributes


def _is_env_script(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _ENV_SCRIPTS)


def _read(tree: Tree, guest: str, notes: Mapping[str, str]) -> str | None:
    """A file of the image as text; None when absent (with a warning when a link, a special file, or what
    `notes` say kept it out is in the way)."""
    try:
        data = tree.read(guest, limit=_MAX_HELP)
    except PathError as error:
        console.warning(f"left out the image's {guest}: {error.message}")
        return None
    if data is None and notes:
        from singpy.image.squashpick import left_out

        if (why := left_out(tree, guest, notes)) is not None:
            console.warning(f"left out the image's {guest}: {why}")
    return None if data is None else data.decode(errors="replace")


def _text(tree: Tree, guest: str, notes: Mapping[str, str]) -> str:
    """A file of the image as text, its trailing newlines dropped (as Apptainer's inspect); "" when absent."""
    return (_read(tree, guest, notes) or "").rstrip("\n")


def _listdir(tree: Tree, guest: str, notes: Mapping[str, str]) -> list[str]:
    try:
        names = tree.listdir(guest)
    except PathError:
        return []
    if notes:  # those left out too, to say so
        from singpy.image.squashpick import noted_names

        names.extend(noted_names(notes, guest))
    return names


def _app_labels(tree: Tree, guest: str, notes: Mapping[str, str]) -> dict[str, str]:
    """An app's labels.json: an object of strings; anything else is left out with a warning (Apptainer's)."""
    import json

    text = _text(tree, guest, notes)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except RecursionError:  # a C-level recursion limit of json's scanner: `[` nested 100000 deep
        console.warning(f"Unable to parse labels of {guest}: nested too deeply")
        return {}
    except ValueError as error:
        console.warning(f"Unable to parse labels of {guest}: {error}")
        return {}
    if not isinstance(value, dict):
        console.warning(f"Unable to parse labels of {guest}: not an object")
        return {}
    return {str(key): item if isinstance(item, str) else json.dumps(item) for key, item in value.items()}


def check_app_name(app: str) -> None:
    """An app is a directory of /scif/apps: its name is one path component (--app ../x names nothing)."""
    if not app or "/" in app or app in (".", "..") or "\0" in app:
        raise UsageError(f"invalid app name {app!r}: an app is named by one directory of {SCIF_APPS}")


def _apps(tree: Tree) -> list[str]:
    try:
        names = tree.listdir(SCIF_APPS)
    except PathError as error:
        console.warning(f"can't read the image's {SCIF_APPS}: {error.message}")
        return []
    return sorted(name for name in names if _is_app(tree, name))


def _is_app(tree: Tree, name: str) -> bool:
    try:
        found = tree.lookup(f"{SCIF_APPS}/{name}/scif")
    except PathError:
        return False
    if found.fd is None:
        return False
    try:
        return stat.S_ISDIR(os.fstat(found.fd).st_mode)
    finally:
        os.close(found.fd)


@contextmanager
def _apps_root(image: ImageSpec, env: Mapping[str, str]) -> Iterator[tuple[str, Mapping[str, str]]]:
    """A root directory holding the image's /scif/apps/*/scif (the sandbox itself, or the files read of it,
    unpacked), and why some of those were not unpacked (guest path -> reason; singpy.image.squashpick)."""
    if image.kind == "sandbox":
        yield image.path, {}
        return
    import tempfile

    from singpy.image import cache, tools
    from singpy.image.detect import sif_partition
    from singpy.image.squashpick import Picker

    part = sif_partition(image.path, check_arch=False) if image.kind == "sif" else image
    unsquashfs = tools.require_tool("unsquashfs", env, "read the apps of a squashfs image")
    scratch = tempfile.mkdtemp(prefix="singpy-apps-")
    try:
        picker = Picker(unsquashfs, part, f"{scratch}/root", limit=_MAX_HELP, label="Reading apps",
                        failure=f"can't read the apps of {image.path}")
        # unsquashfs matches each component of the pattern with fnmatch; the names found are unpacked exactly
        picker.fetch(picker.survey(f"{SCIF_APPS}/*/scif", _is_read))
        yield picker.tree, picker.notes
    finally:
        cache.remove_tree(scratch)


def _is_read(path: str) -> bool:
    """Whether guest `path` is an app's scif directory or one of its files that are read."""
    if not path.startswith(f"{SCIF_APPS}/"):
        return False
    match path[len(SCIF_APPS) + 1:].split("/"):
        case [_, "scif"]:
            return True
        case [_, "scif", name]:
            return name in _READ
        case [_, "scif", "env", name]:
            return _is_env_script(name)
    return False

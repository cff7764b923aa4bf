"""An image's SCIF apps (/scif/apps/NAME/scif), for `inspect --list-apps` and `run-help --app`.

Apptainer lists as apps the directories of /scif/apps that hold a `scif`
directory, sorted by name, and reads an app's help from
/scif/apps/NAME/scif/runscript.help. A sandbox is read in place; from a SIF
or squashfs image only `scif/apps/*/scif` is unpacked (the apps' own scripts
and metadata, small: their programs live beside it, in bin/ and lib/), as
singpy.image.metadata unpacks /.singularity.d alone, so this works
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
    with _apps_root(image, env) as root, Tree(root) as tree:
        return _apps(tree)


def app_file(image: ImageSpec, app: str, name: str, env: Mapping[str, str]) -> str | None:
    """The text of /scif/apps/APP/scif/NAME, None when the image has no such file."""
    check_app_name(app)
    with _apps_root(image, env) as root, Tree(root) as tree:
        guest = f"{SCIF_APPS}/{app}/scif/{name}"
        try:
            data = tree.read(guest, limit=_MAX_HELP)
        except PathError as error:
            console.warning(f"left out the image's {guest}: {error.message}")
            return None
        return None if data is None else data.decode(errors="replace")


# Each app's files as `inspect --all` reads them (Apptainer's inspect.go: the attribute each file is)
_APP_FILES = (("runscript", "runscript"), ("startscript", "startscript"), ("test", "test"),
              ("runscript.help", "helpfile"))


def app_attributes(image: ImageSpec, env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Every app with its attributes, as Apptainer's inspect document has them (data.attributes.apps: its
    AppAttributes, empty ones left out): labels (labels.json), runscript, startscript, test, helpfile
    (runscript.help) and environment (env/10-docker*.sh and env/9*-environment.sh, by their path)."""
    with _apps_root(image, env) as root, Tree(root) as tree:
        return {name: _attributes_of(tree, name) for name in _apps(tree)}


def _attributes_of(tree: Tree, name: str) -> dict[str, Any]:
    scif = f"{SCIF_APPS}/{name}/scif"
    attributes: dict[str, Any] = {}
    for file, key in _APP_FILES:
        text = _text(tree, f"{scif}/{file}")
        if text:
            attributes[key] = text
    labels = _app_labels(tree, f"{scif}/labels.json")
    if labels:
        attributes["labels"] = labels
    environment = {}
    for entry in sorted(_listdir(tree, f"{scif}/env")):
        if fnmatch.fnmatchcase(entry, "10-docker*.sh") or fnmatch.fnmatchcase(entry, "9*-environment.sh"):
            text = _text(tree, f"{scif}/env/{entry}")
            if text:
                environment[f"{scif}/env/{entry}"] = text
    if environment:
        attributes["environment"] = environment
    return attributes


def _text(tree: Tree, guest: str) -> str:
    """A file of the image as text, its trailing newlines dropped (as Apptainer's inspect); "" when absent."""
    try:
        data = tree.read(guest, limit=_MAX_HELP)
    except PathError as error:
        console.warning(f"left out the image's {guest}: {error.message}")
        return ""
    return "" if data is None else data.decode(errors="replace").rstrip("\n")


def _listdir(tree: Tree, guest: str) -> list[str]:
    try:
        return tree.listdir(guest)
    except PathError:
        return []


def _app_labels(tree: Tree, guest: str) -> dict[str, str]:
    """An app's labels.json: an object of strings; anything else is left out with a warning (Apptainer's)."""
    import json

    text = _text(tree, guest)
    if not text:
        return {}
    try:
        value = json.loads(text)
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
def _apps_root(image: ImageSpec, env: Mapping[str, str]) -> Iterator[str]:
    """A root directory holding the image's /scif/apps/*/scif: the sandbox itself, or an unpacked copy."""
    if image.kind == "sandbox":
        yield image.path
        return
    import tempfile

    from singpy.image import cache, tools
    from singpy.image.detect import sif_partition

    part = sif_partition(image.path, check_arch=False) if image.kind == "sif" else image
    unsquashfs = tools.require_tool("unsquashfs", env, "read the apps of a squashfs image")
    scratch = tempfile.mkdtemp(prefix="singpy-apps-")
    try:
        tree = f"{scratch}/root"
        # unsquashfs matches each component of the pattern with fnmatch; names it lacks are skipped
        tools.run_tool([unsquashfs, "-o", str(part.offset), "-d", tree, "-no-xattrs", "-q", part.path,
                        f"{SCIF_APPS.lstrip('/')}/*/scif"],
                       label="Reading apps", failure=f"can't read the apps of {image.path}")
        os.makedirs(tree, exist_ok=True)  # nothing matched (no apps): unsquashfs made no root
        yield tree
    finally:
        cache.remove_tree(scratch)


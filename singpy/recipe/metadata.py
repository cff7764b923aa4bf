"""A stage's metadata written into its root filesystem: /.singularity.d, as Apptainer's build writes it.

The rules are Apptainer 1.4's ([1] internal/pkg/build/metadata.go), in its
order: runscript.help (%help), labels.json, Singularity (the definition
file), env/90-environment.sh (%environment), startscript, runscript, test.
A section the stage does not have leaves the image's file alone: a base
image's runscript stays when the definition file has no %runscript.

The root filesystem comes from an untrusted base image, so every path goes
through the one door (singpy.mounts.rootpath.Tree): links of the directories
on the way are followed as a process inside would follow them (an absolute
target starts again at the rootfs), and the file itself is never written
through a link: a `runscript -> /etc/passwd` is replaced by a new file, so
neither the host's /etc/passwd nor the image's is touched. A file is created
with O_EXCL | O_NOFOLLOW in its parent's descriptor, then given its mode with
fchmod; a directory made is 0755: the umask plays no part.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from typing import Any

from singpy import console
from singpy.constants import ENV_DIR, SINGULARITY_D
from singpy.errors import ImageError, PathError
from singpy.host.hostfiles import write_all
from singpy.mounts.rootpath import Tree
from singpy.recipe.deffile import Section, Stage, labels

BUILD_LABELS = "/.build.labels"  # where %post's $APPTAINER_LABELS lines go ([1] sLabelsPath)
HELP_FILE = f"{SINGULARITY_D}/runscript.help"
LABELS_FILE = f"{SINGULARITY_D}/labels.json"
DEFINITION_FILE = f"{SINGULARITY_D}/Singularity"
HISTORY_DIR = f"{SINGULARITY_D}/bootstrap_history"
ENVIRONMENT_FILE = f"{ENV_DIR}/90-environment.sh"
_SCRIPTS = (("startscript", f"{SINGULARITY_D}/startscript"), ("runscript", f"{SINGULARITY_D}/runscript"),
            ("test", f"{SINGULARITY_D}/test"))
_MAX_READ = 16 << 20  # labels and env scripts are small; never load a huge one
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_metadata(rootfs: str, stage: Stage, *, definition: str, build_labels: Mapping[str, str],
                   force: bool) -> None:
    """Write the metadata of `stage` into `rootfs`; `definition` is the definition file's text.

    `build_labels` are the labels the build itself sets (org.label-schema.*),
    `force` is `build --force`: a %labels name that already exists and an
    existing help file are then replaced instead of kept with a warning.
    """
    with Tree(rootfs) as image:
        help_text = stage.script("help")
        if help_text:
            _write_help(image, help_text, force)
        _write_labels(image, stage, build_labels, force)
        _write_definition(image, definition)
        environment = stage.script("environment")
        if environment:
            _write_environment(image, environment)
        for section, guest in _SCRIPTS:
            body = stage.script(section)
            if body:
                write_file(image, guest, shebang_script(body, stage.args(section)).encode(), 0o755)


def shebang_script(body: str, args: str) -> str:
    """A script file from a section: its own `#!` line kept, else `#!/bin/sh`; the section's args
    (`%runscript -x`, a comment after `#` dropped) are added to that line, as Apptainer does."""
    shebang, script = "#!/bin/sh", body
    if body.strip().startswith("#!"):
        # Leading blank lines skipped: Apptainer splits the raw text there and would make "" the shebang.
        first, _, script = body.lstrip().partition("\n")
        shebang = first.strip()
    extra = args.split("#", 1)[0].strip()
    if extra:
        shebang += " " + extra
    return f"{shebang}\n\n{script}\n"


def _write_help(image: Tree, text: str, force: bool) -> None:
    if _exists(image, HELP_FILE) and not force:
        console.warning("Help message already exists and force option is false, not overwriting")
        return
    write_file(image, HELP_FILE, (text + "\n").encode(), 0o644)


def _write_labels(image: Tree, stage: Stage, build_labels: Mapping[str, str], force: bool) -> None:
    """labels.json: the image's own, then %post's, then the build's, then %labels (never overriding)."""
    found = _existing_labels(image)
    found.update(_post_labels(image))
    found.update(build_labels)
    if stage.script("help"):
        found["org.label-schema.usage"] = HELP_FILE
        found["org.label-schema.usage.apptainer.runscript.help"] = HELP_FILE
    for key, value in stage.header:
        found[f"org.label-schema.usage.singularity.deffile.{key}"] = value
    sections = [section for section in stage.sections if section.name == "labels" and labels(section)]
    if sections:
        console.info("Adding labels")
    for section in sections:
        for name, value in labels(section):
            if name in found and not force:
                console.warning(f"Label: {name} already exists and force option is false, not overwriting")
            else:
                found[name] = value
    text = json.dumps(found, indent="\t", sort_keys=True, ensure_ascii=False)  # Go's MarshalIndent(.., "", "\t")
    write_file(image, LABELS_FILE, text.encode(), 0o644)


def _existing_labels(image: Tree) -> dict[str, str]:
    """The base image's labels.json; anything unreadable is reported and left out, as inspect does."""
    try:
        data = image.read(LABELS_FILE, limit=_MAX_READ)
    except PathError as error:
        console.warning(f"the base image's labels are left out: {error.message}")
        return {}
    if data is None:
        return {}
    try:
        document: Any = json.loads(data)
    except (ValueError, RecursionError):
        console.warning(f"the base image's {LABELS_FILE} is not valid JSON: its labels are left out")
        return {}
    if not isinstance(document, dict):
        console.warning(f"the base image's {LABELS_FILE} is not a JSON object: its labels are left out")
        return {}
    found = {}
    for key, value in document.items():
        if isinstance(value, (dict, list)):
            console.warning(f"the base image's label {key!r} is not a string: left out")
        else:
            found[str(key)] = value if isinstance(value, str) else json.dumps(value)
    return found


def _post_labels(image: Tree) -> dict[str, str]:
    """The "NAME value" lines %post appended to $APPTAINER_LABELS; the file is removed once read."""
    try:
        data = image.read(BUILD_LABELS, limit=_MAX_READ)
    except PathError as error:
        raise ImageError(f"can't read the labels %post wrote in {BUILD_LABELS}: {error.message}") from None
    if data is None:
        return {}
    found = image.lookup(BUILD_LABELS, follow=False)  # the name itself, a link included
    try:
        os.unlink(found.name, dir_fd=found.parent)
    except OSError as error:
        raise ImageError(f"can't remove {BUILD_LABELS} from the image: {error.strerror}") from None
    finally:
        if found.fd is not None:
            os.close(found.fd)
    section = Section(name="labels", args="", body=data.decode(errors="replace"), line=0)
    return dict(labels(section))


def _write_definition(image: Tree, definition: str) -> None:
    """The definition file; one the base image already has goes to bootstrap_history/ first."""
    directory = open_directory(image, SINGULARITY_D, DEFINITION_FILE)
    try:
        if _lstat(directory, "Singularity") is not None:
            history = open_directory(image, HISTORY_DIR, DEFINITION_FILE)
            try:
                name = _history_name(image, history)
                os.rename("Singularity", name, src_dir_fd=directory, dst_dir_fd=history)
            except OSError as error:
                raise ImageError(f"can't move the image's {DEFINITION_FILE} to {HISTORY_DIR}: "
                                 f"{error.strerror}") from None
            finally:
                os.close(history)
    finally:
        os.close(directory)
    write_file(image, DEFINITION_FILE, definition.encode(), 0o644)


def _history_name(image: Tree, history: int) -> str:
    """Apptainer's name: "Apptainer" and the number of entries already there (the next free one)."""
    try:
        number = len(image.listdir(HISTORY_DIR))
    except PathError as error:
        raise ImageError(f"can't list {HISTORY_DIR} in the image: {error.message}") from None
    while _lstat(history, f"Apptainer{number}") is not None:
        number += 1
    return f"Apptainer{number}"


def _write_environment(image: Tree, script: str) -> None:
    """90-environment.sh: a new script, or the image's own with %environment appended to it."""
    try:
        existing = image.read(ENVIRONMENT_FILE, limit=_MAX_READ)
    except PathError as error:
        raise ImageError(f"can't add %environment to the image's {ENVIRONMENT_FILE}: {error.message}") from None
    text = f"#!/bin/sh\n\n{script}\n" if existing is None else f"{existing.decode(errors='replace')}\n{script}\n"
    write_file(image, ENVIRONMENT_FILE, text.encode(), 0o755)


def _exists(image: Tree, guest: str) -> bool:
    """Whether `guest` leads to something in the image (a dangling link does not)."""
    try:
        found = image.lookup(guest)
    except PathError:
        return False
    if found.fd is None:
        return False
    os.close(found.fd)
    return True


def _lstat(directory: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None


def make_directory(image: Tree, guest: str) -> None:
    """Directory `guest` made (with its parents, 0755) where missing."""
    os.close(open_directory(image, guest, guest))


def open_directory(image: Tree, guest: str, purpose: str) -> int:
    """A descriptor (the caller's) of directory `guest`, made when missing; errors name `purpose`."""
    try:
        found = image.lookup(guest)
    except PathError as error:
        raise ImageError(f"can't write {purpose} in the image: {error.message}") from None
    if found.fd is None:
        return _make_directories(found.parent, found.missing, f"can't write {purpose} in the image")
    if not stat.S_ISDIR(os.fstat(found.fd).st_mode):
        os.close(found.fd)
        raise ImageError(f"can't write {purpose} in the image: {found.path} is not a directory")
    return found.fd


def _make_directories(parent: int, names: tuple[str, ...], failure: str) -> int:
    """Directories `names` made one below the other in `parent`, each 0755 whatever the umask (an image's
    /.singularity.d must be readable by every user of it); a descriptor of the last one."""
    current = os.dup(parent)
    try:
        for name in names:
            os.mkdir(name, 0o755, dir_fd=current)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            os.close(current)
            current = below
            os.fchmod(current, 0o755)
    except OSError as error:
        os.close(current)
        raise ImageError(f"{failure}: {error.strerror}") from None
    return current


def write_file(image: Tree, guest: str, data: bytes, mode: int) -> None:
    """Create file `guest` anew with `data` and `mode`, replacing (never following) what has its name."""
    parent, name = guest.rsplit("/", 1)
    directory = open_directory(image, parent or "/", guest)
    try:
        existing = _lstat(directory, name)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise ImageError(f"can't write {guest} in the image: it is a directory")
        if existing is not None:
            os.unlink(name, dir_fd=directory)
        fd = os.open(name, _CREATE, mode, dir_fd=directory)
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as error:
        raise ImageError(f"can't write {guest} in the image: {error.strerror}") from None
    finally:
        os.close(directory)

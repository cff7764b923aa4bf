"""The image's own scripts, found in the image alone: env scripts and the runscript.

The container's shell sources /.singularity.d/env/*.sh and `run` executes
/.singularity.d/runscript. A link among them may lead out of the image once
the container is assembled: a runscript linked to /tmp/run.sh would run, as
the user, whatever another user left in the host's /tmp; an env script
linked to /dev/zero would make the shell read forever. So they are looked up
in the image itself (a Tree on its root, before anything is mounted on it),
and the container is handed the paths they lead to there:

* a path that a mount of the plan covers (the host's /tmp, home, /dev...) is
  not the image's: an env script there is skipped with a warning, a
  runscript there is refused; except where the user bound a file of their own
  on the script's own path (`run --bind rs.sh:/.singularity.d/runscript`),
  which is the user's choice: that file is run or sourced. An image's link
  that leads to a bound path still is refused: the image chose it, not the user;
* an env script that is not a regular file is skipped with a warning, as
  Apptainer's `[ -f "$script" ]` skips it; one over SCRIPT_LIMIT is refused;
* a path the shell could not take as one word (spaces, glob characters) is
  skipped: env script names are plain (`90-environment.sh`).
"""

from __future__ import annotations

import os
import stat

from singpy import console
from singpy.constants import ENV_DIR, RUNSCRIPT, SCIF_APPS, SINGULARITY_D
from singpy.errors import ImageError, PathError
from singpy.host.hostfiles import kind_name
from singpy.mounts.rootpath import Tree
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Callable

SCRIPT_LIMIT = 16 << 20  # bytes; env scripts are a few KB
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-@%=,:/")


class ImageScripts(Record):
    """What the container runs of the image's own, as paths inside the container."""

    env: tuple[str, ...] = ()  # env scripts to source, in the lexical order of their names
    runscript: str | None = None  # the runscript (`run`), None when the image has none


def find_scripts(image: Tree, *, covered: Callable[[str], bool], runscript: str | None,
                 asked: Callable[[str], bool] = lambda path: False) -> ImageScripts:
    """The image's env scripts (and the runscript at guest path `runscript`, when given), checked as the module
    says. `covered`: whether a mount of the plan hides a path; `asked`: whether a bind the user asked for does."""
    env = tuple(path for name in _env_names(image)
                if (path := _users_bind(image, f"{ENV_DIR}/{name}", asked) or _env_script(image, f"{ENV_DIR}/{name}",
                                                                                           covered)))
    if not runscript:
        return ImageScripts(env=env)
    return ImageScripts(env=env, runscript=_users_bind(image, runscript, asked) or _runscript(image, covered,
                                                                                             runscript))


def _users_bind(image: Tree, guest: str, asked: Callable[[str], bool]) -> str | None:
    """`guest` itself when the user bound a file of their own there, reached in the image without a link."""
    if not asked(guest):
        return None
    try:
        found = image.lookup(guest)
    except PathError:
        return None
    if found.fd is not None:
        os.close(found.fd)
    return guest if found.path == guest else None


def runscript_path(app: str, action: str = "run") -> str:
    """What `run` executes: the image's runscript, or with --app that of the SCIF app; for `test`, the
    image's (or the app's) test script (Apptainer's action script: /.singularity.d/test)."""
    name = "test" if action == "test" else "runscript"
    if app:
        return f"{SCIF_APPS}/{app}/scif/{name}"
    return f"{SINGULARITY_D}/test" if action == "test" else RUNSCRIPT


def _env_names(image: Tree) -> list[str]:
    try:
        return sorted(name for name in image.listdir(ENV_DIR) if name.endswith(".sh"))
    except PathError as error:
        console.warning(f"can't read the image's {ENV_DIR}: {error.message}")
        return []


def _env_script(image: Tree, guest: str, covered: Callable[[str], bool]) -> str | None:
    try:
        found = image.lookup(guest)
    except PathError as error:
        console.warning(f"skipping the image's {guest}: {error.message}")
        return None
    if found.fd is None:
        return None  # a dangling link: nothing to source, as the shell's `-f` test says
    info = os.fstat(found.fd)
    os.close(found.fd)
    if not stat.S_ISREG(info.st_mode):
        console.warning(f"skipping the image's {guest}: it {_leads(guest, found.path)}is {kind_name(info.st_mode)}")
        return None
    if info.st_size > SCRIPT_LIMIT:
        raise ImageError(f"the image's {guest} is too large ({info.st_size} bytes, at most {SCRIPT_LIMIT})")
    if covered(found.path):
        console.warning(f"skipping the image's {guest}: it leads to {found.path}, which the container does not "
                        "take from the image")
        return None
    if not set(found.path) <= _PLAIN:
        console.warning(f"skipping the image's {guest}: it leads to {found.path!r}, not a plain path")
        return None
    return found.path


def _runscript(image: Tree, covered: Callable[[str], bool], guest: str) -> str | None:
    try:
        found = image.lookup(guest)
    except PathError as error:
        raise ImageError(f"can't run the image's {guest}: {error.message}") from None
    if found.fd is None:
        if found.path != guest:  # in the container it would lead elsewhere: the host's, another user's
            raise ImageError(f"can't run the image's {guest}: it is a link to {found.path}, which is not in "
                             "the image")
        return None
    info = os.fstat(found.fd)
    os.close(found.fd)
    if not stat.S_ISREG(info.st_mode):
        raise ImageError(f"can't run the image's {guest}: it {_leads(guest, found.path)}is "
                         f"{kind_name(info.st_mode)}, not a regular file")
    if covered(found.path):
        raise ImageError(f"can't run the image's {guest}: it leads to {found.path}, which the container does "
                         "not take from the image")
    return found.path


def _leads(guest: str, path: str) -> str:
    return "" if guest == path else f"leads to {path}, which "

"""registries.conf and its drop-ins as files: which are read, and whether any may define a registry.

A run of a cached `docker://X:TAG` reads them every time, to know whether its tag may be checked directly
(singpy.oci.quickhead): most hosts have none, or only files that can't define a registry (Debian's
registries.conf is all comments, shortnames.conf holds `[aliases]`). Those runs stop here; singpy.oci.mirrors,
which parses the files and applies their entries, is imported only where a file may name a registry
(issue 31: the cached tag's run pays for no module it does not use).

Which files, as containers/image reads them: $CONTAINERS_REGISTRIES_CONF (it must exist) with the system's
and the user's drop-in directories; else the user's ~/.config/containers/registries.conf with the user's
drop-ins only; else /etc/containers/registries.conf with both.
"""

from __future__ import annotations

import os

from singpy.errors import ImageError

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

SYSTEM_FILE = "/etc/containers/registries.conf"
SYSTEM_DIR = "/etc/containers/registries.conf.d"
USER_FILE = ".config/containers/registries.conf"  # under $HOME
USER_DIR = ".config/containers/registries.conf.d"
FILE_VARIABLE = "CONTAINERS_REGISTRIES_CONF"
_FILE_LIMIT = 1 << 20  # bytes of one file (real ones are a few KB)


def files(env: Mapping[str, str], home: str) -> list[tuple[str, bool]] | None:
    """(path, is a drop-in) of each file to read, the main file first; None when none exists."""
    home = env.get("HOME") or home
    user_file = os.path.join(home, USER_FILE)
    user_dir = os.path.join(home, USER_DIR)
    explicit = env.get(FILE_VARIABLE, "")
    dirs: tuple[str, ...]
    if explicit:
        main, dirs = explicit, (SYSTEM_DIR, user_dir)
        if not os.path.lexists(main):
            from singpy.host.hostfiles import shown

            raise ImageError(f"{FILE_VARIABLE} names {shown(main)}, which does not exist")
    elif os.path.lexists(user_file):
        main, dirs = user_file, (user_dir,)
    else:
        main, dirs = SYSTEM_FILE, (SYSTEM_DIR, user_dir)
    drop_ins = [(path, True) for directory in dirs for path in _drop_ins(directory)]
    if os.path.lexists(main):
        return [(main, False), *drop_ins]
    return drop_ins or None


def _drop_ins(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []  # most hosts have none
    except OSError as error:
        raise ImageError(f"can't read the directory {directory}: {error.strerror}") from None
    return [f"{directory}/{name}" for name in names
            if name.endswith(".conf") and not os.path.isdir(f"{directory}/{name}")]


def read(path: str) -> str:
    """The text of one file (bounded; an unreadable one is an ImageError naming it)."""
    from singpy.host.hostfiles import read_text

    return read_text(path, what="registries configuration", error=ImageError, limit=_FILE_LIMIT)


def define_nothing(env: Mapping[str, str], home: str) -> bool:
    """Whether no file may define a registry entry (none exists, or none could): then registries.conf changes
    nothing for any image, and nothing needs parsing."""
    return not any(may_name_registries(read(path)) for path, _ in files(env, home) or ())


def may_name_registries(text: str) -> bool:
    """Whether a file may define registry entries: a table header naming `registr...` (`[[registry]]`, v1's
    `[registries.*]`), a top-level key naming it (`registry = [...]`), a key with an escape (which could
    spell it), or a top-level value spanning lines (not followed: any doubt parses).

    The others (comments only, as Debian ships registries.conf; shortnames.conf's `[aliases]`) are not
    parsed: tomllib's import and parse cost ~5-10 ms on every run of a cached docker:// tag.
    """
    top_level = True  # keys before the first table header are the document's own
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):  # a table header (a value's continuation is never seen at top level)
            if "registr" in stripped.lower() or "\\" in stripped:
                return True
            top_level = False
            continue
        key, _, value = stripped.partition("=")
        if top_level and ("registr" in key.lower() or "\\" in key or value.count("[") != value.count("]")
                          or '"""' in value or "'''" in value):
            return True
    return False

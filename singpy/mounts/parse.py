"""Bind specifications, as Apptainer writes them: `src[:dest[:opts]]`.

Several specs may be joined with commas (`-B /a,/b:/c:ro`) and the flag may
repeat; `SINGULARITY_BIND` / `APPTAINER_BIND` use the same syntax. The only
options are `ro` and `rw`. As in Apptainer, a comma or colon that belongs to
a path is escaped with a backslash (`-B 'data\\,v2:/data'` binds `data,v2`);
any other backslash is part of the path. Parsing is pure: whether the
source exists is checked by the planner.
"""

from __future__ import annotations

import os.path

from singpy.errors import BindSpecError
from singpy.hostfiles import path_problem, shown
from singpy.record import Record

_OPTIONS = {"ro": True, "rw": False}


class BindSpec(Record, kw_only=False):
    source: str  # host path as given (made absolute against the cwd)
    dest: str  # absolute path inside the container
    readonly: bool  # mounted read-only


def parse_bind_list(values: list[str] | tuple[str, ...], cwd: str) -> tuple[BindSpec, ...]:
    """Parse every comma-separated spec of every value, in order."""
    specs = []
    for value in values:
        for item in split_unescaped(value, ","):
            specs.append(parse_bind(item.strip(), cwd))
    return tuple(specs)


def split_unescaped(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` not preceded by a backslash; an escaped one loses its backslash."""
    pieces = text.split(separator)
    parts = [pieces[0]]
    for piece in pieces[1:]:
        if parts[-1].endswith("\\"):
            parts[-1] = parts[-1][:-1] + separator + piece
        else:
            parts.append(piece)
    return parts


def parse_bind(text: str, cwd: str) -> BindSpec:
    """Parse one `src[:dest[:opts]]`.

    Both paths come back absolute and normalised (`//x/./y/` is `/x/y`), and
    are checked against the kernel's limits here, so that no launch meets a
    path it can't use. A bind onto `/` itself is refused: it would hide the
    image (Apptainer refuses it too).
    """
    bad = f"bad bind specification {shown(text)!r}"
    if not text:
        raise BindSpecError(f"{bad}: empty")
    parts = split_unescaped(text, ":")
    if len(parts) > 3:
        raise BindSpecError(f"{bad}: too many ':' (expected src[:dest[:ro|rw]])")
    source = parts[0]
    dest = parts[1] if len(parts) > 1 and parts[1] else source
    option = parts[2] if len(parts) > 2 else "rw"
    if not source:
        raise BindSpecError(f"{bad}: empty source")
    if option not in _OPTIONS:
        raise BindSpecError(f"{bad}: unknown option {shown(option)!r} (expected ro or rw)")
    if not os.path.isabs(dest) and len(parts) > 1 and parts[1]:
        raise BindSpecError(f"{bad}: destination {shown(dest)!r} is not absolute")
    source, dest = checked_pair(source, dest, cwd, bad=bad, onto_root="--bind can't replace the container's "
                                "root directory /")
    return BindSpec(source, dest, _OPTIONS[option])


def checked_pair(source: str, dest: str, cwd: str, *, bad: str, onto_root: str) -> tuple[str, str]:
    """A host source and a container destination made absolute against `cwd` and normalised, then checked:
    lengths the kernel takes, and a destination other than the container's root (`onto_root` says why not).
    `bad` starts each message (--bind and --home share this)."""
    source, dest = absolute(source, cwd), absolute(dest, cwd)
    for role, path in (("source", source), ("destination", dest)):
        problem = path_problem(path)
        if problem:
            raise BindSpecError(f"{bad}: {role} {problem}")
    if dest == "/":
        raise BindSpecError(f"{bad}: {onto_root}")
    return source, dest


def absolute(path: str, cwd: str) -> str:
    """`path` made absolute against `cwd` and normalised; POSIX's special `//` prefix is one `/` here."""
    normal = os.path.normpath(os.path.join(cwd, path))
    return "/" + normal.lstrip("/")

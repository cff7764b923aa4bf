"""Bind specifications, as Apptainer writes them: `src[:dest[:opts]]`.

Several specs may be joined with commas (`-B /a,/b:/c:ro`) and the flag may
repeat; `SINGULARITY_BIND` / `APPTAINER_BIND` use the same syntax. The only
options are `ro` and `rw`. Parsing is pure: whether the source exists is
checked by the planner.
"""

from __future__ import annotations

import os.path

from singpy.errors import BindSpecError
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
        for item in value.split(","):
            specs.append(parse_bind(item.strip(), cwd))
    return tuple(specs)


def parse_bind(text: str, cwd: str) -> BindSpec:
    """Parse one `src[:dest[:opts]]`."""
    if not text:
        raise BindSpecError("bad bind specification '': empty")
    parts = text.split(":")
    if len(parts) > 3:
        raise BindSpecError(f"bad bind specification {text!r}: too many ':' (expected src[:dest[:ro|rw]])")
    source = parts[0]
    dest = parts[1] if len(parts) > 1 and parts[1] else source
    option = parts[2] if len(parts) > 2 else "rw"
    if not source:
        raise BindSpecError(f"bad bind specification {text!r}: empty source")
    if option not in _OPTIONS:
        raise BindSpecError(f"bad bind specification {text!r}: unknown option {option!r} (expected ro or rw)")
    if not os.path.isabs(dest):
        if len(parts) > 1 and parts[1]:
            raise BindSpecError(f"bad bind specification {text!r}: destination {dest!r} is not absolute")
        dest = os.path.normpath(os.path.join(cwd, dest))
    source = os.path.normpath(os.path.join(cwd, source))
    return BindSpec(source, os.path.normpath(dest), _OPTIONS[option])

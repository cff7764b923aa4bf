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
from singpy.host.hostfiles import path_problem, shown
from singpy.record import Record

_OPTIONS = {"ro": True, "rw": False}


class BindSpec(Record, kw_only=False):
    source: str  # host path as given (made absolute against the cwd)
    dest: str  # absolute path inside the container
    readonly: bool  # mounted read-only


def parse_bind_list(values: list[str] | tuple[str, ...], cwd: str) -> tuple[BindSpec, ...]:
    """Parse every comma-separated spec of every value, in order.

    As Apptainer's ParseBindPath: an empty item is skipped (`APPTAINER_BIND="$APPTAINER_BIND,/scratch"` with
    the variable unset), and `ro` or `rw` right after a spec that has options is one more of its options
    (`/a:/b:rw,ro`: read-only, as any `ro` among them makes it), not a path of the working directory.
    """
    specs: list[BindSpec] = []
    for value in values:
        options_open = False  # the last spec of this value ended with its options
        for item in (piece.strip() for piece in split_unescaped(value, ",")):
            if not item:
                continue
            if options_open and item in _OPTIONS:
                specs[-1] = specs[-1].replace(readonly=specs[-1].readonly or _OPTIONS[item])
                continue
            specs.append(parse_bind(item, cwd))
            options_open = len(split_unescaped(item, ":")) == 3
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


# --mount: Docker's `--mount` syntax as Apptainer reads it (its ParseMountString): fields `key[=value]`
# in CSV, so that a path holding a comma is quoted ("src=a,b"); one record per line.
_MOUNT_SOURCE = ("source", "src")
_MOUNT_DEST = ("destination", "dst", "target")
_MOUNT_READONLY = ("ro", "readonly")
_TRUE_FALSE = {"": True, "true": True, "1": True, "false": False, "0": False}


def parse_mount_list(values: list[str] | tuple[str, ...], cwd: str) -> tuple[BindSpec, ...]:
    """Parse every --mount value (several lines in one value are several mounts), in order."""
    specs = []
    for value in values:
        bad = f"bad --mount {shown(value)!r}"
        records = csv_records(value, bad)
        if not records:
            raise BindSpecError(f"{bad}: empty")
        specs += [parse_mount(record, cwd, bad) for record in records]
    return tuple(specs)


def parse_mount(fields: list[str], cwd: str, bad: str) -> BindSpec:
    """One `type=bind,src=...,dst=...[,ro]` record; the keys Apptainer knows, the others refused."""
    source = dest = ""
    readonly = False
    for field in fields:
        key, _, value = field.partition("=")
        if key == "type":
            if value != "bind":
                raise BindSpecError(f"{bad}: unsupported mount type {shown(value)!r}, only 'bind' is supported")
        elif key in _MOUNT_SOURCE + _MOUNT_DEST:
            if not value:
                raise BindSpecError(f"{bad}: {key} can't be empty")
            source, dest = (value, dest) if key in _MOUNT_SOURCE else (source, value)
        elif key in _MOUNT_READONLY:
            if value.lower() not in _TRUE_FALSE:
                raise BindSpecError(f"{bad}: {key} takes true or false, not {shown(value)!r}")
            readonly = _TRUE_FALSE[value.lower()]
        elif key == "nonested":
            pass  # Apptainer: not passed on to nested containers' binds; singpy passes none on
        elif key in ("image-src", "id"):
            raise BindSpecError(f"{bad}: {key}= (binding from inside an image file) is not supported by singpy")
        elif key == "bind-propagation":
            raise BindSpecError(f"{bad}: bind-propagation can't be set for one mount")
        else:
            raise BindSpecError(f"{bad}: unknown key {shown(key)!r} (expected type, source|src, "
                                "destination|dst|target, ro|readonly)")
    if not source or not dest:
        raise BindSpecError(f"{bad}: a mount needs a source and a destination")
    if not os.path.isabs(dest):
        raise BindSpecError(f"{bad}: destination {shown(dest)!r} is not absolute")
    source, dest = checked_pair(source, dest, cwd, bad=bad, onto_root="--mount can't replace the container's "
                                "root directory /")
    return BindSpec(source, dest, readonly)


def csv_records(text: str, bad: str) -> list[list[str]]:
    """`text` read as Go's encoding/csv reads it (Apptainer's parser): the same records, the same refusals.

    Fields are separated by commas, records by newlines (blank lines
    skipped); a field that starts with `"` is quoted: `""` inside is a
    quote, and it may hold commas and newlines. A quote anywhere else, or
    text after a closing quote, is an error, as there.
    """
    text = text.replace("\r\n", "\n")
    records: list[list[str]] = []
    at, end = 0, len(text)
    while at < end:
        if text[at] == "\n":
            at += 1
            continue
        fields: list[str] = []
        while True:
            field, at = _csv_field(text, at, bad)
            fields.append(field)
            if at < end and text[at] == ",":
                at += 1
                continue
            at += 1  # past the newline (or the end)
            break
        records.append(fields)
    return records


def _csv_field(text: str, at: int, bad: str) -> tuple[str, int]:
    """The field starting at `at`, and where it ends (at its `,`, newline or the end of `text`)."""
    if not text.startswith('"', at):
        stop = min((i for i in (text.find(",", at), text.find("\n", at)) if i >= 0), default=len(text))
        if '"' in text[at:stop]:
            raise BindSpecError(f'{bad}: a \'"\' inside a field that is not quoted (quote the whole field)')
        return text[at:stop], stop
    pieces = []
    at += 1
    while True:
        close = text.find('"', at)
        if close < 0:
            raise BindSpecError(f"{bad}: a quoted field is not closed")
        pieces.append(text[at:close])
        at = close + 1
        if not text.startswith('"', at):
            break
        pieces.append('"')  # "" is a quote
        at += 1
    if at < len(text) and text[at] not in ",\n":
        raise BindSpecError(f"{bad}: text after the closing quote of a field")
    return "".join(pieces), at

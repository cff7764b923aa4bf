"""Singularity/Apptainer definition files, parsed: stages, headers, sections, build arguments.

The first piece of `singpy build RECIPE.def` (issue 12); nothing runs a
section yet. The rules are Apptainer 1.4's ([1] pkg/build/types/parser/
deffile.go, [2] internal/pkg/build/args/reader.go), with one difference:
every error names the file and line.

* A file is one or more **stages**, each starting at a line that begins
  with `Bootstrap:` (any case); text before the first one is a stage of its
  own when it holds anything.
* A stage's **header** is its lines before the first section: `Key: value`,
  keys case-insensitive and from Apptainer's list, `#` starting a comment,
  a trailing `\\` continuing the value on the next line.
* A **section** starts at a line whose first word begins with `%`: the
  name (case-insensitive) and the rest of the line (`%files from build`,
  `%post -c /bin/bash`, `%apprun NAME`) are kept; its body is every line up
  to the next section, verbatim (scripts keep their comments).
* **Build arguments**: `{{ NAME }}` is replaced, on every line that is not a
  comment, by the value given to the build (`--build-arg`) or else the
  stage's `%arguments` default (`NAME=value` lines); a name with neither is
  an error. Defaults may refer to other arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from singpy.errors import SingpyError
from singpy.record import Record

SECTIONS = ("help", "setup", "files", "labels", "environment", "pre", "post", "runscript", "test", "startscript",
            "arguments")
APP_SECTIONS = ("appinstall", "applabels", "appfiles", "appenv", "apptest", "apphelp", "apprun", "appstart")
HEADERS = ("bootstrap", "from", "includecmd", "mirrorurl", "updateurl", "osversion", "include", "library",
           "registry", "namespace", "stage", "product", "user", "regcode", "productpgp", "registerurl", "modules",
           "fingerprints", "confurl", "setopt", "target", "frontend", "filename", "buildargs")
_NUMBERED_HEADER = re.compile(r"otherurl\d+")  # otherurl0, otherurl1 ... (Apptainer's "otherurl&n")
_STAGE_START = re.compile(r"bootstrap:", re.IGNORECASE)
_BUILD_ARG = re.compile(r"{{\s*(\w+)\s*}}")
_COMMENT = re.compile(r"#[^!]")  # a comment, not a #! line ([2] commentLineRegexp)


class DefinitionError(SingpyError):
    """A definition file that can't be parsed; the message carries file:line."""


class Section(Record):
    name: str  # lower case, without the %: "post", "files", "apprun"
    args: str  # the rest of the section line: "from build", "-c /bin/bash", an app's name
    body: str  # the lines up to the next section, verbatim
    line: int  # line number of the section line in the file


class Stage(Record):
    header: tuple[tuple[str, str], ...]  # (lower-case key, value), in order
    sections: tuple[Section, ...]  # in order; a name may come more than once (bodies then add up)
    line: int  # line number where the stage starts

    def get(self, key: str, default: str = "") -> str:
        """A header value: `stage.get("bootstrap")`."""
        return next((value for name, value in self.header if name == key), default)

    def script(self, name: str) -> str:
        """The body of every section called `name`, joined in order (as Apptainer joins repeated sections)."""
        return "".join(section.body for section in self.sections if section.name == name)

    def args(self, name: str) -> str:
        """The args of the section line called `name`: with repeated sections, those of the last line
        that has some (`%post -c /bin/bash`), as Apptainer's parser keeps them."""
        return next((section.args for section in reversed(self.sections) if section.name == name and section.args),
                    "")


class Definition(Record):
    stages: tuple[Stage, ...]
    consumed: tuple[str, ...]  # build arguments used, sorted: `--build-arg` values not in it are unused


def parse(text: str, origin: str, build_args: Mapping[str, str] | None = None) -> Definition:
    """Every stage of a definition file (its text, named `origin` in messages)."""
    lines = text.splitlines(keepends=True)
    starts = [number for number, line in enumerate(lines) if _STAGE_START.match(line)]
    if not starts or any(line.strip() and not line.lstrip().startswith("#") for line in lines[:starts[0]]):
        starts.insert(0, 0)
    bounds = list(zip(starts, [*starts[1:], len(lines)], strict=True))
    consumed: set[str] = set()
    stages = []
    for first, end in bounds:
        stage = _stage(lines[first:end], first, origin, build_args or {}, consumed)
        if stage.header or stage.sections:
            stages.append(stage)
    if not stages:
        raise DefinitionError(f"{origin}: empty definition file (no header and no section)")
    return Definition(stages=tuple(stages), consumed=tuple(sorted(consumed)))


def _stage(lines: list[str], first: int, origin: str, build_args: Mapping[str, str], consumed: set[str]) -> Stage:
    chunks = _split_sections(lines, first)
    defaults = _argument_defaults(chunks, origin)
    chunks = [(number, [_substitute(line, number + offset, origin, build_args, defaults, consumed)
                        for offset, line in enumerate(body)]) for number, body in chunks]
    header_lines = chunks[0][1] if chunks and not _section_word(chunks[0][1][0]) else []
    sections = [_section(number, body, origin) for number, body in chunks if _section_word(body[0])]
    return Stage(header=_header(header_lines, first, origin), sections=tuple(sections), line=first + 1)


def _section_word(line: str) -> str:
    """The section name when `line` starts a section ("" otherwise)."""
    words = line.split(None, 1)
    return words[0][1:].lower() if words and words[0].startswith("%") else ""


def _split_sections(lines: list[str], first: int) -> list[tuple[int, list[str]]]:
    """(line number of its first line, its lines) for the header and each section."""
    chunks: list[tuple[int, list[str]]] = []
    for offset, line in enumerate(lines):
        if not chunks or _section_word(line):
            chunks.append((first + offset + 1, [line]))
        else:
            chunks[-1][1].append(line)
    return chunks


def _section(number: int, body: list[str], origin: str) -> Section:
    name = _section_word(body[0])
    head = body[0].strip()
    args = head.split(None, 1)[1].strip() if len(head.split(None, 1)) == 2 else ""
    if name in APP_SECTIONS:
        if not args:
            raise DefinitionError(f"{origin}:{number}: %{name} needs the name of an app")
    elif name not in SECTIONS:
        raise DefinitionError(f"{origin}:{number}: invalid section %{name}",
                              hint=f"sections are %{', %'.join(SECTIONS)} and the %app* ones")
    return Section(name=name, args=args, body="".join(body[1:]), line=number)


def _header(lines: list[str], first: int, origin: str) -> tuple[tuple[str, str], ...]:
    header: dict[str, str] = {}
    key, value, continued = "", "", False
    for offset, raw in enumerate(lines):
        number = first + offset + 1
        line = raw.strip()
        if not line or line.startswith("#"):
            continued = False
            continue
        line = line.split("#", 1)[0].strip()
        if continued:
            value += line
        else:
            key, colon, value = line.partition(":")
            if not colon:
                raise DefinitionError(f"{origin}:{number}: header line {line!r} has no value (expected Key: value)")
            key, value = key.strip().lower(), value.strip()
            if key not in HEADERS and not _NUMBERED_HEADER.fullmatch(key):
                raise DefinitionError(f"{origin}:{number}: invalid header keyword {key!r}")
        continued = value.endswith("\\")
        value = value.removesuffix("\\")
        header[key] = value
    return tuple(header.items())


def _argument_defaults(chunks: list[tuple[int, list[str]]], origin: str) -> dict[str, str]:
    """The stage's %arguments: NAME=value lines (comments and blank lines skipped)."""
    defaults: dict[str, str] = {}
    for number, body in chunks:
        if _section_word(body[0]) != "arguments":
            continue
        for offset, raw in enumerate(body[1:], start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, equals, value = line.partition("=")
            if not equals or not re.fullmatch(r"\w+", name.strip()):
                raise DefinitionError(f"{origin}:{number + offset}: %arguments line {line!r} is not NAME=value")
            defaults[name.strip()] = value.strip().strip("\"'")
    return defaults


def _substitute(line: str, number: int, origin: str, build_args: Mapping[str, str], defaults: Mapping[str, str],
                consumed: set[str]) -> str:
    """`{{ NAME }}` replaced unless a comment comes before it on its line; a default's own `{{ X }}` once.

    As Apptainer does ([2]): `cmd #note {{ X }}` keeps its `{{ X }}`, a
    `#!` is not a comment.
    """
    if "{{" not in line:
        return line

    def value(match: re.Match[str]) -> str:
        if _COMMENT.search(line, 0, match.start()):
            return match.group(0)
        name = match.group(1)
        found = build_args.get(name, defaults.get(name))
        if found is None:
            raise DefinitionError(f"{origin}:{number}: build argument {name} is not defined through either "
                                  "--build-arg (--build-arg-file) or the %arguments section")
        consumed.add(name)
        return _BUILD_ARG.sub(lambda inner: build_args.get(inner.group(1), defaults.get(inner.group(1),
                                                                                         inner.group(0))), found)

    return _BUILD_ARG.sub(value, line)


def files_entries(section: Section) -> list[tuple[str, str]]:
    """%files lines as (source, destination); destination "" means the same path in the image."""
    entries = []
    for line in _content_lines(section):
        words = [quoted or plain for quoted, plain in re.findall(r'"([^"]*)"|(\S+)', line)]
        entries.append((words[0], words[1] if len(words) > 1 else ""))
    return entries


def labels(section: Section) -> list[tuple[str, str]]:
    """%labels lines as (name, value): the name is the first word, the value the rest of the line."""
    found = []
    for line in _content_lines(section):
        name, _, value = line.partition(" ") if " " in line else line.partition("\t")
        found.append((name, value.strip()))
    return found


def _content_lines(section: Section) -> list[str]:
    """The section's lines, stripped, without blank and comment lines."""
    return [line for line in (raw.strip() for raw in section.body.splitlines()) if line and not line.startswith("#")]

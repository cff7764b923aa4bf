"""%files: copies into a stage's root filesystem, from the host or from an earlier stage.

The rules are Apptainer 1.4's ([1] internal/pkg/build/files/copy.go,
files.go):

* a source is a pattern, expanded as bash would with globstar: `*`, `?`,
  `[...]`, `**` (any depth), `{a,b}`, `\\` quoting one character; `*` skips
  names starting with a dot unless the pattern's own name does. A pattern
  matching nothing is an error (Apptainer would leave it to cp to fail);
* an empty destination means the source's own path inside the image;
* the destination is resolved inside the rootfs, its links re-rooted there,
  a trailing `/` kept; missing parent directories are made, all of a
  destination ending in `/`; copying into an existing directory puts the
  source's name inside it;
* from the host, `cp -fLr`: links are followed on the host, where the user
  chose the files;
* from a stage, `cp -a`: the matched source's own links are followed inside
  the source rootfs, never on the host; links below it are copied as links.

Both root filesystems are untrusted. Destination paths are resolved here, so
the cp arguments hold no link; within a recursive copy, cp runs with
`--remove-destination`, so an image's `file -> /etc/passwd` in the way is
replaced, never written through, and a link where a directory is merged is an
error of cp's (it lstat()s the destination of anything not a regular file).
Special files (FIFOs, devices) are copied as such, never opened.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence

from singpy import console
from singpy.errors import ImageError
from singpy.mounts.rootpath import resolve

_CP_PATH = "/usr/bin:/bin"  # the system's cp, whatever $PATH says
_BRACES = re.compile(r"(?<!\\){([^{}]*,[^{}]*)}")  # an innermost {a,b} not quoted with a backslash


def copy_from_host(entries: Sequence[tuple[str, str]], rootfs: str, *, cwd: str) -> None:
    """Copy host files (patterns relative to `cwd`) into `rootfs`, links on the host followed."""
    cp = cp_command()
    rootfs = os.path.abspath(rootfs)  # cp runs in `cwd`
    for source, destination in entries:
        console.info(f"Copying {source} to {destination or source}")
        matches = _expand(source, _HostPaths(cwd))
        if not matches:
            raise ImageError(f"%files: no file matches {source}")
        for match in matches:
            target = _destination(rootfs, destination or match)
            run_cp([cp, "-fLr", "--remove-destination", "--", match, target], cwd=cwd,
                   what=f"{match} to {destination or match} in the image")


def copy_from_stage(entries: Sequence[tuple[str, str]], source_root: str, rootfs: str, *,
                    run: Callable[[list[str]], None]) -> None:
    """Copy files of an earlier stage's rootfs into `rootfs`, one `cp -a` argv per match given to `run`.

    `run` runs the argv (in the fakeroot user namespace when the files are
    owned by subordinate ids) and raises a SingpyError when it fails;
    `run_cp` does it on the host. Nothing of the source files is read here:
    only their directories are listed (patterns) and their links read.
    """
    cp = cp_command()
    source_root, rootfs = os.path.abspath(source_root), os.path.abspath(rootfs)
    for source, destination in entries:
        console.info(f"Copying {source} to {destination or source}")
        matches = _expand(_absolute(source), _StagePaths(source_root))
        if not matches:
            raise ImageError(f"%files: no file matches {source} in the stage")
        for match in matches:
            resolved = resolve(source_root, match)
            if not os.path.lexists(resolved):
                inside = resolved[len(source_root.rstrip("/")):] or "/"
                raise ImageError(f"%files: {match} in the stage leads to {inside}, which is not there")
            target = _destination(rootfs, destination or match)
            if os.path.isdir(target):  # the matched name, not that of what its link leads to ([1])
                target = os.path.join(target, os.path.basename(match.rstrip("/")))
            # -T: an existing directory of that name is merged into, never copied into as a subdirectory.
            run([cp, "-a", "-T", "--remove-destination", "--", resolved, target.rstrip("/") or "/"])


def cp_command() -> str:
    """The system's cp."""
    found = shutil.which("cp", path=_CP_PATH)
    if found is None:
        raise ImageError(f"%files needs cp, which is not in {_CP_PATH}")
    return found


def run_cp(argv: list[str], *, cwd: str | None = None, what: str | None = None) -> None:
    """Run a cp argv on the host; a failure is an ImageError with cp's last line of complaint.

    `what` names the copy in that message ("SRC to DST" of its two last arguments otherwise).
    """
    try:
        done = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
    except OSError as error:
        raise ImageError(f"%files: can't run {argv[0]}: {error.strerror}") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        if reason.startswith(f"{argv[0]}: "):  # cp names itself as it was run: the short name reads better
            reason = "cp: " + reason[len(argv[0]) + 2:]
        raise ImageError(f"%files: can't copy {what or f'{argv[-2]} to {argv[-1]}'}: {reason}")


def _absolute(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _destination(rootfs: str, guest: str) -> str:
    """Host path of `guest` inside `rootfs` (links re-rooted, a trailing slash kept), its parents made."""
    target = resolve(rootfs, guest)
    if guest.endswith("/") and not target.endswith("/"):
        target += "/"
    if not os.path.lexists(target):
        # The path holds no link any more: what is made is made inside the rootfs.
        wanted = target.rstrip("/") if target.endswith("/") else os.path.dirname(target)
        try:
            _make_directories(wanted)
        except OSError as error:
            raise ImageError(f"%files: can't create {guest} in the image: {error.strerror}") from None
    return target


def _make_directories(path: str) -> None:
    """`path` and its missing parents, each 0755 whatever the umask (as Apptainer's build makes them)."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.chmod(directory, 0o755)


class _HostPaths:
    """Pattern matching on the host: paths relative to the build's directory, links followed."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd

    def directory(self, path: str) -> str:
        return os.path.join(self.cwd, path) if path else self.cwd

    def entry(self, path: str) -> str:
        return os.path.join(self.cwd, path)


class _StagePaths:
    """Pattern matching inside a stage's rootfs: every link followed as a process inside would."""

    def __init__(self, root: str) -> None:
        self.root = root

    def directory(self, path: str) -> str:
        return resolve(self.root, path)

    def entry(self, path: str) -> str:
        """The entry itself (a link not followed) under its resolved parent."""
        parent, name = os.path.split(path.rstrip("/"))
        return os.path.join(resolve(self.root, parent), name) if name else self.root


_Paths = _HostPaths | _StagePaths


def _expand(pattern: str, paths: _Paths) -> list[str]:
    """The paths `pattern` matches, spelt as in the pattern (relative stays relative)."""
    found: list[str] = []
    for word in _expand_braces(pattern):
        for match in _glob(word, paths):
            if match not in found:
                found.append(match)
    return found


def _expand_braces(pattern: str) -> list[str]:
    """bash's brace expansion: `a{b,c}d` is `abd acd`, innermost braces first."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    words = [pattern[:match.start()] + choice + pattern[match.end():] for choice in match.group(1).split(",")]
    return [result for word in words for result in _expand_braces(word)]


def _glob(pattern: str, paths: _Paths) -> list[str]:
    trailing = pattern.endswith("/") and pattern.strip("/") != ""
    parts = [part for part in pattern.split("/") if part]
    candidates = ["/" if pattern.startswith("/") else ""]
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            candidates = [found for base in candidates for found in _recursive(base, paths, files=last)]
            continue
        regex = _component_regex(part)
        if regex is None:
            candidates = [_join(base, _unquote(part)) for base in candidates]
            continue
        hidden = part.startswith(".")
        candidates = [_join(base, name) for base in candidates for name in _listing(base, paths)
                      if (hidden or not name.startswith(".")) and regex.match(name)]
    found = [path for path in candidates if path and os.path.lexists(paths.entry(path))]
    if trailing:  # `dir*/`: directories only, spelt with their slash
        found = [f"{path}/" for path in found if os.path.isdir(paths.directory(path))]
    return found


def _recursive(base: str, paths: _Paths, *, files: bool) -> Iterator[str]:
    """`**`: `base` and what is below it (directories only unless `files`); no hidden names, no link
    to a directory descended into (bash's globstar)."""
    yield base
    for name in _listing(base, paths):
        if name.startswith("."):
            continue
        path = _join(base, name)
        is_dir = os.path.isdir(paths.entry(path)) and not os.path.islink(paths.entry(path))
        if is_dir:
            yield from _recursive(path, paths, files=files)
        elif files:
            yield path


def _listing(base: str, paths: _Paths) -> list[str]:
    """The names in directory `base`, sorted; [] when it is not a directory."""
    where = paths.directory(base)
    try:
        return sorted(os.listdir(where))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        raise ImageError(f"%files: can't list {base or '.'} to match a pattern: {error.strerror}") from None


def _join(base: str, name: str) -> str:
    return base + name if base in ("", "/") else f"{base}/{name}"


def _unquote(part: str) -> str:
    return re.sub(r"\\(.)", r"\1", part)


def _component_regex(part: str) -> re.Pattern[str] | None:
    """A regex for one name of a pattern; None when it has nothing to expand (a plain name)."""
    out: list[str] = []
    magic = False
    index = 0
    while index < len(part):
        char = part[index]
        if char == "\\" and index + 1 < len(part):
            out.append(re.escape(part[index + 1]))
            index += 2
            continue
        if char == "*":
            out.append(".*")
            magic = True
        elif char == "?":
            out.append(".")
            magic = True
        elif char == "[" and (bracket := _bracket(part, index)) is not None:
            out.append(bracket[0])
            magic = True
            index = bracket[1]
        else:
            out.append(re.escape(char))
        index += 1
    if not magic:
        return None
    try:
        return re.compile("".join(out) + r"\Z", re.DOTALL)
    except re.error:  # not expected (sets are built checked); were it to happen, no name matches
        return re.compile(r"(?!)")


# bash's POSIX classes ([[:name:]] in a bracket), ASCII as in Apptainer's Go regexps
_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": " \\t\\n\\r\\x0b\\x0c", "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}


def _bracket(part: str, start: int) -> tuple[str, int] | None:
    """The regex of the bracket expression at `start` and the index of its closing `]`; None when it has
    none (then `[` is itself).

    bash's rules: `!` or `^` first negates; a `]` first (after them) is one of
    the set; `[:name:]` a class (an unknown name adds nothing), `[.c.]` and
    `[=c=]` the character c; `a-z` a range (one backwards adds nothing);
    `\\` quotes the next character.
    """
    index = start + 1
    negate = index < len(part) and part[index] in "!^"
    index += negate
    items: list[str] = []
    first = True
    while index < len(part):
        char = part[index]
        if char == "]" and not first:
            return _set_regex(items, negate), index
        first = False
        if char == "[" and part[index + 1:index + 2] in (":", ".", "="):
            item, index = _bracket_term(part, index)
            items.append(item)
            continue
        low, index = _bracket_char(part, index)
        if part[index:index + 1] == "-" and part[index + 1:index + 2] not in ("", "]"):
            high, index = _bracket_char(part, index + 1)
            items.append(f"{_set_char(low)}-{_set_char(high)}" if low <= high else "")
        else:
            items.append(_set_char(low))
    return None


def _bracket_term(part: str, index: int) -> tuple[str, int]:
    """`[:name:]`, `[.c.]` or `[=c=]` at `index`: its regex and the index after it. Without its closing
    `:]` the `[` is dropped and what follows is read as plain characters (as bash does)."""
    kind = part[index + 1]
    close = part.find(kind + "]", index + 2)
    if close < 0:
        return ("", index + 1) if kind == ":" else (_set_char("["), index + 1)
    name = part[index + 2:close]
    if kind == ":":
        return _CLASSES.get(name, ""), close + 2
    return (_set_char(name) if len(name) == 1 else ""), close + 2  # no multi-character collating element


def _bracket_char(part: str, index: int) -> tuple[str, int]:
    """The set's character at `index` (`\\x` is x) and the index after it."""
    if part[index] == "\\" and index + 1 < len(part):
        return part[index + 1], index + 2
    return part[index], index + 1


def _set_char(char: str) -> str:
    return "\\" + char if char in "\\]^-[" else char


def _set_regex(items: list[str], negate: bool) -> str:
    body = "".join(items)
    if not body:  # only unknown classes or backwards ranges: nothing, or with `!` any character
        return "." if negate else "(?!)"
    return f"[{'^' if negate else ''}{body}]"

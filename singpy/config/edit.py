"""`singpy config global`: one directive of singpy.conf set, unset, read or reset, the rest of the file kept.

Apptainer's rules (its internal/app/apptainer/config_global_linux.go): the
value is a comma list, trimmed, duplicates dropped; `--set` of a list
directive (`bind path`, `allow net users`...) adds the values in front of
those already there, and of any other directive replaces its value; `--unset`
removes the values given (an error when none of them was there); `--get`
prints the file's values, comma-joined (nothing when the file does not set
the directive); `--reset` takes the directive back to its default. The
result must be a valid file (sysconf.parse) before anything is written.

Apptainer regenerates the whole file from its template; singpy edits only the
directive's own lines, so an administrator's comments and layout stay. A
directive the file lacks is written after its commented-out example
(`# allow ipc ns = yes`) when there is one, else at the end.

`rewrite` is the one writer (shared with singpy.config.subid): the new text
is written beside the file and renamed over it (nothing half-written), the
file's mode and owner kept; a file that is a mount point (a bind over
/etc/subuid) cannot be renamed over and is rewritten in place, as Apptainer
always does. A symbolic link is refused (Apptainer opens with O_NOFOLLOW).
"""

from __future__ import annotations

import errno
import os

from singpy.config import sysconf
from singpy.errors import ConfigError, UsageError
from singpy.host.hostfiles import current_umask, read_text, shown

OPERATIONS = ("set", "unset", "get", "reset")
# The list directives whose template sets values (Apptainer's `default:` tag, `bind path` in its apptainer.conf and
# in etc/singpy.conf alike: tests/unit/test_config_reset.py holds the two together): `--reset` writes them back,
# where the parsed default of a file without the lines stays empty.
TEMPLATE_LISTS: dict[str, tuple[str, ...]] = {"bind path": ("/etc/localtime", "/etc/hosts")}


def split_values(value: str) -> list[str]:
    """Apptainer's reading of a value: comma-separated, each trimmed, empty ones and repeats dropped."""
    values: list[str] = []
    for item in value.split(","):
        item = item.strip()
        if item and item not in values:
            values.append(item)
    return values


def known_directive(name: str) -> sysconf.Directive | None:
    """The directive `name` (None for an Apptainer directive singpy ignores); UsageError for any other."""
    name = " ".join(name.split())
    for directive in sysconf.DIRECTIVES:
        if directive.name == name:
            return directive
    if name in sysconf.APPTAINER_IGNORED:
        return None
    raise UsageError(f"{shown(name)!r} is not a valid configuration directive",
                     hint="docs/configuration.md lists them; `singpy config global --get NAME` reads one")


class ConfigFile:
    """The lines of a singpy.conf, and where each directive is set in them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines = read_text(path, what="configuration", error=ConfigError).splitlines()

    def _where(self, name: str) -> list[int]:
        return [index for index, line in enumerate(self.lines) if _key(line) == name]

    def values(self, name: str) -> list[str]:
        """The values the file sets, in order (each line a comma list for a list directive)."""
        found: list[str] = []
        for index in self._where(name):
            found += split_values(self.lines[index].partition("=")[2])
        return found

    def names(self) -> list[str]:
        """The directives the file sets, each once, in the order of their first lines."""
        return list(dict.fromkeys(key for key in map(_key, self.lines) if key))

    def first(self, name: str) -> str:
        """The value of the directive's first line, as written (trimmed); "" when the file does not set it."""
        where = self._where(name)
        return self.lines[where[0]].partition("=")[2].strip() if where else ""

    def replace(self, name: str, values: list[str], *, one_per_line: bool) -> None:
        """The directive's lines replaced by `values`, written where its first line (or its example) was."""
        where = self._where(name)
        at = where[0] if where else self._example(name)
        for index in reversed(where):
            del self.lines[index]
        if where:
            at = min(at, len(self.lines))
        new = [f"{name} = {value}" for value in values] if one_per_line else [f"{name} = {', '.join(values)}"]
        self.lines[at:at] = new if values else []

    def _example(self, name: str) -> int:
        """Where a new directive goes: after its commented-out example, else at the end of the file."""
        for index, line in enumerate(self.lines):
            if line.lstrip().startswith("#") and _key(line.lstrip()[1:]) == name:
                return index + 1
        return len(self.lines)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _key(line: str) -> str:
    """The directive a line sets ("" for a comment, a blank line or a line without `=`)."""
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or "=" not in stripped:
        return ""
    return " ".join(stripped.partition("=")[0].split())


def edit(config: ConfigFile, operation: str, name: str, value: str) -> str | None:
    """Apply one operation; the new text of the file, or for `get` the line to print (None: nothing)."""
    directive = known_directive(name)
    name = " ".join(name.split())
    is_list = directive is None or directive.kind == sysconf.LIST  # an ignored one: kept as Apptainer keeps it
    if not value.isprintable():  # a newline would write a directive of its own; a lone surrogate is no UTF-8
        raise UsageError(f"the value {value[:60]!r} of directive \"{name}\" holds a line break or a character that "
                         "is not printable UTF-8 text")
    values, current = split_values(value), config.values(name)
    if operation == "get":
        return ",".join(current) if current else None
    if operation == "set":
        if not values:
            raise UsageError(f'you must specify a value for directive "{name}"')
        if is_list:
            values = [item for item in values if item not in current] + current
        elif len(values) > 1:
            raise UsageError(f'directive "{name}" takes one value, not {len(values)}')
    elif operation == "unset":
        if not any(item in values for item in current):
            raise UsageError(f"value '{value}' not found for directive \"{name}\"")
        values = [item for item in current if item not in values]
    elif is_list:  # reset: a list back to its template's lines (empty for most)
        values = list(TEMPLATE_LISTS.get(name, ()))
    else:  # reset: another directive's default written out where the file set it
        values = [_default_text(directive)] if directive is not None and current else []
    config.replace(name, values, one_per_line=is_list)
    text = config.text()
    try:
        sysconf.parse(text, config.path)
    except ConfigError as error:
        raise ConfigError(f"configuration directive invalid: {error.message}") from None
    return text


def _default_text(directive: sysconf.Directive) -> str:
    if directive.kind == sysconf.BOOL:
        return "yes" if directive.default else "no"
    return str(directive.default)


def rewrite(path: str, text: str, *, create_mode: int | None = None) -> None:
    """Replace the file's content with `text` (see the module's docstring); its mode and owner are kept.

    With `create_mode` (`singpy confgen`), a file that does not exist is made, the same way, with that mode
    less the umask.
    """
    import tempfile

    owner: tuple[int, int] | None = None
    try:
        info = os.lstat(path)
    except OSError as error:
        if create_mode is None or error.errno != errno.ENOENT:
            raise ConfigError(f"can't open {shown(path)}: {error.strerror}") from None
        mode = create_mode & ~current_umask()
    else:
        if not os.path.isfile(path) or os.path.islink(path):
            raise ConfigError(f"{shown(path)} is not a regular file: refusing to rewrite it")
        if _is_mount_point(path):  # nothing can be renamed over it: no temporary file beside it either
            try:
                _in_place(path, text)
            except OSError as error:
                raise ConfigError(f"can't write {shown(path)}: {error.strerror}") from None
            return
        mode, owner = info.st_mode & 0o7777, (info.st_uid, info.st_gid)
    directory, base = os.path.split(os.path.abspath(path))
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    except OSError as error:
        raise ConfigError(f"can't write beside {shown(path)}: {error.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        if owner is not None:
            os.chown(temporary, *owner)
        try:
            os.rename(temporary, path)
            return
        except OSError as error:
            if error.errno != errno.EBUSY:  # the file is a mount point (a bind over it): rewritten in place below
                raise
        _in_place(path, text)
    except OSError as error:
        raise ConfigError(f"can't write {shown(path)}: {error.strerror}") from None
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _is_mount_point(path: str) -> bool:
    """Whether `path` is itself a mount point (a file bound over /etc/subuid), from mountinfo(5)."""
    from singpy.kernel.mountinfo import mount_points

    try:
        return os.path.realpath(path) in mount_points()
    except OSError:
        return False


def _in_place(path: str, text: str) -> None:
    """Write the whole text over the file's start, then cut what is left of the old one, under a lock."""
    import fcntl

    data = text.encode()
    handle = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        written = 0
        while written < len(data):
            written += os.pwrite(handle, data[written:], written)
        os.ftruncate(handle, len(data))
        os.fsync(handle)
    finally:
        os.close(handle)

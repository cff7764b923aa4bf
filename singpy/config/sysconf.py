"""singpy.conf: Apptainer's `key = value` format, parsed against a typed table.

Each directive is declared once in `DIRECTIVES` (name, kind, default, allowed
values, one line of documentation); the parser, the defaults and
docs/configuration.md all come from that table. Nothing is evaluated: values
are matched against their kind, and a bad line is reported as `file:line`.

Where singpy looks (first found wins): `--config FILE`, `$SINGPY_CONFIG`,
`/etc/singpy/singpy.conf`, then the `etc/singpy.conf` shipped beside the package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy.errors import ConfigError
from singpy.hostfiles import path_problem, read_text, shown
from singpy.record import Record

BOOL, CHOICE, STRING, LIST, INT = "bool", "choice", "string", "list", "int"


class Directive(Record, kw_only=False):
    name: str  # as written in the file, e.g. "mount home"
    kind: str  # BOOL, CHOICE, STRING, LIST (may repeat) or INT
    default: object  # value when the file does not set it
    doc: str  # one line for docs/configuration.md
    allowed: tuple[str, ...] = ()  # for CHOICE


DIRECTIVES: tuple[Directive, ...] = (
    Directive("bind path", LIST, (), "host path bound into every container (src[:dst]); may repeat"),
    Directive("mount proc", BOOL, True, "mount /proc in the container"),
    Directive("mount sys", BOOL, True, "mount /sys in the container"),
    Directive("mount dev", CHOICE, "yes", "bind the host /dev (yes), a minimal /dev (minimal) or none (no)",
              ("yes", "no", "minimal")),
    Directive("mount devpts", BOOL, True, "mount a private devpts instance with a minimal /dev"),
    Directive("mount home", BOOL, True, "bind the user's home directory"),
    Directive("mount tmp", BOOL, True, "bind the host /tmp and /var/tmp"),
    Directive("mount hostfs", BOOL, False, "bind every host filesystem mount point into the container"),
    Directive("user bind control", BOOL, True, "allow users to ask for their own binds (--bind)"),
    Directive("allow pid ns", BOOL, True, "allow --pid (a new PID namespace)"),
    Directive("config passwd", BOOL, True, "add the user to the container's /etc/passwd"),
    Directive("config group", BOOL, True, "add the user's group to the container's /etc/group"),
    Directive("config resolv_conf", BOOL, True, "bind the host /etc/resolv.conf"),
    Directive("always use nv", BOOL, False, "act as if --nv were given on every run"),
    Directive("always use rocm", BOOL, False, "act as if --rocm were given on every run"),
    Directive("use nvidia-container-cli", BOOL, True,
              "find NVIDIA libraries with nvidia-container-cli when it is present (no: nvliblist.conf only)"),
    Directive("nvidia-container-cli path", STRING, "", "path of nvidia-container-cli (empty: search PATH)"),
    Directive("ldconfig path", STRING, "/sbin/ldconfig", "ldconfig used to read the host library cache"),
    Directive("root default capabilities", CHOICE, "full",
              "capabilities root keeps in the container: all, those capability.json grants root, or none",
              ("full", "file", "no")),
    Directive("allow net users", LIST, (),
              "users allowed to ask for a network other than none (comma list); may repeat"),
    Directive("allow net networks", LIST, (), "networks those users may ask for (comma list); may repeat"),
    Directive("network bridge name", STRING, "singpy0", "host bridge of --network bridge (made if missing)"),
    Directive("network bridge subnet", STRING, "10.22.0.0/16",
              "IPv4 subnet of --network bridge; its first address is the bridge's"),
    Directive("network ptp subnet", STRING, "10.23.0.0/16",
              "IPv4 subnet of --network ptp; its first address is the host end's"),
    Directive("unsquash", BOOL, False, "always extract SIF/squashfs images instead of mounting them"),
    Directive("allow kernel squashfs", BOOL, True, "let root mount SIF/squashfs images with the kernel's "
              "squashfs on a loop device (no: squashfuse or extraction)"),
)

_BY_NAME = {directive.name: directive for directive in DIRECTIVES}
_PROGRAM_PATHS = ("nvidia-container-cli path", "ldconfig path")  # run by singpy: checked like bind paths
_TRUE, _FALSE = ("yes", "true", "1"), ("no", "false", "0")


class SysConfig(Record, kw_only=False):
    """Parsed settings by directive name; every directive has a value."""

    path: str  # the file read ("" for built-in defaults)
    values: Mapping[str, object]

    def get(self, name: str) -> object:
        return self.values[name]

    def flag(self, name: str) -> bool:
        return bool(self.values[name])

    def text(self, name: str) -> str:
        return str(self.values[name])

    def items(self, name: str) -> tuple[str, ...]:
        value = self.values[name]
        assert isinstance(value, tuple)
        return value


SYSTEM_PATH = "/etc/singpy/singpy.conf"
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "etc")


def default_path(env: Mapping[str, str]) -> str:
    """The singpy.conf to read when --config is not given."""
    if env.get("SINGPY_CONFIG"):
        return env["SINGPY_CONFIG"]
    if os.path.exists(SYSTEM_PATH):
        return SYSTEM_PATH
    return os.path.join(SHIPPED_DIR, "singpy.conf")


def load(path: str) -> SysConfig:
    """Read and check `path`; a missing file is an error (an admin pointed at it).

    A FIFO, a device, a file over 1 MiB or one that is not UTF-8 text is
    refused with one line (singpy.hostfiles), never read without end.
    """
    return parse(read_text(path, what="configuration", error=ConfigError), path)


def parse(text: str, origin: str) -> SysConfig:
    values: dict[str, object] = {d.name: d.default for d in DIRECTIVES}
    lists: dict[str, list[str]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{number}"
        key, sep, value = line.partition("=")
        directive = _BY_NAME.get(" ".join(key.split()))
        if not sep or directive is None:
            raise ConfigError(f"{where}: unknown directive {shown(key.strip())!r}")
        value = value.strip()
        if directive.name == "bind path":
            _check_bind_path(value, where)
        elif directive.name in _PROGRAM_PATHS and path_problem(value):
            raise ConfigError(f"{where}: {directive.name} {shown(value)!r}: {path_problem(value)}")
        if directive.kind == LIST:
            lists.setdefault(directive.name, []).append(value)
        else:
            values[directive.name] = _convert(directive, value, where)
    values.update({name: tuple(items) for name, items in lists.items()})
    return SysConfig(origin, values)


def _check_bind_path(value: str, where: str) -> None:
    """`src[:dest]`, both absolute, usable by the kernel, and not the container's root itself.

    Checked here, with the line, because a relative path has no meaning for a
    bind made inside the container's root, and a path the kernel refuses
    (ENAMETOOLONG) would only fail, less clearly, in the middle of the launch.
    """
    parts = value.split(":")
    if len(parts) > 2 or not parts[0]:
        raise ConfigError(f"{where}: bind path must be src[:dest] (absolute paths), not {shown(value)!r}")
    for role, path in zip(("source", "destination"), parts, strict=False):
        if role == "destination" and not path:  # `src:` means the same path inside
            break
        if not path.startswith("/"):
            raise ConfigError(f"{where}: bind path {role} {shown(path)!r} is not an absolute path")
        problem = path_problem(path)
        if problem:
            raise ConfigError(f"{where}: bind path {role} {shown(path)!r}: {problem}")
    if os.path.normpath(parts[-1] or parts[0]).lstrip("/") == "":
        raise ConfigError(f"{where}: bind path {shown(value)!r} would replace the container's root directory /")


def _convert(directive: Directive, value: str, where: str) -> object:
    if directive.kind == BOOL:
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ConfigError(f"{where}: {directive.name} must be yes or no, not {value!r}")
    if directive.kind == CHOICE and value not in directive.allowed:
        allowed = ", ".join(directive.allowed)
        raise ConfigError(f"{where}: {directive.name} must be one of {allowed}, not {value!r}")
    if directive.kind == INT:
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{where}: {directive.name} must be a number, not {value!r}") from None
    return value


def defaults() -> SysConfig:
    return SysConfig("", {d.name: d.default for d in DIRECTIVES})


def confdir(config: SysConfig) -> str:
    """Directory holding the liblist files: the one singpy.conf was read from."""
    return os.path.dirname(config.path) if config.path else SHIPPED_DIR

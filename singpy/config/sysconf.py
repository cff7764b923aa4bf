"""singpy.conf: Apptainer's `key = value` format, parsed against a typed table.

Each directive is declared once in `DIRECTIVES` (name, kind, default, allowed
values, one line of documentation); the parser, the defaults and
docs/configuration.md all come from that table. Nothing is evaluated: values
are matched against their kind, and a bad line is reported as `file:line`.

Every directive of every Apptainer 1.x and Singularity/SingularityCE 3.x and 4.x
release is accepted, so an admin's file carries over unchanged
(tests/data/conf/directives.json lists them): those singpy acts on, or checks for
later use, are in `DIRECTIVES`; those it has no use for (`allow setuid`, ...) are in
`APPTAINER_IGNORED` and give one --verbose note each. Any other name is an error.

Where singpy looks (first found wins; `default_path`):
1. `--config FILE`;
2. `$SINGPY_CONFIG`;
3. `/etc/singpy/singpy.conf`;
4. `/etc/apptainer/apptainer.conf`, then `/etc/singularity/singularity.conf`;
5. the `singpy.conf` shipped with singpy: `etc/` beside the package in a clone,
   `<prefix>/etc/singpy/` once installed by pip or pipx;
6. built-in defaults (`defaults()`), when none of these exists.
The GPU library lists (nvliblist.conf, rocmliblist.conf) are read beside the file in use.
"""

from __future__ import annotations

import os
import sys

from singpy import console
from singpy.errors import ConfigError
from singpy.host.hostfiles import path_problem, read_text, shown
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Mapping, Sequence

BOOL, CHOICE, STRING, LIST, INT = "bool", "choice", "string", "list", "int"
_LATER = "(Apptainer's; read and checked, not applied by singpy yet)"
# Kernel interfaces newer than RHEL 8's 4.18 that singpy uses, each with a fallback (docs/kernels.md):
# mount_setattr (5.12), LOOP_CONFIGURE (5.8), overlayfs in a user namespace (5.11).
KERNEL_FEATURES = ("mount_setattr", "loop_configure", "userns_overlay")


class Directive(Record, kw_only=False):
    name: str  # as written in the file, e.g. "mount home"
    kind: str  # BOOL, CHOICE, STRING, LIST (comma list, may repeat) or INT (0 or more)
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
    Directive("mount slave", BOOL, True, "host mounts made later (automounted homes, project directories) show up "
              "in the container (no: its mounts are private)"),
    Directive("user bind control", BOOL, True, "allow users to ask for their own binds (--bind)"),
    Directive("allow pid ns", BOOL, True, "allow --pid (a new PID namespace)"),
    Directive("config passwd", BOOL, True, "add the user to the container's /etc/passwd"),
    Directive("config group", BOOL, True, "add the user's groups (primary and supplementary) to the container's "
              "/etc/group"),
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
              "users (names or ids) allowed to ask for a network other than none (comma list); may repeat"),
    Directive("allow net networks", LIST, (), "networks those users may ask for (comma list); may repeat"),
    Directive("network bridge name", STRING, "singpy0", "host bridge of --network bridge (made if missing)"),
    Directive("network bridge subnet", STRING, "10.22.0.0/16",
              "IPv4 subnet of --network bridge; its first address is the bridge's"),
    Directive("network ptp subnet", STRING, "10.23.0.0/16",
              "IPv4 subnet of --network ptp; its first address is the host end's"),
    Directive("unsquash", BOOL, False, "always extract SIF/squashfs images instead of mounting them"),
    Directive("unsquash in background", BOOL, True, "after a user's FUSE run of a SIF/squashfs image, unpack it "
              "into the user's cache in the background, for later runs (docs/images.md)"),
    Directive("unsquash in background max size", INT, 4096, "size in MiB of the largest squashfs partition "
              "unpacked in the background (larger images are always mounted with FUSE; 0: no limit)"),
    Directive("allow kernel extfs", BOOL, True, "let root mount ext3 images (overlays, Singularity 2.x images) with "
              "the kernel's ext3 on a loop device (no: fuse2fs, as for users; SingularityCE's directive)"),
    Directive("allow kernel squashfs", BOOL, True, "let root mount SIF/squashfs images with the kernel's "
              "squashfs on a loop device (no: squashfuse or extraction)"),
    # Apptainer's own directives (docs/configuration.md says how singpy applies each).
    Directive("allow ipc ns", BOOL, True, "allow --ipc (no: the container gets no IPC namespace, with a warning)"),
    Directive("allow uts ns", BOOL, True, "allow --uts and --hostname (no: they are ignored, with a warning)"),
    Directive("allow net groups", LIST, (), "groups (names or ids) whose members may ask for a network other than "
              "none (comma list); may repeat"),
    Directive("enable fusemount", BOOL, True, "allow --fusemount (FUSE programs serving mounts in the container)"),
    Directive("allow netns paths", LIST, (), "network namespaces (paths, comma list) the users of `allow net users` "
              "and `allow net groups` may join with --netns-path; may repeat"),
    Directive("enable overlay", CHOICE, "yes", "overlays (--overlay, --writable-tmpfs, mount points the image "
              "lacks): yes (try is yes), driver (always fuse-overlayfs) or no (none; see docs/overlays.md)",
              ("yes", "no", "try", "driver")),
    Directive("enable underlay", CHOICE, "yes", "mount points the image lacks without an overlay, as binds of the "
              "image's entries in tmpfs levels: yes (where the kernel refuses the overlay, or with enable overlay = "
              "no), preferred (always; --underlay asks for it too) or no (never; see docs/overlays.md)",
              ("yes", "no", "preferred")),
    Directive("avoid kernel features", LIST, (), "kernel interfaces singpy must not use, each replaced by its "
              "fallback (comma list: " + ", ".join(KERNEL_FEATURES) + "; see docs/kernels.md); may repeat"),
    Directive("sessiondir max size", INT, 64, "size in MiB of the staging tmpfs, which holds what --writable-tmpfs "
              "writes, for users other than root (0: no limit)"),
    Directive("max loop devices", INT, 256, "loop devices singpy may use: /dev/loop0 up to this number, excluded"),
    Directive("memory fs type", CHOICE, "tmpfs", "file system of the staging root, which holds what --writable-tmpfs "
              "writes (ramfs: no size limit)", ("tmpfs", "ramfs")),
    Directive("limit container owners", LIST, (),
              "users other than root may only use images and overlays owned by these users"),
    Directive("limit container groups", LIST, (),
              "users other than root may only use images and overlays owned by these groups"),
    Directive("limit container paths", LIST, (), "users other than root may only use images and overlays in these "
              "directories (absolute paths) or below them"),
    Directive("allow container sif", BOOL, True, "allow SIF images, as images or overlays (for users other than root)"),
    Directive("allow container encrypted", BOOL, True, "allow encrypted SIF images (for users other than root)"),
    Directive("allow container squashfs", BOOL, True, "allow bare squashfs images (for users other than root)"),
    Directive("allow container extfs", BOOL, True,
              "allow ext3 images: overlays, and Singularity 2.x images (for users other than root)"),
    Directive("allow container dir", BOOL, True,
              "allow sandbox directories and overlay directories (for users other than root)"),
)

# Directives of Apptainer 1.x and Singularity/SingularityCE 3.x-4.x that have no meaning for singpy (never
# setuid, no CNI, no build or download settings, no OCI mode): accepted with one --verbose note each, so a
# stock apptainer.conf or singularity.conf of any release loads. "apptheus socket path" is the name
# Apptainer's own template writes (its parser knows "apptheus communication socket path"); both occur in
# real files. "allow kernel overlay" is not a directive of any release's code, but SingularityCE documents it.
APPTAINER_IGNORED: frozenset[str] = frozenset({
    "allow setuid", "allow user ns",
    "allow setuid-mount encrypted", "allow setuid-mount squashfs", "allow setuid-mount extfs",
    "sync writable extfs", "shared loop devices", "cni configuration path", "cni plugin path",
    "binary path", "suidbinary path", "mksquashfs procs", "mksquashfs mem", "image driver",
    "download concurrency", "download part size", "download buffer size", "systemd cgroups",
    "apptheus communication socket path", "apptheus socket path", "allow monitoring",
    # Apptainer 1.0 (from Singularity) and Singularity/SingularityCE only:
    "mksquashfs path", "unsquashfs path", "cryptsetup path", "go path", "autofs bug path",
    "allow root capabilities", "allow user capabilities", "root search path", "user search path",
    "oci mode", "sif fuse", "tmp sandbox", "allow kernel overlay",
})

_BY_NAME = {directive.name: directive for directive in DIRECTIVES}
# What limits the images and overlays users may run (singpy.host.policy, loaded only when one of them is set).
IMAGE_LIMITS = ("limit container owners", "limit container groups", "limit container paths", "allow container sif",
                "allow container squashfs", "allow container extfs", "allow container dir")
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

    def number(self, name: str) -> int:
        value = self.values[name]
        assert isinstance(value, int)
        return value

    def changed(self, names: Sequence[str]) -> bool:
        """Whether any of these directives differs from its default: a cheap test before a policy is loaded."""
        return any(self.values[name] != _BY_NAME[name].default for name in names)


SYSTEM_PATH = "/etc/singpy/singpy.conf"
APPTAINER_PATHS = ("/etc/apptainer/apptainer.conf", "/etc/singularity/singularity.conf")
# In a clone (or an editable install) the repository's etc/; pip and pipx install the same
# files as data under <prefix>/etc/singpy/ (pyproject.toml), since a wheel carries no etc/.
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "etc")
INSTALLED_DIR = os.path.join(sys.prefix, "etc", "singpy")


def default_path(env: Mapping[str, str]) -> str:
    """The configuration to read when --config is not given; "" means the built-in defaults."""
    return choose_path(env, (SYSTEM_PATH, *APPTAINER_PATHS, *_shipped_paths()))


def choose_path(env: Mapping[str, str], candidates: Sequence[str]) -> str:
    """$SINGPY_CONFIG (even if absent: the user named it), else the first candidate that exists, else ""."""
    if env.get("SINGPY_CONFIG"):
        return env["SINGPY_CONFIG"]
    return next((path for path in candidates if os.path.exists(path)), "")


def _shipped_paths() -> tuple[str, str]:
    return os.path.join(SHIPPED_DIR, "singpy.conf"), os.path.join(INSTALLED_DIR, "singpy.conf")


def shipped_path() -> str:
    """The singpy.conf shipped with singpy (every directive at its default), "" when neither copy exists."""
    return next((path for path in _shipped_paths() if os.path.isfile(path)), "")


def load(path: str) -> SysConfig:
    """Read and check `path` ("": the built-in defaults); a missing file is an error (an admin pointed at it).

    A FIFO, a device, a file over 1 MiB or one that is not UTF-8 text is
    refused with one line (singpy.host.hostfiles), never read without end.
    """
    console.verbose(f"configuration: {path or 'built-in defaults'}")
    if not path:
        return defaults()
    return parse(read_text(path, what="configuration", error=ConfigError), path)


def parse(text: str, origin: str) -> SysConfig:
    values: dict[str, object] = {d.name: d.default for d in DIRECTIVES}
    lists: dict[str, list[str]] = {}
    noted: set[str] = set()
    given: dict[str, str] = {}  # a single-value directive: where it was set
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{origin}:{number}"
        key, sep, value = line.partition("=")
        name = " ".join(key.split())
        if sep and name in APPTAINER_IGNORED:
            _note_ignored(name, where, noted)
            continue
        directive = _BY_NAME.get(name)
        if not sep or directive is None:
            raise ConfigError(f"{where}: unknown directive {shown(key.strip())!r}")
        value = value.strip()
        if directive.name in _PROGRAM_PATHS and path_problem(value):
            raise ConfigError(f"{where}: {directive.name} {shown(value)!r}: {path_problem(value)}")
        if directive.kind == LIST:
            lists.setdefault(directive.name, []).extend(_list_items(directive, value, where))
        elif directive.name in given:  # Apptainer's parser keeps every line and reads the first
            console.verbose(f"{where}: {directive.name} given again: the value of {given[directive.name]} counts")
        else:
            values[directive.name] = _convert(directive, value, where)
            given[directive.name] = where
    values.update({name: tuple(items) for name, items in lists.items()})
    return SysConfig(origin, values)


def _note_ignored(name: str, where: str, noted: set[str]) -> None:
    """One --verbose line per directive: an admin's apptainer.conf loads, and says what singpy skips."""
    if name not in noted:
        noted.add(name)
        console.verbose(f"{where}: Apptainer directive {name!r} has no meaning for singpy: ignored")


def _list_items(directive: Directive, value: str, where: str) -> list[str]:
    """Apptainer's list directives are comma lists (`bind path = /etc/localtime,/etc/hosts`) and may repeat."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if directive.name == "bind path":
        for item in items or [value]:  # an empty `bind path =` is reported, not skipped
            _check_bind_path(item, where)
    if directive.name == "limit container paths":
        for item in items:  # a relative one would be relative to wherever the user runs singpy from
            if not item.startswith("/") or path_problem(item):
                raise ConfigError(f"{where}: limit container paths {shown(item)!r} is not a usable absolute path")
    if directive.name == "avoid kernel features":
        for item in items:
            if item not in KERNEL_FEATURES:
                raise ConfigError(f"{where}: avoid kernel features: unknown feature {shown(item)!r} "
                                  f"(known: {', '.join(KERNEL_FEATURES)})")
    return items


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
        # Apptainer's numbers are unsigned (strconv.ParseUint): a negative size or count is a mistake.
        if not value.isdecimal() or not value.isascii():
            raise ConfigError(f"{where}: {directive.name} must be a number (0 or more), not {shown(value)!r}")
        return int(value)
    return value


def for_build(config: SysConfig) -> SysConfig:
    """`--build-config`: what %post and %test run under (Apptainer's ApplyBuildConfig).

    The site's `bind path` entries are left out: a --writable build container
    invents no mount point, and an image should not depend on a site's binds.
    """
    return SysConfig(config.path, {**config.values, "bind path": (), "mount home": False, "mount devpts": False})


def defaults() -> SysConfig:
    return SysConfig("", {d.name: d.default for d in DIRECTIVES})


def confdir(config: SysConfig) -> str:
    """Directory holding the liblist files: the one the configuration was read from.

    With the built-in defaults, the shipped directory (the clone's etc/, else the
    installed <prefix>/etc/singpy/); beside apptainer.conf, Apptainer's own lists.
    """
    if config.path:
        return os.path.dirname(config.path)
    return SHIPPED_DIR if os.path.isdir(SHIPPED_DIR) else INSTALLED_DIR

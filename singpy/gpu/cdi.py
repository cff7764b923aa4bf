"""--device VENDOR/CLASS=NAME: Container Device Interface specs, applied by singpy itself.

A CDI spec (cncf-tags/container-device-interface SPEC.md, versions up to
0.8.0) is a JSON or YAML file in /etc/cdi or /var/run/cdi (--cdi-dirs
replaces that list; a later directory wins for the same kind and device
name, as in the CDI library). It names a `kind` (`nvidia.com/gpu`), its
`devices` and, for each device and for the spec as a whole, the edits a
runtime makes to the container: device nodes, mounts, environment variables
and hooks. Every edit of a requested device and of its spec is applied:

* `deviceNodes`: the host node (`hostPath`, else `path`) must exist and
  match the spec's type/major/minor; it is bound at `path`, usable (dev), as
  --nv binds /dev/nvidia*. With --contain only those nodes are in /dev.
* `mounts`: bound `hostPath` -> `containerPath`, read-only with `ro`.
* `env`: injected as --env injects them (they survive --cleanenv), but
  literal: the spec's text, never evaluated (singpy.launch.launch). A name
  must be a shell name: the container's shell handles the injected names.
* `hooks`: singpy runs no hook binary. NVIDIA's two hooks are done here:
  `create-symlinks --link TARGET::LINK` becomes a read-only bind at LINK of
  the file TARGET names (the container gets the same content at the same
  path), and `update-ldcache --folder DIR` puts what ldconfig in the
  container would enter in its cache in /.singularity.d/libs (a tmpfs singpy
  owns, on every LD_LIBRARY_PATH): the spec's libraries in DIR under their
  sonames, and the links create-symlinks makes in DIR. They are links there
  (`singpy.gpu.libsdir`): each library is bound once, where the spec mounts
  it. NVIDIA's
  `disable-device-node-modification` and `enable-cuda-compat` are no-ops
  here (a --verbose note). Any other hook is refused.

Everything is checked before the launch: each problem is one GpuError
(a FATAL line), naming the spec file (and line) it comes from.
"""

from __future__ import annotations

import os
import stat

from singpy.constants import LIBS_DIR
from singpy.env.environ import is_protected, is_valid_name
from singpy.errors import GpuError
from singpy.gpu import CDI_DIRS, CDI_SPEC_SUFFIXES, GpuContribution
from singpy.gpu.cdiparse import parse
from singpy.gpu.libsdir import libs_dir_mounts, link_notes
from singpy.plan import Missing, MountOp, MountSpec, Stage
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

NEWEST_VERSION = (0, 8, 0)
SPEC_LIMIT = 16 << 20  # a generated spec for 8 GPUs with MIG is ~100 KB
# Characters after the first (an ASCII letter or digit) of a CDI vendor, class and device name (the CDI
# library's parser rules); checked by hand: `import re` alone costs ~10 ms of start-up here.
_VENDOR_CHARS = frozenset(".-")
_CLASS_CHARS = frozenset("_.-")
_DEVICE_CHARS = frozenset("_.:-")
_HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
_HOOK_PROGRAMS = ("nvidia-cdi-hook", "nvidia-ctk")
_NOOP_HOOKS = {
    "disable-device-node-modification": "the container can't create device nodes anyway",
    "enable-cuda-compat": "the image's CUDA forward-compatibility libraries are not preferred (as with --nv)",
}
# Mount options that singpy's read-only, nosuid binds honour or that change nothing for one container.
_MOUNT_OPTIONS = {"ro", "rw", "bind", "rbind", "nosuid", "nodev", "private", "rprivate", "slave", "rslave",
                  "shared", "rshared", "relatime", "norelatime", "noatime", "strictatime", "nodiratime"}
_EDIT_FIELDS = {"env", "deviceNodes", "mounts", "hooks"}


class CdiDevice(Record, kw_only=False):
    """One requested device: `kind=name`, found in `spec`."""

    kind: str
    name: str
    spec: str  # the file defining it
    edits: Mapping[str, object]  # its containerEdits


class _Spec(Record, kw_only=False):
    path: str
    kind: str
    devices: Mapping[str, Mapping[str, object]]  # name -> containerEdits
    edits: Mapping[str, object]  # the spec's own containerEdits


def parse_names(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """--device values (comma lists allowed) as (kind, name), in order, without repeats."""
    found: dict[tuple[str, str], None] = {}
    for value in values:
        for item in value.split(","):
            kind, _, name = item.strip().partition("=")
            if not (is_kind(kind) and _is_word(name, _DEVICE_CHARS)):
                raise GpuError(f"bad --device {item!r}: expected a CDI device name VENDOR/CLASS=NAME "
                                 "(nvidia.com/gpu=all, nvidia.com/gpu=0, amd.com/gpu=GPU-...)")
            found[(kind, name)] = None
    return tuple(found)


def is_kind(kind: str) -> bool:
    """VENDOR/CLASS: "nvidia.com/gpu"."""
    vendor, slash, device_class = kind.partition("/")
    return bool(slash) and _is_word(vendor, _VENDOR_CHARS) and _is_word(device_class, _CLASS_CHARS)


def _is_word(text: str, more: frozenset[str]) -> bool:
    """An ASCII letter or digit, then letters, digits or `more`."""
    return bool(text) and text[0].isascii() and text[0].isalnum() and all(
        char.isascii() and (char.isalnum() or char in more) for char in text)


def discover(values: Iterable[str], dirs: Iterable[str] = CDI_DIRS, *, cache: str | None = None) -> GpuContribution:
    """What the requested CDI devices add to the launch; a GpuError for anything that can't be applied.

    `cache`: the user's cache directory, where the libraries' sonames are kept (singpy.gpu.sonames).
    """
    wanted = parse_names(values)
    dirs = tuple(dirs)
    specs = load_specs(dirs)
    devices = [resolve(kind, name, specs, dirs) for kind, name in wanted]
    edits = _Edits()
    for path in dict.fromkeys(device.spec for device in devices):  # each spec's own edits once
        spec = next(spec for spec in specs if spec.path == path)
        edits.add(spec.edits, f"{path} (containerEdits)")
    for device in devices:
        edits.add(device.edits, f"{device.spec} ({device.kind}={device.name})")
    return edits.contribution(cache=cache,
                              devices=", ".join(f"{device.kind}={device.name}" for device in devices))


def resolve(kind: str, name: str, specs: list[_Spec], dirs: tuple[str, ...]) -> CdiDevice:
    """The device `kind=name`: the spec of the latest directory defining it wins."""
    of_kind = [spec for spec in specs if spec.kind == kind]
    if not of_kind:
        kinds = sorted({spec.kind for spec in specs})
        have = f"the specs there define {', '.join(kinds)}" if kinds else "no CDI spec found there"
        raise GpuError(f"--device {kind}={name}: no CDI spec for kind {kind} in {', '.join(dirs)} ({have})",
                       hint="generate one (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml), or name its "
                            "directory with --cdi-dirs")
    defining = [spec for spec in of_kind if name in spec.devices]
    if not defining:
        names = sorted({device for spec in of_kind for device in spec.devices}, key=_natural)
        files = ", ".join(spec.path for spec in of_kind)
        raise GpuError(f"--device {kind}={name}: no device {name!r} in {files} (it has: {', '.join(names)})")
    spec = defining[-1]
    return CdiDevice(kind, name, spec.path, spec.devices[name])


def _natural(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isascii() and name.isdigit() and len(name) <= 18 else (1, name)


def load_specs(dirs: Iterable[str]) -> list[_Spec]:
    """Every spec file of `dirs` in priority order (lowest first); directories that don't exist are skipped."""
    specs: list[_Spec] = []
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as error:
            raise GpuError(f"can't read the CDI directory {directory}: {error.strerror}") from None
        specs += [read_spec(os.path.join(directory, name)) for name in names if name.endswith(CDI_SPEC_SUFFIXES)]
    return specs


def read_spec(path: str) -> _Spec:
    """One spec file, parsed and checked."""
    try:  # non-blocking: a FIFO or a tty among the specs is refused, never waited on (links are followed)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise GpuError(f"can't read the CDI spec {path}: {error.strerror}") from None
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GpuError(f"the CDI spec {path} is not a regular file")
        try:
            raw = handle.read(SPEC_LIMIT + 1)
        except OSError as error:
            raise GpuError(f"can't read the CDI spec {path}: {error.strerror}") from None
    if len(raw) > SPEC_LIMIT:
        raise GpuError(f"the CDI spec {path} is larger than {SPEC_LIMIT >> 20} MiB")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise GpuError(f"the CDI spec {path} is not UTF-8 text") from None
    data = parse(path, text)
    return _check_spec(path, data)


def _check_spec(path: str, data: object) -> _Spec:
    spec = _mapping(data, path, "the spec")
    version = spec.get("cdiVersion")
    parts = version.split(".") if isinstance(version, str) else []
    if len(parts) != 3 or not all(part.isascii() and part.isdigit() and len(part) <= 9 for part in parts):
        raise GpuError(f"CDI spec {path}: cdiVersion {version!r} is not a version (0.5.0)")
    if (int(parts[0]), int(parts[1])) > NEWEST_VERSION[:2]:
        newest = ".".join(map(str, NEWEST_VERSION))
        raise GpuError(f"CDI spec {path}: cdiVersion {version} is newer than {newest}, the newest singpy reads",
                       hint="generate the spec for an older CDI version (nvidia-ctk cdi generate --format/"
                            "--version), or update singpy")
    kind = spec.get("kind")
    if not isinstance(kind, str) or not is_kind(kind):
        raise GpuError(f"CDI spec {path}: kind {kind!r} is not VENDOR/CLASS (nvidia.com/gpu)")
    devices: dict[str, Mapping[str, object]] = {}
    for entry in _list(spec.get("devices"), path, "devices"):
        device = _mapping(entry, path, "a device")
        name = device.get("name")
        if not isinstance(name, str) or not _is_word(name, _DEVICE_CHARS):
            raise GpuError(f"CDI spec {path}: device name {name!r} is not valid")
        if name in devices:
            raise GpuError(f"CDI spec {path}: device {name!r} is defined twice")
        devices[name] = _mapping(device.get("containerEdits") or {}, path, f"device {name}'s containerEdits")
    if not devices:
        raise GpuError(f"CDI spec {path}: it defines no device")
    return _Spec(path, kind, devices, _mapping(spec.get("containerEdits") or {}, path, "containerEdits"))


def _mapping(value: object, path: str, what: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise GpuError(f"CDI spec {path}: {what} is not a mapping")
    return value


def _list(value: object, path: str, what: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise GpuError(f"CDI spec {path}: {what} is not a list")
    return value


def _text(value: object, path: str, what: str) -> str:
    """A non-empty string that can reach the kernel: no NUL, no lone surrogate."""
    if not isinstance(value, str) or not value:
        raise GpuError(f"CDI spec {path}: {what} is not a string")
    if "\0" in value or not value.isascii() and not _encodes(value):
        raise GpuError(f"CDI spec {path}: {what} holds a NUL or a lone surrogate (\\u0000, \\ud800)")
    return value


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class _Edits:
    """The container edits of every requested device and spec, gathered in order, then made mounts."""

    def __init__(self) -> None:
        self.nodes: dict[str, str] = {}  # container path -> host node
        self.mounts: dict[str, tuple[str, bool]] = {}  # container path -> (host path, read-only)
        self.sources: dict[str, os.stat_result] = {}  # host path of each mount -> what it is
        self.env: dict[str, str] = {}
        self.links: dict[str, str] = {}  # create-symlinks: link -> target (as written)
        self.folders: dict[str, None] = {}  # update-ldcache folders
        self.notes: list[str] = []
        self.warnings: list[str] = []

    def add(self, edits: Mapping[str, object], where: str) -> None:
        path = where.split(" (", 1)[0]
        unknown = sorted(str(field) for field in edits if field not in _EDIT_FIELDS)  # YAML keys: 5, ~ too
        if unknown:
            raise GpuError(f"CDI spec {where}: singpy can't apply {', '.join(unknown)}")
        for entry in _list(edits.get("env"), path, "env"):
            name, sep, value = _text(entry, path, "an env entry").partition("=")
            if not sep or not is_valid_name(name):  # the container's shell evaluates injected names
                raise GpuError(f"CDI spec {where}: env entry {entry!r} is not NAME=VALUE (NAME: letters, digits, _)")
            if is_protected(name):  # as --env HOME: Apptainer never lets injection replace it, nor singpy its own
                self.warnings.append(f"overriding {name} environment variable with the CDI spec {path} is "
                                     "not permitted")
                continue
            self.env[name] = value
        for entry in _list(edits.get("deviceNodes"), path, "deviceNodes"):
            self._node(_mapping(entry, path, "a device node"), where)
        for entry in _list(edits.get("mounts"), path, "mounts"):
            self._mount(_mapping(entry, path, "a mount"), where)
        for entry in _list(edits.get("hooks"), path, "hooks"):
            self._hook(_mapping(entry, path, "a hook"), where)

    def _node(self, node: Mapping[str, object], where: str) -> None:
        path = _text(node.get("path"), where, "a device node's path")
        given = node.get("hostPath")
        host = path if given in (None, "") else _text(given, where, "a device node's hostPath")
        if not os.path.isabs(path) or not os.path.isabs(host):
            raise GpuError(f"CDI spec {where}: device node {path} is not an absolute path")
        try:
            info = os.stat(host)
        except OSError:
            raise GpuError(f"CDI spec {where}: device node {host} does not exist on this host",
                           hint="the spec is stale (regenerate it: nvidia-ctk cdi generate), or the driver's "
                                "module is not loaded") from None
        kind = node.get("type")
        expected = {"c": stat.S_ISCHR, "u": stat.S_ISCHR, "b": stat.S_ISBLK, "p": stat.S_ISFIFO}
        if kind is not None and (not isinstance(kind, str) or kind not in expected):
            raise GpuError(f"CDI spec {where}: device node {path} has an unknown type {kind!r}")
        check = expected[kind] if isinstance(kind, str) else None
        if not (check(info.st_mode) if check else stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)):
            raise GpuError(f"CDI spec {where}: {host} is not a {_node_kind(kind)} device node on this host")
        for field, actual in (("major", os.major(info.st_rdev)), ("minor", os.minor(info.st_rdev))):
            wanted = node.get(field)
            if wanted is not None and wanted != actual:
                raise GpuError(f"CDI spec {where}: device node {host} is {os.major(info.st_rdev)}:"
                               f"{os.minor(info.st_rdev)} on this host, the spec says {field} {wanted}",
                               hint="the spec is stale: regenerate it (nvidia-ctk cdi generate)")
        self.nodes[path] = host

    def _mount(self, mount: Mapping[str, object], where: str) -> None:
        host = _text(mount.get("hostPath"), where, "a mount's hostPath")
        dest = _text(mount.get("containerPath"), where, "a mount's containerPath")
        kind = mount.get("type")
        if kind not in (None, "bind", "none"):
            raise GpuError(f"CDI spec {where}: mount of {dest} has type {kind!r}; singpy makes only bind mounts")
        options = [_text(option, where, "a mount option") for option in _list(mount.get("options"), where,
                                                                              "mount options")]
        unknown = [option for option in options if option not in _MOUNT_OPTIONS]
        if unknown:
            raise GpuError(f"CDI spec {where}: mount of {dest}: option {', '.join(unknown)} is not supported")
        if not os.path.isabs(host) or not os.path.isabs(dest):
            raise GpuError(f"CDI spec {where}: mount {host} -> {dest}: paths must be absolute")
        try:
            self.sources[host] = os.stat(host)
        except OSError:
            raise GpuError(f"CDI spec {where}: mount source {host} does not exist on this host",
                           hint="the spec is stale: regenerate it (nvidia-ctk cdi generate)") from None
        self.mounts[os.path.normpath(dest)] = (host, "ro" in options)

    def _hook(self, hook: Mapping[str, object], where: str) -> None:
        path = _text(hook.get("path"), where, "a hook's path")
        name = hook.get("hookName")
        args = [_text(arg, where, "a hook argument") for arg in _list(hook.get("args"), where, "hook args")]
        shown = " ".join([path, *args[1:]])
        program = os.path.basename(path)
        words = args[1:] if args and os.path.basename(args[0]) == program else args
        if program == "nvidia-ctk" and words[:1] == ["hook"]:
            words = words[1:]
        if name not in _HOOK_NAMES or program not in _HOOK_PROGRAMS or not words:
            raise GpuError(f"CDI spec {where}: hook `{shown}` is not one singpy knows; singpy runs no hook program",
                           hint="singpy does NVIDIA's create-symlinks and update-ldcache itself")
        command, options = words[0], words[1:]
        if command in _NOOP_HOOKS:
            self.notes.append(f"CDI hook {command}: not needed, {_NOOP_HOOKS[command]}")
            return
        flag = {"create-symlinks": "--link", "update-ldcache": "--folder"}.get(command)
        values = _flag_values(options, flag, {"--ldconfig-path"}) if flag else None
        if values is None:
            raise GpuError(f"CDI spec {where}: hook `{shown}` is not one singpy knows; singpy runs no hook program",
                           hint="singpy does NVIDIA's create-symlinks and update-ldcache itself")
        for value in values:
            if command == "update-ldcache":
                self.folders[os.path.normpath(value)] = None
                continue
            target, sep, link = value.partition("::")
            if not sep or not target or not os.path.isabs(link):
                raise GpuError(f"CDI spec {where}: create-symlinks --link {value!r} is not TARGET::/LINK")
            self.links[os.path.normpath(link)] = target

    def contribution(self, *, cache: str | None, devices: str) -> GpuContribution:
        specs = [MountSpec(op=MountOp.BIND, source=host, dest=path, dev=True, stage=Stage.GPU)
                 for path, host in self.nodes.items()]
        specs += [MountSpec(op=MountOp.BIND, source=host, dest=dest, readonly=readonly, stage=Stage.GPU)
                  for dest, (host, readonly) in self.mounts.items()]
        sonames = self._sonames(cache)
        for link, target in self.links.items():
            source = self._provider(link, target, sonames)
            if source is None:
                self.warnings.append(f"CDI link {link} -> {target}: {target} is not a file of the spec; "
                                     "made only where singpy may create it")
                specs.append(MountSpec(op=MountOp.SYMLINK, source=target, dest=link, missing=Missing.SKIP,
                                       stage=Stage.GPU))
            elif link not in self.mounts:
                specs.append(MountSpec(op=MountOp.BIND, source=source, dest=link, readonly=True, stage=Stage.GPU))
        specs += self._libs_dir(sonames)
        notes = [f"CDI {devices}: binding {spec.source} -> {spec.dest}" for spec in specs if spec.op == MountOp.BIND]
        notes += link_notes(specs)
        return GpuContribution(mounts=tuple(specs), env=tuple(self.env.items()),
                               libs_dir_used=any(spec.dest.startswith(f"{LIBS_DIR}/") for spec in specs),
                               warnings=tuple(self.warnings), notes=(*notes, *self.notes))

    def _sonames(self, cache: str | None) -> dict[str, str]:
        """update-ldcache's soname links: container path of the link -> container path of the library."""
        from singpy.gpu.sonames import sonames

        libraries = self._folder_libraries()
        names = sonames({host: self.sources[host] for host in libraries.values()}, cache)
        found: dict[str, str] = {}
        for dest, host in libraries.items():
            folder, name = os.path.split(dest)
            soname = names[host]
            if soname and soname != name and "/" not in soname:
                found.setdefault(os.path.join(folder, soname), dest)
        return found

    def _folder_libraries(self) -> dict[str, str]:
        """The libraries the spec mounts in an update-ldcache folder: container path -> host path."""
        return {dest: host for dest, (host, _) in self.mounts.items()
                if os.path.dirname(dest) in self.folders and ".so" in os.path.basename(dest)}

    def _provider(self, link: str, target: str, sonames: Mapping[str, str], depth: int = 0) -> str | None:
        """The host file a link leads to, through the spec's mounts, soname links and other links."""
        path = os.path.normpath(os.path.join(os.path.dirname(link), target))
        if path in self.mounts:
            return self.mounts[path][0]
        for dest, (host, _) in self.mounts.items():  # a file inside a mounted directory, and not out of it
            candidate = os.path.join(host, path[len(dest) + 1:])
            if path.startswith(dest + "/") and os.path.exists(candidate) and _inside(candidate, host):
                return candidate
        if depth < 8 and path in sonames:
            return self._provider(path, sonames[path], sonames, depth + 1)
        if depth < 8 and path in self.links and path != link:
            return self._provider(path, self.links[path], sonames, depth + 1)
        return None

    def _libs_dir(self, sonames: Mapping[str, str]) -> tuple[MountSpec, ...]:
        """update-ldcache's effect: the names ldconfig would enter in the cache, as links in /.singularity.d/libs.

        ldconfig keys its cache by soname: a library under its soname (under its
        own name when it has no other), and the links create-symlinks makes in
        the folders (libcuda.so). Every entry is an absolute link to where the
        spec mounts the library (`singpy.gpu.libsdir`): the libraries are bound
        once, at the spec's own paths.
        """
        links = [(os.path.basename(link), library) for link, library in sonames.items()]
        named = set(sonames.values())
        links += [(os.path.basename(dest), dest) for dest in self._folder_libraries() if dest not in named]
        for link, target in self.links.items():
            folder, name = os.path.split(link)
            if folder in self.folders:
                resolved = os.path.normpath(os.path.join(folder, target))
                links.append((name, sonames.get(resolved, resolved)))  # a soname link exists only here
        return libs_dir_mounts((), links)


def _inside(candidate: str, directory: str) -> bool:
    """Whether `candidate` is in `directory` once the host's links are followed (`sub -> /etc` leads out)."""
    return os.path.realpath(candidate).startswith(os.path.realpath(directory).rstrip("/") + "/")


def _node_kind(kind: object) -> str:
    return {"b": "block", "p": "fifo"}.get(kind, "character") if isinstance(kind, str) else "character or block"


def _flag_values(options: list[str], flag: str, ignored: set[str]) -> list[str] | None:
    """The values of `flag` (`--flag V` or `--flag=V`); None when another option is there."""
    values: list[str] = []
    index = 0
    while index < len(options):
        option, sep, inline = options[index].partition("=")
        if option not in (flag, *ignored):
            return None
        if sep:
            value = inline
            index += 1
        elif index + 1 < len(options):
            value = options[index + 1]
            index += 2
        else:
            return None
        if option == flag:
            values.append(value)
    return values

"""The default mounts every container gets, as Apptainer makes them.

Each function returns `MountSpec`s for one concern; the planner chains them in
`Stage` order. Nothing here touches the kernel or the image: the user's passwd
and group entries are merged with the image's files (`merge_passwd`,
`merge_group`) on the bytes singpy.mounts.apply read from it.

Where Apptainer skips a default mount that can't be made (its kernel, files,
tmp, cwd, hostfs and bind-path mounts: a warning, and the container starts),
the spec says `Missing.SKIP`; the home directory and the user's own binds are
`Missing.REQUIRED`, as there ([1] Apptainer container_linux.go, mountGeneric).
"""

from __future__ import annotations

import os

from singpy.errors import UsageError
from singpy.host.hostfiles import shown
from singpy.plan import Missing, MountOp, MountSpec, Stage

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Mapping

    from singpy.host.host import HostInfo

# Device nodes bind-mounted into a minimal /dev (a user namespace cannot mknod).
MINIMAL_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx"))
_HOSTNAME_MAX = 64  # HOST_NAME_MAX: what sethostname() takes
# Working directories that are never bound: they are the container's own.
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/sbin", "/sys",
               "/usr", "/var")


# What --no-mount names, as Apptainer: its `mount xxx` directives, `bind-paths` (every `bind path` entry and
# /etc/resolv.conf) and `cwd`; an absolute path names one `bind path` destination (or /etc/resolv.conf).
NO_MOUNT_NAMES = ("proc", "sys", "dev", "devpts", "home", "tmp", "hostfs", "cwd", "bind-paths")


def check_no_mount(names: list[str]) -> tuple[str, ...]:
    """--no-mount's names, checked: a known name or an absolute path (normalised), each once.

    Apptainer only warns about an unknown name and mounts everything; a typo
    (`--no-mount hmoe`) would then silently expose what the user meant to
    hide, so singpy refuses it.
    """
    import os.path

    checked: dict[str, None] = {}
    for raw in names:
        name = raw.strip()
        if name.startswith("/"):
            name = "/" + os.path.normpath(name).lstrip("/")
        elif name not in NO_MOUNT_NAMES:
            from singpy.errors import BindSpecError
            from singpy.host.hostfiles import shown

            raise BindSpecError(f"--no-mount: unknown mount {shown(name)!r} (expected {', '.join(NO_MOUNT_NAMES)} "
                                "or the absolute destination of a `bind path` entry)")
        checked[name] = None
    return tuple(checked)


def kernel_mounts(*, new_pid: bool, proc: bool, sys: bool, dev: str, devpts: bool = True) -> list[MountSpec]:
    """/proc, /sys and /dev. `dev` is "yes" (host /dev), "minimal" or "no"."""
    specs = []
    if proc:
        # A fresh procfs needs a PID namespace owned by our user namespace;
        # otherwise the host's /proc is bound, as Apptainer does.
        specs.append(MountSpec(op=MountOp.PROC if new_pid else MountOp.BIND, source=None if new_pid else "/proc",
                               dest="/proc", missing=Missing.SKIP, stage=Stage.KERNEL))
    if sys:
        specs.append(MountSpec(op=MountOp.BIND, source="/sys", dest="/sys", missing=Missing.SKIP, stage=Stage.KERNEL))
    if dev == "yes":
        specs.append(MountSpec(op=MountOp.BIND, source="/dev", dest="/dev", dev=True, missing=Missing.SKIP,
                               stage=Stage.KERNEL))
    elif dev == "minimal":
        specs += minimal_dev(devpts=devpts)
    return specs


def minimal_dev(*, devpts: bool = True) -> list[MountSpec]:
    """A tmpfs /dev with the usual nodes, a private devpts (`mount devpts`) and /dev/shm."""
    specs = [MountSpec(op=MountOp.TMPFS, dest="/dev", missing=Missing.SKIP, stage=Stage.KERNEL)]
    specs += [MountSpec(op=MountOp.BIND, source=f"/dev/{name}", dest=f"/dev/{name}", dev=True,
                        missing=Missing.SKIP, stage=Stage.KERNEL) for name in MINIMAL_DEV_NODES]
    if devpts:
        specs.append(MountSpec(op=MountOp.DEVPTS, dest="/dev/pts", missing=Missing.SKIP, stage=Stage.KERNEL))
    specs.append(MountSpec(op=MountOp.TMPFS, dest="/dev/shm", mode="1777", missing=Missing.SKIP,
                           stage=Stage.KERNEL))
    specs += [MountSpec(op=MountOp.SYMLINK, source=target, dest=f"/dev/{name}", missing=Missing.SKIP,
                        stage=Stage.KERNEL) for name, target in DEV_LINKS if devpts or name != "ptmx"]
    return specs


def identity_files(host: HostInfo, *, home: str, fakeroot: bool, passwd: bool, group: bool,
                   root: tuple[str, str, str] | None = None) -> list[MountSpec]:
    """The container's /etc/passwd and /etc/group: the image's, with the user merged in (`merge_passwd`,
    `merge_group`), as Apptainer's addIdentityMount.

    With --fakeroot the user is uid 0 inside: the entry merged is root's, the
    image's root line taking the home (/root), or, for an image without one, the
    host's (`root`: its name, gecos and shell, singpy.host.host.root_entry; where
    Apptainer 1.5 appends the user's own entry at their host uid); the groups stay
    the host's, as Apptainer writes them (their names for the host's gids, the
    user as member).
    """
    user, gecos, shell = (root or ("root", "root", "/bin/sh")) if fakeroot else (host.user, host.gecos, host.shell)
    uid, gid = (0, 0) if fakeroot else (host.uid, host.gid)
    # No /etc/group at all where the primary group has no name, as Apptainer (files.Group fails, a warning)
    groups = ((host.gid, host.group), *host.groups) if host.group else ()
    return identity_files_of((user, uid, gid, gecos, shell), groups, home=home, passwd=passwd, group=group,
                             member=host.user)


def unknown_group(gid: int) -> tuple[str, ...]:
    """Apptainer's warning (Go's os/user error) where the primary group has no name on the host: it writes no
    /etc/group then (files.Group), and neither does singpy."""
    return (f"group: unknown groupid {gid}",)


def identity_files_of(entry: tuple[str, int, int, str, str], groups: tuple[tuple[int, str], ...], *, home: str,
                      passwd: bool, group: bool, member: str = "") -> list[MountSpec]:
    """/etc/passwd with `entry` (name, uid, gid, gecos, shell) merged in, /etc/group with `groups` ((gid, name),
    `member` their member: the entry's name unless given): `identity_files`' and --security uid:/gid:'s
    (singpy.launch.security.target_identity)."""
    specs = []
    name, uid, gid, gecos, shell = entry
    if passwd:
        specs.append(MountSpec(op=MountOp.FILE, dest="/etc/passwd", readonly=True, missing=Missing.SKIP,
                               content=passwd_line(user=name, uid=uid, gid=gid, gecos=gecos, home=home, shell=shell),
                               stage=Stage.SYSTEM_FILES))
    lines = [group_line(group=group_name, gid=number, user=member or name) for number, group_name in groups if group]
    if lines:  # none where no group of the user's has an entry on the host: Apptainer skips a gid without one
        specs.append(MountSpec(op=MountOp.FILE, dest="/etc/group", content="\n".join(lines), readonly=True,
                               missing=Missing.SKIP, stage=Stage.SYSTEM_FILES))
    return specs


def host_files(bind_paths: tuple[str, ...], *, resolv_conf: bool) -> list[MountSpec]:
    """`bind path` entries of singpy.conf (src[:dst]) and /etc/resolv.conf; absent ones are skipped."""
    specs = []
    for entry in bind_paths:
        source, _, dest = entry.partition(":")
        specs.append(MountSpec(op=MountOp.BIND, source=source, dest=dest or source, missing=Missing.SKIP,
                               stage=Stage.SYSTEM_FILES))
    if resolv_conf:
        specs.append(MountSpec(op=MountOp.BIND, source="/etc/resolv.conf", dest="/etc/resolv.conf",
                               missing=Missing.SKIP, stage=Stage.SYSTEM_FILES))
    return specs


def kept_bind_paths(bind_paths: tuple[str, ...], skipped: set[str]) -> tuple[str, ...]:
    """The `bind path` entries --no-mount leaves: none with `bind-paths`, else those whose destination it does
    not name."""
    if "bind-paths" in skipped:
        return ()
    return tuple(entry for entry in bind_paths if _bind_path_dest(entry) not in skipped)


def _bind_path_dest(entry: str) -> str:
    """The destination of a `bind path` entry (src[:dst[:opts]]), normalised as --no-mount's paths are."""
    import os.path

    parts = entry.split(":")
    dest = parts[1] if len(parts) > 1 and parts[1] else parts[0]
    return "/" + os.path.normpath(dest).lstrip("/")


def home_mounts(*, source: str | None, dest: str, enabled: bool, asked: bool = False, no_layer: bool = False,
                covered: list[MountSpec] | None = None) -> list[MountSpec]:
    """The home directory: the host's `source`, or an empty tmpfs when there is none to bind.

    None is --contain's empty home, and a home whose host directory does not
    exist (Apptainer stages an empty session directory there, its issue #4208).
    `asked`: the user named it (--home SRC:DST), as a bind of their own.
    `no_layer`: the launch can add no mount point to the image (--writable...);
    the default home is then staged (`_staged_home`) over the planned mounts
    `covered`.
    """
    if not enabled:
        return []
    if source is None:
        spec = MountSpec(op=MountOp.TMPFS, dest=dest, stage=Stage.HOME_TMP)
    else:
        spec = MountSpec(op=MountOp.BIND, source=source, dest=dest, missing=Missing.REQUIRED, stage=Stage.HOME_TMP,
                         asked=asked)
    if no_layer and not asked:
        return _staged_home(spec, covered or [])
    return [spec]


def _staged_home(home: MountSpec, covered: list[MountSpec]) -> list[MountSpec]:
    """The default home where the image gets no layer of mount points: as Apptainer, a tmpfs of the launch on
    its first directory (/home), where the home's mount point is made (Apptainer binds its session directory's
    /home there, holding only the staged home); the image's own /home is hidden meanwhile.

    Never over a system directory (/usr, /var: a home in /var/lib/x would hide the image's /var, which
    Apptainer does) nor over a planned mount (a home in the host's /tmp is in that bind already). Either way,
    and where the image lacks that directory, the home is left out with a warning (Missing.SKIP, as
    Apptainer's other default mounts are), not made a FATAL error: the user did not ask for it.
    """
    home = home.replace(missing=Missing.SKIP)
    base = "/" + home.dest.strip("/").split("/")[0]
    if base == home.dest or base in SYSTEM_DIRS or any(_under(base, spec.dest) for spec in covered):
        return [home]
    return [MountSpec(op=MountOp.TMPFS, dest=base, missing=Missing.SKIP, stage=Stage.HOME_TMP), home]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def tmp_mounts(*, contain: bool, enabled: bool) -> list[MountSpec]:
    """/tmp and /var/tmp: the host's, or empty tmpfs under --contain."""
    if not enabled:
        return []
    if contain:
        return [MountSpec(op=MountOp.TMPFS, dest=path, mode="1777", missing=Missing.SKIP, stage=Stage.HOME_TMP)
                for path in ("/tmp", "/var/tmp")]
    return [MountSpec(op=MountOp.BIND, source=path, dest=path, missing=Missing.SKIP, stage=Stage.HOME_TMP)
            for path in ("/tmp", "/var/tmp")]


# Pseudo and memory filesystems are never "host filesystems" for `mount hostfs`.
_PSEUDO_FS = frozenset(("proc", "sysfs", "devtmpfs", "devpts", "tmpfs", "cgroup", "cgroup2", "mqueue", "debugfs",
                        "tracefs", "securityfs", "pstore", "bpf", "autofs", "hugetlbfs", "configfs", "fusectl",
                        "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs", "ramfs"))
_HOSTFS_SKIPPED_UNDER = ("/proc", "/sys", "/dev", "/run", "/boot", "/var/lib/docker")


def hostfs_mounts(mountinfo: str) -> list[MountSpec]:
    """`mount hostfs = yes`: every host mount point of a real filesystem, at the same path.

    Read from /proc/self/mountinfo lines ("id parent maj:min root mountpoint opts ... - fstype ...").
    The root and system directories stay the container's own, as Apptainer does.
    """
    from singpy.kernel.mountinfo import entries  # only with `mount hostfs = yes`

    under = tuple(f"{path}/" for path in _HOSTFS_SKIPPED_UNDER)
    specs = []
    for point, fstype, _ in entries(mountinfo):
        if fstype in _PSEUDO_FS or point in SYSTEM_DIRS or point.startswith(under):
            continue
        specs.append(MountSpec(op=MountOp.BIND, source=point, dest=point, missing=Missing.SKIP,
                               stage=Stage.SYSTEM_FILES))
    return list({spec.dest: spec for spec in specs}.values())


def cwd_mount(cwd: str, covered: list[MountSpec]) -> list[MountSpec]:
    """The working directory, unless it is a system directory or already bound."""
    if cwd in SYSTEM_DIRS or any(_covers(spec, cwd) for spec in covered):
        return []
    return [MountSpec(op=MountOp.BIND, source=cwd, dest=cwd, missing=Missing.SKIP, stage=Stage.HOME_TMP)]


def _covers(spec: MountSpec, path: str) -> bool:
    if spec.op != MountOp.BIND or spec.source is None or spec.source != spec.dest:
        return False
    return path == spec.dest or path.startswith(spec.dest.rstrip("/") + "/")


def hostname_file(hostname: str) -> MountSpec:
    """--hostname: the container's /etc/hostname, holding that name (Apptainer's addHostnameMount)."""
    return MountSpec(op=MountOp.FILE, dest="/etc/hostname", content=hostname, readonly=True, merge=False,
                     stage=Stage.SYSTEM_FILES)


def check_hostname(name: str) -> None:
    """A name sethostname() takes and that is a host name (RFC 1123 labels; `_` tolerated, as real clusters use it).

    The kernel takes any 64 bytes, newlines, `/` and control characters
    included, which would then break /etc/hosts, prompts and log lines.
    """
    bad = f"bad --hostname {shown(name)!r}"
    if not name or len(os.fsencode(name)) > _HOSTNAME_MAX:  # fsencode: argv may hold undecodable bytes
        raise UsageError(f"{bad}: a host name has 1 to {_HOSTNAME_MAX} characters")
    for label in name.split("."):
        if not label or len(label) > 63:
            raise UsageError(f"{bad}: each dot-separated label has 1 to 63 characters")
        if not label.isascii() or not label.replace("-", "").replace("_", "").isalnum():
            raise UsageError(f"{bad}: only letters, digits, '-', '_' and '.' may be used")
        if label.startswith("-") or label.endswith("-"):
            raise UsageError(f"{bad}: a label can't start or end with '-'")


def passwd_line(*, user: str, uid: int, gid: int, gecos: str, home: str, shell: str) -> str:
    """The user's passwd entry, as the plan carries it (merged with the image's by `merge_passwd`)."""
    _check_fields("/etc/passwd", user=user, gecos=gecos, home=home, shell=shell)
    return f"{user}:x:{uid}:{gid}:{gecos}:{home}:{shell}"


def group_line(*, group: str, gid: int, user: str) -> str:
    """One of the user's groups as the container's /etc/group gets it: the user its one member."""
    _check_fields("/etc/group", group=group, user=user)
    return f"{group}:x:{gid}:{user}"


def _check_fields(path: str, **fields: str) -> None:
    """Refuse a field that would not stay one field of one line: a ':' or a line break in it.

    The home can come from $HOME (a uid the host's passwd lacks) or --home's
    DEST; `HOME=$'/x\\nevil::0:0::/:/bin/sh'` would otherwise write a second entry.
    """
    for name, value in fields.items():
        if ":" in value or any(char in value for char in "\n\r"):
            from singpy.errors import SingpyError

            raise SingpyError(f"can't write the container's {path}: the {name} {value!r} holds a ':' or a line "
                              "break, which would split its entry",
                              hint="choose a home directory without them (--home, or $HOME for a user the "
                              "host's passwd lacks)" if name == "home" else None)


# The user's entries merged with the image's /etc/passwd and /etc/group, as Apptainer 1.5 does (its
# internal/pkg/util/fs/files/passwd.go and group.go). Pure functions on bytes: singpy.mounts.apply reads the image.

_INT64 = 1 << 63


def merge_passwd(image: bytes, entry: str) -> bytes:
    """The image's passwd with the user's `entry` (`passwd_line`) put in, as Apptainer writes it.

    The image's first line with the user's uid is rewritten in place: the host's
    name and gecos (for uid 0 the image's: root keeps its name), the home of
    `entry`, the image's gid and shell (a shell the image has); without one,
    `entry` is appended. Lines are Go's bufio.ScanLines (a CR before the newline
    dropped), joined with newlines. Raises ValueError for a line before the
    user's that is not a passwd entry, where Apptainer leaves the file alone.
    """
    name, _, uid_text, _, gecos, home, _ = entry.split(":")
    uid = int(uid_text)
    lines = image.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    for number, line in enumerate(lines):
        if line == b"":
            continue
        fields = _passwd_fields(line)
        if fields[2] != uid:
            continue
        image_name, _, _, image_gid, image_gecos, _, image_shell = fields
        if not 0 <= image_gid < 1 << 32:
            raise ValueError(f"{_quoted(line)} has a gid out of range")
        kept = (image_name, image_gecos) if uid == 0 else (os.fsencode(name), os.fsencode(gecos))
        lines[number] = b":".join((kept[0], b"x", str(uid).encode(), str(image_gid).encode(), kept[1],
                                   os.fsencode(home), image_shell))
        break
    else:
        lines.append(os.fsencode(entry))
    return b"\n".join(lines) + b"\n"


def _passwd_fields(line: bytes) -> tuple[bytes, bytes, int, int, bytes, bytes, bytes]:
    """A passwd line's fields as Apptainer's parser (etcpwdparse) reads them: 7, trimmed, decimal ids."""
    parts = line.strip().split(b":")
    if len(parts) != 7:
        raise ValueError(f"{_quoted(line)} is not a passwd entry (7 fields, separated by ':')")
    name, password, uid, gid, gecos, home, shell = parts
    return (name.strip(), password.strip(), _atoi(uid, line), _atoi(gid, line), gecos.strip(), home.strip(),
            shell.strip())


def _atoi(text: bytes, line: bytes) -> int:
    """Go's strconv.Atoi: an optional sign, decimal digits, within int64 (no spaces, no '_' as int() takes)."""
    digits = text[1:] if text[:1] in (b"+", b"-") else text
    if not digits.isdigit() or len(digits) > 19 or not -_INT64 <= int(text) < _INT64:
        raise ValueError(f"{_quoted(line)} has a badly formatted id")
    return int(text)


def _quoted(line: bytes) -> str:
    """An image's passwd line as a message quotes it: its first 100 bytes."""
    return f"line {line[:100]!r}" + ("..." if len(line) > 100 else "")


def merge_group(image: bytes, entries: str) -> bytes:
    """The image's group file as it is (a newline added after its last line) and the user's `entries` after it:
    their primary group, then the others (HostInfo.groups).

    As Apptainer: the image's groups are not looked at, not even one of the same
    name (glibc then finds the image's first); the new lines are not repeated.
    """
    if image and not image.endswith(b"\n"):
        image += b"\n"
    added = dict.fromkeys(line for line in entries.split("\n") if line)
    return image + b"".join(os.fsencode(line) + b"\n" for line in added)


def job_mounts(env: Mapping[str, str], *, contain: bool) -> list[MountSpec]:
    """What the ranks of a parallel job meet through on the host, visible inside as outside.

    Open MPI's shared-memory transport maps files in /dev/shm, which --contain
    replaces with a tmpfs of its own; PMIx servers (Slurm's in its spool
    directory, mpirun's in its session directory) keep their rendezvous files
    in PMIX_SERVER_TMPDIR and PMIX_SYSTEM_TMPDIR, which no default mount
    reaches. A rank without them can't find its peers.
    """
    specs = []
    if contain:
        specs.append(MountSpec(op=MountOp.BIND, source="/dev/shm", dest="/dev/shm", missing=Missing.SKIP,
                               stage=Stage.SYSTEM_FILES))  # after the minimal /dev (Stage.KERNEL)
    seen = set()
    for name in ("PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR"):
        path = os.path.normpath(env.get(name, "") or ".")
        under_tmp = not contain and path.startswith(("/tmp/", "/var/tmp/"))  # the host's, bound already
        if not path.startswith("/") or path == "/" or path in seen or under_tmp:
            continue
        seen.add(path)
        specs.append(MountSpec(op=MountOp.BIND, source=path, dest=path, missing=Missing.SKIP, stage=Stage.HOME_TMP))
    return specs

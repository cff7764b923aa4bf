"""Where the container's cgroup goes on this host, and its plan (singpy.plan.CgroupSpec).

Read-only: the cgroup filesystems mounted under /sys/fs/cgroup (from
/proc/self/mountinfo), the caller's cgroup (/proc/self/cgroup), and on cgroup
v2 which controllers the parent hands to its children. Root makes the
cgroup at the top of each hierarchy it needs; a user only below the highest
cgroup v2 directory that is theirs (a subtree delegated to them, as systemd
delegates user@UID.service): nowhere else may a user make or join a cgroup.
Each container's cgroup has a name of its own (`singpy-PID-RANDOM`), so two
launches never share one, and singpy never writes in a cgroup it did not make.
"""

from __future__ import annotations

import os

from singpy.cgroups.files import ACCOUNTING, v1_writes, v2_writes
from singpy.cgroups.limits import requested
from singpy.errors import SingpyError
from singpy.kernel.mountinfo import entries
from singpy.plan import CgroupSpec

CGROUP_ROOT = "/sys/fs/cgroup"
Mount = tuple[str, str, frozenset[str]]  # (mount point, "cgroup" or "cgroup2", the v1 controllers it holds)


def plan_cgroup(limits: tuple[tuple[str, object], ...], uid: int) -> CgroupSpec:
    """The cgroup of a launch with these limit flags (singpy.launch.request.LIMIT_OPTIONS), or one error why not."""
    asked, origin = requested(limits)
    mounts = cgroup_mounts()
    name = f"singpy-{os.getpid()}-{os.urandom(4).hex()}"
    if version(mounts) == 2:
        return _v2_spec(asked, mounts, uid, name, origin)
    if not mounts:
        raise SingpyError(f"resource limits need cgroups, and none is mounted on {CGROUP_ROOT}")
    if uid != 0:
        raise SingpyError("resource limits as an unprivileged user need cgroup v2 with a subtree delegated to you, "
                          "and this host runs cgroup v1: run as root, or on a host booted with cgroup v2 "
                          "(systemd.unified_cgroup_hierarchy=1) from a systemd user session")
    return _v1_spec(v1_writes(asked), mounts, name, origin)


def cgroup_mounts() -> list[Mount]:
    """The cgroup filesystems mounted on /sys/fs/cgroup or below it."""
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as mountinfo:
            text = mountinfo.read()
    except OSError:
        return []
    for point, fstype, options in entries(text):
        if fstype in ("cgroup", "cgroup2") and (point == CGROUP_ROOT or point.startswith(CGROUP_ROOT + "/")):
            found.append((point, fstype, frozenset(options.split(",")) if fstype == "cgroup" else frozenset()))
    return found


def version(mounts: list[Mount]) -> int:
    """2 where /sys/fs/cgroup itself is cgroup2 (unified); 1 otherwise (v1, or hybrid: the controllers are in v1)."""
    return 2 if any(point == CGROUP_ROOT and kind == "cgroup2" for point, kind, _ in mounts) else 1


def _v1_spec(writes: list[tuple[str, str, str]], mounts: list[Mount], name: str, origin: str) -> CgroupSpec:
    where: dict[str, str] = {}  # controller -> the cgroup's directory in its hierarchy
    for controller in (*dict.fromkeys(controller for controller, _, _ in writes), *ACCOUNTING):
        point = next((point for point, kind, options in mounts if kind == "cgroup" and controller in options), None)
        if point is not None:
            where[controller] = os.path.join(point, name)
        elif any(controller == used for used, _, _ in writes):
            raise SingpyError(f"cgroups: the {controller} controller is not mounted on this host (cgroup v1): "
                              f"its limits can't be applied")
    if "cpuset" in where:
        writes = _cpuset_complete(writes, os.path.dirname(where["cpuset"]))
    return CgroupSpec(version=1, dirs=tuple(dict.fromkeys(where.values())), origin=origin,
                      writes=tuple((os.path.join(where[controller], file), value)
                                   for controller, file, value in writes))


def _cpuset_complete(writes: list[tuple[str, str, str]], parent: str) -> list[tuple[str, str, str]]:
    """A v1 cpuset takes no process before both its cpus and mems are set: the one not asked, as its parent's."""
    given = {file for controller, file, _ in writes if controller == "cpuset"}
    inherited = []
    for file in ("cpuset.cpus", "cpuset.mems"):
        if file not in given:
            inherited.append(("cpuset", file, _read(os.path.join(parent, file))))
    return [*inherited, *writes]


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read(4096).strip()
    except (OSError, UnicodeDecodeError) as error:
        raise SingpyError(f"cgroups: can't read {path}: {getattr(error, 'strerror', error)}") from None


def _v2_spec(asked: dict[str, object], mounts: list[Mount], uid: int, name: str, origin: str) -> CgroupSpec:
    writes = v2_writes(asked)
    parent = CGROUP_ROOT if uid == 0 else delegated(uid)
    enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
    missing = sorted({controller for controller, _, _ in writes if controller} - enabled)
    if missing:
        whose = "the root cgroup" if uid == 0 else "your delegated cgroup"
        raise SingpyError(f"cgroups: the {', '.join(missing)} controller(s) are not enabled for the cgroups below "
                          f"{whose} {parent} (its cgroup.subtree_control holds: {' '.join(sorted(enabled)) or 'none'})"
                          f": the limits need them")
    directory = os.path.join(parent, name)
    return CgroupSpec(version=2, dirs=(directory,), origin=origin,
                      writes=tuple((os.path.join(directory, file), value) for _, file, value in writes))


def current(mount: str = CGROUP_ROOT) -> str:
    """The caller's cgroup v2 directory (its `0::` line of /proc/self/cgroup)."""
    for line in _read("/proc/self/cgroup").splitlines():
        if line.startswith("0::"):
            return os.path.normpath(mount + "/" + line[3:].lstrip("/"))
    raise SingpyError("cgroups: this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")


def delegated(uid: int) -> str:
    """The highest cgroup v2 directory above the caller that the user owns and may move processes in.

    Moving a process between two cgroups needs write access to the
    cgroup.procs of their common ancestor: the container's cgroup is made
    right below this one, so the user may move their own processes into it.
    """
    here = current()
    found = ""
    while here != CGROUP_ROOT and _owned(here, uid):
        found, here = here, os.path.dirname(here)
    if not found:
        raise SingpyError(f"resource limits as an unprivileged user need a cgroup v2 subtree delegated to you, and "
                          f"your cgroup {here} belongs to root: run singpy in a systemd user session (systemd "
                          f"delegates user@{uid}.service; `systemd-run --user --scope singpy ...`), or as root")
    return found


def _owned(directory: str, uid: int) -> bool:
    try:
        return (os.stat(directory).st_uid == uid and os.stat(os.path.join(directory, "cgroup.procs")).st_uid == uid
                and os.access(os.path.join(directory, "cgroup.procs"), os.W_OK))
    except OSError:
        return False

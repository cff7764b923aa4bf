"""Making the container's cgroup, moving a process into it, and removing it (singpy.plan.CgroupSpec).

`create` makes the directories and writes the limits before any process of
the container exists; whatever fails, what it made is removed. `join` moves
a process in (its children follow); `remove` kills what is left in the
cgroup (a daemon the payload left running) and removes the directories:
only those of the plan, which singpy made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time

from singpy.errors import SingpyError
from singpy.plan import CgroupSpec

_REMOVE_TIMEOUT = 5.0  # seconds to wait for the cgroup's last processes to be gone
_OURS = re.compile(r"singpy-([0-9]+)-[0-9a-f]{8}")  # the name singpy.cgroups.hierarchy gives a container's cgroup


def create(spec: CgroupSpec) -> None:
    made: list[str] = []
    for directory in spec.dirs:
        sweep(os.path.dirname(directory))
    try:
        for directory in spec.dirs:
            _mkdir(directory)
            made.append(directory)
        for path, value in spec.writes:
            _write(path, value, spec)
    except BaseException:
        _remove_dirs(made)
        raise


def _mkdir(directory: str) -> None:
    try:
        os.mkdir(directory, 0o755)
    except OSError as error:
        raise SingpyError(f"can't create the container's cgroup {directory}: {error.strerror}") from None


# v1 kernels whose block layer schedules with BFQ name the weights so (runc falls back the same way)
_BFQ = {"blkio.weight": "blkio.bfq.weight", "blkio.weight_device": "blkio.bfq.weight_device"}


def _write(path: str, value: str, spec: CgroupSpec) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        bfq = _BFQ.get(os.path.basename(path))
        if bfq is None or not os.path.exists(os.path.join(os.path.dirname(path), bfq)):
            raise SingpyError(f"cgroups ({spec.origin}): can't set {os.path.basename(path)}: this kernel has no such "
                              "cgroup file") from None
        _write(os.path.join(os.path.dirname(path), bfq), value, spec)
        return
    except OSError as error:
        raise SingpyError(f"cgroups ({spec.origin}): can't set {os.path.basename(path)}: {error.strerror}") from None
    try:
        os.write(fd, value.encode())
    except OSError as error:
        raise SingpyError(f"cgroups ({spec.origin}): the kernel refused {os.path.basename(path)} = {value}: "
                          f"{error.strerror}") from None
    finally:
        os.close(fd)


def join(spec: CgroupSpec, pid: int = 0) -> None:
    """Move `pid` (0: the caller) into the cgroup; its children from now on are born there."""
    for directory in spec.dirs:
        move(directory, pid or os.getpid())


def move(directory: str, pid: int) -> None:
    try:
        with open(os.path.join(directory, "cgroup.procs"), "w") as procs:
            procs.write(str(pid))
    except OSError as error:
        raise SingpyError(f"can't move process {pid} into the cgroup {directory}: {error.strerror}") from None


def origins(spec: CgroupSpec) -> tuple[str, ...]:
    """The caller's cgroups now, in the hierarchies of the plan's directories (to `leave` back to)."""
    from singpy.cgroups.hierarchy import cgroup_mounts, current

    if spec.version == 2:
        return (current(),)
    lines = {}
    with open("/proc/self/cgroup", encoding="ascii", errors="replace") as table:
        for line in table.read().splitlines():
            _, controllers, path = line.split(":", 2)
            lines[frozenset(controllers.split(","))] = path
    found = []
    for directory in spec.dirs:
        point = os.path.dirname(directory)
        options = next((options for mount, _, options in cgroup_mounts() if mount == point), frozenset())
        path = next((path for controllers, path in lines.items() if controllers and controllers <= options), "/")
        found.append(os.path.normpath(point + "/" + path.lstrip("/")))
    return tuple(found)


def leave(spec: CgroupSpec, back: tuple[str, ...]) -> None:
    """Move the caller back where it was (`origins`), so that the cgroup can be removed while it still runs."""
    for directory in back:
        with contextlib.suppress(SingpyError):
            move(directory, os.getpid())


def remove(spec: CgroupSpec) -> None:
    """Kill what is left in the cgroup and remove it; best effort, never raising (the container has ended)."""
    deadline = time.monotonic() + _REMOVE_TIMEOUT
    for directory in spec.dirs:
        while _kill_members(directory) and time.monotonic() < deadline:
            time.sleep(0.01)
    _remove_dirs(list(spec.dirs), deadline)


def sweep(parent: str) -> None:
    """Remove the empty cgroups of launchers that are gone (a SIGKILL leaves the launcher no time to): named
    singpy-PID-RANDOM by `singpy.cgroups.hierarchy`, whose PID no longer runs. The kernel removes only an empty
    cgroup, so one still in use (an instance's, whose starter has ended) stays."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = _OURS.fullmatch(name)
        if match is not None and not os.path.exists(f"/proc/{match[1]}"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))


def made_for(dirs: tuple[str, ...], version: int, uid: int) -> bool:
    """Whether `dirs` can be a cgroup singpy made for a launch of user `uid`, as singpy.cgroups.hierarchy plans it.

    An instance's record names its cgroup, and whoever wrote the record could
    name any (root's `instance stop --user` would kill all in it): one name of
    singpy's (`_OURS`), in each hierarchy of this host's cgroup version, right
    where a launch of `uid` makes it. On v1 a mount point's child, for root only
    (a user gets no cgroup on v1); on v2 the root cgroup's child (root), or the
    user's own child of a directory delegated to them (theirs, its cgroup.procs
    too).
    """
    from singpy.cgroups.hierarchy import CGROUP_ROOT, cgroup_mounts
    from singpy.cgroups.hierarchy import version as host_version

    mounts = cgroup_mounts()
    names = {os.path.basename(directory) for directory in dirs}
    if (not dirs or version != host_version(mounts) or len(names) != 1 or _OURS.fullmatch(names.pop()) is None
            or len(set(dirs)) != len(dirs) or any(os.path.normpath(path) != path for path in dirs)):
        return False
    parents = [os.path.dirname(directory) for directory in dirs]
    if version == 1:
        points = {point for point, kind, _ in mounts if kind == "cgroup"}
        return uid == 0 and all(parent in points for parent in parents)
    if len(dirs) != 1:
        return False
    if uid == 0:
        return parents[0] == CGROUP_ROOT
    try:
        return all(os.stat(path).st_uid == uid for path in (dirs[0], parents[0],
                                                            os.path.join(parents[0], "cgroup.procs")))
    except OSError:
        return False


def _kill_members(directory: str) -> bool:
    """SIGKILL to every process in the cgroup; whether there was any."""
    try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as procs:
            pids = [int(pid) for pid in procs.read().split()]
    except (OSError, ValueError):
        return False
    for pid in pids:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return bool(pids)


def _remove_dirs(dirs: list[str], deadline: float = 0.0) -> None:
    """rmdir each; EBUSY (the last killed process not quite gone) is tried again until `deadline`."""
    for directory in reversed(dirs):
        while True:
            try:
                os.rmdir(directory)
            except OSError as error:
                if error.errno == errno.EBUSY and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            break

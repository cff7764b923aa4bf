"""An instance killed whole: its holder, every process below it and every process that joined it (`instance stop
--force`, or past --timeout).

The holder ends its startscript's processes itself when it is signalled, but
only after its grace (singpy.launch.holder._STOP_GRACE); a SIGKILL to the
holder alone would leave them running, given to init. So the tree is
frozen first, top down: the holder is stopped (SIGSTOP), then each child of
a stopped process, until a pass of /proc finds none new. A stopped parent
reaps nothing, so none of those pids can go to another process meanwhile;
and each is signalled through a pidfd opened before its parent is checked
again. The processes that joined (`exec instance://NAME`, and what they
started) are not below the holder: they are its owner's processes in its
mount namespace (the container's; never ours), and below them. Then all get SIGKILL. The network's
keeper (singpy.launch.holdernet) is spared: it outlives the holder to undo
the network.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

_SPARED = (b"singpy-netkeep",)
_FREEZE_TIME = 2.0  # seconds at most to find the whole tree (a fork bomb could outrun the passes)


def kill_tree(holder: int, holder_fd: int) -> None:
    """SIGKILL to the holder `holder` (its pidfd `holder_fd`, -1 without) and to all its descendants."""
    frozen = {holder: holder_fd}
    opened: list[int] = []
    try:
        _send(holder, holder_fd, signal.SIGSTOP)
        container = _container(holder)
        deadline = time.monotonic() + _FREEZE_TIME
        while time.monotonic() < deadline and _freeze_children(frozen, opened, container):
            pass
        for pid, fd in frozen.items():
            _send(pid, fd, signal.SIGKILL)
    finally:
        for fd in opened:
            os.close(fd)


def _freeze_children(frozen: dict[int, int], opened: list[int], container: str) -> bool:
    """SIGSTOP to the children of frozen processes and to the processes in the mount namespace `container` not
    frozen yet; whether any was found."""
    found = False
    for pid, parent in _processes():
        if pid in frozen or (parent not in frozen and not _inside(pid, container)):
            continue
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        except OSError:  # ENOSYS: its parent is stopped and can't reap it, the pid is still its own
            fd = -1
        if fd >= 0:
            opened.append(fd)
        if (_parent_of(pid) not in frozen and not _inside(pid, container)) or _comm(pid) in _SPARED:
            continue  # (checked after the pidfd was opened: of the process it names)
        frozen[pid] = fd
        _send(pid, fd, signal.SIGSTOP)
        found = True
    return found


def _processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process in /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (parent := _parent_of(int(entry))):
            found.append((int(entry), parent))
    return found


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return 0
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def _mount_ns(pid: int) -> str:
    """The mount namespace of process `pid` ("mnt:[INODE]"); "" if it can't be read."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _container(holder: int) -> str:
    """The holder's mount namespace, and its owner: "uid:mnt:[INODE]"; "" if it is ours (a record names what its
    writer wants, and root's `instance stop --user` must not take the host's processes for the instance's)."""
    found = _mount_ns(holder)
    try:
        owner = os.stat(f"/proc/{holder}").st_uid
    except OSError:
        return ""
    return f"{owner}:{found}" if found and found != _mount_ns(os.getpid()) else ""


def _inside(pid: int, container: str) -> bool:
    """Whether `pid` is a process of the holder's owner in its mount namespace (`_container`)."""
    if not container:
        return False
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    return f"{owner}:{_mount_ns(pid)}" == container


def _comm(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            return comm.read().rstrip(b"\n")
    except OSError:
        return b""


def _send(pid: int, fd: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if fd >= 0:
            signal.pidfd_send_signal(fd, number)
        else:
            os.kill(pid, number)

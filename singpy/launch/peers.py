"""The processes an instance's holder (singpy.launch.holder) signals, each by a handle that can't name another.

A process that joins is known by the pid SO_PEERCRED gives; once it has
exited, that pid may go to any new process (its connection may outlive it,
held by a background child). So the holder opens a pidfd of it as it is
accepted, before the reply that it is blocked waiting for is sent (a reply
that arrives proves it was alive when the pidfd was opened), and signals
through that: a signal to a pidfd whose process has gone fails, it never
reaches the pid's next owner. Linux < 5.3 has no pidfd: there the process's
start time, read as it is accepted, must still be the pid's when it is
signalled.

The holder's own children are safe to signal by pid, as only it reaps them.
As a child subreaper it gets every orphan the startscript leaves (a daemon, a
background job), so that `instance stop` finds them all among its children.
"""

from __future__ import annotations

import contextlib
import os
import signal

from singpy.kernel import syscalls as k

_PR_SET_CHILD_SUBREAPER = 36


class Peer:
    """A joined process: its pidfd, or (old kernels) its pid and start time."""

    __slots__ = ("pidfd", "pid", "started")

    def __init__(self, pidfd: int, pid: int, started: bytes) -> None:
        self.pidfd, self.pid, self.started = pidfd, pid, started

    def send(self, number: int) -> None:
        """The signal, to this process only: nothing once it has gone."""
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, number)
            elif self.started and _start_time(self.pid) == self.started:
                os.kill(self.pid, number)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def open_peer(pid: int) -> Peer | None:
    """A handle on the process `pid` (the peer being accepted); None if it has gone already, or if it is
    not in our PID namespace (SO_PEERCRED gives 0), where nothing can signal it."""
    if pid <= 0:
        return None
    try:
        return Peer(os.pidfd_open(pid), pid, b"")
    except ProcessLookupError:
        return None
    except OSError:  # ENOSYS (Linux < 5.3), or seccomp refusing it
        started = _start_time(pid)
        return Peer(-1, pid, started) if started else None


def _start_time(pid: int) -> bytes:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the pid, names one process; b"" if gone.

    (Without --pid the container's /proc shows the holder's pids; with it, the joiners die with the namespace.)
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return b""
    return fields[19] if len(fields) > 19 else b""


def become_subreaper() -> None:
    """Orphans of our descendants become our children (not init's): `instance stop` finds them.

    Refused (a seccomp filter around singpy), the instance still runs: only its startscript's group is
    then signalled at the end, as before."""
    from singpy.errors import SingpyError

    try:
        k.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (SingpyError, OSError) as error:
        from singpy import console

        console.warning(f"can't become the child subreaper of the instance's processes: {error}")


def open_proc() -> int:
    """The host's /proc, opened before the holder enters the container (whose /proc may be absent)."""
    try:
        return os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1


def children(proc: int, keep: frozenset[int] = frozenset()) -> list[int]:
    """Our children but `keep` (the image's helpers, the PID namespace's init), read from `proc`.

    (/proc/PID/task/TID/children needs CONFIG_PROC_CHILDREN, which kernels may lack: each process's
    stat is read instead; only the holder's stop does it.)
    """
    if proc < 0:
        return []
    me, found = os.getpid(), []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            fd = os.open(f"{entry}/stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        except OSError:
            continue
        try:
            fields = os.read(fd, 4096).rpartition(b")")[2].split()
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(fields) > 1 and fields[1] == str(me).encode() and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found

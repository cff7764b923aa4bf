"""Shared containers: the ranks of a job step on one node run in one container.

Why: with one user namespace per rank, Open MPI's shared-memory transport
can't use single-copy (CMA: process_vm_readv is refused across user
namespaces) and, in Open MPI 4.1, messages of a few MiB then hang for ever.
Ranks in one container also cost one set-up per node instead of one per rank.

How (Apptainer's --sharens, Charliecloud's --join): every rank's launcher,
with the same plan (singpy.planner: the key is the job step plus a digest of
the plan without the rank's own process), meets at an abstract unix socket
named by that key. Abstract names live in the network namespace, so they are
per node, need no file (nothing to clean up on a shared or full /tmp), and
binding one is atomic: the launcher that binds it first forks the *holder*,
a process of its own session that builds the container exactly as a plain
launch would (singpy.launch phases) and then, instead of running a payload,
stays in it. Every launcher, the first included, connects; the holder sends
its namespaces as file descriptors (SCM_RIGHTS: no /proc lookup, no pid that
could be recycled) and the image's scripts; the launcher joins them (setns,
user namespace first) and execs its payload in place, keeping the connection
open across execve. The holder counts open connections: when the last rank
has exited (scancel included: the kernel closes their sockets), it closes the
socket and exits, stopping the helpers that served the image (squashfuse).

Trust: both ends check the other's uid (SO_PEERCRED). Anyone can bind an
abstract name; a holder of another user is refused, so root never joins a
namespace an unprivileged user made.
"""

from __future__ import annotations

import _socket
import os
import select
import struct
import time

from singpy import console
from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.plan import LaunchPlan

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

JOIN_TIMEOUT = 300.0  # seconds a rank waits for the holder to build the container (a large image on squashfuse)
# In the order they are joined; "pid" is opened by the holder apart (singpy.pidns), and joined last.
NAMESPACES = (("user", k.CLONE_NEWUSER), ("mnt", k.CLONE_NEWNS), ("ipc", k.CLONE_NEWIPC), ("uts", k.CLONE_NEWUTS),
              ("net", k.CLONE_NEWNET), ("pid", k.CLONE_NEWPID))
READY, ERROR = b"ready\0", b"error\0"
_BACKLOG = 4096  # every rank of a node may connect before the holder is ready
# The start-up path imports neither `socket` nor `json` (3 ms each): `_socket`, and a message of NUL-separated fields.
_SOCKET_FLAGS = _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC


class _Retry(Exception):
    """The holder went away before answering: its last rank left as we came. Start over."""


def run(plan: LaunchPlan) -> int:
    """Join the container of this job step on this node, making it first if nobody has.

    Execs the payload in place; returns only with a PID namespace (the payload's exit status), where the
    payload is forked into it and this launcher stays outside as its supervisor (singpy.pidns).
    """
    assert plan.share is not None
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        connection = connect(plan.share.socket)
        if connection is None and not plan.share.create:
            raise SingpyError(f"{plan.share.origin} is not running")
        if connection is None:
            listener = bind(plan.share.socket)
            if listener is not None:
                console.verbose(f"{plan.share.origin}: this rank builds the shared container")
                from singpy import holder

                holder.start(plan, listener)
            elif time.monotonic() > deadline:
                raise SingpyError(f"{plan.share.origin}: timed out waiting for the shared container")
            else:
                time.sleep(0.005)  # another rank has bound the name and is about to listen
            continue
        try:
            fds, scripts, _ = receive(connection, deadline, plan.share.origin)
        except _Retry:
            connection.close()
            continue
        from singpy import process  # now: the package is out of reach once we are in the container

        caps.preload(plan.process.privileges)  # (python-prctl too)
        own_pid = any(name == "pid" for name, _ in fds)
        _join(fds)
        console.verbose(f"{plan.share.origin}: joined the shared container")
        os.set_inheritable(connection.fileno(), True)  # held by the payload: the holder counts it
        if own_pid:  # setns moved only our children into the PID namespace: the payload is one
            return process.supervise(_payload(plan, scripts))
        process.exec_process(plan.process, scripts)


def _payload(plan: LaunchPlan, scripts: ImageScripts) -> Callable[[], NoReturn]:
    from singpy import process

    return lambda: process.exec_process(plan.process, scripts)


def _address(name: str) -> bytes:
    return b"\0" + name.encode()


def connect(name: str) -> _socket.socket | None:
    """A connection to the holder listening at `name`; None when nobody listens."""
    connection = _socket.socket(_socket.AF_UNIX, _SOCKET_FLAGS)
    try:
        connection.connect(_address(name))
    except (ConnectionRefusedError, FileNotFoundError):
        connection.close()
        return None
    if peer_uid(connection) != os.getuid():
        connection.close()
        raise SingpyError(f"the shared container's socket @{name} is held by another user",
                          hint="run with --no-sharens")
    return connection


def bind(name: str) -> _socket.socket | None:
    """A listening socket at `name`, or None when another process has it (EADDRINUSE): binding is the election."""
    listener = _socket.socket(_socket.AF_UNIX, _SOCKET_FLAGS)
    try:
        listener.bind(_address(name))
    except OSError:  # EADDRINUSE: another rank was first
        listener.close()
        return None
    listener.listen(_BACKLOG)
    return listener


def peer_uid(connection: _socket.socket) -> int:
    _, uid, _ = struct.unpack("3i", connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))
    return int(uid)


def peer_pid(connection: _socket.socket) -> int:
    """The process at the other end, as it was when it connected (or listened)."""
    pid, _, _ = struct.unpack("3i", connection.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))
    return int(pid)


def receive(connection: _socket.socket, deadline: float,
            origin: str) -> tuple[list[tuple[str, int]], ImageScripts, int]:
    """The holder's namespaces (name, fd), the image's scripts and the holder's pid; its error as a SingpyError.

    (SO_PEERCRED would name the process that called listen(): the rank that forked the holder.)
    """
    ready, _, _ = select.select([connection], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise SingpyError(f"{origin}: timed out waiting for the shared container")
    try:
        message, ancillary, _, _ = connection.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * len(NAMESPACES)))
    except ConnectionResetError:
        raise _Retry() from None
    fds = [fd for level, kind, data in ancillary if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4])]
    if message.startswith(ERROR):
        raise SingpyError(message[len(ERROR):].decode(errors="replace"))
    if not message.startswith(READY):
        for fd in fds:
            os.close(fd)
        raise _Retry()
    pid, names, runscript, *env = message[len(READY):].decode().split("\0")
    scripts = ImageScripts(env=tuple(env), runscript=runscript or None)
    return list(zip(names.split(","), fds, strict=True)), scripts, int(pid)


def ready_message(pid: int, namespaces: list[str], scripts: ImageScripts) -> bytes:
    """What `receive` reads: NUL-separated, as no path holds a NUL."""
    fields = [str(pid), ",".join(namespaces), scripts.runscript or "", *scripts.env]
    return READY + "\0".join(fields).encode()


def _join(fds: list[tuple[str, int]]) -> None:
    """setns into each namespace, the user namespace first (it gives the rights over the others)."""
    types = dict(NAMESPACES)
    for name, fd in fds:
        k.setns(fd, types[name], f"the shared container's {name} namespace")
        os.close(fd)
    # Joining the mount namespace put us at its root, which is the container's (pivot_root moved it there).

"""Where the ranks of a job step meet their holder: the abstract socket, its messages, the namespaces passed.

Shared by the rank's side (singpy.launch.shared) and the holder's
(singpy.launch.holder), below both, so that the rank may start the holder
without a cycle. Imports only the base, the image's scripts record and the
kernel layer.
"""

from __future__ import annotations

import _socket
import os
import select
import struct
import time

from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.kernel import syscalls as k

JOIN_TIMEOUT = 300.0  # seconds a rank waits for the holder to build the container (a large image on squashfuse)
# In the order they are joined; "pid" is opened by the holder apart (singpy.launch.pidns), and joined last.
NAMESPACES = (("user", k.CLONE_NEWUSER), ("mnt", k.CLONE_NEWNS), ("ipc", k.CLONE_NEWIPC), ("uts", k.CLONE_NEWUTS),
              ("net", k.CLONE_NEWNET), ("pid", k.CLONE_NEWPID))
READY, ERROR = b"ready\0", b"error\0"
_BACKLOG = 4096  # every rank of a node may connect before the holder is ready
# The start-up path imports neither `socket` nor `json` (3 ms each): `_socket`, and a message of NUL-separated fields.
_SOCKET_FLAGS = _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC


class Retry(Exception):
    """The holder went away before answering: its last rank left as we came. Start over."""


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
        raise Retry() from None
    fds = [fd for level, kind, data in ancillary if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
           for fd in struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4])]
    if message.startswith(ERROR):
        raise SingpyError(message[len(ERROR):].decode(errors="replace"))
    if not message.startswith(READY):
        for fd in fds:
            os.close(fd)
        raise Retry()
    pid, names, runscript, *env = message[len(READY):].decode().split("\0")
    scripts = ImageScripts(env=tuple(env), runscript=runscript or None)
    return list(zip(names.split(","), fds, strict=True)), scripts, int(pid)


def ready_message(pid: int, namespaces: list[str], scripts: ImageScripts) -> bytes:
    """What `receive` reads: NUL-separated, as no path holds a NUL."""
    fields = [str(pid), ",".join(namespaces), scripts.runscript or "", *scripts.env]
    return READY + "\0".join(fields).encode()

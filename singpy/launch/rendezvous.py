"""Where the ranks of a job step meet their holder: the abstract socket, its messages, the namespaces passed.

Shared by the rank's side (singpy.launch.shared) and the holder's
(singpy.launch.holder), below both, so that the rank may start the holder
without a cycle. Imports only the base, the image's scripts record and the
kernel layer.
"""

from __future__ import annotations

import _socket
import fcntl
import os
import select
import struct
import time

from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.kernel import syscalls as k
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

JOIN_TIMEOUT = 300.0  # seconds a rank waits for the holder to build the container (a large image on squashfuse)
# In the order they are joined; "pid" is opened by the holder apart (singpy.launch.pidns), and joined last.
NAMESPACES = (("user", k.CLONE_NEWUSER), ("mnt", k.CLONE_NEWNS), ("ipc", k.CLONE_NEWIPC), ("uts", k.CLONE_NEWUTS),
              ("net", k.CLONE_NEWNET), ("pid", k.CLONE_NEWPID))
READY, ERROR = b"ready\0", b"error\0"
_BACKLOG = 4096  # every rank of a node may connect before the holder is ready
# The start-up path imports neither `socket` nor `json` (3 ms each): `_socket`, and a message of NUL-separated fields.
_SOCKET_FLAGS = _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CONNECT_TIMEOUT = 5  # seconds connect() may wait for room in a listener's backlog
NS_GET_USERNS, NS_GET_PARENT, NS_GET_NSTYPE = 0xB701, 0xB702, 0xB703  # ioctl_ns(2)


class Retry(Exception):
    """The holder went away before answering: its last rank left as we came. Start over."""


class Taken(SingpyError):
    """The name is held by a socket we can't use: another user's, or one that accepts nobody."""


class Expected(Record):
    """What the holder's answer must be, as the plan implies it (singpy.launch.shared.expected)."""

    # the namespaces it must send, exactly (mnt always); None: an instance's, whose namespaces are its own
    # plan's (mnt among them), not the joining command's
    names: frozenset[str] | None
    # the process that sends them (SCM_CREDENTIALS) must be in our PID namespace and in the user namespace it
    # sends (ours without one): a job's holder, forked by one of its ranks; an instance may be started in
    # another PID namespace (singpy.launch.pidview), and its name is random and secret
    sender: bool


def _address(name: str) -> bytes:
    return b"\0" + name.encode()


def connect(name: str) -> _socket.socket | None:
    """A connection to the holder listening at `name`; None when nobody listens (Taken: not ours to join).

    SO_PASSCRED before connect(): the holder's reply then carries the credentials of the process that sent it,
    which the kernel checks (SO_PEERCRED names the process that called listen(): a rank, maybe gone).
    SO_SNDTIMEO: a listener that never accepts, its backlog full, would keep connect() waiting for ever.
    """
    connection = _socket.socket(_socket.AF_UNIX, _SOCKET_FLAGS)
    connection.setsockopt(_socket.SOL_SOCKET, _socket.SO_PASSCRED, 1)
    connection.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, struct.pack("ll", _CONNECT_TIMEOUT, 0))
    try:
        connection.connect(_address(name))
    except (ConnectionRefusedError, FileNotFoundError):
        connection.close()
        return None
    except OSError as error:  # EPROTOTYPE (a socket of another type), EAGAIN (a backlog that stays full)
        connection.close()
        raise Taken(f"the shared container's socket @{name} is held by a socket that can't be joined "
                    f"({error.strerror})") from None
    if peer_uid(connection) != os.getuid():
        connection.close()
        raise Taken(f"the shared container's socket @{name} is held by another user")
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


def receive(connection: _socket.socket, deadline: float, origin: str,
            expected: Expected | None = None) -> tuple[list[tuple[str, int]], ImageScripts, int]:
    """The holder's namespaces (name, fd), the image's scripts and the holder's pid; its error as a SingpyError.

    Anything of our uid may have bound the name first (untrusted code in an earlier container sees the names
    in /proc/net/unix): what it sends is checked before anything is joined or run (`_check`). `expected`
    None: the caller started that holder itself (singpy.launch.holder.start_instance).
    """
    ready, _, _ = select.select([connection], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise SingpyError(f"{origin}: timed out waiting for the shared container")
    try:
        message, ancillary, _, _ = connection.recvmsg(
            1 << 16, _socket.CMSG_SPACE(4 * len(NAMESPACES)) + _socket.CMSG_SPACE(_CREDENTIALS.size))
    except ConnectionResetError:
        raise Retry() from None
    fds, sender = _ancillary(ancillary)
    try:
        if message.startswith(ERROR):
            raise SingpyError(message[len(ERROR):].decode(errors="replace"))
        if not message.startswith(READY):
            raise Retry()
        namespaces, scripts, pid = _parse(message[len(READY):], fds, origin)
        _check(namespaces, expected or Expected(names=None, sender=False), sender, origin)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return namespaces, scripts, pid


def _ancillary(ancillary: list[tuple[int, int, bytes]]) -> tuple[list[int], int]:
    """The descriptors received, and the sender's pid (0: none said, or a process out of our sight)."""
    fds: list[int] = []
    sender = 0
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(data) // 4}i", data[:len(data) - len(data) % 4])
        elif level == _socket.SOL_SOCKET and kind == _socket.SCM_CREDENTIALS and len(data) >= _CREDENTIALS.size:
            sender = _CREDENTIALS.unpack(data[:_CREDENTIALS.size])[0]
    return fds, sender


def _parse(body: bytes, fds: list[int], origin: str) -> tuple[list[tuple[str, int]], ImageScripts, int]:
    """`ready_message`'s fields; a malformed one is a SingpyError (the caller closes the descriptors)."""
    bad = f"{origin}: the shared container's socket sent a malformed answer"
    try:
        pid, names, runscript, *env = body.decode().split("\0")
    except (UnicodeDecodeError, ValueError):
        raise SingpyError(bad) from None
    listed = names.split(",")
    known = {name for name, _ in NAMESPACES}
    if not pid.isdigit() or len(listed) != len(fds) or len(set(listed)) != len(listed) or not set(listed) <= known:
        raise SingpyError(bad)
    if any(not path.startswith("/") for path in (*env, *((runscript,) if runscript else ()))):
        raise SingpyError(bad)
    return list(zip(listed, fds, strict=True)), ImageScripts(env=tuple(env), runscript=runscript or None), int(pid)


def _check(namespaces: list[tuple[str, int]], expected: Expected, sender: int, origin: str) -> None:
    """What a holder sends, as only a holder of ours can: exactly the namespaces expected (the mount namespace
    always: without it the env scripts and the runscript would run on the host), each of the type named, made
    from our user namespace (a user namespace its child, the others owned by it or by ours), sent by a process
    in it (a job's: in our PID namespace). Code confined in an earlier container can name none but its own."""
    names = {name for name, _ in namespaces}
    if "mnt" not in names or expected.names is not None and names != expected.names:
        _refuse(origin, f"it sent the namespaces {', '.join(sorted(names))}")
    types = dict(NAMESPACES)
    for name, fd in namespaces:
        if _ioctl(fd, NS_GET_NSTYPE) != types[name]:
            _refuse(origin, f"what it sent as the {name} namespace is not one")
    try:
        ours = _identity(os.stat("/proc/self/ns/user"))
    except OSError as error:  # no /proc: nothing can be checked, so nothing is joined
        _refuse(origin, f"can't read our own user namespace ({error.strerror})")
    user = next((fd for name, fd in namespaces if name == "user"), None)
    if user is not None and _owner(user, NS_GET_PARENT) != ours:
        _refuse(origin, "its user namespace was not made from ours")
    theirs = _identity(os.fstat(user)) if user is not None else ours
    if any(name != "user" and _owner(fd, NS_GET_USERNS) not in (theirs, ours) for name, fd in namespaces):
        _refuse(origin, "its namespaces belong to another user namespace")
    if expected.sender:
        _check_sender(sender, theirs, origin)


def _check_sender(pid: int, user: tuple[int, int], origin: str) -> None:
    """The process that sent the namespaces is in our PID namespace and in the user namespace it sent."""
    try:
        here = _identity(os.stat(f"/proc/{pid}/ns/pid")) == _identity(os.stat("/proc/self/ns/pid")) if pid else False
        inside = here and _identity(os.stat(f"/proc/{pid}/ns/user")) == user
    except OSError:
        here = inside = False
    if not here:
        _refuse(origin, "the process that answered is not in our PID namespace")
    if not inside:
        _refuse(origin, "the process that answered is not in the container it sent")


def _owner(fd: int, request: int) -> tuple[int, int] | None:
    """The user namespace above `fd` (NS_GET_PARENT, NS_GET_USERNS); None where it is out of our sight."""
    try:
        owner = fcntl.ioctl(fd, request)
    except OSError:  # EPERM: above ours
        return None
    try:
        return _identity(os.fstat(owner))
    finally:
        os.close(owner)


def _ioctl(fd: int, request: int) -> int:
    try:
        return fcntl.ioctl(fd, request)
    except OSError:  # ENOTTY: no namespace at all
        return -1


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _refuse(origin: str, why: str) -> NoReturn:
    raise SingpyError(f"{origin}: the process answering at the shared container's socket is no holder of ours: "
                      f"{why}", hint="another process of yours holds the socket's name: run with --no-sharens")


def ready_message(pid: int, namespaces: list[str], scripts: ImageScripts) -> bytes:
    """What `receive` reads: NUL-separated, as no path holds a NUL."""
    fields = [str(pid), ",".join(namespaces), scripts.runscript or "", *scripts.env]
    return READY + "\0".join(fields).encode()

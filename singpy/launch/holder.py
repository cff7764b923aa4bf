"""The holder of a shared container (singpy.launch.shared) or of an instance (singpy.launch.instance).

Forked by the first rank of a job step (or by `instance start`) into a
session of its own, so that it outlives that rank; it builds the container
as a plain launch would (singpy.launch.launch's phases), then stays in it, handing
its namespaces to every process of its user that connects, until the last
has gone (a job's container) or until it is signalled (an instance).
"""

from __future__ import annotations

import _socket
import contextlib
import os
import select
import signal
import socket
import time

from singpy import console
from singpy.constants import STARTSCRIPT
from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.launch import holdernet
from singpy.launch.peers import Peer, become_subreaper, children, open_peer, open_proc
from singpy.launch.pidns import STOP_SIGNALS
from singpy.launch.rendezvous import (
    ERROR,
    JOIN_TIMEOUT,
    NAMESPACES,
    Retry,
    bind,
    connect,
    peer_pid,
    peer_uid,
    ready_message,
    receive,
)
from singpy.plan import LaunchPlan
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

_IDLE_TIMEOUT = 30.0  # seconds a holder waits for its first rank (the one that forked it connects at once)


class Instance(Record):
    """What makes a holder an instance (singpy.launch.instance): it runs the startscript and stays until stopped."""

    log_out: int  # open log files for the startscript's output (and the holder's own errors)
    log_err: int
    records: int  # open directory of the instance's record, removed by the holder when it ends
    record: str  # the record's name in it
    # --disable-cache: the open parent of the instance's temporary image directory (its pulled SIF, which the
    # commands joining it read), and that directory's name; removed with the record (-1: none)
    temporary: int = -1
    temporary_name: str = ""
    # a pipe's write end (start_instance makes it): the holder writes the container's address there (--network
    # bridge|ptp) before it is ready, for the record (`instance list` shows it)
    report: int = -1


def start_instance(plan: LaunchPlan, instance: Instance) -> Started:
    """Start an instance's holder and wait until it is ready. The caller `release`s it once its record is
    written (from then on it outlives us), or `abort`s it; it is killed if we end first."""
    assert plan.share is not None
    listener = bind(plan.share.socket)
    if listener is None:  # its name is random (singpy.launch.instance.new_socket_name): not another instance's
        raise SingpyError(f"{plan.share.origin}: can't bind its socket @{plan.share.socket}")
    report, written = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        started = start(plan, listener, instance.replace(report=written))
    finally:
        os.close(written)
    try:
        _wait_ready(plan, instance, started)
        with contextlib.suppress(BlockingIOError):  # written before it is ready; nothing without a network
            started.address = os.read(report, 64).decode("ascii", "replace")
    finally:
        os.close(report)
    return started


def _wait_ready(plan: LaunchPlan, instance: Instance, started: Started) -> None:
    assert plan.share is not None
    ended = f"{plan.share.origin} ended while starting: see its log {_fd_path(instance.log_err)}"
    try:
        connection = connect(plan.share.socket)
        if connection is None:
            raise SingpyError(ended)
        try:
            fds, _, _ = receive(connection, time.monotonic() + JOIN_TIMEOUT, plan.share.origin)
        except Retry:  # it died without a word (killed): its socket went with it
            raise SingpyError(ended) from None
        finally:
            connection.close()
        for _, fd in fds:
            os.close(fd)
    except BaseException:  # Ctrl-C, the timeout, an error: no holder that no record names
        started.abort()
        raise


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class Started:
    """A holder just forked, through a middle process that stays its parent until `release` or `abort`.

    While the middle lives the holder's pid is its own (only the middle may
    reap it), so it can be killed safely; and the middle kills it unless
    released, also when we die first (SIGHUP, SIGKILL: its pipe from us ends).
    """

    def __init__(self, pid: int, middle: int, hold: int) -> None:
        self.pid, self._middle, self._hold = pid, middle, hold
        self.released = False
        self.address = ""  # the container's, with --network bridge|ptp (start_instance)

    def release(self) -> None:
        """The holder outlives us from now on (its record is written)."""
        os.write(self._hold, b"r")
        self.released = True
        self._end()

    def abort(self) -> bool:
        """The holder killed and reaped; False if it was released already (it runs on)."""
        self._end()
        return not self.released

    def _end(self) -> None:
        if self._hold >= 0:
            os.close(self._hold)
            self._hold = -1
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._middle, 0)


def start(plan: LaunchPlan, bound: _socket.socket, instance: Instance | None = None) -> Started:
    """Fork the holder into a session of its own, detached from this rank (which may end first once released)."""
    listener = socket.socket(fileno=bound.detach())  # the full socket API: accept(), send_fds()
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    hold_read, hold_write = os.pipe2(os.O_CLOEXEC)
    interrupt = signal.getsignal(signal.SIGINT)
    middle = os.fork()
    if middle == 0:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # until setsid: a Ctrl-C at the rank is not ours
            os.close(report_read)
            os.close(hold_write)
            os.setsid()
            pid = os.fork()
            if pid == 0:
                if interrupt is not None:
                    signal.signal(signal.SIGINT, interrupt)
                _holder(plan, listener, instance)
            listener.close()  # the holder's alone: a rank must not wait on it after the holder died
            os.write(report_write, str(pid).encode())
            if os.read(hold_read, 1) != b"r":  # aborted, or the rank ended first: no record will name it
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        finally:
            os._exit(0)
    listener.close()
    os.close(report_write)
    os.close(hold_read)
    started = Started(0, middle, hold_write)
    try:
        started.pid = int(os.read(report_read, 32) or b"0")
    except BaseException:
        started.abort()
        raise
    finally:
        os.close(report_read)
    return started


def _holder(plan: LaunchPlan, listener: socket.socket, instance: Instance | None) -> NoReturn:
    with open("/proc/self/comm", "w") as comm:  # what ps shows: not the rank's own `python3`
        comm.write("singpy-instance" if instance else "singpy-shared")
    _detach_stdio((listener.fileno(), plan.process.in_use[0]), instance)  # in_use: the cache's tree held (cache clean)
    # the startscript's orphans are found in the host's /proc at the end (with --pid, its PID 1 ends them all)
    proc = open_proc() if instance is not None and not plan.namespaces.pid else -1
    if instance is not None and instance.temporary >= 0:  # now: the package is out of reach once in the container
        from singpy.image import trees  # noqa: F401  (used by _remove_record)
    try:
        fds, scripts = _build(plan)
    except SingpyError as error:
        console.fatal(error.message)  # an instance's log; /dev/null for a job's holder
        _refuse_waiting(listener, error.message)
        _remove_record(instance)
        os._exit(1)
    except BaseException as error:  # never unwind into the rank's code
        _refuse_waiting(listener, f"internal error in the shared container: {error!r}")
        _remove_record(instance)
        os._exit(1)
    ready = ready_message(os.getpid(), [name for name, _ in fds], scripts)
    if instance is not None and instance.report >= 0:
        with contextlib.suppress(OSError):
            os.write(instance.report, "".join(holdernet.ADDRESS).encode())
        os.close(instance.report)
    try:
        if instance is None:
            _serve(listener, fds, ready)
        else:
            _serve_instance(plan, listener, fds, ready, scripts, proc)
    finally:
        _remove_record(instance)
        os._exit(0)


def _detach_stdio(keep: tuple[int, ...], instance: Instance | None) -> None:
    """The rank's terminal or job pipes are not the holder's: it would hold srun's output open.

    An instance writes to its log files instead.
    """
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    if instance is not None:
        os.dup2(instance.log_out, 1)
        os.dup2(instance.log_err, 2)
    else:
        for fd in (1,) if console.level() >= console.DEBUG else (1, 2):
            os.dup2(null, fd)
    os.close(null)
    kept = sorted({*keep, *((instance.records, instance.temporary, instance.report) if instance else ())} - {-1})
    low = 3
    for fd in kept:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _remove_record(instance: Instance | None) -> None:
    """The instance's record, and its temporary image directory with --disable-cache, removed as it ends."""
    if instance is not None:
        with contextlib.suppress(OSError):
            os.unlink(instance.record, dir_fd=instance.records)
        if instance.temporary >= 0:
            from singpy.image import trees

            with contextlib.suppress(OSError):
                trees.remove_at(instance.temporary, instance.temporary_name)


def _build(plan: LaunchPlan) -> tuple[list[tuple[str, int]], ImageScripts]:
    """The container, built as a plain launch builds it; the holder stays in it. Returns its namespaces."""
    from singpy.launch import phases
    from singpy.layers import rootfs

    if plan.namespaces.pid:  # now: the package is out of reach once in the staging root
        from singpy.launch import pidns
    phases.import_for_phases(plan)  # the same reason (an instance with --overlay needed layers.overlayfs)
    phases.enter_namespaces(plan, holdernet.wired(plan))  # --network bridge|ptp: wired from the host first
    names = [name for name, _ in NAMESPACES if _has(plan, name)]
    fds = [(name, os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)) for name in names]
    rootfs.enter_staging(plan.staging_fs, plan.staging_size, slave=plan.mount_slave)
    image_root, helpers = phases.attach_image(plan)
    root, layer_helpers = phases.prepare_root(plan, image_root)
    _HELPERS.extend((*reversed(layer_helpers), *helpers))
    if plan.namespaces.pid:  # --pid, --containall: PID 1 builds the container, the holder stays outside
        init, namespace = pidns.start(plan, root)
        _INIT.append(init)
        return [*fds, ("pid", namespace)], root.scripts
    return fds, phases.build_container(plan, root)


_HELPERS: list[int] = []  # squashfuse, fuse-overlayfs...: stopped when the holder ends
_INIT: list[int] = []  # PID 1 of the container's PID namespace (singpy.launch.pidns), while it runs


def _has(plan: LaunchPlan, name: str) -> bool:
    ns = plan.namespaces
    return {"user": ns.user, "mnt": True, "ipc": ns.ipc, "uts": ns.uts, "net": ns.net,
            "pid": False}[name]  # "pid": made later, by singpy.launch.pidns (its helpers must not be in it)


def _refuse_waiting(listener: socket.socket, message: str) -> None:
    """Tell the ranks already waiting why there is no container; later ones will try again, and learn it."""
    deadline = time.monotonic() + 1.0
    while (left := deadline - time.monotonic()) > 0 and select.select([listener], [], [], left)[0]:
        connection, _ = listener.accept()
        with connection, contextlib.suppress(OSError):
            if peer_uid(connection) == os.getuid():  # someone else's process learns nothing (a path in the error)
                connection.send(ERROR + message.encode())
    listener.close()


class _Members:
    """The connections of the ranks in the container: a closed one is a rank that has exited."""

    def __init__(self, listener: socket.socket, fds: list[tuple[str, int]], ready: bytes) -> None:
        self.listener, self.fds, self.ready = listener, fds, ready
        self.connections: dict[int, socket.socket] = {}
        self.peers: dict[int, Peer] = {}  # connection fd -> the process that connected (it execs the payload)
        self.joined = False
        self.poller = select.poll()
        self.poller.register(listener, select.POLLIN)

    def handle(self, fd: int) -> bool:
        """Deal with a ready descriptor if it is ours: a rank coming or going."""
        if fd == self.listener.fileno():
            accepted = _accept(self.listener, self.fds, self.ready)
            if accepted is not None:
                connection, peer = accepted
                self.connections[connection.fileno()] = connection
                if peer is not None:
                    self.peers[connection.fileno()] = peer
                self.poller.register(connection, select.POLLIN)  # POLLHUP once its rank has exited
                self.joined = True
            return True
        if fd in self.connections:
            self.poller.unregister(fd)
            self.connections.pop(fd).close()
            if fd in self.peers:
                self.peers.pop(fd).close()
            return True
        return False

    def kill(self, number: int) -> None:
        """Signal the processes that joined (an instance being stopped: nothing of it may stay)."""
        for peer in self.peers.values():  # by pidfd: a joiner that has gone left its pid to anyone
            peer.send(number)

    def close(self, startscript: int | None = None) -> None:
        """First: a rank arriving now is refused, and makes a new container. Then everything in its PID
        namespace, and the image's helpers, which those processes may use until they are gone."""
        from singpy.launch import process

        self.listener.close()
        for peer in self.peers.values():
            peer.close()
        if _INIT:
            from singpy.launch import pidns  # imported already (_build): the host's files are out of reach now

            pidns.end(_INIT.pop(), startscript)
        for helper in _HELPERS:
            process.stop_helper(helper)


def _serve(listener: socket.socket, fds: list[tuple[str, int]], ready: bytes) -> None:
    """Hand the namespaces to every rank of ours that connects; return once the last one has gone."""
    members = _Members(listener, fds, ready)
    started = time.monotonic()
    try:
        while members.connections or (not members.joined and time.monotonic() - started < _IDLE_TIMEOUT):
            for fd, _ in members.poller.poll(1000):
                members.handle(fd)
    finally:
        members.close()


# Seconds the instance's processes get to exit after the signal `instance stop` sent: less than stop's --timeout
# (10 s by default), after which `instance stop` kills them all itself (singpy.launch.stoptree), as with a shorter one.
_STOP_GRACE = 7.0


def _serve_instance(plan: LaunchPlan, listener: socket.socket, fds: list[tuple[str, int]], ready: bytes,
                    scripts: ImageScripts, proc: int) -> None:
    """An instance: run the startscript, let `exec instance://` join, until `instance stop` signals us.

    Signals reach the loop through a wakeup pipe (a handler would run between
    two bytecodes, possibly after poll() went to sleep). A signal is passed on
    to everything of the instance (`_pass_on`), and ends the instance once
    they have gone; after _STOP_GRACE seconds they are killed. (Past its
    --timeout, `instance stop` kills the holder and all of them itself:
    singpy.launch.stoptree.)
    """
    members = _Members(listener, fds, ready)
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    for signum in (*STOP_SIGNALS, signal.SIGCHLD):  # `instance stop`'s: the holder gets signals from nobody else
        signal.signal(signum, lambda *_: None)
    members.poller.register(wakeup_read, select.POLLIN)
    if proc >= 0:
        become_subreaper()
    child = _start_script(plan, scripts)
    booted, stop_at = plan.process.action == "boot", None  # --boot: a stop waits for /sbin/init (PID 1) too
    try:
        while stop_at is None or ((_running(child, members, proc) or booted and _INIT) and time.monotonic() < stop_at):
            for fd, _ in members.poller.poll(200):
                if members.handle(fd):
                    continue
                for number in os.read(wakeup_read, 256):
                    if number == signal.SIGCHLD:
                        child = _reap(child)
                        if not _INIT and plan.namespaces.pid:  # its PID 1 died: nothing runs in it any more
                            stop_at = stop_at or time.monotonic() + _STOP_GRACE
                        continue
                    _pass_on(number, child, members, proc)
                    stop_at = stop_at or time.monotonic() + _STOP_GRACE
    finally:
        _kill_group(child, signal.SIGKILL)
        members.kill(signal.SIGKILL)
        _end_children(proc)
        members.close(child)


def _pass_on(number: int, child: int | None, members: _Members, proc: int) -> None:
    """The stop signal to the instance's processes, once each. In a PID namespace, to its PID 1, which passes it
    on to all in it (singpy.launch.pidns: what a joiner left there is its child, out of our reach); otherwise to
    the startscript's group, its orphans (ours: the holder is a child subreaper) and every process that joined."""
    if not _INIT:
        _kill_group(child, number)
        members.kill(number)
    for pid in _INIT or _others(proc):  # our children, reaped by us alone: each pid still its own
        if pid != child:  # (the startscript has it from its group)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)


def _others(proc: int) -> list[int]:
    """Our children but the image's helpers and the PID namespace's init: the startscript and its orphans."""
    return children(proc, frozenset((*_HELPERS, *_INIT, *holdernet.KEEPERS)))


def _running(child: int | None, members: _Members, proc: int) -> bool:
    return child is not None or bool(members.connections) or bool(_others(proc))


def _end_children(proc: int) -> None:
    """SIGKILL to the startscript and all it started, until none is left (a process killed leaves its children to
    us, the subreaper: killed in the next round), reaped."""
    deadline = time.monotonic() + 5.0
    while (left := _others(proc)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(pid, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:
                    time.sleep(0.005)


def _kill_group(leader: int | None, number: int) -> None:
    if leader is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, number)


def _start_script(plan: LaunchPlan, scripts: ImageScripts) -> int | None:
    """Fork the instance's startscript (in a process group of its own, for `instance stop`); None without one."""
    from singpy.launch import process

    runscript = plan.share is not None and plan.share.runscript  # `instance run`: the plan's own process, a `run`
    if plan.process.action == "boot":  # --boot: the namespace's PID 1 is the image's /sbin/init (launch.boot)
        return None
    if not runscript and not (os.path.isfile(STARTSCRIPT) and os.access(STARTSCRIPT, os.X_OK)):
        console.info(f"no executable {STARTSCRIPT} in the image: the instance runs nothing until joined")
        return None
    pid = process.fork_tied()
    if pid == 0:
        os.setpgid(0, 0)
        startscript = plan.process if runscript else plan.process.replace(action="exec",
                                                                          args=(STARTSCRIPT, *plan.process.args))
        process.run_child(lambda: process.exec_process(startscript, scripts))
    return pid


def _reap(child: int | None) -> int | None:
    """None once the startscript has exited (reaped); the instance itself goes on."""
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if done == 0:
            return child
        if done in _HELPERS:  # a helper that crashed: never signalled again (its pid may go to another process)
            _HELPERS.remove(done)
            console.warning(f"a helper serving the image (pid {done}) ended with status "
                            f"{os.waitstatus_to_exitcode(status)}")
        if _INIT and done == _INIT[0]:  # never signalled again: its pid may be another process's soon
            _INIT.clear()
            console.info("the container's init (PID 1 of its PID namespace) ended: stopping the instance")
        if done == child:
            console.info(f"the startscript exited with status {os.waitstatus_to_exitcode(status)}")
            child = None


def _accept(listener: socket.socket, fds: list[tuple[str, int]],
            ready: bytes) -> tuple[socket.socket, Peer | None] | None:
    """A process of ours connecting: it gets the namespaces. The connection, and a handle on that process
    (None where it can't be had: a process of a PID namespace above ours, which we can't signal either)."""
    connection, _ = listener.accept()
    if peer_uid(connection) != os.getuid():  # someone else's process: it gets nothing
        connection.close()
        return None
    peer = open_peer(peer_pid(connection))  # first: the reply it waits for proves it was alive then
    try:
        socket.send_fds(connection, [ready], [fd for _, fd in fds])
    except OSError:  # gone already
        connection.close()
        if peer is not None:
            peer.close()
        return None
    return connection, peer

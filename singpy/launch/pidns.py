"""The PID namespace of a held container: an instance (or a job's shared container) with --pid or --containall.

The holder (singpy.launch.holder) stays outside the namespace, as a --pid launcher
does: it must outlive everything in it to stop the image's helpers last, and
the joiners' connections reach it there. A fresh /proc must be mounted from
inside the namespace, so the holder forks its PID 1 (`start`), which builds
the container (singpy.launch.phases.build_container) and then only reaps the orphans
of the namespace (`_reap_orphans`) until the holder kills it: SIGKILL to a
namespace's PID 1 ends every process in it, which is how `instance stop`
leaves nothing behind.

The holder's later children (the startscript) are in the namespace too
(unshare(CLONE_NEWPID) moves the caller's children, never the caller), and
every process that joins (singpy.launch.shared) enters it with setns, which again
moves only its children: a joiner forks its payload and stays outside as its
supervisor (singpy.launch.process.supervise), forwarding signals.
"""

from __future__ import annotations

import contextlib
import os
import signal

from singpy.errors import SingpyError
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.layers import rootfs

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

    from singpy.launch.phases import PreparedRoot
    from singpy.plan import LaunchPlan

_REPORT_LIMIT = 1 << 16  # bytes of PID 1's report: "" (built) or the error's message
# What `instance stop --signal` may send. The holder sends it to the namespace's PID 1 too, which passes it on to
# every process in the namespace: the orphans a joiner left there are nobody else's children.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def start(plan: LaunchPlan, root: PreparedRoot) -> tuple[int, int]:
    """Called by the holder in the staging root, its helpers started: the namespace, its PID 1 building the
    container in it. Returns PID 1's pid and a descriptor of the namespace, for the joiners; raises what went
    wrong in PID 1 (a missing mount point...) as the holder's own error."""
    k.unshare(k.CLONE_NEWPID)  # only now: a helper (squashfuse) must not become its PID 1
    go_read, go_write = os.pipe2(os.O_CLOEXEC)
    report_read, report_write = os.pipe2(os.O_CLOEXEC)
    pid = process.fork_tied()
    if pid == 0:
        os.close(go_write)
        os.close(report_read)
        process.run_child(lambda: _init(plan, root, go_read, report_write))
    os.close(go_read)
    os.close(report_write)
    try:
        # The namespace exists for setns(2) only once its PID 1 does (pid_for_children refers to nothing
        # before), and the host's /proc is out of reach once PID 1 has pivoted into the container: PID 1
        # waits for the go.
        namespace = os.open(f"{rootfs.PROC}/self/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC)
        os.write(go_write, b"g")
        report = _read_report(report_read)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(go_write)
        os.close(report_read)
    if report is not None:
        os.close(namespace)
        os.waitpid(pid, 0)
        raise SingpyError(report or "the container's init ended while the container was being built")
    return pid, namespace


def _read_report(fd: int) -> str | None:
    """None once PID 1 reports the container built (one NUL); its error's message; "" if it died silently."""
    data = b""
    while len(data) < _REPORT_LIMIT and (chunk := os.read(fd, _REPORT_LIMIT)):
        data += chunk
        if data == b"\0":
            return None
    return data.decode(errors="replace").rstrip("\0")


def _init(plan: LaunchPlan, root: PreparedRoot, go: int, report: int) -> NoReturn:
    """PID 1: build the container, report, then reap orphans for as long as the namespace lives."""
    from singpy.launch.phases import build_container

    if os.read(go, 1) != b"g":  # the holder died first (fork_tied's signal may not have come yet)
        os._exit(1)
    os.close(go)
    booting = plan.process.action == "boot"  # --boot: /sbin/init replaces this PID 1 once the container is built
    if booting:
        from singpy.launch import boot  # now: out of reach once in the container
    try:
        with open(f"{rootfs.PROC}/self/comm", "w") as comm:  # what `ps` shows inside: not the holder's name
            comm.write("singpy-init")
        build_container(plan, root)
        if booting:
            boot.check_init()
    except SingpyError as error:
        os.write(report, error.message.encode())
        os._exit(error.exit_code)
    except BaseException as error:  # never unwind into the holder's code
        os.write(report, f"internal error in the container's init: {error!r}".encode())
        os._exit(255)
    os.write(report, b"\0")
    os.close(report)
    if booting:
        boot.exec_init(plan.process)
    _reap_orphans()


def _reap_orphans() -> NoReturn:
    """Reap what is reparented to PID 1 (the children of a joiner or a startscript that ended), and pass a stop
    signal from outside the namespace (the holder's: `instance stop`) on to every process in it, until killed.

    SIGCHLD and the stop signals are blocked and taken with sigwaitinfo: one
    that comes between the wait and the sleep stays pending (singpy.launch.process's
    rule), and a blocked signal is queued where the kernel would drop it for a
    namespace's PID 1 without a handler. One sent from inside the namespace
    (its si_pid is a pid there; the holder's is 0) is ignored, as the kernel
    ignores it without a handler; the holder ends PID 1 with SIGKILL.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an ignored SIGCHLD would not be pending
    waited = (signal.SIGCHLD, *STOP_SIGNALS)
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        info = signal.sigwaitinfo(waited)
        if info.si_signo != signal.SIGCHLD and info.si_pid == 0:
            with contextlib.suppress(ProcessLookupError):  # nothing in the namespace but PID 1
                os.kill(-1, info.si_signo)  # every process of the namespace but PID 1


def end(pid: int, startscript: int | None) -> None:
    """Kill everything in the namespace (SIGKILL to its PID 1) and wait until it is gone.

    The startscript is the holder's child, not PID 1's: the kernel lets a
    namespace's PID 1 finish exiting only once such a child is reaped, so it
    is reaped first (killed with the rest).
    """
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for child in (startscript, pid):
        if child is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)

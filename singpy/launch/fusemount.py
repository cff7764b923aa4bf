"""--fusemount: FUSE programs serving mounts inside the container (Apptainer's flag).

A spec is `TYPE:PROGRAM [ARGS...] MOUNTPOINT`, split on white space as
Apptainer splits it ([1] pkg/runtime/engine/apptainer/config/config.go,
SetFuseMount): TYPE `host` (the program is a host program, run in the
host's file tree) or `container` (run in the container's), and their
`-daemon` forms, which singpy runs the same way. As in Apptainer, it implies
--pid and is refused by `enable fusemount = no`.

How ([2] internal/pkg/runtime/engine/apptainer/container_linux.go,
addFuseMount): the launcher opens /dev/fuse, mounts a FUSE filesystem on
MOUNTPOINT with that descriptor (`fd=N,rootmode=40000,user_id,group_id`),
then runs PROGRAM ARGS /dev/fd/N, which libfuse (>= 3.3) takes as "serve
this descriptor, already mounted": the program needs no privilege and no
fusermount. So a user needs /dev/fuse readable and writable (mode 0666);
where it is not, one FATAL line says so before anything starts.

When: in the staging root, once the plan's mounts are made (singpy.launch.
phases.build_container, in the container's PID 1): the mount point is found
in the container's tree alone (singpy.mounts.rootpath: its links stay
inside it) and is a TMPFS of the mount plan (made as any mount point is, in
the overlay or the underlay), which the FUSE mount then covers; a `host`
program is started there, chrooted to the host's tree, as squashfuse is.
A `container` program is started once the container is the root, so that it
finds its files there. Then a first access of each mount waits for its
program to answer (or fails at once if it died). The programs are children
of PID 1, in the PID namespace: they end with the container, whatever way
it ends, and the kernel ends their mounts with it.
"""

from __future__ import annotations

import os
import signal
import time

from singpy import console
from singpy.errors import SingpyError, UsageError
from singpy.host.hostfiles import path_problem, shown
from singpy.launch import process
from singpy.plan import FuseMountSpec, LaunchPlan, MountOp, MountSpec, Privileges, Stage
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.mounts.rootpath import Tree

SIDES = {"host": False, "container": False, "host-daemon": True, "container-daemon": True}
FUSE_DEVICE = "/dev/fuse"
_FLAGS = 0x2 | 0x4  # MS_NOSUID | MS_NODEV, as Apptainer mounts them
SERVE_TIMEOUT = 10.0  # seconds a program gets to answer its mount's first access (as fuse2fs gets to mount)
_HINT = "ask the administrator to make /dev/fuse usable by users (mode 0666)"


class FuseMountError(SingpyError):
    """A --fusemount that can't be served."""


def plan_fusemounts(specs: tuple[str, ...], *, uid: int, enabled: bool,
                    host_path: str) -> tuple[tuple[FuseMountSpec, ...], tuple[MountSpec, ...]]:
    """The --fusemount specs, checked, and the TMPFS mounts that make their mount points."""
    parsed = tuple(spec for spec in (parse(text, host_path) for text in specs) if spec is not None)
    if not parsed:
        return (), ()
    if not enabled:  # Apptainer's words
        raise FuseMountError("fusemount disabled by configuration 'enable fusemount = no'")
    if uid != 0 and not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        raise FuseMountError(f"--fusemount needs FUSE, and {FUSE_DEVICE} is not readable and writable by you",
                             hint="ask the administrator to make /dev/fuse usable by users (mode 0666)")
    points = tuple(MountSpec(op=MountOp.TMPFS, dest=spec.mountpoint, stage=Stage.USER) for spec in parsed)
    return parsed, points


def parse(text: str, host_path: str) -> FuseMountSpec | None:
    """One spec, as Apptainer's SetFuseMount reads it; None for an empty one (Apptainer skips it too)."""
    words = text.split()
    if not words:
        return None
    if len(words) == 1:
        raise UsageError(f"bad --fusemount {shown(text)!r}: no whitespace separators found in command")
    side, sep, program = words[0].partition(":")
    if not sep or side not in SIDES:
        raise UsageError(f"bad --fusemount {shown(text)!r}: fusemount spec begin with an unknown prefix "
                         f"{shown(side)} (host:, container:, host-daemon: or container-daemon:)")
    if not program:
        raise UsageError(f"bad --fusemount {shown(text)!r}: no FUSE program after {side}:")
    mountpoint = words[-1]
    problem = path_problem(mountpoint)
    if not mountpoint.startswith("/") or problem or os.path.normpath(mountpoint) == "/":
        raise UsageError(f"bad --fusemount {shown(text)!r}: the mount point must be an absolute path in the "
                         "container, not its root" + (f" ({problem})" if problem else ""))
    argv = (program, *words[1:-1])
    if side.startswith("host"):
        argv = (_host_program(program, host_path, text), *argv[1:])
    return FuseMountSpec(side=side.removesuffix("-daemon"), program=argv, mountpoint=os.path.normpath(mountpoint),
                         daemon=SIDES[side])


def _host_program(program: str, host_path: str, text: str) -> str:
    """A host program's absolute path, found now (the plan shows which one runs)."""
    from singpy.host.hostfiles import which

    found = which(program, host_path) if "/" not in program else os.path.abspath(program)
    if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
        raise FuseMountError(f"--fusemount {shown(text)!r}: FUSE program {shown(program)} not found on the host "
                             "(or not executable)")
    return found


class Pending(Record):
    """A FUSE mount made whose program is still to start in the container (and its mount to check)."""

    spec: FuseMountSpec
    device: int = -1  # container side: our /dev/fuse descriptor, for the program still to start; -1 once started
    pid: int = 0  # the program's pid once started
    errors: int = -1  # the read end of its stderr


def mount_all(plan: LaunchPlan) -> tuple[Pending, ...]:
    """Called in the staging root once the plan's mounts are made: each FUSE mount on its mount point (found
    in the container's tree alone), and the host's programs started there, chrooted to the host's tree."""
    from singpy.layers import rootfs
    from singpy.mounts.rootpath import Tree

    uid, gid = (0, 0) if plan.fakeroot is not None else (plan.uid, plan.gid)  # the ids of our user namespace
    quiet = console.level() < console.DEBUG
    pending: list[Pending] = []
    try:
        with Tree(rootfs.NEWROOT, proc=rootfs.PROC) as tree:
            for spec in plan.fusemounts:
                device = _mount(tree, spec, uid, gid)
                if spec.side == "container":
                    pending.append(Pending(spec=spec, device=device))
                    continue
                try:
                    pid, errors = process.spawn_helper([*spec.program, f"/dev/fd/{device}"], root=rootfs.HOST,
                                                       keep_fd=device, quiet=quiet)
                finally:
                    # Ours must go before we touch the mount: if the program failed, the kernel then aborts the
                    # connection (ENOTCONN) instead of leaving our first access waiting (as image.squashfs).
                    os.close(device)
                # Checked now, not after the pivot: pivot_root would move a child not yet chrooted into the container.
                _check_served(Pending(spec=spec, pid=pid, errors=errors), tree)
    except BaseException:
        for item in pending:
            if item.device >= 0:
                os.close(item.device)
        raise
    return tuple(pending)


def _mount(tree: Tree, spec: FuseMountSpec, uid: int, gid: int) -> int:
    """Open /dev/fuse and mount a FUSE filesystem on the spec's mount point (the plan's TMPFS there)."""
    from singpy.errors import KernelError
    from singpy.kernel import syscalls as k
    from singpy.layers import rootfs

    name = os.path.basename(spec.program[0])
    try:
        device = os.open(rootfs.host_path(FUSE_DEVICE), os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        raise FuseMountError(f"can't open {FUSE_DEVICE} for --fusemount: {error.strerror}", hint=_HINT) from None
    found = tree.lookup(spec.mountpoint)
    try:
        if found.fd is None:
            raise FuseMountError(f"--fusemount: no mount point {shown(spec.mountpoint)} in the container")
        k.mount(name, k.fd_path(found.fd, rootfs.PROC), f"fuse.{name}", _FLAGS,
                f"fd={device},rootmode=40000,user_id={uid},group_id={gid}")
    except KernelError as error:
        os.close(device)
        raise FuseMountError(f"can't mount FUSE on {shown(spec.mountpoint)} for {shown(name)}: {error.reason}") \
            from None
    except BaseException:
        os.close(device)
        raise
    finally:
        if found.fd is not None:
            os.close(found.fd)
    tree.forget(spec.mountpoint)
    return device


def serve(pending: tuple[Pending, ...], privileges: Privileges) -> None:
    """Called in the finished container: the container's programs started, then every mount checked.

    A program of the image runs as the payload will: no_new_privs, the capabilities left to the payload.
    """
    quiet = console.level() < console.DEBUG
    started: list[Pending] = []
    remaining = list(pending)
    try:
        while remaining:
            item = remaining.pop(0)
            if item.device >= 0:
                try:
                    argv = [_container_program(item.spec.program[0]), *item.spec.program[1:], f"/dev/fd/{item.device}"]
                    pid, errors = process.spawn_helper(argv, root="/", keep_fd=item.device, quiet=quiet,
                                                       privileges=privileges)
                finally:
                    os.close(item.device)  # as in mount_all
                item = item.replace(device=-1, pid=pid, errors=errors)
            started.append(item)
    finally:
        for item in remaining:
            if item.device >= 0:
                os.close(item.device)
    for item in started:
        _check_served(item)


def _container_program(program: str) -> str:
    if "/" in program:
        return program
    from singpy.constants import DEFAULT_PATH
    from singpy.host.hostfiles import which

    found = which(program, DEFAULT_PATH)
    if found is None:
        raise FuseMountError(f"--fusemount: FUSE program {shown(program)} not found in the container")
    return found


def _check_served(item: Pending, tree: Tree | None = None) -> None:
    """A first stat of the mount waits for its program to answer, or finds it gone (ENOTCONN).

    `tree`: the container's tree, seen from the staging root; None once the container is the root.
    The stat is made in a child, waited for SERVE_TIMEOUT seconds: a program that lives on but never
    answers would otherwise hold us in the kernel for good (a FUSE request waits for its answer, and only
    SIGKILL ends that wait). Past the deadline the program is killed, which ends its connection.
    """
    error = _first_access(item, tree)
    if tree is not None:
        tree.forget(item.spec.mountpoint)
    if error is None:
        return
    # `errors` stays open, unread, for our lifetime: closed, a later message would kill the program (SIGPIPE).
    reason = process.helper_failure(item.pid, item.errors) or error
    raise FuseMountError(f"--fusemount on {shown(item.spec.mountpoint)}: "
                         f"{shown(os.path.basename(item.spec.program[0]))} failed: {reason}")


def _first_access(item: Pending, tree: Tree | None) -> str | None:
    """Stat the mount in a child: None once it answered, else why not (an errno's text); FuseMountError
    past the deadline."""
    child = process.fork_tied()
    if child == 0:
        code = 0
        try:
            _stat_mount(item.spec.mountpoint, tree)
        except OSError as error:
            code = error.errno or 255
        except BaseException:
            code = 255
        os._exit(code)
    deadline, pause = time.monotonic() + SERVE_TIMEOUT, 0.0005
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)  # its wait for the answer ends with SIGKILL alone
            os.waitpid(child, 0)
            _stop_program(item.pid)
            # Its stderr is not read: a process of it that left its group may hold the pipe open for good.
            raise FuseMountError(f"--fusemount on {shown(item.spec.mountpoint)}: "
                                 f"{shown(os.path.basename(item.spec.program[0]))} did not answer in "
                                 f"{SERVE_TIMEOUT:.0f} s: stopped")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    code = os.waitstatus_to_exitcode(status[1])
    return None if code == 0 else os.strerror(code) if 0 < code < 255 else "its mount could not be checked"


def _stat_mount(mountpoint: str, tree: Tree | None) -> None:
    if tree is None:
        os.stat(mountpoint)
        return
    found = tree.lookup(mountpoint)
    assert found.fd is not None  # mounted on just before
    os.fstat(found.fd)


def _stop_program(pid: int) -> None:
    """SIGKILL to the program's process group (a helper leads its own), then reaped: its /dev/fuse closed,
    the kernel aborts the connection; whatever of it is left ends with the container's PID namespace."""
    try:  # noqa: SIM105 - contextlib is not imported for one call (start-up time)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)

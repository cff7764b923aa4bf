"""Shared containers: the ranks of a job step on one node run in one container.

Why: with one user namespace per rank, Open MPI's shared-memory transport
can't use single-copy (CMA: process_vm_readv is refused across user
namespaces) and, in Open MPI 4.1, messages of a few MiB then hang for ever.
Ranks in one container also cost one set-up per node instead of one per rank.

How (Apptainer's --sharens, Charliecloud's --join): every rank's launcher,
with the same plan (singpy.launch.planner: the key is the job step plus a digest of
the plan without the rank's own process), meets at an abstract unix socket
named by that key. Abstract names live in the network namespace, so they are
per node, need no file (nothing to clean up on a shared or full /tmp), and
binding one is atomic: the launcher that binds it first forks the *holder*,
a process of its own session that builds the container exactly as a plain
launch would (singpy.launch.launch phases) and then, instead of running a payload,
stays in it. Every launcher, the first included, connects; the holder sends
its namespaces as file descriptors (SCM_RIGHTS: no /proc lookup, no pid that
could be recycled) and the image's scripts; the launcher joins them (setns,
user namespace first) and execs its payload in place, keeping the connection
open across execve. The holder counts open connections: when the last rank
has exited (scancel included: the kernel closes their sockets), it closes the
socket and exits, stopping the helpers that served the image (squashfuse).

Trust: anyone can bind an abstract name, and names are computable (and
listed in /proc/net/unix). Both ends check the other's uid (SO_PEERCRED): a
name held by another user, or bound with nobody listening for a few
seconds, makes this rank run alone (a warning), never fail or join that
user's namespaces. A process of our own uid may be code confined in an
earlier container (it shares the host's network namespace): what it sends
is checked (singpy.launch.rendezvous._check) before anything is joined or
run: exactly the namespaces of the plan, the mount namespace among them,
of the types named, made from our user namespace, and sent by a process of
our PID namespace that is in them. Code in a container can name only its
own namespaces, and with --pid is in a PID namespace of its own.
"""

from __future__ import annotations

import os
import time

from singpy import console
from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.launch.rendezvous import JOIN_TIMEOUT, NAMESPACES, Expected, Retry, Taken, bind, connect, receive
from singpy.plan import LaunchPlan

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import _socket
    from collections.abc import Callable
    from typing import NoReturn

BOUND_WAIT = 3.0  # seconds a rank waits for a bound name to listen, before it runs in a container of its own


def run(plan: LaunchPlan, alone: Callable[[LaunchPlan], int]) -> int:
    """Join the container of this job step on this node, making it first if nobody has.

    Execs the payload in place; returns only with a PID namespace (the payload's exit status), where the
    payload is forked into it and this launcher stays outside as its supervisor (singpy.launch.pidns).
    A name another user holds (anyone can bind any abstract name) is no reason to fail: this rank then runs
    in a container of its own (`alone`, singpy.launch.launch.launch), with a warning.
    """
    assert plan.share is not None
    deadline = time.monotonic() + JOIN_TIMEOUT
    expected = expect(plan)
    stuck = None  # since when the name has been bound with nobody listening
    while True:
        try:
            connection = connect(plan.share.socket)
        except Taken as taken:
            if not plan.share.create:  # an instance: its own socket, or none
                raise
            return alone(_alone(plan, taken.message))
        if connection is None:
            stuck = _make(plan, stuck)
            if stuck is not None and time.monotonic() - stuck > BOUND_WAIT:  # a rank binds and listens at once
                return alone(_alone(plan, f"the shared container's socket @{plan.share.socket} is bound, but "
                                          "nobody listens"))
            continue
        stuck = None
        answer = _answer(plan, connection, deadline, expected)
        if answer is None:
            continue
        fds, scripts = answer
        from singpy.launch import process  # now: the package is out of reach once we are in the container

        _enter(plan, connection, fds)
        if any(name == "pid" for name, _ in fds):  # setns moved only our children into the PID namespace
            return process.supervise(_payload(plan, scripts))
        process.exec_process(plan.process, scripts)


def _make(plan: LaunchPlan, stuck: float | None) -> float | None:
    """Nobody listens at the name: bind it and start the holder (None), or wait a moment for the rank that has
    bound it to listen (since when it has been bound: `stuck`)."""
    assert plan.share is not None
    if not plan.share.create:
        raise SingpyError(f"{plan.share.origin} is not running")
    listener = bind(plan.share.socket)
    if listener is None:
        time.sleep(0.005)  # another rank has bound the name and is about to listen
        return stuck or time.monotonic()
    console.verbose(f"{plan.share.origin}: this rank builds the shared container")
    from singpy.launch import holder

    holder.start(plan, listener).release()  # a job's holder: it ends with its last rank
    return None


def _answer(plan: LaunchPlan, connection: _socket.socket, deadline: float,
            expected: Expected) -> tuple[list[tuple[str, int]], ImageScripts] | None:
    """The holder's namespaces and the image's scripts, checked; None: start over (its last rank left)."""
    assert plan.share is not None
    try:
        fds, scripts, _ = receive(connection, deadline, plan.share.origin, expected)
    except Retry:
        connection.close()
        if time.monotonic() > deadline:
            raise SingpyError(f"{plan.share.origin}: timed out waiting for the shared container") from None
        return None
    except BaseException:
        connection.close()
        raise
    return fds, scripts


def expect(plan: LaunchPlan) -> Expected:
    """What the holder must send: a job's, the namespaces of this plan (the ranks' plans are one: the socket's
    name is their digest); an instance's, those it was started with (the joining command's plan does not say)."""
    assert plan.share is not None
    if not plan.share.create:
        return Expected(names=None, sender=False)
    ns = plan.namespaces
    planned = {"user": ns.user, "mnt": True, "ipc": ns.ipc, "uts": ns.uts, "net": ns.net, "pid": ns.pid}
    return Expected(names=frozenset(name for name, wanted in planned.items() if wanted), sender=True)


def _alone(plan: LaunchPlan, why: str) -> LaunchPlan:
    assert plan.share is not None
    console.warning(f"{why}: this launch of {plan.share.origin} runs in a container of its own")
    from singpy.launch import jobs

    return jobs.unshared(plan, os.environ)


def _enter(plan: LaunchPlan, connection: _socket.socket, fds: list[tuple[str, int]]) -> None:
    """Into the holder's namespaces, keeping the connection for the payload (the holder counts it)."""
    assert plan.share is not None
    caps.preload(plan.process.privileges)  # (python-prctl too)
    _join(fds)
    console.verbose(f"{plan.share.origin}: joined the shared container")
    os.set_inheritable(connection.fileno(), True)  # held by the payload: the holder counts it


def _payload(plan: LaunchPlan, scripts: ImageScripts) -> Callable[[], NoReturn]:
    from singpy.launch import process

    return lambda: process.exec_process(plan.process, scripts)


def _join(fds: list[tuple[str, int]]) -> None:
    """setns into each namespace, the user namespace first (it gives the rights over the others)."""
    types = dict(NAMESPACES)
    order = list(types)
    for name, fd in sorted(fds, key=lambda pair: order.index(pair[0])):
        k.setns(fd, types[name], f"the shared container's {name} namespace")
        os.close(fd)
    # Joining the mount namespace put us at its root, which is the container's (pivot_root moved it there).

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

Trust: both ends check the other's uid (SO_PEERCRED). Anyone can bind an
abstract name; a holder of another user is refused, so root never joins a
namespace an unprivileged user made.
"""

from __future__ import annotations

import os
import time

from singpy import console
from singpy.errors import SingpyError
from singpy.image.scripts import ImageScripts
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.launch.rendezvous import JOIN_TIMEOUT, NAMESPACES, Retry, bind, connect, receive
from singpy.plan import LaunchPlan

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

def run(plan: LaunchPlan) -> int:
    """Join the container of this job step on this node, making it first if nobody has.

    Execs the payload in place; returns only with a PID namespace (the payload's exit status), where the
    payload is forked into it and this launcher stays outside as its supervisor (singpy.launch.pidns).
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
                from singpy.launch import holder

                holder.start(plan, listener).release()  # a job's holder: it ends with its last rank
            elif time.monotonic() > deadline:
                raise SingpyError(f"{plan.share.origin}: timed out waiting for the shared container")
            else:
                time.sleep(0.005)  # another rank has bound the name and is about to listen
            continue
        try:
            fds, scripts, _ = receive(connection, deadline, plan.share.origin)
        except Retry:
            connection.close()
            continue
        from singpy.launch import process  # now: the package is out of reach once we are in the container

        caps.preload(plan.process.privileges)  # (python-prctl too)
        own_pid = any(name == "pid" for name, _ in fds)
        _join(fds)
        console.verbose(f"{plan.share.origin}: joined the shared container")
        os.set_inheritable(connection.fileno(), True)  # held by the payload: the holder counts it
        if own_pid:  # setns moved only our children into the PID namespace: the payload is one
            return process.supervise(_payload(plan, scripts))
        process.exec_process(plan.process, scripts)


def _payload(plan: LaunchPlan, scripts: ImageScripts) -> Callable[[], NoReturn]:
    from singpy.launch import process

    return lambda: process.exec_process(plan.process, scripts)


def _join(fds: list[tuple[str, int]]) -> None:
    """setns into each namespace, the user namespace first (it gives the rights over the others)."""
    types = dict(NAMESPACES)
    for name, fd in fds:
        k.setns(fd, types[name], f"the shared container's {name} namespace")
        os.close(fd)
    # Joining the mount namespace put us at its root, which is the container's (pivot_root moved it there).

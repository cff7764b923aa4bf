"""An instance's network (root, --network bridge|ptp): wired from the host, undone once its holder has gone.

A plain run's launcher stays outside the container as its supervisor and
removes the veth (and an emptied bridge) as the container ends
(singpy.launch.launch.attach_network). An instance's holder can't: it
enters the container, where the host's netlink and lock files are out of
reach, and `instance stop` may SIGKILL it. So the holder wires the network
namespace before it enters any (singpy.kernel.netns.attach) and forks a
keeper that stays in the host: it waits on a pipe whose write end the holder
alone holds, which ends however the holder does, then detaches the network.
"""

from __future__ import annotations

import os

from singpy.plan import LaunchPlan

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.kernel.netns import Attachment

KEEPERS: list[int] = []  # the keeper: not one of the instance's processes, it must outlive the holder
ADDRESS: list[str] = []  # the container's address, once wired: the holder reports it for `instance list`


def wired(plan: LaunchPlan) -> int | None:
    """The network namespace wired for the container (its descriptor), and the keeper started; None when the
    plan asks for no network wired from the host (none: the holder's own unshare makes a loopback one)."""
    if plan.network is None or plan.network.type == "none" or os.getuid() != 0:
        return None
    from singpy.kernel import netns

    attachment = netns.attach(plan.network)
    try:
        ended, alive = os.pipe2(os.O_CLOEXEC)
        keeper = os.fork()
    except BaseException:
        netns.detach(attachment)
        raise
    if keeper == 0:
        _keep(attachment, ended)
    os.close(ended)
    KEEPERS.append(keeper)
    ADDRESS.append(attachment.address.partition("/")[0])
    # `alive` stays open, close-on-exec, for as long as the holder lives (its forks hold it until they exec)
    return attachment.netns_fd


def _keep(attachment: Attachment, ended: int) -> None:
    """In the keeper: wait for the holder's end, then remove the veth (and the bridge if singpy made it and
    nothing else uses it). Nothing of the holder's is held meanwhile (its listening socket above all)."""
    from singpy import console
    from singpy.errors import SingpyError
    from singpy.kernel import netns

    try:
        with open("/proc/self/comm", "w") as comm:
            comm.write("singpy-netkeep")
        low = 3  # (stdin, stdout, stderr: /dev/null and the instance's log, as the holder's)
        for fd in sorted({ended, attachment.netns_fd}):
            if fd > low:  # (never an empty range: os.closerange(0, 0) closes every descriptor)
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        os.setsid()  # out of the holder's session and process group: no signal meant for them
        while os.read(ended, 1):
            pass
        try:
            netns.detach(attachment)
        except SingpyError as error:
            console.warning(f"{error.message}: the next bridge or ptp run will remove it")
    finally:
        os._exit(0)

"""A launch with resource limits: its cgroup made, the container started in it, the cgroup removed at the end.

The launcher makes the cgroup (singpy.cgroups.manager) and stays outside it
as the container's supervisor (singpy.launch.process.supervise): its child
moves itself into the cgroup before anything else, so every process of the
container, the payload's first instruction included, runs under the limits;
when the child has ended, the supervisor kills what is left in the cgroup and
removes it. An instance's holder does the same for itself (`enter`, `leave`).
"""

from __future__ import annotations

from singpy.cgroups import manager
from singpy.launch import process
from singpy.plan import CgroupSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn


def run_limited(spec: CgroupSpec, container: Callable[[], NoReturn]) -> int:
    """Run `container` (the rest of the launch) in a child that starts in the cgroup; its exit status."""
    manager.create(spec)
    try:
        return process.supervise(lambda: _in_cgroup(spec, container))
    finally:
        manager.remove(spec)


def _in_cgroup(spec: CgroupSpec, container: Callable[[], NoReturn]) -> NoReturn:
    manager.join(spec)
    container()


def enter(spec: CgroupSpec) -> tuple[str, ...]:
    """An instance's holder: the cgroup made and the holder in it (all it forks is born there); where it was."""
    back = manager.origins(spec)
    manager.create(spec)
    try:
        manager.join(spec)
    except BaseException:
        manager.remove(spec)
        raise
    return back


def leave(spec: CgroupSpec, back: tuple[str, ...]) -> None:
    """The holder, ending: out of the cgroup (back where it was), the rest killed and the cgroup removed."""
    manager.leave(spec, back)
    manager.remove(spec)

"""--netns-path PATH: the container joins an existing network namespace (Apptainer's flag).

The rules are Apptainer 1.5's ([1] internal/pkg/runtime/engine/apptainer/
prepare_linux.go, joinNetns): the path must exist; root may join any
network namespace; another user only one listed, exactly as given, in
`allow netns paths`, and only when `allow net users` or `allow net groups`
names them. --net with it is ignored, with Apptainer's warning: the
namespace joined is the container's network.

singpy is never setuid: what root's privilege did for Apptainer's setuid
starter, the kernel decides for a user. setns(2) into a network namespace
needs CAP_SYS_ADMIN over the user namespace that owns it, which an
unprivileged user never has on the host (even a namespace made in a user
namespace of their own would need singpy to enter that user namespace
first, which it does not do): the join fails with one FATAL line saying so,
after the configuration's checks, which come first as in Apptainer. The
namespace is joined first, on the host, before any new user namespace exists
(`join`, from singpy.launch.phases.enter_namespaces).
"""

from __future__ import annotations

import os

from singpy.config.sysconf import SysConfig
from singpy.errors import SingpyError
from singpy.host.hostfiles import path_problem, shown


class NetnsPathError(SingpyError):
    """A --netns-path the launch may not, or can't, join."""


def plan_netns_path(path: str, *, uid: int, user: str, config: SysConfig) -> str:
    """The network namespace path to join, checked against singpy.conf (Apptainer's rules); "" for none."""
    if not path:
        return ""
    problem = path_problem(path)
    if problem:
        raise NetnsPathError(f"bad --netns-path {shown(path)!r}: {problem}")
    if not os.path.exists(path):  # Apptainer's words
        raise NetnsPathError(f"while checking netns path: {shown(path)} does not exist")
    if uid == 0:
        return path
    from singpy.launch.network import allowed_net_user

    if path not in {item.strip() for value in config.items("allow netns paths") for item in value.split(",")}:
        raise NetnsPathError(f"{shown(path)!r} is not an allowed netns path in singpy.conf",
                             hint="the system administrator lists the paths users may join in `allow netns paths`")
    if not allowed_net_user(uid, user, config):
        raise NetnsPathError("you are not permitted to join network namespaces in singpy.conf",
                             hint="`allow net users` or `allow net groups` in singpy.conf must name you")
    return path


def join(path: str) -> None:
    """Called on the host, before any new namespace: setns(2) into the network namespace at `path`."""
    from singpy.errors import KernelError
    from singpy.kernel import netns

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        raise NetnsPathError(f"can't open --netns-path {shown(path)}: {error.strerror}") from None
    try:
        netns.join(fd)
    except KernelError as error:
        raise NetnsPathError(_refusal(path, error.reason)) from None
    finally:
        os.close(fd)


def _refusal(path: str, reason: str) -> str:
    """Why setns(2) refused: not a network namespace (EINVAL), or not ours to join (EPERM)."""
    if "Invalid argument" in reason:
        return f"--netns-path {shown(path)} is not a network namespace"
    if os.geteuid() != 0 and ("not permitted" in reason or "denied" in reason):
        return (f"can't join the network namespace {shown(path)}: the kernel lets only a process with "
                "CAP_SYS_ADMIN over it join it, and singpy is never setuid: ask root to run the container")
    return f"can't join the network namespace {shown(path)}: {reason}"

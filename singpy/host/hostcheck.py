"""Why this host refuses what singpy needs, in words a user on a login node can act on.

A failed unshare(2) says "No space left on device"; a failed uid_map write
says "Operation not permitted". Neither names the cause, which is a host
setting an administrator chose: a sysctl, a security module, a seccomp
filter, the container singpy itself runs in. The functions here read what
the host shows (read-only: /proc/sys, /proc/self/status, the files container
engines leave) and build one message naming the cause and the fix
(docs/troubleshooting.md lists them all).

Imported only when something has failed, or by `singpy check`: never on the
start-up path of `singpy exec`. Every /proc/sys value is read through
`sysctl`, so a test simulates a host by binding files over /proc/sys in a
private mount namespace (tests/support/seccomp.py), as an administrator's
setting would show, with no switch in the product.
"""

from __future__ import annotations

import errno as errnos
import os
import sys

from singpy.constants import FUSE_DEVICE

ENOSPC, EPERM, EACCES, EUSERS, EINVAL = errnos.ENOSPC, errnos.EPERM, errnos.EACCES, errnos.EUSERS, errnos.EINVAL

MAX_USERNS = "user.max_user_namespaces"
USERNS_CLONE = "kernel.unprivileged_userns_clone"  # Debian and Ubuntu kernels before 2024 only
APPARMOR_USERNS = "kernel.apparmor_restrict_unprivileged_userns"  # Ubuntu 23.10 and later
SUGGESTED_MAX = 15000  # what RHEL's documentation suggests for rootless containers
MIN_KERNEL = (4, 18)  # RHEL 8's kernel: the oldest singpy supports
HINT = "run `singpy check` for what else this host allows; docs/troubleshooting.md explains each message"

# The package holding each program singpy runs, on Debian/Ubuntu and on RHEL/Fedora.
PACKAGES = {
    "squashfuse": ("squashfuse", "squashfuse"),
    "squashfuse_ll": ("squashfuse", "squashfuse"),
    "unsquashfs": ("squashfs-tools", "squashfs-tools"),
    "mksquashfs": ("squashfs-tools", "squashfs-tools"),
    "fuse-overlayfs": ("fuse-overlayfs", "fuse-overlayfs"),
    "fuse2fs": ("fuse2fs", "e2fsprogs"),
    "newuidmap": ("uidmap", "shadow-utils"),
    "newgidmap": ("uidmap", "shadow-utils"),
}


# --- reading the host ------------------------------------------------------------------------------------------------


def sysctl(name: str) -> str | None:
    """The value of sysctl `name` ("user.max_user_namespaces") from /proc/sys; None where this kernel has none."""
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as handle:
            return handle.read().strip()
    except OSError:
        return None


def status_field(name: str, pid: str = "self") -> str | None:
    """A field of /proc/PID/status ("Seccomp", "NoNewPrivs"), None when absent."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        pass
    return None


def seccomp_filtered() -> bool:
    """Whether a seccomp filter applies to this process (Seccomp: 2 in /proc/self/status)."""
    return status_field("Seccomp") == "2"


def container() -> str | None:
    """The container engine singpy runs under ("docker", "podman", "kubernetes", ...), or None on a host.

    From the marks engines leave: /.dockerenv (Docker), /run/.containerenv
    (Podman), and the cgroup paths of PID 1.
    """
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    try:
        with open("/proc/1/cgroup") as handle:
            groups = handle.read()
    except OSError:
        return None
    for mark, engine in (("kubepods", "kubernetes"), ("docker", "docker"), ("libpod", "podman"),
                         ("containerd", "containerd"), ("lxc", "lxc")):
        if mark in groups:
            return engine
    return None


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of the running kernel, from its release string ("5.14.0-362.el9.x86_64")."""
    numbers = [*(release or os.uname().release).split("-")[0].split("."), "0"][:2]
    leading = [number[:len(number) - len(number.lstrip("0123456789"))] or "0" for number in numbers]
    return int(leading[0]), int(leading[1])


def python_binary() -> str:
    """The interpreter running singpy, as an AppArmor profile must name it (links resolved)."""
    return os.path.realpath(sys.executable)


def fuse_problem(uid: int) -> str | None:
    """Why /dev/fuse can't serve `uid`, with the fix in parentheses; None when it can."""
    found = fuse_state(uid)
    return None if found is None else f"{found[0]} ({found[1]})"


def fuse_state(uid: int) -> tuple[str, str] | None:
    """(why /dev/fuse can't serve `uid`, the fix), or None when it can."""
    if not os.path.exists(FUSE_DEVICE):
        inside = container()
        if inside:
            return (f"{FUSE_DEVICE} does not exist in this {inside} container",
                    "start that container with --device /dev/fuse")
        return f"{FUSE_DEVICE} does not exist", "the fuse kernel module is not loaded: `modprobe fuse`, as root"
    if uid == 0 or os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        return None
    mode = os.stat(FUSE_DEVICE).st_mode & 0o777
    return (f"{FUSE_DEVICE} is not readable and writable by you (its mode is {mode:o})",
            "an administrator can make it 0666, as most distributions do")


def package(tool: str) -> str:
    """Which package installs `tool`, said as a fix ("install squashfs-tools (Debian, Ubuntu and RHEL)")."""
    debian, rhel = PACKAGES.get(tool, (tool, tool))
    if debian == rhel:
        return f"install package {debian} (Debian, Ubuntu, RHEL, Fedora)"
    return f"install package {debian} (Debian, Ubuntu) or {rhel} (RHEL, Fedora)"


# --- messages --------------------------------------------------------------------------------------------------------


def unshare_failure(error: int) -> str | None:
    """Why unshare(CLONE_NEWUSER) failed with `error`, and what to do; None when nothing more can be said."""
    if error in (ENOSPC, EUSERS):
        return _no_space()
    if error == EPERM:
        return _not_permitted()
    if error == EINVAL and not os.path.exists("/proc/self/ns/user"):
        return ("this kernel is built without user namespaces (CONFIG_USER_NS); singpy needs a kernel that has "
                "them, or to run as root")
    return None


def _no_space() -> str:
    value = sysctl(MAX_USERNS)
    fix = f"`sysctl -w {MAX_USERNS}={SUGGESTED_MAX}`, kept in a file of /etc/sysctl.d"
    if value == "0":
        return f"user namespaces are disabled on this host ({MAX_USERNS} = 0); an administrator can enable them: {fix}"
    shown = f" ({MAX_USERNS} = {value})" if value is not None else f" ({MAX_USERNS})"
    return (f"the host's limit of user namespaces is reached{shown}, or they are nested too deep; an administrator "
            f"can raise it: {fix}")


def _not_permitted() -> str:
    if sysctl(USERNS_CLONE) == "0":
        return (f"unprivileged user namespaces are disabled on this host ({USERNS_CLONE} = 0); an administrator "
                f"can enable them: `sysctl -w {USERNS_CLONE}=1`, kept in a file of /etc/sysctl.d")
    inside = container()
    if seccomp_filtered():
        if inside:
            return (f"a seccomp filter refuses it: singpy runs inside a {inside} container, whose default seccomp "
                    "profile blocks unshare and mount; start that container with `--security-opt "
                    "seccomp=unconfined` (or a profile allowing unshare), or run singpy on the host")
        return ("a seccomp filter on this process refuses it (Seccomp: 2 in /proc/self/status); run singpy "
                "outside the sandbox or service manager that installed the filter")
    if inside:
        return (f"singpy runs inside a {inside} container that does not allow nested namespaces; start that "
                "container with --privileged (or the capabilities and profile it needs), or run singpy on the host")
    if sysctl(APPARMOR_USERNS) == "1":
        return _apparmor()
    return "the kernel or a security module refuses unprivileged user namespaces here"


def _apparmor() -> str:
    return (f"AppArmor restricts unprivileged user namespaces on this host ({APPARMOR_USERNS} = 1, Ubuntu's "
            f"default since 23.10); an administrator can allow singpy with an AppArmor profile granting `userns,` "
            f"to {python_binary()} (docs/troubleshooting.md has one), or set the sysctl to 0")


def in_userns_failure(error: int) -> str | None:
    """Why a step right after the unshare (the uid_map write, the first mount) failed; None if unexplained.

    On Ubuntu 23.10 and later AppArmor lets the namespace be created, then
    denies every capability in it: the first privileged step fails.
    """
    if error in (EPERM, EACCES) and sysctl(APPARMOR_USERNS) == "1":
        return _apparmor()
    return None


def map_tool_failure(tool: str, path: str) -> str | None:
    """Why newuidmap/newgidmap (at `path`) could not map ids, from what can be seen; None if unexplained."""
    if status_field("NoNewPrivs") == "1":
        return (f"{tool} is setuid, and this process may not gain privileges (NoNewPrivs: 1 in /proc/self/status, "
                "set by a container or service manager); run singpy where no_new_privs is not set, or without "
                "--fakeroot's subordinate ids")
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not (info.st_mode & 0o4000 and info.st_uid == 0) and not _has_file_caps(path):
        return f"{path} is neither setuid root nor has file capabilities; reinstall it: {package(tool)}"
    return None


def _has_file_caps(path: str) -> bool:
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False

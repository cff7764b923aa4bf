"""singpy.host.hostcheck's pure parts: version parsing, package names, and messages from what this host shows.

The messages for other hosts (a sysctl at 0, AppArmor, seccomp) are shown by
tests/integration/test_restricted_hosts.py, which emulates those hosts.
"""

from __future__ import annotations

import errno
import os

import pytest

from singpy.host import hostcheck


@pytest.mark.parametrize(("release", "version"), [("5.14.0-362.el9.x86_64", (5, 14)), ("4.18.0", (4, 18)),
                                                  ("6.8.0-45-generic", (6, 8)), ("3.10.0-1160.el7", (3, 10)),
                                                  ("6.1", (6, 1)), ("6", (6, 0)), ("6.10rc1", (6, 10))])
def test_kernel_version(release: str, version: tuple[int, int]) -> None:
    assert hostcheck.kernel_version(release) == version
    assert (hostcheck.kernel_version(release) >= hostcheck.MIN_KERNEL) == (version >= (4, 18))


def test_packages_name_both_families() -> None:
    assert hostcheck.package("unsquashfs") == "install package squashfs-tools (Debian, Ubuntu, RHEL, Fedora)"
    assert hostcheck.package("newuidmap") == "install package uidmap (Debian, Ubuntu) or shadow-utils (RHEL, Fedora)"
    assert hostcheck.package("squashfuse_ll") == hostcheck.package("squashfuse")


def test_sysctl_reads_proc_sys() -> None:
    with open("/proc/sys/kernel/ostype") as handle:
        assert hostcheck.sysctl("kernel.ostype") == handle.read().strip() == "Linux"
    assert hostcheck.sysctl("kernel.no_such_setting_here") is None


def test_status_field() -> None:
    assert hostcheck.status_field("Pid") == str(os.getpid())
    assert hostcheck.status_field("NoSuchField") is None


def test_no_space_names_the_sysctl_and_its_value() -> None:
    """ENOSPC reads the limit as this host has it (a host with user namespaces: not 0)."""
    value = hostcheck.sysctl(hostcheck.MAX_USERNS)
    message = hostcheck.unshare_failure(errno.ENOSPC)
    assert message is not None
    assert f"({hostcheck.MAX_USERNS} = {value})" in message
    assert f"sysctl -w {hostcheck.MAX_USERNS}=15000" in message
    assert hostcheck.unshare_failure(errno.EUSERS) == message  # what kernels before 4.9 said


def test_unexplained_errors_are_left_alone() -> None:
    assert hostcheck.unshare_failure(errno.ENOMEM) is None
    assert hostcheck.unshare_failure(errno.EINVAL) is None  # this kernel has user namespaces: not the cause
    assert hostcheck.in_userns_failure(errno.ENOENT) is None


def test_fuse_state_of_root() -> None:
    """Root may open /dev/fuse whatever its mode: only a missing device is a problem."""
    state = hostcheck.fuse_state(0)
    assert (state is None) == os.path.exists("/dev/fuse")
    assert hostcheck.fuse_problem(0) == (None if state is None else f"{state[0]} ({state[1]})")

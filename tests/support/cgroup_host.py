"""The host's cgroups as the tests of limits see them (tests/integration/test_cgroups.py, test_instance_commands.py,
test_instance_records.py): the mounts in /proc/self/mountinfo, whether the host runs cgroup v1, and `needs_v1`, the
mark of a test that needs it."""

from __future__ import annotations

import pytest


def mounts() -> list[tuple[str, str]]:
    with open("/proc/self/mountinfo") as mountinfo:
        lines = mountinfo.read().splitlines()
    found = []
    for line in lines:
        fields, _, tail = line.partition(" - ")
        found.append((fields.split()[4], tail.split()[0]))
    return found


def v1_host() -> bool:
    return ("/sys/fs/cgroup", "cgroup2") not in mounts() and any(kind == "cgroup" for _, kind in mounts())


needs_v1 = pytest.mark.skipif(not v1_host(), reason="this host does not run cgroup v1")

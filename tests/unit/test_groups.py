"""The user's groups as the container's /etc/group gets them (task "groups"): HostInfo.groups, read from the
host's group database in one pass, and the lines singpy.mounts.system plans from them."""

from __future__ import annotations

import ast
import grp
import os
import subprocess
import sys

import pytest

from singpy.host import host as host_module
from singpy.mounts.system import identity_files
from singpy.plan import MountOp


def _host(**fields: object) -> host_module.HostInfo:
    captured = host_module.capture({"HOME": "/home/alice", "PATH": "/bin"})
    values: dict[str, object] = {"uid": 1000, "gid": 1000, "user": "alice", "group": "users", "gecos": "Alice",
                                 "shell": "/bin/sh", "home": "/home/alice", "cwd": "/",
                                 "groups": ((10, "wheel"), (27, "sudo"))}
    return captured.replace(**{**values, **fields})


def _content(host: host_module.HostInfo, dest: str, root: tuple[str, str, str] | None = None,
             **flags: bool) -> str | None:
    options = {"fakeroot": False, "passwd": True, "group": True, **flags}
    specs = identity_files(host, home="/home/alice", root=root, **options)
    found = [spec for spec in specs if spec.dest == dest]
    assert all(spec.op == MountOp.FILE and spec.merge and spec.readonly for spec in found)
    return found[0].content if found else None


def test_every_group_gets_a_line_the_primary_first() -> None:
    assert _content(_host(), "/etc/group") == "users:x:1000:alice\nwheel:x:10:alice\nsudo:x:27:alice"


def test_a_primary_group_without_a_name_writes_no_group_file() -> None:
    """Apptainer's files.Group fails then (the planner warns: tests/integration/test_identity_files.py): the
    image's /etc/group is left as it is, the other groups' names not added either."""
    assert _content(_host(group=""), "/etc/group") is None
    assert _content(_host(group="", groups=()), "/etc/group") is None


def test_config_group_no_plans_no_group() -> None:
    assert _content(_host(), "/etc/group", group=False) is None
    assert _content(_host(), "/etc/passwd", group=False) == "alice:x:1000:1000:Alice:/home/alice:/bin/sh"


def test_fakeroot_merges_roots_entry() -> None:
    """The host's root entry (its name, gecos and shell), merged into the image's root line or added (where
    Apptainer 1.5 adds the user's own entry: docs/isolation.md); not the user's name."""
    root = ("root", "Super User", "/bin/bash")
    assert _content(_host(), "/etc/passwd", root, fakeroot=True) == "root:x:0:0:Super User:/home/alice:/bin/bash"
    assert _content(_host(), "/etc/passwd", fakeroot=True) == "root:x:0:0:root:/home/alice:/bin/sh"  # none known
    assert _content(_host(), "/etc/group", fakeroot=True) == "users:x:1000:alice\nwheel:x:10:alice\nsudo:x:27:alice"


CAPTURE = ("import sys; sys.path.insert(0, sys.argv[1]); from singpy.host.host import capture; "
           "info = capture({}); print(info.gid, repr(info.group), repr(info.groups))")


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a process's supplementary groups needs root")
def test_capture_names_the_supplementary_groups_the_host_knows() -> None:
    """A process with groups the host names and one it doesn't: the named ones, in getgroups(2)'s order,
    the primary group apart (and not repeated), the unnamed one left out."""
    known = sorted({entry.gr_gid for entry in grp.getgrall()} - {0})[:3]
    unknown = next(gid for gid in range(54321, 54421) if gid not in {entry.gr_gid for entry in grp.getgrall()})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", CAPTURE, root], user=0, group=known[0],
                          extra_groups=[unknown, *known], capture_output=True, text=True, check=True, timeout=30)
    gid, group, groups = done.stdout.split(" ", 2)
    assert (int(gid), ast.literal_eval(group)) == (known[0], grp.getgrgid(known[0]).gr_name)
    expected = [(number, grp.getgrgid(number).gr_name) for number in known[1:]]
    expected.append((0, grp.getgrgid(0).gr_name))  # root's passwd group, last (Apptainer adds pw.GID too)
    assert ast.literal_eval(groups) == tuple(expected)

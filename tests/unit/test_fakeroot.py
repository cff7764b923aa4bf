"""singpy.layers.fakeroot: subordinate ranges, the mapping chosen, and what --fakeroot changes in the plan."""

from __future__ import annotations

import pwd
from pathlib import Path

from singpy.config import sysconf
from singpy.host import host as host_module
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.layers.fakeroot import pick_range, plan_id_map, read_ranges
from singpy.plan import ImageSpec, MountOp

SUBUID = "alice:100000:65536\nbob:165536:65536\n1000:300000:10\nbad line\nalice:x:1\nalice:400000:0\n"


def test_read_ranges() -> None:
    assert read_ranges(SUBUID, "alice", 1000) == ((100000, 65536), (300000, 10))
    assert read_ranges(SUBUID, "bob", 1001) == ((165536, 65536),)
    assert read_ranges(SUBUID, "carol", 1002) == ()
    assert read_ranges("", "alice", 1000) == ()


def test_ranges_through_newuidmap(tmp_path: Path) -> None:
    """One range each, as Apptainer's GetIDRange: never every line stacked (two equal lines would overlap)."""
    (tmp_path / "subuid").write_text(SUBUID + "alice:100000:65536\n")
    (tmp_path / "subgid").write_text("alice:200000:1000\nalice:300000:131072\nalice:500000:65537\n")
    idmap = plan_id_map(uid=1000, gid=1000, user="alice", subuid=str(tmp_path / "subuid"),
                        subgid=str(tmp_path / "subgid"))
    if not idmap.helper:  # a host without the uidmap package
        assert "newuidmap/newgidmap not found" in idmap.note
        return
    assert idmap.uids == ((0, 1000, 1), (1, 100000, 65536))
    assert idmap.gids == ((0, 1000, 1), (1, 300000, 131072))
    assert "newuidmap" in idmap.note and "1-65536 to 100000-165535" in idmap.note


def test_pick_range_is_apptainers_rule() -> None:
    assert pick_range(((1, 10), (400000, 131072), (100000, 65536), (200000, 65536))) == (100000, 65536)
    assert pick_range(((300000, 70000), (400000, 131072), (500000, 131072))) == (400000, 131072)
    assert pick_range(((300000, 65535), (1, 10))) is None
    assert pick_range(()) is None


def test_unreadable_lines_are_skipped(tmp_path: Path) -> None:
    """Another user's line in Latin-1, digits that are not ASCII, a range past 2**32: skipped, no error."""
    (tmp_path / "subuid").write_bytes(b"r\xe9my:200000:65536\nalice:\xc2\xb2:65536\nalice:4294967295:65536\n"
                                      b"alice:100000:65536\n")
    assert read_ranges((tmp_path / "subuid").read_bytes().decode(errors="replace"), "alice", 1000) == \
        ((100000, 65536),)
    (tmp_path / "subgid").write_bytes(b"r\xe9my:200000:65536\n")
    idmap = plan_id_map(uid=1000, gid=1000, user="alice", subuid=str(tmp_path / "subuid"),
                        subgid=str(tmp_path / "subgid"))
    assert not idmap.helper and "no range for alice in" in idmap.note


def test_single_mapping_without_ranges(tmp_path: Path) -> None:
    (tmp_path / "subuid").write_text(SUBUID)
    (tmp_path / "subgid").write_text("bob:200000:1000\n")
    idmap = plan_id_map(uid=1000, gid=1000, user="alice", subuid=str(tmp_path / "subuid"),
                        subgid=str(tmp_path / "subgid"))
    assert not idmap.helper
    assert idmap.uids == ((0, 1000, 1),) and idmap.gids == ((0, 1000, 1),)
    assert f"no range for alice in {tmp_path / 'subgid'}: single mapping" in idmap.note
    missing = plan_id_map(uid=5, gid=6, user="carol", subuid=str(tmp_path / "none"), subgid=str(tmp_path / "none"))
    assert missing.uids == ((0, 5, 1),) and missing.gids == ((0, 6, 1),) and not missing.helper


def test_plan_with_fakeroot() -> None:
    host = host_module.capture({"HOME": "/home/alice", "PATH": "/bin"}).replace(
        uid=1000, gid=1000, user="alice", home="/", cwd="/")
    image = ImageSpec(kind="sandbox", path="/img", rootfs="/img")
    request = LaunchRequest(action="exec", image="/img", args=("id",), fakeroot=True)
    plan = build_plan(request, sysconf.defaults(), host, image).plan
    assert plan.namespaces.user and plan.fakeroot is not None
    assert plan.fakeroot.uids[0] == (0, 1000, 1)
    assert dict(plan.process.env.base)["HOME"] == "/root"
    # as Apptainer: the host's root entry merged in (the image's root line takes /root as its home)
    host_root = pwd.getpwuid(0)
    assert [spec.content for spec in plan.mounts if spec.op == MountOp.FILE and spec.dest == "/etc/passwd"] == \
        [f"{host_root.pw_name}:x:0:0:{host_root.pw_gecos}:/root:{host_root.pw_shell}"]
    root = build_plan(request, sysconf.defaults(), host.replace(uid=0, gid=0, user="root"), image).plan
    assert root.namespaces.user and root.fakeroot is not None
    assert build_plan(request.replace(fakeroot=False), sysconf.defaults(), host, image).plan.fakeroot is None

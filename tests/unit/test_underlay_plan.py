"""The plan's underlay and avoided kernel features (issue 15): `enable underlay`, --underlay, `enable overlay`,
`avoid kernel features`; and the underlay's tree of missing mount points."""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.errors import SingpyError
from singpy.host import host as host_module
from singpy.host.host import HostInfo
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.layers.underlay import _Node
from singpy.plan import ImageSpec, LaunchPlan


@pytest.fixture
def image(tmp_path: Path) -> ImageSpec:
    rootfs = tmp_path / "sandbox"
    (rootfs / "bin").mkdir(parents=True)
    return ImageSpec(kind="sandbox", path=str(rootfs), rootfs=str(rootfs))


def host(tmp_path: Path, uid: int) -> HostInfo:
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    captured = host_module.capture({"PATH": "/usr/bin:/bin", "HOME": str(home)})
    return captured.replace(uid=uid, gid=uid, user="alice", group="users", home=str(home), cwd="/srv")


def plan(tmp_path: Path, image: ImageSpec, conf: str, *, uid: int = 1000, **fields: object) -> LaunchPlan:
    request = LaunchRequest(**{"action": "exec", "image": "sandbox", "args": ("true",), **fields})  # type: ignore[arg-type]
    return build_plan(request, sysconf.parse(conf, "t.conf"), host(tmp_path, uid), image).plan


@pytest.mark.parametrize(("conf", "fields", "uid", "expected"), [
    ("", {}, 1000, "fallback"),
    ("enable underlay = preferred", {}, 1000, "always"),
    ("", {"underlay": True}, 1000, "always"),
    ("enable underlay = no", {}, 1000, "no"),
    ("enable overlay = no", {}, 1000, "always"),
    ("enable overlay = no\nenable underlay = no", {}, 1000, "no"),
    ("avoid kernel features = userns_overlay", {}, 1000, "always"),
    ("avoid kernel features = userns_overlay", {}, 0, "fallback"),  # root: no user namespace
    ("avoid kernel features = userns_overlay", {"userns": True}, 0, "always"),
], ids=["default", "preferred", "flag", "no", "overlay-no", "neither", "avoided", "avoided-root", "avoided-userns"])
def test_underlay_in_plan(tmp_path: Path, image: ImageSpec, conf: str, fields: dict[str, object], uid: int,
                          expected: str) -> None:
    assert plan(tmp_path, image, conf, uid=uid, **fields).underlay == expected


def test_flag_refused_when_disabled(tmp_path: Path, image: ImageSpec) -> None:
    with pytest.raises(SingpyError, match="--underlay needs the underlay, but `enable underlay = no`"):
        plan(tmp_path, image, "enable underlay = no", underlay=True)


def test_avoided_features_in_plan(tmp_path: Path, image: ImageSpec) -> None:
    made = plan(tmp_path, image, "avoid kernel features = loop_configure\navoid kernel features = mount_setattr")
    assert made.avoid_features == ("loop_configure", "mount_setattr")
    assert made.to_json_data()["avoid_features"] == ["loop_configure", "mount_setattr"]
    assert plan(tmp_path, image, "").avoid_features == ()


def test_node_tree_of_missing_points() -> None:
    root = _Node()
    for path, is_dir in (("home/alice", True), ("data/x/y", True), ("usr/lib/gpu-file", False), ("home/bob", True)):
        root.add(path.split("/"), is_dir)
    assert sorted(root.children) == ["data", "home", "usr"]
    assert sorted(root.children["home"].children) == ["alice", "bob"]
    assert root.children["usr"].children["lib"].children["gpu-file"].is_dir is False
    assert root.children["data"].children["x"].children["y"].children == {}

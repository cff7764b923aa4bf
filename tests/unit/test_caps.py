"""singpy.kernel.caps: capability names, Apptainer's policy for root, capability.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.errors import ConfigError
from singpy.host import host as host_module
from singpy.kernel.caps import NAMES, NUMBER, CapabilityError, parse_names, plan_privileges, read_capability_file
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.plan import ImageSpec, Privileges


def test_names_match_the_kernel() -> None:
    assert NUMBER["CAP_CHOWN"] == 0 and NUMBER["CAP_NET_RAW"] == 13 and NUMBER["CAP_SYS_ADMIN"] == 21
    assert NUMBER["CAP_CHECKPOINT_RESTORE"] == 40 and len(NAMES) == 41
    last = Path("/proc/sys/kernel/cap_last_cap")
    if last.exists():
        assert int(last.read_text()) <= len(NAMES) - 1, "a capability newer than the table: add its name"


@pytest.mark.parametrize(("values", "expected"), [
    (["CAP_NET_RAW"], ("CAP_NET_RAW",)),
    (["net_raw"], ("CAP_NET_RAW",)),
    (["Cap_Sys_Admin,chown"], ("CAP_CHOWN", "CAP_SYS_ADMIN")),
    (["sys_admin", "CAP_CHOWN, net_raw,"], ("CAP_CHOWN", "CAP_NET_RAW", "CAP_SYS_ADMIN")),
    (["all"], NAMES),
    ([], ()),
], ids=["full name", "short name", "mixed case, comma list", "repeated", "all", "none"])
def test_parse_names(values: list[str], expected: tuple[str, ...]) -> None:
    assert parse_names(values, "--add-caps") == expected


@pytest.mark.parametrize("value", ["CAP_NOPE", "net-raw", "CAP_", "sysadmin"])
def test_unknown_names(value: str) -> None:
    with pytest.raises(CapabilityError) as raised:
        parse_names([value], "--drop-caps")
    assert raised.value.message == f"--drop-caps: unknown capability {value!r}"


def privileges(uid: int = 0, *, fakeroot: bool = False, keep_privs: bool = False, no_privs: bool = False,
               add: tuple[str, ...] = (), drop: tuple[str, ...] = (), default: str = "full",
               file_caps: tuple[str, ...] = ()) -> Privileges:
    return plan_privileges(uid=uid, fakeroot=fakeroot, keep_privs=keep_privs, no_privs=no_privs, add=add,
                           drop=drop, root_default=default, file_caps=file_caps)


ALL_BUT_RAW = tuple(name for name in NAMES if name != "CAP_NET_RAW")


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, Privileges(keep=None, as_root=True)),
    ({"drop": ("CAP_NET_RAW",)}, Privileges(keep=ALL_BUT_RAW, as_root=True)),
    ({"default": "no"}, Privileges(keep=(), as_root=True)),
    ({"default": "no", "add": ("CAP_NET_RAW", "CAP_CHOWN")}, Privileges(keep=("CAP_CHOWN", "CAP_NET_RAW"),
                                                                       as_root=True)),
    ({"default": "file", "file_caps": ("CAP_KILL",)}, Privileges(keep=("CAP_KILL",), as_root=True)),
    ({"default": "no", "keep_privs": True}, Privileges(keep=None, as_root=True)),
    ({"no_privs": True}, Privileges(keep=(), as_root=True)),
    ({"no_privs": True, "add": ("CAP_KILL",)}, Privileges(keep=("CAP_KILL",), as_root=True)),
    ({"add": ("CAP_NET_RAW",), "drop": ("CAP_NET_RAW",)}, Privileges(keep=ALL_BUT_RAW, as_root=True)),
    ({"uid": 1000}, Privileges(keep=(), as_root=False)),
    ({"uid": 1000, "drop": ("CAP_NET_RAW",), "no_privs": True}, Privileges(keep=(), as_root=False)),
    ({"uid": 1000, "fakeroot": True}, Privileges(keep=None, as_root=True)),
    ({"uid": 1000, "fakeroot": True, "default": "no"}, Privileges(keep=None, as_root=True)),
    ({"uid": 1000, "fakeroot": True, "drop": ("CAP_NET_RAW",)}, Privileges(keep=ALL_BUT_RAW, as_root=True)),
    ({"uid": 1000, "fakeroot": True, "no_privs": True}, Privileges(keep=(), as_root=True)),
], ids=["root default full", "root drop", "root default no", "no + add", "file", "keep-privs beats the default",
        "no-privs", "no-privs + add", "drop wins over add", "user", "user drop and no-privs: nothing to drop",
        "fakeroot", "fakeroot ignores root's default", "fakeroot drop", "fakeroot no-privs"])
def test_policy(kwargs: dict[str, object], expected: Privileges) -> None:
    assert privileges(**kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"keep_privs": True, "no_privs": True}, "--keep-privs and --no-privs cannot be used together"),
    ({"uid": 1000, "keep_privs": True}, "--keep-privs is for root only"),
    ({"uid": 1000, "add": ("CAP_NET_RAW",)}, "--add-caps is for root only"),
])
def test_policy_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CapabilityError) as raised:
        privileges(**kwargs)  # type: ignore[arg-type]
    assert message in raised.value.message


def test_capability_file(tmp_path: Path) -> None:
    path = tmp_path / "capability.json"
    assert read_capability_file(str(path), "root") == ()  # missing: nothing granted
    path.write_text(json.dumps({"users": {"root": ["CAP_NET_RAW", "chown"]}, "groups": {}}))
    assert read_capability_file(str(path), "root") == ("CAP_CHOWN", "CAP_NET_RAW")
    assert read_capability_file(str(path), "alice") == ()
    path.write_text(json.dumps({"users": {"root": ["CAP_BOGUS"]}}))
    with pytest.raises(ConfigError, match="unknown capability 'CAP_BOGUS'"):
        read_capability_file(str(path), "root")
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=f"can't read {path}"):
        read_capability_file(str(path), "root")


def test_planner_reads_the_file_beside_the_conf(tmp_path: Path) -> None:
    conf = tmp_path / "singpy.conf"
    conf.write_text("root default capabilities = file\n")
    (tmp_path / "capability.json").write_text(json.dumps({"users": {"root": ["CAP_SYS_ADMIN"]}}))
    host = host_module.capture({"HOME": "/", "PATH": "/bin"}).replace(uid=0, gid=0, home="/", cwd="/")
    request = LaunchRequest(action="exec", image="/img", args=("true",))
    image = ImageSpec(kind="sandbox", path="/img", rootfs="/img")
    planned = build_plan(request, sysconf.load(str(conf)), host, image).plan
    assert planned.process.privileges == Privileges(keep=("CAP_SYS_ADMIN",), as_root=True)
    user = build_plan(request, sysconf.load(str(conf)), host.replace(uid=1000, gid=1000), image).plan
    assert user.process.privileges == Privileges(keep=(), as_root=False)
    with pytest.raises(CapabilityError, match="--add-caps: unknown capability 'nope'"):
        build_plan(request.replace(add_caps=("nope",)), sysconf.defaults(), host, image)

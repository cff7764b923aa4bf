"""The pure parts of --security, --fusemount and --netns-path: specs, seccomp profiles, the netns rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from singpy.config import sysconf
from singpy.errors import SingpyError, UsageError
from singpy.launch import fusemount, netnspath, security
from singpy.plan import FuseMountSpec, SeccompRule

# --- --security ------------------------------------------------------------------------------------------------------


def test_first_value_of_a_feature_wins_and_comma_lists_split() -> None:
    assert security._params(("uid:5,gid:6", "uid:7")) == {"uid": "5", "gid": "6"}


@pytest.mark.parametrize("values", [("nope:1",), ("uid",), ("uid:",), ("seccomp",)])
def test_bad_security_values(values: tuple[str, ...]) -> None:
    with pytest.raises(UsageError):
        security._params(values)


def test_ids() -> None:
    assert security._ids("1:2:3", "gid") == (1, 2, 3)
    for bad in ("", "1:", "x", "-1", "4294967295", "１"):
        with pytest.raises(UsageError):
            security._ids(bad, "gid")
    with pytest.raises(UsageError):
        security._ids("1:2", "uid")


def test_ids_need_root() -> None:
    with pytest.raises(SingpyError, match="needs root"):
        security.plan_security(("gid:5",), uid=1000, kept_caps=None)
    spec = security.plan_security(("uid:5", "gid:6:7"), uid=0, kept_caps=None)
    assert spec is not None and (spec.uid, spec.gids) == (5, (6, 7))


def _profile(tmp_path: Path, data: object) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_docker_style_profile(tmp_path: Path) -> None:
    path = _profile(tmp_path, {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]}],
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"name": "clone3", "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
            {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
        ]})
    as_root = security.read_profile(path, uid=0, kept_caps=None)
    assert (as_root.default_action, as_root.default_errno) == ("SCMP_ACT_ERRNO", 38)
    assert as_root.architectures == ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32")
    assert as_root.rules == (SeccompRule(names=("read", "write"), action="SCMP_ACT_ALLOW"),
                             SeccompRule(names=("clone3",), action="SCMP_ACT_ERRNO", errno=38),
                             SeccompRule(names=("bpf",), action="SCMP_ACT_ALLOW"),
                             SeccompRule(names=("personality",), action="SCMP_ACT_ALLOW",
                                         args=((0, "SCMP_CMP_EQ", 8, 0),)))
    as_user = security.read_profile(path, uid=1000, kept_caps=None)  # no CAP_SYS_ADMIN: the bpf rule is left out
    assert [rule.names for rule in as_user.rules] == [("read", "write"), ("clone3",), ("personality",)]
    dropped = security.read_profile(path, uid=0, kept_caps=("CAP_CHOWN",))
    assert ("bpf",) not in [rule.names for rule in dropped.rules]


@pytest.mark.parametrize(("data", "message"), [
    ([], "not a JSON object"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}, "syscalls is not a JSON list"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "defaultErrnoRet": "x"}, "defaultErrnoRet must be an error number"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["x"], "action": "SCMP_ACT_ERRNO",
                                                       "args": [{"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}]}]},
     "64-bit unsigned"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["x"], "action": "SCMP_ACT_ERRNO",
                                                       "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_LIKE"}]}]},
     "invalid operator"),
    ({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["x86_64"]}, "SCMP_ARCH_ names"),
])
def test_bad_profiles(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(SingpyError, match=message):
        security.read_profile(_profile(tmp_path, data), uid=0, kept_caps=None)


def test_profile_compiles_to_bpf(tmp_path: Path) -> None:
    from singpy.kernel import seccomp

    path = _profile(tmp_path, {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["mkdir", "no_such_call"], "action": "SCMP_ACT_ERRNO"},
        {"names": ["getpid"], "action": "SCMP_ACT_ALLOW"}]})  # the default's own action: skipped, not refused
    seccomp.compile_filter(security.read_profile(path, uid=0, kept_caps=None))
    assert seccomp._program is not None and len(seccomp._program) % 8 == 0 and len(seccomp._program) > 8

# --- --fusemount -----------------------------------------------------------------------------------------------------


def test_fusemount_specs() -> None:
    assert fusemount.parse("host:/bin/true  /data/x.sqfs   /mnt/x/", "") == FuseMountSpec(
        side="host", program=("/bin/true", "/data/x.sqfs"), mountpoint="/mnt/x")
    found = fusemount.parse("host:true a /m", "/usr/bin:/bin")  # a host program is looked up in the host's PATH
    assert found is not None and found.program[0] == shutil.which("true", path="/usr/bin:/bin")
    assert fusemount.parse("container-daemon:sshfs -o ro host:/ /sshfs", "") == FuseMountSpec(
        side="container", program=("sshfs", "-o", "ro", "host:/"), mountpoint="/sshfs", daemon=True)
    assert fusemount.parse("   ", "") is None
    with pytest.raises(SingpyError, match="not found on the host"):
        fusemount.parse("host:no-such-program a /m", "/usr/bin:/bin")


@pytest.mark.parametrize(("spec", "message"), [
    ("container:prog", "no whitespace separators"),
    ("cloud:prog /m", "unknown prefix cloud"),
    ("host /m", "unknown prefix host"),
    ("container: /m", "no FUSE program"),
    ("container:prog m", "absolute path"),
    ("container:prog /..", "not its root"),
])
def test_bad_fusemount_specs(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        fusemount.parse(spec, "")


def test_fusemount_mount_points_are_planned_tmpfs() -> None:
    specs, points = fusemount.plan_fusemounts(("container:prog a /mnt/a",), uid=0, enabled=True, host_path="")
    assert [spec.mountpoint for spec in specs] == ["/mnt/a"]
    assert [(point.op, point.dest) for point in points] == [("tmpfs", "/mnt/a")]
    with pytest.raises(SingpyError, match="enable fusemount = no"):
        fusemount.plan_fusemounts(("container:prog a /mnt/a",), uid=0, enabled=False, host_path="")

# --- --netns-path ----------------------------------------------------------------------------------------------------


def test_netns_rules(tmp_path: Path) -> None:
    target = tmp_path / "ns"
    target.write_text("")
    path = str(target)
    assert netnspath.plan_netns_path(path, uid=0, user="root", config=sysconf.defaults()) == path
    assert netnspath.plan_netns_path("", uid=1000, user="alice", config=sysconf.defaults()) == ""
    with pytest.raises(SingpyError, match="is not an allowed netns path"):
        netnspath.plan_netns_path(path, uid=1000, user="alice", config=sysconf.defaults())
    paths_only = sysconf.parse(f"allow netns paths = /elsewhere, {path}\n", "t.conf")
    with pytest.raises(SingpyError, match="you are not permitted"):
        netnspath.plan_netns_path(path, uid=1000, user="alice", config=paths_only)
    both = sysconf.parse(f"allow netns paths = {path}\nallow net users = bob, alice\n", "t.conf")
    assert netnspath.plan_netns_path(path, uid=1000, user="alice", config=both) == path
    by_uid = sysconf.parse(f"allow netns paths = {path}\nallow net users = 1000\n", "t.conf")
    assert netnspath.plan_netns_path(path, uid=1000, user="alice", config=by_uid) == path
    with pytest.raises(SingpyError, match="does not exist"):
        netnspath.plan_netns_path(str(tmp_path / "missing"), uid=0, user="root", config=sysconf.defaults())

"""singpy.launch.planner.build_plan: real configuration, host facts and a sandbox image in, a LaunchPlan out:
its mounts, user binds and --home (namespaces, process, environment and JSON: test_planner_process.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from singpy.config import sysconf
from singpy.errors import BindSpecError, UsageError
from singpy.host.host import HostInfo
from singpy.launch.planner import LaunchRequest, build_plan
from singpy.mounts.parse import parse_bind_list
from singpy.mounts.system import MINIMAL_DEV_NODES
from singpy.plan import ImageSpec, Missing, MountOp, MountSpec, Stage

if TYPE_CHECKING:
    pass
from tests.support.planning import (
    CWD,
    MINIMAL_DEV,
    alice,
    by_dest,
    config,
    dests,
    home_dir,
    plan,
    request,
    sandbox_image,
    summary,
)


@pytest.fixture
def home(tmp_path: Path) -> str:
    return home_dir(tmp_path)


@pytest.fixture
def image(tmp_path: Path) -> ImageSpec:
    return sandbox_image(tmp_path)


@pytest.fixture
def host(home: str) -> HostInfo:
    return alice(home)


# --- mounts -------------------------------------------------------------------------------------------------------


def test_default_mounts(host: HostInfo, image: ImageSpec, home: str) -> None:
    mounts = plan(host, image).mounts
    assert summary(mounts) == [
        ("bind", "/proc", "/proc"), ("bind", "/sys", "/sys"), ("bind", "/dev", "/dev"),
        ("file", "/etc/passwd", None), ("file", "/etc/group", None), ("bind", "/etc/resolv.conf", "/etc/resolv.conf"),
        ("bind", "/tmp", "/tmp"), ("bind", "/var/tmp", "/var/tmp"), ("bind", home, home), ("bind", CWD, CWD),
    ]
    assert [spec.stage for spec in mounts] == [Stage.KERNEL] * 3 + [Stage.SYSTEM_FILES] * 3 + [Stage.HOME_TMP] * 4
    assert by_dest(mounts, "/dev").dev is True
    assert by_dest(mounts, home).missing == Missing.REQUIRED
    assert by_dest(mounts, CWD).missing == Missing.SKIP
    assert by_dest(mounts, "/tmp").missing == Missing.SKIP
    assert by_dest(mounts, "/etc/resolv.conf").missing == Missing.SKIP
    assert not any(spec.readonly for spec in mounts if spec.op == MountOp.BIND)


@pytest.mark.parametrize("contain", [False, True])
def test_gpu_nodes_come_with_the_host_dev(host: HostInfo, image: ImageSpec, contain: bool) -> None:
    """Without --contain the host's /dev is bound whole: a GPU node's bind onto itself is left out, with a note."""
    node = MountSpec(op=MountOp.BIND, source="/dev/nvidia0", dest="/dev/nvidia0", dev=True, stage=Stage.GPU)
    planned = build_plan(request(contain=contain), config(), host, image, gpu_mounts=(node,))
    assert (node in planned.plan.mounts) == contain
    assert any("come with the host's /dev" in note for note in planned.notes) != contain


def test_mounts_sorted_by_stage(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    gpu = (MountSpec(op=MountOp.BIND, source="/usr/lib/libcuda.so.1", dest="/.singularity.d/libs/libcuda.so.1",
                     stage=Stage.GPU),
           MountSpec(op=MountOp.BIND, source="/usr/bin/nvidia-smi", dest="/usr/bin/nvidia-smi", stage=Stage.GPU))
    binds = parse_bind_list([f"{tmp_path}:/tmp"], CWD)
    mounts = build_plan(request(binds=binds, pid=True), config("bind path = /etc/hosts"), host, image,
                        gpu_mounts=gpu).plan.mounts
    stages = [spec.stage for spec in mounts]
    assert stages == sorted(stages)
    assert mounts[-3:-1] == gpu
    assert summary(mounts[-1:]) == [("bind", "/tmp", str(tmp_path))]  # after the default /tmp bind: it wins
    assert mounts[-1].stage == Stage.USER


def test_proc_is_bound_without_pid_and_fresh_with_pid(host: HostInfo, image: ImageSpec) -> None:
    assert summary((by_dest(plan(host, image).mounts, "/proc"),)) == [("bind", "/proc", "/proc")]
    fresh = by_dest(plan(host, image, pid=True).mounts, "/proc")
    assert (fresh.op, fresh.source, fresh.stage) == (MountOp.PROC, None, Stage.KERNEL)


@pytest.mark.parametrize(
    ("conf", "contain", "expected"),
    [
        ("", False, [("bind", "/dev", "/dev")]),
        ("", True, MINIMAL_DEV),
        ("mount dev = minimal", False, MINIMAL_DEV),
        ("mount dev = minimal", True, MINIMAL_DEV),
        ("mount dev = no", False, []),
        ("mount dev = no", True, []),
    ],
    ids=["host-dev", "contain-minimal", "conf-minimal", "conf-minimal-contain", "conf-no", "conf-no-contain"],
)
def test_dev(host: HostInfo, image: ImageSpec, conf: str, contain: bool,
             expected: list[tuple[str, str, str | None]]) -> None:
    mounts = plan(host, image, conf, contain=contain).mounts
    assert [item for item in summary(mounts) if item[1] == "/dev" or item[1].startswith("/dev/")] == expected


def test_minimal_dev_nodes_keep_devices_and_skip_absent(host: HostInfo, image: ImageSpec) -> None:
    mounts = plan(host, image, contain=True).mounts
    for name in MINIMAL_DEV_NODES:
        node = by_dest(mounts, f"/dev/{name}")
        assert (node.dev, node.missing, node.stage) == (True, Missing.SKIP, Stage.KERNEL)


def test_mount_devpts_no(host: HostInfo, image: ImageSpec) -> None:
    assert "/dev/pts" not in dests(plan(host, image, "mount devpts = no", contain=True).mounts)


@pytest.mark.parametrize(
    ("conf", "present", "absent"),
    [
        ("mount proc = no", ["/sys", "/dev"], ["/proc"]),
        ("mount sys = no", ["/proc", "/dev"], ["/sys"]),
        ("config passwd = no", ["/etc/group"], ["/etc/passwd"]),
        ("config group = no", ["/etc/passwd"], ["/etc/group"]),
        ("config resolv_conf = no", ["/etc/passwd"], ["/etc/resolv.conf"]),
        ("mount tmp = no", ["/proc"], ["/tmp", "/var/tmp"]),
    ],
    ids=["no-proc", "no-sys", "no-passwd", "no-group", "no-resolv-conf", "no-tmp"],
)
def test_config_switches(host: HostInfo, image: ImageSpec, conf: str, present: list[str],
                         absent: list[str]) -> None:
    mounted = dests(plan(host, image, conf).mounts)
    assert all(dest in mounted for dest in present)
    assert not any(dest in mounted for dest in absent)


def test_mount_home_no(host: HostInfo, image: ImageSpec, home: str) -> None:
    built = plan(host, image, "mount home = no")
    assert home not in dests(built.mounts)
    assert dict(built.process.env.base)["HOME"] == home  # still the user's home, just not mounted


def test_no_home_option(host: HostInfo, image: ImageSpec, home: str) -> None:
    assert home not in dests(plan(host, image, no_home=True).mounts)
    assert home not in dests(plan(host, image, no_home=True, contain=True).mounts)


def test_contain_mounts(host: HostInfo, image: ImageSpec, home: str) -> None:
    mounts = plan(host, image, contain=True).mounts
    home_tmp = [spec for spec in mounts if spec.stage == Stage.HOME_TMP]
    assert summary(tuple(home_tmp)) == [("tmpfs", "/tmp", None), ("tmpfs", "/var/tmp", None), ("tmpfs", home, None)]
    assert CWD not in dests(mounts)


def test_contain_does_not_need_the_home_directory(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-home")
    mounts = plan(host.replace(home=missing), image, contain=True).mounts
    assert summary((by_dest(mounts, missing),)) == [("tmpfs", missing, None)]


def test_missing_home_directory_is_an_empty_home(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-home")  # Apptainer stages an empty session directory (its issue #4208)
    assert summary((by_dest(plan(host.replace(home=missing), image).mounts, missing),)) == [("tmpfs", missing, None)]
    assert missing not in dests(plan(host.replace(home=missing), image, no_home=True).mounts)


def test_home_that_is_not_a_directory(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BindSpecError, match="is not a directory"):
        plan(host, image, home=f"{tmp_path}/file:/home/x")


def test_custom_home_is_bound_under_contain(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    built = plan(host, image, home=f"{tmp_path}:/home/x", contain=True)
    assert summary((by_dest(built.mounts, "/home/x"),)) == [("bind", "/home/x", str(tmp_path))]


def test_custom_home_and_the_admin_config(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    built = plan(host, image, "mount home = no", home=f"{tmp_path}:/home/x")  # as Apptainer: --home still mounts
    assert by_dest(built.mounts, "/home/x").source == str(tmp_path)
    with pytest.raises(BindSpecError, match="user bind control = no"):
        plan(host, image, "user bind control = no", home=f"{tmp_path}:/home/x")


@pytest.mark.parametrize(
    ("cwd", "bound"),
    [
        ("/srv/project", True),
        ("/scratch/run 1", True),
        ("/", False),
        ("/usr", False),
        ("/etc", False),
        ("/var", False),
        ("/root", False),
        ("/tmp", False),
        ("/tmp/work", False),
        ("/var/tmp/x", False),
        ("/proc/self", False),
        ("/tmpfoo", True),
    ],
    ids=["project", "spaces", "root", "usr", "etc", "var", "root-home", "tmp", "under-tmp", "under-var-tmp",
         "under-proc", "tmp-prefix"],
)
def test_cwd_mount(host: HostInfo, image: ImageSpec, home: str, cwd: str, bound: bool) -> None:
    mounts = plan(host.replace(cwd=cwd), image).mounts
    home_tmp = summary(tuple(spec for spec in mounts if spec.stage == Stage.HOME_TMP))
    expected = [("bind", "/tmp", "/tmp"), ("bind", "/var/tmp", "/var/tmp"), ("bind", home, home)]
    assert home_tmp == expected + ([("bind", cwd, cwd)] if bound else [])
    assert plan(host.replace(cwd=cwd), image).process.cwd == cwd


def test_cwd_under_home_is_not_bound_again(host: HostInfo, image: ImageSpec, home: str) -> None:
    for cwd in (home, f"{home}/work/deep"):
        mounts = plan(host.replace(cwd=cwd), image).mounts
        assert [spec.dest for spec in mounts if spec.stage == Stage.HOME_TMP] == ["/tmp", "/var/tmp", home]


def test_cwd_under_tmp_bound_when_tmp_is_not(host: HostInfo, image: ImageSpec) -> None:
    mounts = plan(host.replace(cwd="/tmp/work"), image, "mount tmp = no").mounts
    assert summary(tuple(spec for spec in mounts if spec.stage == Stage.HOME_TMP))[-1] == (
        "bind", "/tmp/work", "/tmp/work")


def test_contain_does_not_bind_cwd(host: HostInfo, image: ImageSpec, home: str) -> None:
    built = plan(host, image, contain=True)
    assert CWD not in dests(built.mounts)
    assert built.process.cwd == home


def test_bind_path_entries(host: HostInfo, image: ImageSpec) -> None:
    mounts = plan(host, image, "bind path = /etc/localtime\nbind path = /opt/site:/site\n").mounts
    system_files = [spec for spec in mounts if spec.stage == Stage.SYSTEM_FILES]
    assert summary(tuple(system_files)) == [
        ("file", "/etc/passwd", None), ("file", "/etc/group", None), ("bind", "/etc/localtime", "/etc/localtime"),
        ("bind", "/site", "/opt/site"), ("bind", "/etc/resolv.conf", "/etc/resolv.conf")]
    assert all(spec.missing == Missing.SKIP for spec in system_files if spec.op == MountOp.BIND)


def test_passwd_and_group_content(host: HostInfo, image: ImageSpec, home: str) -> None:
    mounts = plan(host, image).mounts
    passwd, group = by_dest(mounts, "/etc/passwd"), by_dest(mounts, "/etc/group")
    assert passwd.content == f"alice:x:1000:1000:Alice Liddell:{home}:/bin/bash"
    assert group.content == "users:x:1000:alice"
    for spec in (passwd, group):
        assert (spec.op, spec.readonly, spec.stage, spec.source) == (MountOp.FILE, True, Stage.SYSTEM_FILES, None)


def test_passwd_home_follows_home_option(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    source = tmp_path / "other-home"
    source.mkdir()
    mounts = plan(host, image, home=f"{source}:/home/guest").mounts
    assert by_dest(mounts, "/etc/passwd").content == "alice:x:1000:1000:Alice Liddell:/home/guest:/bin/bash"


# --- user binds ---------------------------------------------------------------------------------------------------


def test_user_binds_last_in_order(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "file.txt").write_text("x")
    binds = parse_bind_list([f"{tmp_path}/data:/data:ro,{tmp_path}/file.txt", f"{tmp_path}/data:/home"], CWD)
    mounts = plan(host, image, binds=binds).mounts
    users = mounts[-3:]
    assert users == (
        MountSpec(op=MountOp.BIND, source=f"{tmp_path}/data", dest="/data", readonly=True, missing=Missing.REQUIRED,
                  stage=Stage.USER, asked=True),
        MountSpec(op=MountOp.BIND, source=f"{tmp_path}/file.txt", dest=f"{tmp_path}/file.txt", readonly=False,
                  missing=Missing.REQUIRED, stage=Stage.USER, asked=True),
        MountSpec(op=MountOp.BIND, source=f"{tmp_path}/data", dest="/home", readonly=False, missing=Missing.REQUIRED,
                  stage=Stage.USER, asked=True),
    )
    assert all(spec.stage < Stage.USER for spec in mounts[:-3])
    assert not any(spec.asked for spec in mounts[:-3])  # no default mount counts as one the user named


def test_missing_bind_source(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    missing = f"{tmp_path}/nope"
    with pytest.raises(BindSpecError, match=f"bind source {missing} does not exist"):
        plan(host, image, binds=parse_bind_list([f"{tmp_path}:/ok,{missing}:/data"], CWD))


def test_user_bind_control_no(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    binds = parse_bind_list([str(tmp_path)], CWD)
    with pytest.raises(BindSpecError, match="user bind control = no"):
        plan(host, image, "user bind control = no", binds=binds)
    assert plan(host, image, "user bind control = no").mounts == plan(host, image).mounts


def test_allow_pid_ns_no_drops_the_namespace(host: HostInfo, image: ImageSpec) -> None:
    planned = build_plan(LaunchRequest(action="exec", image=image.path, args=("true",), pid=True),
                         sysconf.parse("allow pid ns = no", "test.conf"), host, image)
    assert planned.plan.namespaces.pid is False
    assert any("allow pid ns = no" in warning for warning in planned.warnings)


# --- --home -------------------------------------------------------------------------------------------------------


def test_home_option_source_and_dest(host: HostInfo, image: ImageSpec, tmp_path: Path, home: str) -> None:
    source = tmp_path / "alt"
    source.mkdir()
    built = plan(host, image, home=f"{source}:/home/guest")
    assert summary((by_dest(built.mounts, "/home/guest"),)) == [("bind", "/home/guest", str(source))]
    assert home not in dests(built.mounts)
    assert dict(built.process.env.base)["HOME"] == "/home/guest"
    assert plan(host, image, home=f"{source}:/home/guest", contain=True).process.cwd == "/home/guest"


@pytest.mark.parametrize("suffix", ["", ":"], ids=["source-only", "empty-dest"])
def test_home_option_source_only(host: HostInfo, image: ImageSpec, tmp_path: Path, suffix: str) -> None:
    source = tmp_path / "alt"
    source.mkdir()
    built = plan(host, image, home=f"{source}{suffix}")
    assert summary((by_dest(built.mounts, str(source)),)) == [("bind", str(source), str(source))]
    assert dict(built.process.env.base)["HOME"] == str(source)


def test_home_option_relative_dest(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="destination must be an absolute path"):  # the flag's text: exit 1
        plan(host, image, home=f"{tmp_path}:relative")


def test_home_option_missing_source(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    built = plan(host, image, home=f"{tmp_path}/nope:/home/x")
    assert summary((by_dest(built.mounts, "/home/x"),)) == [("tmpfs", "/home/x", None)]
    assert dict(built.process.env.base)["HOME"] == "/home/x"


def test_home_option_relative_source_uses_host_cwd(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    (tmp_path / "relative-home-7f3a").mkdir()
    built = plan(host.replace(cwd=str(tmp_path)), image, home="relative-home-7f3a:/home/guest")
    assert by_dest(built.mounts, "/home/guest").source == str(tmp_path / "relative-home-7f3a")

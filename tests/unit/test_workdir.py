"""Issue 28's action flags, the pure parts: --workdir and --scratch planned (singpy.mounts.workdir), --no-env's
filter (singpy.env.environ), --no-pid, --no-nv and --no-rocm in the request (singpy.cli.actions)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.cli.actions import build_request
from singpy.cli.parse import parse_action
from singpy.env.environ import host_passthrough
from singpy.errors import SingpyError, UsageError
from singpy.launch.request import LaunchRequest
from singpy.mounts import system, workdir
from singpy.plan import HostDir, MountOp, MountSpec, Stage


def _defaults(*, contain: bool, home: str = "/home/u") -> list[MountSpec]:
    mounts = system.tmp_mounts(contain=contain, enabled=True)
    mounts += system.home_mounts(source=None if contain else home, dest=home, enabled=True)
    return mounts


def _planned(mounts: list[MountSpec], **kwargs: object) -> workdir.WorkdirPlan:
    options: dict[str, object] = {"workdir": "/w", "scratch": (), "contain": True, "home_dest": "/home/u",
                                  "default_home": True, "bind_control": True, **kwargs}
    return workdir.plan(mounts, **options)  # type: ignore[arg-type]


def test_contain_binds_tmp_var_tmp_and_home_from_the_workdir() -> None:
    planned = _planned(_defaults(contain=True))
    binds = {spec.dest: spec.source for spec in planned.mounts}
    assert binds == {"/tmp": "/w/tmp", "/var/tmp": "/w/var_tmp", "/home/u": "/w/home"}
    assert all(spec.op == MountOp.BIND and spec.stage == Stage.HOME_TMP for spec in planned.mounts)
    assert planned.host_dirs == (HostDir(path="/w/tmp", mode="1777"), HostDir(path="/w/var_tmp", mode="1777"),
                                 HostDir(path="/w/home", mode="0700"))
    assert planned.warnings == ()


def test_without_contain_the_workdir_changes_nothing_but_scratch() -> None:
    mounts = _defaults(contain=False)
    planned = _planned(mounts, contain=False)
    assert planned.mounts == mounts and planned.host_dirs == ()


def test_a_home_of_ones_own_stays() -> None:
    mounts = _defaults(contain=True)
    planned = _planned(mounts, default_home=False)
    assert [spec for spec in planned.mounts if spec.dest == "/home/u"] == [mounts[-1]]
    assert HostDir(path="/w/home", mode="0700") not in planned.host_dirs


def test_mount_tmp_off_stays_off() -> None:
    """`mount tmp = no` or --no-mount tmp: no /tmp to replace, none added."""
    planned = _planned(system.home_mounts(source=None, dest="/home/u", enabled=True))
    assert {spec.dest for spec in planned.mounts} == {"/home/u"}


def test_user_bind_control_off_drops_tmp_and_scratch_with_warnings() -> None:
    planned = _planned(_defaults(contain=True), scratch=("/s",), bind_control=False)
    assert {spec.dest for spec in planned.mounts} == {"/home/u"}
    assert len(planned.warnings) == 2 and all("user bind control" in text for text in planned.warnings)


def test_scratch_in_memory_or_under_the_workdir() -> None:
    memory = _planned([], workdir="", scratch=("/a", "/b/c"))
    assert [(spec.op, spec.dest) for spec in memory.mounts] == [(MountOp.TMPFS, "/a"), (MountOp.TMPFS, "/b/c")]
    assert memory.host_dirs == ()
    under = _planned([], scratch=("/a", "/b/c"), contain=False)
    assert [(spec.source, spec.dest) for spec in under.mounts] == [("/w/scratch/a", "/a"), ("/w/scratch/b/c", "/b/c")]
    assert [entry.path for entry in under.host_dirs] == ["/w/scratch", "/w/scratch/a", "/w/scratch/b",
                                                        "/w/scratch/b/c"]
    assert {entry.mode for entry in under.host_dirs} == {"0750"}


@pytest.mark.parametrize(("values", "expected"), [(["/a"], ("/a",)), (["/a,/b//c/", "/a"], ("/a", "/b/c")),
                                                  (["/x/../y"], ("/y",))])
def test_scratch_paths_normalised(values: list[str], expected: tuple[str, ...]) -> None:
    assert workdir.checked_scratch(values) == expected


@pytest.mark.parametrize("value", ["rel", "/", "", "/a,", "/a\0b", "/" + "x" * 300])
def test_bad_scratch_paths(value: str) -> None:
    with pytest.raises(UsageError):
        workdir.checked_scratch([value])


def test_checked_workdir(tmp_path: Path) -> None:
    assert workdir.checked_workdir(".", str(tmp_path)) == str(tmp_path)
    assert workdir.checked_workdir(f"{tmp_path}/x/..", "/") == str(tmp_path)
    with pytest.raises(SingpyError, match="is not a directory"):
        workdir.checked_workdir("missing", str(tmp_path))
    with pytest.raises(UsageError):
        workdir.checked_workdir("", str(tmp_path))
    # Writable by everyone: only if sticky (as /tmp), where others can't rename the home singpy makes in it.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert workdir.checked_workdir(str(shared), "/") == str(shared)
    shared.chmod(0o777)
    with pytest.raises(SingpyError, match="writable by everyone but not sticky"):
        workdir.checked_workdir(str(shared), "/")


def test_make_host_dirs_modes_whatever_the_umask(tmp_path: Path) -> None:
    dirs = (HostDir(path=f"{tmp_path}/tmp", mode="1777"), HostDir(path=f"{tmp_path}/s", mode="0750"),
            HostDir(path=f"{tmp_path}/s/a", mode="0750"))
    old = os.umask(0o077)
    try:
        workdir.make_host_dirs(dirs)
        workdir.make_host_dirs(dirs)  # a second run uses them as they are
    finally:
        os.umask(old)
    assert [oct(os.stat(entry.path).st_mode & 0o7777) for entry in dirs] == ["0o1777", "0o750", "0o750"]


def test_make_host_dirs_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "tmp").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SingpyError, match="symbolic link"):
        workdir.make_host_dirs((HostDir(path=f"{tmp_path}/tmp", mode="1777"),))
    assert not (tmp_path / "elsewhere").exists()


def test_make_host_dirs_refuses_another_users_directory(tmp_path: Path) -> None:
    """A home made first by another user in a shared workdir would get the container's files."""
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root (the integration test runs as both)")
    planted = tmp_path / "home"
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    dirs = (HostDir(path=f"{tmp_path}/tmp", mode="1777"), HostDir(path=str(planted), mode="0700"))
    with pytest.raises(SingpyError, match=r"home is in the way of the work directory: a directory of another user"):
        workdir.make_host_dirs(dirs)
    assert sorted(os.listdir(tmp_path)) == ["home"] and list(planted.iterdir()) == []  # nor tmp, checked first


def test_no_env_filter() -> None:
    env = {"A": "1", "B": "2", "TERM": "xterm", "http_proxy": "p", "SLURM_JOB_ID": "7"}
    passed = host_passthrough(env, cleanenv=False, keep=("SLURM_JOB_ID",), blocked=("A", "TERM", "SLURM_JOB_ID"))
    assert passed == {"B": "2", "TERM": "xterm", "http_proxy": "p"}
    assert host_passthrough(env, cleanenv=True, blocked=("http_proxy",)) == {"TERM": "xterm", "http_proxy": "p"}


def _request(argv: list[str], env: dict[str, str] | None = None) -> LaunchRequest:
    values, positionals = parse_action("exec", [*argv, "img", "true"], env or {})
    return build_request("exec", values, positionals, "/")


@pytest.mark.parametrize(("argv", "env", "pid"), [(["--containall"], {}, True), (["-C", "--no-pid"], {}, False),
                                                  (["--pid", "--no-pid"], {}, False),
                                                  (["--containall"], {"APPTAINER_NO_PID": "1"}, False),
                                                  (["--compat"], {"SINGULARITY_NO_PID": "true"}, False)])
def test_no_pid_wins(argv: list[str], env: dict[str, str], pid: bool) -> None:
    request = _request(argv, env)
    assert request.pid is pid
    assert request.ipc is bool(argv != ["--pid", "--no-pid"])


def test_no_gpu_flags_and_no_env_lists() -> None:
    request = _request(["--no-nv", "--no-env", "A,B", "--no-env", "C"], {"APPTAINER_ROCM_OFF": "1"})
    assert (request.no_nv, request.no_rocm, request.no_env) == (True, True, ("A", "B", "C"))
    plain = _request([])
    assert (plain.no_nv, plain.no_rocm, plain.no_env, plain.workdir, plain.scratch) == (
        False, False, (), "", ())

"""singpy.launch.planner.build_plan: namespaces, the process, the environment and the plan as JSON (as
test_planner.py: real configuration, host facts and a sandbox image in, a LaunchPlan out)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from singpy.constants import DEFAULT_PATH
from singpy.host.host import HostInfo
from singpy.launch.planner import Planned, build_plan
from singpy.mounts.parse import parse_bind_list
from singpy.plan import ImageSpec, Missing, MountOp, MountSpec, Namespaces, Stage

if TYPE_CHECKING:
    pass
from tests.support.planning import (
    CWD,
    alice,
    by_dest,
    config,
    dests,
    home_dir,
    plan,
    request,
    sandbox_image,
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


# --- namespaces, process ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uid", "fields", "expected"),
    [
        (1000, {}, Namespaces(user=True)),
        (0, {}, Namespaces(user=False)),
        (1000, {"pid": True, "ipc": True}, Namespaces(user=True, pid=True, ipc=True)),
        (1000, {"uts": True}, Namespaces(user=True, uts=True)),
        (0, {"hostname": "box"}, Namespaces(user=False, uts=True)),
    ],
    ids=["user", "root-no-userns", "pid-ipc", "uts", "hostname-implies-uts"],
)
def test_namespaces(host: HostInfo, image: ImageSpec, uid: int, fields: dict[str, Any],
                    expected: Namespaces) -> None:
    built = plan(host.replace(uid=uid), image, **fields)
    assert built.namespaces == expected
    assert built.uid == uid
    assert built.gid == 1000


def test_hostname_and_plan_fields(host: HostInfo, image: ImageSpec) -> None:
    built = plan(host, image, hostname="box", writable_tmpfs=True)
    assert (built.hostname, built.writable_tmpfs, built.image) == ("box", True, image)
    assert plan(host, image).hostname is None


def test_process(host: HostInfo, image: ImageSpec) -> None:
    built = plan(host, image, action="shell", args=(), shell="/bin/ash", pwd="/work")
    assert (built.process.action, built.process.args, built.process.shell, built.process.cwd) == (
        "shell", (), "/bin/ash", "/work")
    assert plan(host, image, args=("ls", "-l")).process.args == ("ls", "-l")
    assert plan(host, image, contain=True, pwd="/opt").process.cwd == "/opt"


# --- environment --------------------------------------------------------------------------------------------------


def test_env_base(host: HostInfo, image: ImageSpec, home: str) -> None:
    env = build_plan(request(action="run"), config(), host, image).plan.process.env
    base = dict(env.base)
    assert base == {
        "HOME": home, "PATH": DEFAULT_PATH, "PS1": "Singpy> ",
        "SINGULARITY_CONTAINER": image.path, "SINGULARITY_NAME": "busybox.sandbox", "SINGULARITY_COMMAND": "run",
        "APPTAINER_CONTAINER": image.path, "APPTAINER_NAME": "busybox.sandbox", "APPTAINER_COMMAND": "run",
        "SINGULARITY_BIND": "", "APPTAINER_BIND": "",  # no bind asked for
    }
    assert "LANG" not in base
    # PATH, LD_LIBRARY_PATH and the launcher's own variables never pass; HOME passes but the base wins.
    assert dict(env.host) == {"TERM": "xterm-256color", "LANG": "en_US.UTF-8", "http_proxy": "http://proxy:3128",
                              "MYVAR": "mine", "HOME": home}
    assert (env.injected, env.prepend_path, env.append_path, env.path) == ((), "", "", "")


def test_env_cleanenv(host: HostInfo, image: ImageSpec) -> None:
    env = plan(host, image, cleanenv=True).process.env
    assert dict(env.base)["LANG"] == "C"
    assert dict(env.host) == {"TERM": "xterm-256color", "http_proxy": "http://proxy:3128"}


def test_env_keep_host_env_survives_cleanenv(host: HostInfo, image: ImageSpec) -> None:
    env = build_plan(request(cleanenv=True), config(), host, image, keep_host_env=("MYVAR", "ABSENT")).plan.process.env
    assert dict(env.host) == {"TERM": "xterm-256color", "http_proxy": "http://proxy:3128", "MYVAR": "mine"}


def test_env_home_is_the_home_destination(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    built = plan(host.replace(env={**host.env, "SINGULARITYENV_HOME": "/evil"}), image, home=f"{tmp_path}:/h")
    assert dict(built.process.env.base)["HOME"] == "/h"
    assert "HOME" not in dict(built.process.env.injected)


def test_env_precedence(host: HostInfo, image: ImageSpec) -> None:
    host_env = {**host.env, "SINGULARITYENV_A": "s", "APPTAINERENV_A": "a", "SINGULARITYENV_B": "s",
                "SINGULARITYENV_C": "s", "APPTAINERENV_C": "a", "SINGPYENV_C": "p", "SINGULARITYENV_D": "s"}
    env = plan(host.replace(env=host_env), image, env_file=(("A", "file"), ("B", "file"), ("E", "file")),
               env=(("A", "cli"), ("F", "cli"))).process.env
    assert dict(env.injected) == {"A": "cli", "B": "file", "C": "p", "D": "s", "E": "file", "F": "cli"}


def test_env_path_rules_split_out(host: HostInfo, image: ImageSpec) -> None:
    host_env = {**host.env, "SINGULARITYENV_PREPEND_PATH": "/pre", "APPTAINERENV_APPEND_PATH": "/app",
                "SINGULARITYENV_PATH": "/host-path", "SINGULARITYENV_X": "1"}
    env = plan(host.replace(env=host_env), image, env=(("PATH", "/cli-path"),)).process.env
    assert (env.prepend_path, env.append_path, env.path) == ("/pre", "/app", "/cli-path")
    assert dict(env.injected) == {"X": "1"}
    assert dict(env.base)["PATH"] == DEFAULT_PATH


def test_env_home_cannot_be_overridden(host: HostInfo, image: ImageSpec, home: str) -> None:
    host_env = {**host.env, "SINGULARITYENV_HOME": "/a"}
    planned = build_plan(request(env=(("HOME", "/c"),), env_file=(("HOME", "/f"),)), config(),
                         host.replace(env=host_env), image)
    env = planned.plan.process.env
    assert dict(env.base)["HOME"] == home
    assert "HOME" not in dict(env.injected)
    assert len(planned.warnings) == 3
    assert all("HOME" in warning and "not permitted" in warning for warning in planned.warnings)


def test_no_warnings_by_default(host: HostInfo, image: ImageSpec) -> None:
    planned = build_plan(request(), config(), host, image)
    assert isinstance(planned, Planned)
    assert planned.warnings == ()


# --- JSON ---------------------------------------------------------------------------------------------------------


def test_to_json_data(host: HostInfo, image: ImageSpec, tmp_path: Path) -> None:
    host_env = {**host.env, "SINGULARITYENV_PREPEND_PATH": "/pre", "SINGULARITYENV_X": "x y"}
    built = plan(host.replace(env=host_env), image, pid=True, contain=True, hostname="box",
                 binds=parse_bind_list([f"{tmp_path}:/data:ro"], CWD))
    data: Any = built.to_json_data()
    text = json.dumps(data)
    assert json.loads(text) == data
    assert data["namespaces"] == {"user": True, "pid": True, "ipc": False, "uts": True, "net": False}
    assert data["image"] == image.as_dict()
    assert data["image"]["kind"] == "sandbox" and data["image"]["rootfs"] == image.rootfs
    assert data["process"]["env"]["prepend_path"] == "/pre"
    assert ["X", "x y"] in data["process"]["env"]["injected"]
    assert len(data["mounts"]) == len(built.mounts)
    for entry, spec in zip(data["mounts"], built.mounts, strict=True):
        assert isinstance(entry["op"], str) and isinstance(entry["missing"], str)
        assert type(entry["stage"]) is int
        assert entry["op"] in MountOp.ALL and entry["missing"] in Missing.ALL and entry["stage"] in Stage.ALL
        rebuilt = MountSpec(**entry)
        assert rebuilt == spec
    assert {entry["op"] for entry in data["mounts"]} >= {"proc", "tmpfs", "devpts", "symlink", "file", "bind"}


def test_plan_is_deterministic(host: HostInfo, image: ImageSpec) -> None:
    assert plan(host, image) == plan(host, image)
    assert os.path.isdir(image.path)  # planning touched nothing


@pytest.mark.parametrize(("conf", "fields"), [("", {"writable": True}),
                                              ("enable overlay = no\nenable underlay = no\n", {})])
def test_home_staged_without_a_layer(host: HostInfo, image: ImageSpec, conf: str, fields: dict[str, object]) -> None:
    """No layer of mount points (issue 26): the default home is made in a tmpfs on its first directory, as
    Apptainer stages it, and left out (a warning) rather than fatal where even that can't be."""
    host = host.replace(home="/home/alice")  # not on this host: an empty home (a tmpfs), as with --contain
    mounts = plan(host, image, conf, **fields).mounts
    staged = [spec for spec in mounts if spec.dest in ("/home", "/home/alice")]
    assert [(spec.op, spec.dest, spec.missing) for spec in staged] == [
        (MountOp.TMPFS, "/home", Missing.SKIP), (MountOp.TMPFS, "/home/alice", Missing.SKIP)]


def test_home_not_staged_with_a_layer_or_when_asked(host: HostInfo, image: ImageSpec, home: str) -> None:
    host = host.replace(home="/home/alice")
    assert "/home" not in dests(plan(host, image).mounts)
    assert by_dest(plan(host, image).mounts, "/home/alice").missing == Missing.REQUIRED
    asked = plan(host, image, writable=True, home=f"{home}:/home/alice").mounts  # --home: a bind of the user's
    assert "/home" not in dests(asked)
    assert by_dest(asked, "/home/alice").missing == Missing.REQUIRED


@pytest.mark.parametrize("home_dir", ["/root", "/var/lib/svc"])
def test_home_never_staged_over_a_system_directory(host: HostInfo, image: ImageSpec, home_dir: str) -> None:
    """/root is the home itself; a tmpfs on /var would hide the image's /var (Apptainer's staging does)."""
    mounts = plan(host.replace(home=home_dir), image, writable=True).mounts
    assert by_dest(mounts, home_dir).missing == Missing.SKIP
    assert not [spec for spec in mounts if spec.op == MountOp.TMPFS and spec.dest in ("/root", "/var")]

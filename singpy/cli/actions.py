"""`run`, `exec`, `shell`: parsed options -> LaunchRequest -> launch.run."""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy import console
from singpy.cli.parse import action_help, parse_action
from singpy.constants import IMAGE_URI_PREFIXES
from singpy.errors import UsageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import Any

    from singpy.mounts.parse import BindSpec
    from singpy.planner import LaunchRequest


def verbosity(values: Mapping[str, Any], base: int = 0) -> int:
    if values.get("debug"):
        return console.DEBUG
    if values.get("verbose"):
        return max(base, console.VERBOSE)
    if values.get("quiet"):
        return console.QUIET
    return base


def run_action(action: str, argv: list[str], global_values: Mapping[str, Any]) -> int:
    env = os.environ
    values, positionals = parse_action(action, argv, env)
    if values.get("help"):
        print(action_help(action), end="")
        return 0
    console.set_level(verbosity(values, verbosity(global_values)))
    if not positionals:
        raise UsageError(f"singpy {action} needs an IMAGE", hint=f"Run 'singpy {action} --help' for usage.")
    if action == "exec" and len(positionals) < 2:
        raise UsageError("singpy exec needs a COMMAND after the IMAGE", hint="Run 'singpy exec --help' for usage.")

    from singpy import host as host_module
    from singpy import launch
    from singpy.config import sysconf

    host = host_module.capture(env)
    config = sysconf.load(global_values.get("config") or sysconf.default_path(env))
    if positionals[0].startswith(IMAGE_URI_PREFIXES):
        positionals = [_pulled(positionals[0], values, env, host.home), *positionals[1:]]
    request = build_request(action, values, positionals, host.cwd)
    return launch.run(request, config, host, dry_run=bool(values.get("dry_run")))


def _pulled(reference: str, values: Mapping[str, Any], env: Mapping[str, str], home: str) -> str:
    """The cached SIF of a docker://, oci:... image, pulled first if needed: the launch sees only a SIF."""
    from singpy.oci.pull import PullOptions, cached_image, wait_single_threaded

    options = PullOptions(login=bool(values.get("docker_login")), authfile=values.get("authfile") or "",
                          https=not values.get("no_https"))
    sif = cached_image(reference, options, env, home)
    wait_single_threaded()  # the download threads are gone: unshare(CLONE_NEWUSER) refuses a threaded process
    return sif


def build_request(action: str, values: Mapping[str, Any], positionals: list[str], cwd: str) -> LaunchRequest:
    from singpy.environ import parse_env_option
    from singpy.planner import LaunchRequest

    containall = bool(values.get("containall"))
    return LaunchRequest(
        action=action,
        image=positionals[0],
        args=tuple(positionals[1:]),
        binds=_binds(values.get("bind", []), cwd),
        contain=containall or bool(values.get("contain")),
        cleanenv=containall or bool(values.get("cleanenv")),
        env=tuple(parse_env_option(values.get("env", [])).items()),
        env_file=tuple(_read_env_files(values.get("env_file", []))),
        home=values.get("home"),
        no_home=bool(values.get("no_home")),
        pwd=values.get("pwd"),
        writable_tmpfs=bool(values.get("writable_tmpfs")),
        hostname=values.get("hostname") or None,  # --hostname '' sets nothing, as in Apptainer
        pid=containall or bool(values.get("pid")),
        ipc=containall or bool(values.get("ipc")),
        uts=bool(values.get("uts")),
        shell=values.get("shell"),
        no_eval=bool(values.get("no_eval")),
        unsquash=bool(values.get("unsquash")),
        nv=bool(values.get("nv")),
        rocm=bool(values.get("rocm")),
        net=bool(values.get("net")),
        network=values.get("network"),
        network_args=tuple(values.get("network_args", [])),
        dns=(values["dns"],) if values.get("dns") else (),
        fakeroot=bool(values.get("fakeroot")),
        keep_privs=bool(values.get("keep_privs")),
        no_privs=bool(values.get("no_privs")),
        add_caps=tuple(values.get("add_caps", [])),
        drop_caps=tuple(values.get("drop_caps", [])),
    )


def _binds(values: list[str], cwd: str) -> tuple[BindSpec, ...]:
    """--bind (and SINGULARITY_BIND...) parsed; the parser is imported only when there is one (start-up time)."""
    if not values:
        return ()
    from singpy.mounts.parse import parse_bind_list

    return parse_bind_list(values, cwd)


def _read_env_files(paths: list[str]) -> list[tuple[str, str]]:
    """The files' variables, later files winning; each a regular UTF-8 file of at most 1 MiB."""
    from singpy.environ import parse_env_file
    from singpy.errors import SingpyError
    from singpy.hostfiles import read_text, shown

    merged: dict[str, str] = {}
    for value in paths:
        for path in value.split(","):
            merged.update(parse_env_file(read_text(path, what="--env-file", error=SingpyError), shown(path)))
    return list(merged.items())

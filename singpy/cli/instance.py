"""`singpy instance start|list|stop`: named background containers (singpy.launch.instance, singpy.launch.shared)."""

from __future__ import annotations

import os
import signal
import time

import typer

from singpy import console
from singpy.cli.pull import variables
from singpy.errors import SingpyError, UsageError

instance_app = typer.Typer(name="instance", help="Manage background containers (instances).",
                           no_args_is_help=True)

_START_SUMMARY = ("Start a named instance of IMAGE in the background: its startscript (/.singularity.d/startscript) "
                  "runs with ARGS, and `singpy exec|run|shell instance://NAME` run in its container. The options are "
                  "those of `singpy run`.")


@instance_app.command(name="start", help="Start a named instance of an image. Options as for `singpy run`.",
                      context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                      add_help_option=False)
def start_command(ctx: typer.Context) -> None:
    raise typer.Exit(_start(list(ctx.args)))


def _start(argv: list[str]) -> int:
    from singpy.cli.actions import _pulled, build_request, verbosity
    from singpy.cli.parse import parse_action
    from singpy.config import sysconf
    from singpy.constants import IMAGE_URI_PREFIXES
    from singpy.host import host as host_module
    from singpy.launch import holder, instance, launch
    from singpy.plan import ShareSpec

    env = os.environ
    values, positionals = parse_action("run", argv, env)
    if values.get("help"):
        from singpy.cli.parse import action_help

        print(action_help("run", command="instance start", usage="IMAGE NAME [ARGS...]", summary=_START_SUMMARY),
              end="")
        return 0
    console.set_level(verbosity(values, console.level()))
    if len(positionals) < 2:
        raise UsageError("singpy instance start needs an IMAGE and a NAME",
                         hint="Run 'singpy instance start --help' for usage.")
    image, name, *args = positionals
    instance.check_name(name)
    host = host_module.capture(env)
    config = sysconf.load(sysconf.default_path(env))
    records, logs = instance.state_dirs(host.home, host.user)
    instance.refuse_running(records, name, host.uid)
    if image.startswith(IMAGE_URI_PREFIXES):
        image = _pulled(image, values, env, host.home)
    request = build_request("run", values, [image, *args], host.cwd)
    planned, _ = launch.plan_launch(request, config, host)
    socket = instance.new_socket_name(host.uid)
    plan = planned.plan.replace(share=ShareSpec(socket=socket, origin=f"instance {name}"))
    out, err, lock = instance.claim(logs, name)
    directory = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        instance.refuse_running(records, name, host.uid)  # a start of the same name that ended meanwhile
        pid = holder.start_instance(plan, holder.Instance(log_out=out, log_err=err, records=directory,
                                                          record=f"{name}.json"))
        try:
            instance.write_record(records, instance.InstanceRecord(
                name=name, pid=pid, image=plan.image.path, socket=socket,
                log_out=os.path.join(logs, f"{name}.out"), log_err=os.path.join(logs, f"{name}.err"),
                started=time.time()))
        except SingpyError:  # an instance nobody could find: not left running
            os.kill(pid, signal.SIGKILL)
            raise
    finally:
        for fd in (out, err, lock, directory):
            os.close(fd)
    console.info("instance started successfully")
    return 0


@instance_app.command(name="list", help="List your running instances.")
def list_command(
    name: str = typer.Argument("", metavar="[NAME]", help="only this instance (a glob pattern)"),
    as_json: bool = typer.Option(False, "--json", "-j", help="print as JSON", envvar=variables("JSON"),
                                 show_envvar=False),
    logs: bool = typer.Option(False, "--logs", "-l", help="show the paths of the log files",
                              envvar=variables("LOGS"), show_envvar=False),
) -> None:
    import fnmatch
    import json

    from singpy.console import escape  # a path may hold anything; a name is checked (check_name)
    from singpy.host import host as host_module
    from singpy.launch import instance

    host = host_module.capture(os.environ)
    records, _ = instance.state_dirs(host.home, host.user)
    found = [record for record in instance.running(records, host.uid)
             if not name or fnmatch.fnmatchcase(record.name, name)]
    if as_json:
        entries = [{"instance": record.name, "pid": record.pid, "img": record.image, "ip": "",
                    "logErrPath": record.log_err, "logOutPath": record.log_out} for record in found]
        print(json.dumps({"instances": entries}, indent=4))
        return
    if logs:
        print(f"{'INSTANCE NAME':<16} {'PID':<8} LOGS")
        for record in found:
            print(f"{record.name:<16} {record.pid:<8} {escape(record.log_err)}\n{'':<25} {escape(record.log_out)}")
        return
    print(f"{'INSTANCE NAME':<16} {'PID':<8} {'IP':<15} IMAGE")
    for record in found:
        print(f"{record.name:<16} {record.pid:<8} {'':<15} {escape(record.image)}")


@instance_app.command(name="stop", help="Stop running instances.")
def stop_command(
    names: list[str] = typer.Argument(None, metavar="[NAME]...", help="instances to stop (glob patterns)"),  # noqa: B008
    stop_all: bool = typer.Option(False, "--all", "-a", help="stop all your instances", envvar=variables("ALL"),
                                  show_envvar=False),
    signal_name: str = typer.Option("TERM", "--signal", "-s", help="signal to send (number or name)",
                                    envvar=variables("SIGNAL"), show_envvar=False),
    force: bool = typer.Option(False, "--force", "-F", help="kill at once (SIGKILL)", envvar=variables("FORCE"),
                               show_envvar=False),
    timeout: float = typer.Option(10.0, "--timeout", "-t", help="seconds before SIGKILL"),
) -> None:
    import fnmatch

    from singpy.host import host as host_module
    from singpy.launch import instance

    if not names and not stop_all:
        raise UsageError("singpy instance stop needs a NAME or --all")
    signum = instance.parse_signal(signal_name)
    host = host_module.capture(os.environ)
    records, _ = instance.state_dirs(host.home, host.user)
    running = instance.running(records, host.uid)
    chosen = [record for record in running
              if stop_all or any(fnmatch.fnmatchcase(record.name, pattern) for pattern in names or [])]
    if not chosen:
        raise SingpyError("no instance found" if stop_all else f"no instance found with name {' '.join(names or [])}")
    for record in chosen:
        instance.stop(records, record, host.uid, signum=signum, timeout=timeout, force=force)
        console.info(f"stopping {record.name} instance of {record.image} (PID={record.pid})")

"""`singpy instance start|list|stop`: named background containers (singpy.launch.instance, singpy.launch.shared)."""

from __future__ import annotations

import contextlib
import os
import time

import typer

from singpy import console
from singpy.cli.pull import variables
from singpy.errors import SingpyError, UsageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from singpy.launch.holder import Instance, Started
    from singpy.launch.instance import InstanceRecord
    from singpy.launch.request import LaunchRequest
    from singpy.plan import LaunchPlan

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


_RUN_SUMMARY = ("Start a named instance of IMAGE in the background running its runscript with ARGS (where `instance "
                "start` runs the startscript); `singpy exec|run|shell instance://NAME` run in its container. The "
                "options are those of `singpy run`.")


@instance_app.command(name="run", help="Start a named instance running the image's runscript. Options as for "
                      "`singpy run`.", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                      add_help_option=False)
def run_command(ctx: typer.Context) -> None:
    raise typer.Exit(_start(list(ctx.args), runscript=True))


def _start(argv: list[str], *, runscript: bool = False) -> int:
    from singpy.cli.actions import build_request, pulled, verbosity
    from singpy.cli.parse import parse_action
    from singpy.config import sysconf
    from singpy.constants import PULLED_URI_PREFIXES
    from singpy.host import host as host_module
    from singpy.launch import instance, launch
    from singpy.plan import ShareSpec

    env = os.environ
    argv, pid_file = take_pid_file(argv, env)
    values, positionals = parse_action("instance run" if runscript else "instance start", argv, env)
    if values.get("help"):
        from singpy.cli.parse import action_help

        print(action_help("run", command="instance run" if runscript else "instance start", usage="IMAGE NAME "
                          "[ARGS...]", summary=_RUN_SUMMARY if runscript else _START_SUMMARY), end="")
        print("\nInstance options:\n  --pid-file FILE   write the instance's PID to FILE [$APPTAINER_PID_FILE]")
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
    temporary = _temporary_cache(values, image)  # --disable-cache: "" unless a pulled image
    try:
        if temporary:
            host = host.replace(env={**host.env, "SINGPY_CACHEDIR": temporary})
        if image.startswith(PULLED_URI_PREFIXES):
            image = pulled(image, values, host.env, host.home)  # --config is in SINGPY_CONFIG here (cli.main)
        request = build_request("run", values, [image, *args], host.cwd)
        if values.get("boot"):  # (singpy.launch.boot, imported only then)
            from singpy.launch.boot import booted

            request = booted(request, name, host.uid)
        planned, _ = launch.plan_launch(request, config, host)
        socket = instance.new_socket_name(host.uid)
        plan = planned.plan.replace(share=ShareSpec(socket=socket, origin=f"instance {name}", runscript=runscript))
        pid = _started(plan, request, name, (records, logs), temporary, host.uid)
    except BaseException:  # nothing left behind: the holder, once started, removes the directory as it ends
        if temporary:
            from singpy.image import trees

            trees.remove(temporary)
        raise
    if pid_file:
        write_pid_file(pid_file, pid)
    console.info("instance started successfully")
    return 0


def _started(plan: LaunchPlan, request: LaunchRequest, name: str, dirs: tuple[str, str], temporary: str,
             uid: int) -> int:
    """The instance's holder started and its record written (`dirs`: the records' and logs'); the holder's pid."""
    from singpy.launch import holder, instance

    assert plan.share is not None
    records, logs = dirs
    out, err, lock = instance.claim(logs, name)
    directory = os.open(records, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    parent = os.open(os.path.dirname(temporary), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if temporary else -1
    try:
        instance.refuse_running(records, name, uid)  # a start of the same name that ended meanwhile
        started = _start_holder(plan, holder.Instance(
            log_out=out, log_err=err, records=directory, record=f"{name}.json", temporary=parent,
            temporary_name=os.path.basename(temporary)))
        pid, written = started.pid, False
        try:
            instance.write_record(records, instance.InstanceRecord(
                name=name, pid=pid, image=plan.image.path, socket=plan.share.socket,
                log_out=os.path.join(logs, f"{name}.out"), log_err=os.path.join(logs, f"{name}.err"),
                started=time.time(), cgroup=plan.cgroup.dirs if plan.cgroup else (),
                cgroup_version=plan.cgroup.version if plan.cgroup else 0, security=_recorded_security(request),
                ip=started.address, allow_setuid=plan.allow_setuid))
            written = True
            started.release()  # from now on the holder outlives us
        except BaseException:  # an instance nobody could find, or an interrupted start: not left running
            _abort(started, plan, os.path.join(records, f"{name}.json") if written else "")
            raise
    finally:
        for fd in (out, err, lock, directory, parent):
            if fd >= 0:
                os.close(fd)
    return pid


def _abort(started: Started, plan: LaunchPlan, record: str) -> None:
    """The holder killed and reaped (by its middle process, which alone may reap it: its pid is its own),
    its cgroup removed, the record written for it (if any) removed."""
    if not started.abort():
        return
    if plan.cgroup is not None:
        from singpy.cgroups import manager

        manager.remove(plan.cgroup)
    if record:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record)


def _temporary_cache(values: Mapping[str, Any], image: str) -> str:
    """--disable-cache of a pulled image: a fresh private directory in $TMPDIR for its pull and caches, as
    run/exec use (singpy.cli.nocache); "" otherwise. It lives as long as the instance: its holder removes it."""
    from singpy.cli import nocache

    if not values.get("disable_cache") or not nocache.is_pulled(image):
        return ""
    import tempfile

    try:
        return tempfile.mkdtemp(prefix="singpy-nocache-")  # 0700
    except OSError as error:
        raise SingpyError(f"--disable-cache: can't make a temporary directory in {tempfile.gettempdir()}: "
                          f"{error.strerror}", hint="set TMPDIR to a directory you can write to") from None


def _recorded_security(request: LaunchRequest) -> tuple[str, ...]:
    """The instance's --security values as its record keeps them (the commands joining it inherit them)."""
    if not request.security:
        return ()
    from singpy.launch.security import recorded

    return recorded(request.security)


def _start_holder(plan: LaunchPlan, settings: Instance) -> Started:
    """The instance's holder started, in the plan's cgroup when it has one: the holder is born there (we join it
    while forking, then go back), and so is all it starts; the cgroup goes with `instance stop`."""
    from singpy.launch import holder

    if plan.cgroup is None:
        return holder.start_instance(plan, settings)
    from singpy.launch import limits

    back = limits.enter(plan.cgroup)
    try:
        return holder.start_instance(plan, settings)
    except BaseException:
        limits.leave(plan.cgroup, back)
        raise
    finally:
        from singpy.cgroups import manager

        manager.leave(plan.cgroup, back)


def take_pid_file(argv: list[str], env: Mapping[str, str]) -> tuple[list[str], str]:
    """--pid-file FILE (or APPTAINER_PID_FILE...) taken out of the options before the IMAGE; the rest of argv."""
    from singpy.cli.options import ACTION_OPTIONS, ENV_PREFIXES

    takes_value = {name for option in ACTION_OPTIONS if option.value for name in (option.long, option.short) if name}
    rest, pid_file, index = list(argv), "", 0
    while index < len(rest) and rest[index].startswith("-") and rest[index] != "--":
        word = rest[index]
        if word == "--pid-file" and index + 1 < len(rest):
            pid_file = rest.pop(index + 1)
            rest.pop(index)
        elif word.startswith("--pid-file="):
            pid_file = rest.pop(index).partition("=")[2]
        else:
            index += 2 if word in takes_value else 1
    for prefix in reversed(ENV_PREFIXES):  # SINGPY_ beats APPTAINER_ beats SINGULARITY_, as the other flags
        if not pid_file and env.get(prefix + "PID_FILE"):
            pid_file = env[prefix + "PID_FILE"]
    return rest, pid_file


def write_pid_file(path: str, pid: int) -> None:
    """The instance's PID in FILE; a warning (the instance runs) when it can't be written, as Apptainer."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as file:
            file.write(f"{pid}\n")
    except OSError as error:
        console.warning(f"Failed to write pid file: {error.strerror}: {console.escape(path)}")


@instance_app.command(name="list", help="List your running instances.")
def list_command(
    name: str = typer.Argument("", metavar="[NAME]", help="only this instance (a glob pattern)"),
    as_json: bool = typer.Option(False, "--json", "-j", help="print as JSON", envvar=variables("JSON"),
                                 show_envvar=False),
    logs: bool = typer.Option(False, "--logs", "-l", help="show the paths of the log files",
                              envvar=variables("LOGS"), show_envvar=False),
    user: str = typer.Option("", "--user", "-u", help="root only: list the instances of this user",
                             metavar="USERNAME", envvar=variables("USER"), show_envvar=False),
    all_: bool = typer.Option(False, "--all", "-a", help="all instances (as every listing: singpy's --sharens "
                              "makes no hidden instance, Apptainer's does)", envvar=variables("ALL"),
                              show_envvar=False),
) -> None:
    import fnmatch
    import json

    from singpy.console import escape  # a record is its writer's: a name is checked (check_name), a path is not

    records, uid, owner = _records_of(user, "Only root user can list user's instances")
    found = [record for record in _running(records, uid, owner) if not name or fnmatch.fnmatchcase(record.name, name)]
    if as_json:
        entries = [{"instance": record.name, "pid": record.pid, "img": record.image, "ip": record.ip,
                    "logErrPath": record.log_err, "logOutPath": record.log_out} for record in found]
        print(json.dumps({"instances": entries}, indent=4))
        return
    if logs:
        print(f"{'INSTANCE NAME':<16} {'PID':<8} LOGS")
        for record in found:
            print(f"{escape(record.name):<16} {record.pid:<8} {escape(record.log_err)}\n{'':<25} "
                  f"{escape(record.log_out)}")
        return
    print(f"{'INSTANCE NAME':<16} {'PID':<8} {'IP':<15} IMAGE")
    for record in found:
        print(f"{escape(record.name):<16} {record.pid:<8} {escape(record.ip):<15} {escape(record.image)}")


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
    user: str = typer.Option("", "--user", "-u", help="root only: stop the instances of this user",
                             metavar="USERNAME", envvar=variables("USER"), show_envvar=False),
) -> None:
    import fnmatch

    from singpy.launch import instance

    if not names and not stop_all:
        raise UsageError("singpy instance stop needs a NAME or --all")
    signum = instance.parse_signal(signal_name)
    records, uid, owner = _records_of(user, "Only root user can stop user's instances")
    running = _running(records, uid, owner)
    chosen = [record for record in running
              if stop_all or any(fnmatch.fnmatchcase(record.name, pattern) for pattern in names or [])]
    if not chosen:
        hidden = [pattern for pattern in names or [] if instance.out_of_sight(records, pattern, uid, owner)]
        if hidden:  # not "no instance": it may well run, where its pid means something
            raise SingpyError(f"instance {hidden[0]} runs in another PID namespace, out of sight here: stop it "
                              "from there")
        raise SingpyError("no instance found" if stop_all else f"no instance found with name {' '.join(names or [])}")
    for record in chosen:
        instance.stop(records, record, uid, signum=signum, timeout=timeout, force=force)
        console.info(f"stopping {record.name} instance of {record.image} (PID={record.pid})")


def _records_of(user: str, refusal: str) -> tuple[str, int, int | None]:
    """(the records directory, the uid owning the instances, that uid when root looks at another user's, else None)."""
    from singpy.host import host as host_module
    from singpy.launch import instance

    host = host_module.capture(os.environ)
    if user and host.uid != 0:
        raise SingpyError(refusal)
    if not user or user == host.user:
        return instance.state_dirs(host.home, host.user)[0], host.uid, None
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SingpyError(f"no such user {user!r}") from None
    return instance.user_dirs(entry.pw_dir, entry.pw_name, entry.pw_uid)[0], entry.pw_uid, entry.pw_uid


def _running(records: str, uid: int, owner: int | None) -> list[InstanceRecord]:
    from singpy.launch import instance

    return instance.running(records, uid, owner=owner)


@instance_app.command(name="stats", help="Show the CPU, memory, PIDs and block I/O of a running instance.")
def stats_command(
    name: str = typer.Argument(..., metavar="NAME", help="the instance"),
    as_json: bool = typer.Option(False, "--json", "-j", help="print as JSON (one sample: --no-stream)"),
    no_stream: bool = typer.Option(False, "--no-stream", help="print one sample and exit (no live update)"),
    user: str = typer.Option("", "--user", "-u", help="root only: an instance of this user", metavar="USERNAME",
                      envvar=variables("USER"), show_envvar=False),
) -> None:
    import json

    from singpy.cgroups import stats
    from singpy.launch import instance

    records, uid, owner = _records_of(user, "Only the root user can look at stats of a user's instance")
    record = instance.find(records, name, uid, owner)
    if as_json and not no_stream:
        console.warning("JSON output is only available for a single timepoint (--no-stream)")
        no_stream = True
    if not as_json:
        console.info(f"Stats for {record.name} instance of {console.escape(record.image)} (PID={record.pid})")
    cgroup = instance.cgroup_of(record, uid)  # a record names what its writer wants: only singpy's, the holder's
    before, then = stats.sample(record.pid, cgroup, record.cgroup_version), time.monotonic()
    while True:
        time.sleep(1.0)
        if not instance.is_alive(record, uid):
            raise SingpyError(f"instance {record.name} has ended")
        after, now = stats.sample(record.pid, cgroup, record.cgroup_version), time.monotonic()
        if as_json:
            print(json.dumps(after, indent="\t"))
            return
        if not no_stream:
            print("\033[2J\033[H", end="")  # a fresh screen for each sample, as Apptainer's goterm.Clear
        print(stats.HEADER)
        print(stats.row(console.escape(record.name), before, after, now - then), flush=True)
        if no_stream:
            return
        before, then = after, now

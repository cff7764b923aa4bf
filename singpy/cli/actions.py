"""`run`, `exec`, `shell`: parsed options -> LaunchRequest -> launch.run."""

from __future__ import annotations

import os
import sys

from singpy import console
from singpy.cli.parse import action_help, parse_action
from singpy.constants import PULLED_URI_PREFIXES
from singpy.errors import SingpyError, UsageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Mapping
    from typing import Any

    from singpy.config.sysconf import SysConfig
    from singpy.host.host import HostInfo
    from singpy.launch.planner import LaunchRequest
    from singpy.mounts.parse import BindSpec


def verbosity(values: Mapping[str, Any], base: int = 0) -> int:
    """The message level of these flags over `base` (set by the global flags and variables before).

    Apptainer's precedence, whoever set what: debug, then verbose, then quiet, then silent.
    """
    if values.get("debug"):
        return console.DEBUG
    if values.get("verbose"):
        return max(base, console.VERBOSE)
    if base > console.NORMAL:
        return base
    if values.get("quiet"):
        return console.QUIET
    if values.get("silent"):
        return console.QUIET if base == console.QUIET else console.SILENT
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
    if action == "shell" and len(positionals) > 1:  # Apptainer's words; the shell starts without them
        console.warning("parameters to shell command are ignored")
        positionals = positionals[:1]

    if positionals[0].startswith(("docker://", "oras://")) and not values.get("disable_cache"):
        from singpy.oci import tagcheck  # its TLS context begun first: the set-up below overlaps it

        tagcheck.prepare(positionals[0], _pull_options(values), env)
    elif "singpy.oci.tagcheck" in sys.modules:  # one begun early (singpy.cli.main) on a word the parse did not
        from singpy.oci import tagcheck  # take for the image: released, as a launch needs one thread

        tagcheck.release()
    from singpy.config import sysconf
    from singpy.host import host as host_module

    host = host_module.capture(env)
    config = sysconf.load(global_values.get("config") or sysconf.default_path(env))
    if global_values.get("build_config"):
        config = sysconf.for_build(config)
    if values.get("disable_cache") and _uncached(positionals[0]):  # this run's caches in a temporary directory
        from singpy.cli import nocache

        return nocache.in_temporary_cache(host, lambda host: _launch(values, positionals, global_values, host,
                                                                      config, action=action, uncached=True))
    return _launch(values, positionals, global_values, host, config, action=action)


def _launch(values: Mapping[str, Any], positionals: list[str], global_values: Mapping[str, Any], host: HostInfo,
            config: SysConfig, *, action: str, uncached: bool = False) -> int:
    """The image pulled if it must be, the request built and launched (`uncached`: in a supervised child)."""
    sent = _send_tag_check(positionals[0], values, host)  # first: the launch's imports overlap the registry's answer
    from singpy.launch import launch

    instance = ""
    if positionals[0].startswith("instance://"):
        instance, image = _instance_image(positionals[0], host)
        positionals = [image, *positionals[1:]]
    if positionals[0].startswith(PULLED_URI_PREFIXES):
        mine = global_values.get("nocolor") and "NO_COLOR" not in os.environ
        if mine:  # for the pull's progress bars (rich honours it) only: not a variable of the container's
            os.environ["NO_COLOR"] = "1"
        try:
            positionals = [pulled(positionals[0], {**values, "global_config": global_values.get("config")},
                                   host.env, host.home), *positionals[1:]]
        finally:
            if mine:
                del os.environ["NO_COLOR"]
            if sent:  # the check sent ahead, closed if an error came before the pull asked for its answer
                from singpy.oci import tagcheck

                tagcheck.settle()
    request = build_request(action, values, positionals, host.cwd).replace(instance=instance)
    if uncached:
        from singpy.cli import nocache

        return nocache.launched(lambda: launch.run(request, config, host, dry_run=bool(values.get("dry_run"))))
    return launch.run(request, config, host, dry_run=bool(values.get("dry_run")))


def _send_tag_check(reference: str, values: Mapping[str, Any], host: HostInfo) -> bool:
    """A cached docker:// or oras:// image's tag check sent now (singpy.oci.tagcheck); whether it was."""
    if not reference.startswith(("docker://", "oras://")):
        return False
    from singpy.oci import tagcheck

    return tagcheck.send_ahead(reference, _pull_options(values), host.env, host.home)


def _pull_options(values: Mapping[str, Any]) -> Any:
    from singpy.oci.pull import PullOptions

    return PullOptions(login=bool(values.get("docker_login")), authfile=values.get("authfile") or "",
                       https=not values.get("no_https"))


def _uncached(reference: str) -> bool:
    """--disable-cache was given: whether it applies (an image pulled first, not a file)."""
    from singpy.cli import nocache

    return nocache.is_pulled(reference)


def _instance_image(reference: str, host: HostInfo) -> tuple[str, str]:
    """instance://NAME: the name, and the image of that running instance (its container is joined)."""
    from singpy.launch import instance

    name = reference[len(instance.PREFIX):]
    records, _ = instance.state_dirs(host.home, host.user)
    return name, instance.find(records, name, host.uid).image


def pulled(reference: str, values: Mapping[str, Any], env: Mapping[str, str], home: str) -> str:
    """The cached SIF of a docker://, oci:, oras://, library://... image (PULLED_URI_PREFIXES), pulled first if
    needed: the launch sees only a SIF. The one routing of run/exec/shell/test, `instance start|run` and
    `inspect` (`values`: their --docker-login, --authfile, --no-https, the hidden --docker-username,
    --docker-password and --tmpdir (singpy.cli.flagvars), and the global --config)."""
    from singpy.kernel.syscalls import wait_single_threaded
    from singpy.oci.pull import cached_image

    if values.get("docker_username") or values.get("docker_password") or values.get("tmpdir"):
        from singpy.cli.flagvars import flag_variables

        env = {**env, **flag_variables(env, username=values.get("docker_username") or "",
                                       password=values.get("docker_password") or "", tmpdir=values.get("tmpdir") or "")}
    options = _pull_options(values)
    if reference.startswith("library://"):  # a SIF in a Sylabs library: cached as it is (singpy.library.pull)
        from singpy.library.pull import LibraryOptions
        from singpy.library.pull import cached_image as cached_library_image

        if values.get("global_config"):  # --config DIR/singpy.conf: the system's remote.yaml is DIR's
            env = {**env, "SINGPY_CONFIG": values["global_config"]}
        sif = cached_library_image(reference, LibraryOptions(https=not values.get("no_https")), env, home)
    elif reference.startswith(("http://", "https://")):  # an image file on a web server, cached as Apptainer's
        from singpy.oci.netcache import cached_url_image

        sif = cached_url_image(reference, env, home)
    elif reference.startswith("oras://"):  # a SIF stored in a registry: cached as it is, nothing to convert
        from singpy.oci.oras import cached_sif

        sif = cached_sif(reference, options, env, home)
    else:
        sif = cached_image(reference, options, env, home)
    wait_single_threaded()  # the download threads are gone: unshare(CLONE_NEWUSER) refuses a threaded process
    return sif


def build_request(action: str, values: Mapping[str, Any], positionals: list[str], cwd: str) -> LaunchRequest:
    from singpy.env.environ import parse_env_option
    from singpy.launch.planner import LaunchRequest
    from singpy.launch.request import LIMIT_OPTIONS

    compat = bool(values.get("compat"))  # Apptainer's --compat: these five, no more
    containall = compat or bool(values.get("containall"))
    return LaunchRequest(
        action=action,
        image=positionals[0],
        args=tuple(positionals[1:]),
        binds=_binds(values.get("bind", []), cwd) + _mounts(values.get("mount", []), cwd),
        contain=containall or bool(values.get("contain")),
        cleanenv=containall or bool(values.get("cleanenv")),
        env=tuple(parse_env_option(values.get("env", [])).items()),
        env_file=tuple(_read_env_files(values.get("env_file", []), positionals[0])),
        home=values.get("home"),
        no_home=bool(values.get("no_home")),
        pwd=values.get("pwd"),
        writable_tmpfs=compat or bool(values.get("writable_tmpfs")) or _nvccli_tmpfs(values),
        hostname=values.get("hostname") or None,  # --hostname '' sets nothing, as in Apptainer
        pid=(containall or bool(values.get("pid"))) and not values.get("no_pid"),  # --no-pid wins, as Apptainer's
        ipc=containall or bool(values.get("ipc")),
        uts=bool(values.get("uts")),
        shell=values.get("shell"),
        no_eval=compat or bool(values.get("no_eval")),
        unsquash=bool(values.get("unsquash")),
        passphrase=bool(values.get("passphrase")),
        pem_path=values.get("pem_path") or "",
        writable=bool(values.get("writable")),
        overlays=tuple(values.get("overlay", [])),
        underlay=bool(values.get("underlay")),
        nv=bool(values.get("nv") or values.get("nvccli")),
        rocm=bool(values.get("rocm")),
        net=bool(values.get("net")),
        network=values.get("network"),
        network_args=tuple(values.get("network_args", [])),
        dns=(values["dns"],) if values.get("dns") else (),
        fakeroot=bool(values.get("fakeroot")),
        ignore_subuid=bool(values.get("ignore_subuid")),
        ignore_userns=bool(values.get("ignore_userns")),
        containlibs=tuple(values.get("containlibs", [])),
        keep_privs=bool(values.get("keep_privs")),
        no_privs=bool(values.get("no_privs")),
        allow_setuid=bool(values.get("allow_setuid")),
        add_caps=tuple(values.get("add_caps", [])),
        drop_caps=tuple(values.get("drop_caps", [])),
        no_mount=_no_mount(values.get("no_mount", [])),
        no_init=compat or bool(values.get("no_init")),
        no_umask=compat or bool(values.get("no_umask")),
        userns=bool(values.get("userns")),
        nvccli=bool(values.get("nvccli")),
        app=values.get("app") or "",
        sharens=bool(values.get("sharens")),
        no_sharens=bool(values.get("no_sharens")),
        devices=tuple(values.get("device", [])),
        cdi_dirs=tuple(path for value in values.get("cdi_dirs", []) for path in value.split(",") if path),
        **_checked_fields(values, cwd),
        netns_path=values.get("netns_path") or "",
        security=tuple(values.get("security", [])),
        fusemount=tuple(values.get("fusemount", [])),
        limits=tuple((name, values[name]) for name in LIMIT_OPTIONS if values.get(name)),
    )


def _checked_fields(values: Mapping[str, Any], cwd: str) -> dict[str, Any]:
    """The fields of flags checked here or read apart: --workdir and --scratch (checked by singpy.mounts.workdir,
    imported only then), --no-env, --no-nv, --no-rocm, --compat32, --intel-hpu, --runscript-timeout."""
    fields: dict[str, Any] = {"no_nv": bool(values.get("no_nv")), "no_rocm": bool(values.get("no_rocm")),
                              "compat32": bool(values.get("compat32")), "intel_hpu": bool(values.get("intel_hpu"))}
    if values.get("runscript_timeout"):  # checked here, a command-line mistake (exit 1) as Apptainer's
        from singpy.launch.scripttimer import parse_duration

        parse_duration(values["runscript_timeout"])
        fields["runscript_timeout"] = values["runscript_timeout"]
    if values.get("no_env"):
        fields["no_env"] = tuple(name for value in values["no_env"] for name in value.split(",") if name)
    if values.get("workdir") or values.get("scratch"):
        from singpy.mounts import workdir

        if values.get("workdir"):
            fields["workdir"] = workdir.checked_workdir(values["workdir"], cwd)
        fields["scratch"] = workdir.checked_scratch(values.get("scratch", []))
    return fields


def _binds(values: list[str], cwd: str) -> tuple[BindSpec, ...]:
    """--bind (and SINGULARITY_BIND...) parsed; the parser is imported only when there is one (start-up time)."""
    if not values:
        return ()
    from singpy.errors import BindSpecError
    from singpy.mounts.parse import parse_bind_list

    try:
        return parse_bind_list(values, cwd)
    except BindSpecError as error:  # the text of a flag (or of *_BIND) is wrong: a command-line mistake
        raise _usage(error) from None


def _nvccli_tmpfs(values: Mapping[str, Any]) -> bool:
    """--nvccli makes the image writable in memory unless it is already writable, as Apptainer does."""
    if not values.get("nvccli") or values.get("writable") or values.get("writable_tmpfs"):
        return False
    return all(spec.endswith(":ro") for spec in values.get("overlay", []))  # a writable overlay will do


def _mounts(values: list[str], cwd: str) -> tuple[BindSpec, ...]:
    """--mount (and SINGULARITY_MOUNT...): docker's CSV syntax, parsed only when given (start-up time)."""
    if not values:
        return ()
    from singpy.errors import BindSpecError
    from singpy.mounts.parse import parse_mount_list

    try:
        return parse_mount_list(values, cwd)
    except BindSpecError as error:
        raise _usage(error) from None


def _no_mount(values: list[str]) -> tuple[str, ...]:
    """--no-mount's comma lists, each name checked (singpy.mounts.system.check_no_mount)."""
    if not values:
        return ()
    from singpy.errors import BindSpecError
    from singpy.mounts.system import NO_MOUNT_NAMES, check_no_mount

    names = [name for value in values for name in value.split(",")]
    try:
        return check_no_mount(names)
    except BindSpecError as error:
        from singpy.cli.parse import suggestion

        near = next((hint for name in names if name not in NO_MOUNT_NAMES and not name.startswith("/")
                     for hint in [suggestion(name, NO_MOUNT_NAMES)] if hint), "")
        raise _usage(SingpyError(error.message + near)) from None


def _usage(error: SingpyError) -> UsageError:
    """A flag value singpy read and refused before looking at the host or the image: exit 1, as any
    command-line mistake (docs/usage.md), with the same hint."""
    return UsageError(error.message, hint=error.hint or "Run 'singpy exec --help' for the syntax of the flags.")


def _read_env_files(paths: list[str], image: str) -> list[tuple[str, str]]:
    """The files' variables, later files winning; each a regular UTF-8 file of at most 1 MiB.

    Each is evaluated as shell assignments (singpy.env.envfile, imported only
    here: start-up time) seeing the host's environment and APPTAINER_IMAGE,
    as Apptainer evaluates it; one file's variables are not seen by the next.
    """
    if not paths:
        return []
    from singpy.env.envfile import evaluate
    from singpy.errors import SingpyError
    from singpy.host.hostfiles import read_text, shown

    scope = {**os.environ, "APPTAINER_IMAGE": os.path.abspath(image)}
    merged: dict[str, str] = {}
    for value in paths:
        for path in value.split(","):
            text = read_text(path, what="--env-file", error=SingpyError)
            merged.update(evaluate(text, shown(path), scope=scope))
    return list(merged.items())

"""The typer application: help, version, and the commands off the hot path.

`run`, `exec` and `shell` are listed here for `singpy --help`, but are
normally dispatched to the fast parser before typer is imported.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.main

# typer 0.28 (pinned in pyproject.toml) carries click inside it; its exceptions are caught by type here.
from typer import _click as click
from typer._click import exceptions as click_errors
from typer.core import TyperArgument, TyperGroup

from singpy.cli.options import ACTIONS, ENV_PREFIXES, GLOBAL_OPTIONS, NO_DMTCP, NO_DOCKER_DAEMON, Option

_HELP = next(option for option in GLOBAL_OPTIONS if option.dest == "help")

app = typer.Typer(
    name="singpy",
    help="Run programs in Singularity/Apptainer container images, unprivileged.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": [name for name in (_HELP.long, _HELP.short) if name]},
)


def _global_callback(options: tuple[Option, ...]) -> Callable[..., None]:
    """The typer callback of the global flags, made from `options` (GLOBAL_OPTIONS): declared once.

    singpy.cli.main has already acted on them (split_global: --version, the
    verbosity, --config for run/exec/shell); typer only has to accept them in
    front of its own commands and list them in `singpy --help`.
    """

    def callback(**values: Any) -> None:
        from singpy import console
        from singpy.cli.actions import verbosity

        console.set_level(verbosity(values, console.level()))  # main set it from the variables already

    callback.__doc__ = app.info.help
    callback.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
        inspect.Parameter(option.dest, inspect.Parameter.KEYWORD_ONLY, annotation=str if option.value else bool,
                          default=typer.Option("" if option.value else False,
                                               *(name for name in (option.long, option.short) if name),
                                               help=option.help, metavar=option.value or None))
        for option in options if option is not _HELP])
    return callback


app.callback()(_global_callback(GLOBAL_OPTIONS))


def _action_command(action: str) -> None:
    usage, summary = ACTIONS[action]

    @app.command(name=action, help=f"{summary.capitalize()}. See 'singpy {action} --help'.",
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                 add_help_option=False)
    def _command(ctx: typer.Context) -> None:
        from singpy.cli.actions import run_action

        raise typer.Exit(run_action(action, list(ctx.args), {}))


for _action in ACTIONS:
    _action_command(_action)


def _register_image_commands() -> None:
    from singpy.cli.build import build_command
    from singpy.cli.cache import cache_app
    from singpy.cli.check import check_command
    from singpy.cli.inspect import inspect_command
    from singpy.cli.instance import instance_app
    from singpy.cli.overlay import overlay_app
    from singpy.cli.pull import pull_command
    from singpy.cli.push import push_command
    from singpy.cli.registry import registry_app

    app.command(name="inspect")(inspect_command)
    from singpy.cli.runhelp import run_help_command

    app.command(name="run-help")(run_help_command)
    app.command(name="build")(build_command)
    app.command(name="pull")(pull_command)
    app.command(name="push")(push_command)
    from singpy.cli.delete import delete_command

    app.command(name="delete")(delete_command)
    app.add_typer(registry_app)
    from singpy.cli.remote import remote_app
    from singpy.cli.search import search_command

    app.add_typer(remote_app)
    app.command(name="search")(search_command)
    app.command(name="check")(check_command)
    app.command(name="doctor", help="The same as `singpy check`.")(check_command)
    app.add_typer(cache_app)
    app.add_typer(overlay_app)
    app.add_typer(instance_app)
    from singpy.cli.sif import sif_app, siftool_app

    app.add_typer(sif_app)
    from singpy.cli.config import config_app

    app.add_typer(config_app)
    app.add_typer(siftool_app, hidden=True)
    from singpy.cli.key import key_app
    from singpy.cli.keyserver import keyserver_app

    app.add_typer(key_app)
    from singpy.cli.capability import capability_app

    app.add_typer(capability_app)
    app.add_typer(key_app, name="keys", hidden=True)  # Apptainer's alias
    app.add_typer(keyserver_app)
    from singpy.cli.sign import sign_command
    from singpy.cli.verify import verify_command

    app.command(name="sign")(sign_command)
    app.command(name="verify")(verify_command)
    from singpy.cli.installation import buildcfg_command, confgen_command

    app.command(name="buildcfg", hidden=True)(buildcfg_command)  # Apptainer's hidden installation commands
    app.command(name="confgen", hidden=True)(confgen_command)


_register_image_commands()


@app.command(name="help")
def help_command(command: list[str] = typer.Argument(None, metavar="[COMMAND]...",  # noqa: B008
                                                    help="the command to explain, e.g. exec or cache clean")) -> None:
    """Show the help of a command (the same text as `singpy COMMAND --help`), or of singpy itself."""
    from singpy.errors import UsageError

    words = list(command or [])
    if words and words[0] in ACTIONS:
        from singpy.cli.parse import action_help

        print(action_help(words[0]), end="")
        return
    groups = (group.name or (group.typer_instance.info.name if group.typer_instance else None)
              for group in app.registered_groups)
    known = {name for name in (info.name for info in app.registered_commands) if name} | \
        {name for name in groups if isinstance(name, str)}
    if words and words[0] not in known:
        from singpy.cli.parse import unknown

        raise UsageError(unknown("command", words[0], sorted(known)), hint=_COMMANDS_HINT)
    raise typer.Exit(run_app([*words, "--help"]))


@app.command(name="completion")
def completion_command(shell: str = typer.Argument("", metavar="[SHELL]", show_default=False,
                                                  help="bash, zsh or fish")) -> None:
    """Print the shell completion script: `source <(singpy completion bash)` (see docs/usage.md)."""
    from singpy.cli.completion import SHELLS, script
    from singpy.errors import UsageError

    if not shell:  # as `apptainer completion`: the shells, one a line
        print("".join(f"  {name:<6} print the {name} completion script\n" for name in SHELLS), end="")
        return
    if shell not in SHELLS:
        from singpy.cli.parse import unknown

        raise UsageError(unknown("shell", shell, SHELLS) + f"; singpy completes {', '.join(SHELLS)}",
                         hint="Run 'singpy completion' for the list of shells.")
    print(script(shell, typer.main.get_command(app)), end="")


@app.command()
def version() -> None:
    """Print the version (as `apptainer version` does: the number alone, under Apptainer's names)."""
    from singpy.cli.version import version_number

    print(version_number())


_COMMANDS_HINT = "Run 'singpy --help' for the list of commands."


def run_app(args: list[str]) -> int:
    """Run a typer command; click's own errors become singpy's lines (exit 1), by their type."""
    from singpy import console
    from singpy.errors import ExitCode

    group = typer.main.get_command(app)
    _plain_help(group)
    try:
        status = group.main(args=args, prog_name="singpy", standalone_mode=False)
        if isinstance(status, int):  # click returns a command's typer.Exit code when not standalone
            return status
    except typer.Exit as done:
        return int(done.exit_code)
    except click_errors.NoArgsIsHelpError as error:  # `singpy`, `singpy cache`: as Apptainer, a short usage
        sys.stderr.write(short_usage(error.ctx))
        return int(ExitCode.USAGE)
    except click_errors.ClickException as error:  # NoSuchOption, BadParameter, MissingParameter, ...
        message, hint = _usage_message(error)
        if message is None:
            sys.stderr.write(short_usage(error.ctx))  # type: ignore[attr-defined]
        else:
            console.fatal(message)
            if hint:
                console.hint(hint)
        return int(ExitCode.USAGE)
    except typer.Abort:  # end of input at a prompt
        console.fatal("aborted")
        return int(ExitCode.USAGE)
    return 0


# Apptainer's commands singpy does not have, and why: refused as such, not as a typing mistake.
NOT_SUPPORTED_COMMANDS = {
    "oci": "singpy has no OCI runtime commands (Apptainer's `oci create|start|...`, for a runtime's own use)",
    "checkpoint": NO_DMTCP,
    "plugin": "singpy loads no plugins (Apptainer's are Go plugins built against its own source)",
}


_NO_CLEANUP = "a pull has no build directory to keep: singpy squashes the layers as they arrive"
# Apptainer's flags of the typer commands that singpy does not have, and why (those of run, exec, shell and
# instance start/run: singpy.cli.options.NOT_SUPPORTED).
NOT_SUPPORTED_FLAGS = {
    ("build", "--docker-host"): NO_DOCKER_DAEMON, ("pull", "--docker-host"): NO_DOCKER_DAEMON,
    ("push", "--docker-host"): NO_DOCKER_DAEMON,
    ("build", "--buildkit-host"): "singpy builds no Dockerfile (Apptainer's builds through BuildKit)",
    ("build", "--json"): "singpy reads definition files, not JSON ones",
    ("build", "--remote"): "singpy builds locally (Apptainer no longer supports it either)",
    ("build", "--data"): "singpy builds no data container (an OCI-SIF holding a data layer)",
    ("pull", "--no-cleanup"): _NO_CLEANUP,
    ("push", "--annotation"): "singpy pushes no OCI annotations",
}


def _usage_message(error: click_errors.ClickException) -> tuple[str | None, str | None]:
    """The one wording of a command-line mistake (docs/usage.md): the FATAL line, with a suggestion for
    an unknown name, and the HINT; None for a group given no command (its short usage is shown instead)."""
    from singpy.cli.parse import unknown

    ctx = getattr(error, "ctx", None)
    path = ctx.command_path if ctx is not None else "singpy"
    hint = f"Run '{path} --help' for usage."
    if isinstance(error, click_errors.NoSuchOption):
        why = NOT_SUPPORTED_FLAGS.get((path.removeprefix("singpy "), error.option_name))
        if why:
            return f"{error.option_name} is not supported: {why}", None
        known = [name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)
                 if name.startswith("-")] if ctx is not None else []
        return unknown("flag", error.option_name, known), hint
    message = error.format_message()
    # click's wording for a group's mistakes (typer 0.28 is pinned: its texts are stable)
    if ctx is not None and isinstance(ctx.command, TyperGroup):
        if message == "Missing command.":
            return None, hint
        named = re.match(r"No such command '(.*)'\.", message)
        if named and path == "singpy" and named.group(1) in NOT_SUPPORTED_COMMANDS:
            return f"{named.group(1)} is not supported: {NOT_SUPPORTED_COMMANDS[named.group(1)]}", None
        if named:
            return unknown("command", named.group(1), ctx.command.list_commands(ctx)), \
                _COMMANDS_HINT if path == "singpy" else hint
    return message, hint


# The Examples section of each command's help (Apptainer's help has one: its docs/content.go).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "singpy": ("singpy help <command> [<subcommand>]", "singpy help build", "singpy exec image.sif cat /etc/os-release",
               "singpy pull alpine.sif docker://alpine:latest"),
    "singpy pull": ("singpy pull alpine.sif docker://alpine:latest",
                    "singpy pull --arch arm64 docker://ubuntu:24.04",
                    "singpy pull --dir ~/images --name tools.sif oci-archive:tools.tar",
                    "singpy pull https://example.org/images/tool.sif",
                    "singpy pull tool.sif oras://ghcr.io/org/tool:1.0",
                    "singpy pull library://sylabs/examples/blender:latest"),
    "singpy push": ("singpy push tool.sif oras://ghcr.io/org/tool:1.0",
                    "singpy push --allow-unsigned tool.sif library://me/tools/tool:1.0"),
    "singpy search": ("singpy search alpine",
                      "singpy search --arch arm64 --library https://library.example.org blender"),
    "singpy remote": ("singpy remote add --tokenfile token.txt mylib library.example.org", "singpy remote list"),
    "singpy key": ("singpy key newpair", "singpy key list", "singpy key import ./key.asc",
                   "singpy key pull --url https://keys.example.org 8883491F4268F173C6E5DC49EDECE4F3F38D871E"),
    "singpy keyserver": ("sudo singpy keyserver add https://keys.example.org", "singpy keyserver list",
                         "singpy keyserver login --password-stdin https://keys.example.org"),
    "singpy remote add": ("singpy remote add --tokenfile token.txt mylib library.example.org",
                          "singpy remote add --no-login --insecure devlib http://127.0.0.1:8080",
                          "sudo singpy remote add --global site library.example.org"),
    "singpy remote list": ("singpy remote list",),
    "singpy remote use": ("singpy remote use mylib", "sudo singpy remote use --exclusive site"),
    "singpy remote remove": ("singpy remote remove mylib",),
    "singpy remote status": ("singpy remote status", "singpy remote status mylib"),
    "singpy remote login": ("singpy remote login --tokenfile token.txt mylib", "singpy remote login"),
    "singpy remote logout": ("singpy remote logout mylib",),
    "singpy remote get-login-password": ("singpy remote get-login-password | singpy registry login "
                                         "--password-stdin oras://registry.example.org",),
    "singpy registry": ("singpy registry login --username alice docker://ghcr.io", "singpy registry list"),
    "singpy registry login": ("echo \"$TOKEN\" | singpy registry login -u alice --password-stdin oras://ghcr.io",
                              "singpy registry login --username alice docker://docker.io"),
    "singpy registry logout": ("singpy registry logout oras://ghcr.io",),
    "singpy registry list": ("singpy registry list",),
    "singpy build": ("singpy build image.sif recipe.def",
                     "singpy build --sandbox ubuntu/ docker://ubuntu:24.04",
                     "singpy build image.sif ubuntu/",
                     "singpy build --build-arg VERSION=1.2 --notest image.sif recipe.def",
                     "singpy build --fix-perms --sandbox app/ recipe.def",
                     "singpy build --update --section post --sandbox app/ more.def"),
    "singpy inspect": ("singpy inspect image.sif", "singpy inspect --runscript image.sif",
                       "singpy inspect --json --all docker://alpine"),
    "singpy check": ("singpy check", "singpy check --json"),
    "singpy sign": ("singpy sign image.sif", "singpy sign --keyidx 1 image.sif",
                    "singpy sign --key private.pem image.sif"),
    "singpy verify": ("singpy verify image.sif", "singpy verify --json image.sif",
                      "singpy verify --key public.pem image.sif",
                      "singpy verify --certificate leaf.pem --certificate-intermediates intermediate.pem "
                      "--certificate-roots root.pem image.sif"),
    "singpy sif": ("singpy sif list image.sif", "singpy sif info 1 image.sif", "singpy sif dump 1 image.sif"),
    "singpy sif add": ("singpy sif add --datatype 1 image.sif recipe.def",
                       "singpy sif add --datatype 4 --parttype 3 --partfs 4 --partarch 2 image.sif data.img"),
    "singpy config": ("singpy config global --get 'bind path'", "singpy config fakeroot --add alice"),
    "singpy config global": ("singpy config global --set 'bind path' /scratch",
                             "singpy config global --unset 'bind path' /scratch",
                             "singpy config global --reset 'mount home'",
                             "singpy config global --dry-run --set 'mount tmp' no"),
    "singpy config fakeroot": ("singpy config fakeroot --add alice", "singpy config fakeroot --disable alice",
                               "singpy config fakeroot --dry-run --remove alice"),
    "singpy run-help": ("singpy run-help image.sif", "singpy run-help --app foo image.sif"),
    "singpy doctor": ("singpy doctor",),
    "singpy cache": ("singpy cache list", "singpy cache clean --dry-run"),
    "singpy cache list": ("singpy cache list",),
    "singpy cache clean": ("singpy cache clean --dry-run", "singpy cache clean --days 30 --force"),
    "singpy overlay": ("singpy overlay create --size 1024 overlay.img",),
    "singpy overlay create": ("singpy overlay create --size 1024 /tmp/image.sif",
                              "singpy overlay create --size 1024 --sparse overlay.img",
                              "singpy overlay create --fakeroot --size 1024 overlay.img"),
    "singpy instance": ("singpy instance start image.sif web", "singpy instance list",
                        "singpy instance stop web"),
    "singpy instance list": ("singpy instance list", "singpy instance list --json 'web*'",
                             "sudo singpy instance list --user alice"),
    "singpy instance stop": ("singpy instance stop web", "singpy instance stop --all",
                             "singpy instance stop --signal KILL web", "sudo singpy instance stop --user alice web"),
    "singpy instance stats": ("singpy instance stats web", "singpy instance stats --json --no-stream web"),
    "singpy help": ("singpy help exec", "singpy help cache clean"),
    "singpy completion": ("singpy completion", "source <(singpy completion bash)"),
    "singpy version": ("singpy version",),
}


def _plain_help(command: click.Command) -> None:
    """Every command's help in the one plain layout of run/exec/shell (singpy.cli.parse.help_text), not
    typer's boxed panels: set on each command of the tree, the group's too."""
    command.format_help = lambda ctx, formatter: formatter.write(help_of(ctx))  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def help_of(ctx: click.Context) -> str:
    """The help of ctx's command: usage, summary, commands of a group, options, examples."""
    from singpy.cli.parse import help_text

    command = ctx.command
    if ctx.command_path == "singpy":
        return _top_help(ctx)
    pieces = [piece for piece in command.collect_usage_pieces(ctx) if piece != "[OPTIONS]"]
    usage = " ".join([ctx.command_path, "[options]", *pieces]).replace("COMMAND [ARGS]...", "<command>")
    summary = inspect.cleandoc(command.help or command.short_help or "").split("\n\n")[0].replace("\n", " ")
    rows = [("Arguments", f"  {param.human_readable_name:<28} {getattr(param, 'help', '') or ''}".rstrip())
            for param in command.get_params(ctx) if isinstance(param, TyperArgument)]
    for param in command.get_params(ctx):
        if not isinstance(param, TyperArgument) and not getattr(param, "hidden", False):
            rows.append(("Options", _option_row(param)))
    sections = [("Commands", _command_lines(ctx))] if isinstance(command, TyperGroup) else []
    return help_text(usage, summary, rows, EXAMPLES.get(ctx.command_path, ()), sections)


def _option_row(param: Any) -> str:
    from singpy.cli.parse import help_row

    names = [*param.opts, *param.secondary_opts]
    shorts = [name for name in names if not name.startswith("--")]
    longs = [name for name in names if name.startswith("--")]
    value = "" if getattr(param, "is_flag", False) else (param.metavar or param.type.name.upper())
    if param.multiple and value:
        value += "..."
    variables = [name for name in (param.envvar or ()) if name.startswith("APPTAINER_")] \
        if not isinstance(param.envvar, str) else [param.envvar]
    text = getattr(param, "help", "") or ""
    if param.name == "help":
        text = "show this help and exit"
    return help_row(", ".join(shorts), ", ".join(longs), value, text, variables[0] if variables else "")


def _command_lines(ctx: click.Context) -> list[str]:
    group = ctx.command
    assert isinstance(group, TyperGroup)
    lines = []
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            lines.append(f"  {name:<12} {sub.get_short_help_str(limit=66)}")
    return lines


def _top_help(ctx: click.Context) -> str:
    from singpy.cli.parse import help_row, help_text

    rows = [("Global options", help_row(option.short, option.long, option.value, option.help,
                                         option.env and ENV_PREFIXES[1] + option.env))
            for option in GLOBAL_OPTIONS]
    return help_text("singpy [global options] <command> [options] ...", str(app.info.help), rows,
                     EXAMPLES["singpy"], [("Commands", _command_lines(ctx))])


def short_usage(ctx: click.Context) -> str:
    """What `singpy` (or `singpy cache`) alone prints, on stderr, as Apptainer's usage: the command list."""
    front = "singpy [global options]" if ctx.command_path == "singpy" else f"{ctx.command_path} [options]"
    return (f"Usage: {front} <command>\n\nCommands:\n" + "\n".join(_command_lines(ctx))
            + f"\n\nRun '{ctx.command_path} --help' for more detailed usage information.\n")

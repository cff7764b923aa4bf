"""The typer application: help, version, and the commands off the hot path.

`run`, `exec` and `shell` are listed here for `singpy --help`, but are
normally dispatched to the fast parser before typer is imported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer

# typer 0.28 (pinned in pyproject.toml) carries click inside it; its exceptions are caught by type here.
from typer._click import exceptions as click_errors

from singpy.cli.options import ACTIONS, GLOBAL_OPTIONS, Option

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

        console.set_level(verbosity(values))

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

    app.command(name="inspect")(inspect_command)
    app.command(name="build")(build_command)
    app.command(name="pull")(pull_command)
    app.command(name="check")(check_command)
    app.command(name="doctor", help="The same as `singpy check`.")(check_command)
    app.add_typer(cache_app)
    app.add_typer(overlay_app)
    app.add_typer(instance_app)


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
        raise UsageError(f"unknown command {words[0]!r}", hint="Run 'singpy --help' for the list of commands.")
    raise typer.Exit(run_app([*words, "--help"]))


@app.command(name="completion")
def completion_command(shell: str = typer.Argument(..., metavar="SHELL", help="bash, zsh or fish")) -> None:
    """Print the shell completion script: `source <(singpy completion bash)` (see docs/usage.md)."""
    from singpy.cli.completion import SHELLS, script
    from singpy.errors import UsageError

    if shell not in SHELLS:
        raise UsageError(f"no completion for {shell!r}: singpy completes {', '.join(SHELLS)}")
    print(script(shell), end="")


@app.command()
def version() -> None:
    """Print the version (as `apptainer version` does: the number alone, under Apptainer's names)."""
    from singpy.cli.version import version_number

    print(version_number())


def run_app(args: list[str]) -> int:
    """Run a typer command; click's own errors become singpy's one line (exit 1), by their type."""
    from singpy import console
    from singpy.errors import ExitCode

    try:
        status = app(args=args, prog_name="singpy", standalone_mode=False)
        if isinstance(status, int):  # click returns a command's typer.Exit code when not standalone
            return status
    except typer.Exit as done:
        return int(done.exit_code)
    except click_errors.NoArgsIsHelpError:  # the help was printed: `singpy`, `singpy cache`
        return int(ExitCode.USAGE)
    except click_errors.ClickException as error:  # NoSuchOption, BadParameter, MissingParameter, ...
        console.fatal(error.format_message())
        return int(ExitCode.USAGE)
    except typer.Abort:  # end of input at a prompt
        console.fatal("aborted")
        return int(ExitCode.USAGE)
    return 0

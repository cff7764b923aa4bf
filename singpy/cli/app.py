"""The typer application: help, version, and the commands off the hot path.

`run`, `exec` and `shell` are listed here for `singpy --help`, but are
normally dispatched to the fast parser before typer is imported.
"""

from __future__ import annotations

import typer

from singpy import __version__
from singpy.cli.options import ACTIONS

app = typer.Typer(
    name="singpy",
    help="Run programs in Singularity/Apptainer container images, unprivileged.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="only print errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="print each step"),
    debug: bool = typer.Option(False, "--debug", "-d", help="print debugging messages and tracebacks"),
    config: str = typer.Option("", "--config", help="read this singpy.conf instead of the default"),
    version: bool = typer.Option(False, "--version", help="print the version and exit"),
) -> None:
    """Run programs in Singularity/Apptainer container images, unprivileged."""
    from singpy import console
    from singpy.cli.actions import verbosity

    console.set_level(verbosity({"quiet": quiet, "verbose": verbose, "debug": debug}))


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
    from singpy.cli.inspect import inspect_command

    app.command(name="inspect")(inspect_command)
    app.command(name="build")(build_command)
    app.add_typer(cache_app)


_register_image_commands()


@app.command()
def version() -> None:
    """Print the version."""
    print(f"singpy version {__version__}")


def run_app(args: list[str]) -> int:
    from singpy.errors import ExitCode

    try:
        status = app(args=args, prog_name="singpy", standalone_mode=False)
        if isinstance(status, int):  # click returns a command's typer.Exit code when not standalone
            return status
    except typer.Exit as done:
        return int(done.exit_code)
    except Exception as error:  # click's usage errors: one line, exit 1
        name = type(error).__name__
        if name in ("NoSuchOption", "UsageError", "BadParameter", "NoArgsIsHelpError", "MissingParameter"):
            if name == "NoArgsIsHelpError":
                return int(ExitCode.USAGE)
            from singpy import console

            message = error.format_message() if hasattr(error, "format_message") else str(error)
            console.fatal(message)
            return int(ExitCode.USAGE)
        raise
    return 0

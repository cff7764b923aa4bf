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


@app.command()
def version() -> None:
    """Print the version."""
    print(f"singpy version {__version__}")


def run_app(args: list[str]) -> int:
    from singpy.errors import ExitCode

    try:
        app(args=args, prog_name="singpy", standalone_mode=False)
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

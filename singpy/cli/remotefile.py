"""`--config FILE` of the remote, registry and keyserver command groups (Apptainer's): the remote configuration
(remote.yaml) their commands read and write in place of the user's ~/.apptainer/remote.yaml."""

from __future__ import annotations

import typer


def config_option(group: typer.Typer, what: str) -> dict[str, str]:
    """Give `group` the option; the dict returned holds its value under "config" once the group's callback ran."""
    state: dict[str, str] = {}

    def callback(config: str = typer.Option("", "--config", "-c", metavar="FILE",
                                            help=f"path to the file holding {what} configurations (default: "
                                                 "~/.apptainer/remote.yaml)")) -> None:
        state["config"] = config

    group.callback()(callback)
    return state

"""Apptainer's two hidden installation commands: `buildcfg [NAME]` and `confgen [OLD] NEW`.

`buildcfg` prints Apptainer's compile-time parameters, `NAME=value` one a line,
or the value of NAME alone (an unknown NAME is an error). Install notes and site
scripts run it to find the installation (`BINDIR`, `APPTAINER_CONF_FILE`) or to
tell which package answers (`PACKAGE_NAME`, `PACKAGE_VERSION`). singpy has no
compile time: it prints those of Apptainer's parameters that mean something for
it, with its own values, and leaves out the rest (a build directory, libexec's
helpers, plugin and session directories, which singpy does not have), so that a
question about them gets an error, not a made-up path. Under Apptainer's names
the package is the Apptainer release singpy stands in for, as `--version` says
(singpy.cli.version).

`confgen`: singpy.config.confgen.
"""

from __future__ import annotations

import os
import sys

import typer

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping


def parameters(env: Mapping[str, str], program: str) -> list[tuple[str, str]]:
    """(name, value) of every parameter, in Apptainer's order; `program` is the path singpy was started by."""
    from singpy import APPTAINER_VERSION, __version__
    from singpy.cli.version import is_drop_in
    from singpy.config.sysconf import SYSTEM_PATH, default_path

    package = ("apptainer", APPTAINER_VERSION) if is_drop_in(program) else ("singpy", __version__)
    conf = default_path(env) or SYSTEM_PATH  # read when no --config is given (SYSTEM_PATH: none exists yet)
    return [("PACKAGE_NAME", package[0]), ("PACKAGE_VERSION", package[1]),
            ("PREFIX", sys.prefix), ("EXECPREFIX", sys.exec_prefix),
            ("BINDIR", os.path.dirname(os.path.abspath(program))),
            ("SYSCONFDIR", "/etc"),
            ("APPTAINER_CONFDIR", os.path.dirname(os.path.abspath(conf))),  # the GPU library lists are read there
            ("APPTAINER_CONF_FILE", os.path.abspath(conf)),
            ("APPTAINER_SUID_INSTALL", "0")]  # singpy has no setuid part


def buildcfg_command(name: str = typer.Argument("", metavar="[PARAMETER]", show_default=False,
                                                help="print only this parameter's value")) -> None:
    """Print where singpy is installed and reads its configuration, as Apptainer's buildcfg."""
    found = parameters(os.environ, sys.argv[0])
    if not name:
        print("".join(f"{key}={value}\n" for key, value in found), end="")
        return
    value = dict(found).get(name)
    if value is None:
        from singpy.errors import UsageError

        raise UsageError(f"no variable named \"{name}\"",
                         hint="`singpy buildcfg` lists those singpy has (it has no build, libexec, plugin or "
                              "session directory)")
    print(value)


def confgen_command(paths: list[str] = typer.Argument(..., metavar="[OLD] NEW",  # noqa: B008
                                                      help="the configuration to take the settings from, and the "
                                                           "file to write")) -> None:
    """Write a whole singpy.conf (every directive, commented), with the settings of OLD, as Apptainer's confgen."""
    from singpy import console
    from singpy.config.confgen import confgen
    from singpy.errors import UsageError

    if len(paths) > 2:
        raise UsageError(f"confgen takes [OLD] NEW: {len(paths)} paths given")
    console.info(confgen(paths))

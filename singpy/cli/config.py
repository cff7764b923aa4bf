"""`singpy config global` (a directive of singpy.conf) and `singpy config fakeroot` (/etc/subuid, /etc/subgid).

As Apptainer's `config global` and `config fakeroot` (singpy.config.edit and
singpy.config.subid say how). Both change files that are the whole machine's:
root only. `--dry-run` prints the resulting file(s) instead of writing them,
and `config global --get` only reads, so anyone may use those two.
"""

from __future__ import annotations

import typer

config_app = typer.Typer(name="config", help="Manage singpy's configuration (root only).", no_args_is_help=True)


def _one_operation(chosen: dict[str, bool]) -> str:
    named = [name for name, given in chosen.items() if given]
    if not named:
        from singpy.errors import UsageError

        flags = "/".join(f"--{name}" for name in chosen)
        raise UsageError(f"you must specify an option (eg: {flags})")
    if len(named) > 1:
        from singpy.errors import UsageError

        raise UsageError(f"choose one of --{' and --'.join(named)}")
    return named[0]


def _require_root(command: str) -> None:
    import os

    from singpy.errors import SingpyError

    if os.geteuid() != 0:
        raise SingpyError(f'"singpy config {command}" command requires root privileges',
                          hint="--dry-run shows the result without writing it")


def _config_path() -> str:
    """The configuration in use: --config (main passes it as SINGPY_CONFIG), else the first found."""
    import os

    from singpy.config import sysconf
    from singpy.errors import ConfigError

    path = sysconf.default_path(os.environ)
    if not path:
        raise ConfigError("no configuration file to edit: singpy runs on its built-in defaults",
                          hint=f"create {sysconf.SYSTEM_PATH} (etc/singpy.conf is a template), or pass --config FILE")
    return path


@config_app.command("global")
def global_command(
    directive: str = typer.Argument(..., metavar="DIRECTIVE", help="a directive of singpy.conf, e.g. 'bind path'"),
    value: str = typer.Argument("", metavar="[VALUE]", help="its value (a comma list for list directives)"),
    set_: bool = typer.Option(False, "--set", "-s", help="set value of the configuration directive (for "
                              "multi-value directives, it will add it)"),
    unset: bool = typer.Option(False, "--unset", "-u", help="unset value of the configuration directive (for "
                               "multi-value directives, it will remove matching values)"),
    get: bool = typer.Option(False, "--get", "-g", help="get value of the configuration directive"),
    reset: bool = typer.Option(False, "--reset", "-r", help="reset the configuration directive value to its "
                               "default value"),
    dry_run: bool = typer.Option(False, "--dry-run", "-d", help="dump resulting configuration on stdout but "
                                 "doesn't write it to singpy.conf"),
) -> None:
    """Edit a directive of the configuration file in use (singpy.conf, or the one --config names)."""
    from singpy.config.edit import ConfigFile, edit, rewrite

    operation = _one_operation({"set": set_, "unset": unset, "get": get, "reset": reset})
    if operation != "get" and not dry_run:
        _require_root("global")
    path = _config_path()
    result = edit(ConfigFile(path), operation, directive, value)
    if operation == "get":
        if result is not None:
            _print_escaped(result + "\n")
    elif dry_run:
        _print_escaped(result or "")
    else:
        rewrite(path, result or "")


@config_app.command("fakeroot")
def fakeroot_command(
    user: str = typer.Argument(..., metavar="USER", help="the user whose subordinate id range to change"),
    add: bool = typer.Option(False, "--add", "-a", help="add a fakeroot mapping entry for a user allowing him to "
                             "use the fakeroot feature"),
    remove: bool = typer.Option(False, "--remove", "-r", help="remove the user fakeroot mapping entry preventing "
                                "him to use the fakeroot feature"),
    enable: bool = typer.Option(False, "--enable", "-e", help="enable a user fakeroot mapping entry (the user "
                                "mapping must be present)"),
    disable: bool = typer.Option(False, "--disable", "-d", help="disable a user fakeroot mapping entry (the user "
                                 "mapping must be present)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the resulting /etc/subuid and /etc/subgid "
                                 "instead of writing them"),
) -> None:
    """Add, remove, enable or disable a user's subordinate id range (/etc/subuid, /etc/subgid) for --fakeroot."""
    import os

    from singpy.config import subid
    from singpy.config.edit import rewrite

    operation = _one_operation({"add": add, "remove": remove, "enable": enable, "disable": disable})
    if not dry_run:
        _require_root("fakeroot")
    results = [(path, *subid.edited(path, operation, user)) for path in (subid.SUBUID, subid.SUBGID)]
    for path, before, after in results:
        if dry_run:
            _print_escaped(f"# {path}\n{after}")
        elif after != before:
            if not os.path.exists(path):  # as Apptainer, which opens the files with O_CREATE
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            rewrite(path, after)


def _print_escaped(text: str) -> None:
    """A file's text on the terminal: it was written by others, its control characters are shown escaped."""
    from singpy.console import escape

    print(escape(text, "\n\t"), end="")

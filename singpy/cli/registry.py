"""`singpy registry login|logout|list`: OCI/Docker registry credentials in ~/.apptainer/docker-config.json
(or --authfile), as Apptainer keeps them; every pull and push reads them (singpy.oci.auth)."""

from __future__ import annotations

import os

import typer

from singpy.cli.pull import AUTHFILE, NO_HTTPS, variables
from singpy.cli.remotefile import config_option

registry_app = typer.Typer(name="registry", help="Log in to, log out of and list OCI/Docker registries.",
                           no_args_is_help=True)
_STATE = config_option(registry_app, "registry")


URI = typer.Argument(..., metavar="docker://HOST|oras://HOST", show_default=False,
                     help="the registry (its host[:port])")
USERNAME = typer.Option("", "--username", "-u", help="username to authenticate with", metavar="NAME",
                        envvar=variables("LOGIN_USERNAME"), show_envvar=False)
PASSWORD = typer.Option("", "--password", "-p", help="password / token to authenticate with (visible to other "
                        "users in the process list: prefer --password-stdin)", metavar="PASSWORD",
                        envvar=variables("LOGIN_PASSWORD"), show_envvar=False)
PASSWORD_STDIN = typer.Option(False, "--password-stdin", help="take the password from standard input")


@registry_app.command("login")
def login_command(
    context: typer.Context,
    uri: str = URI,
    username: str = USERNAME,
    password: str = PASSWORD,
    password_stdin: bool = PASSWORD_STDIN,
    authfile: str = AUTHFILE,
    no_https: bool = NO_HTTPS,
) -> None:
    """Log in to an OCI/Docker registry: the credentials are checked, then stored for pulls and pushes."""
    from typer._click.core import ParameterSource

    typed = bool(password) and context.get_parameter_source("password") == ParameterSource.COMMANDLINE
    login(uri, username, password, password_stdin=password_stdin, authfile=authfile, no_https=no_https,
          password_typed=typed, config=_STATE.get("config", ""))


def login(uri: str, username: str, password: str, *, password_stdin: bool, authfile: str, no_https: bool,
          password_typed: bool, config: str = "") -> None:
    """`registry login` (and `remote login` of a registry, Apptainer's older way); `password_typed`: the
    password came on the command line, where other users can read it; `config`: the remote configuration that
    lists the login (--config), else the user's."""
    from singpy import console
    from singpy.errors import UsageError
    from singpy.host import host
    from singpy.oci import authfile as files
    from singpy.oci.auth import Credentials
    from singpy.oci.pull import nohttps

    registry = files.registry_of(uri)
    if "/" in registry:  # Apptainer's go-containerregistry name.NewRegistry refuses it; no pull would ever use it
        raise UsageError(f"registries must be valid RFC 3986 URI authorities: {registry} (log in to "
                         f"docker://{registry.split('/', 1)[0]}: a login is the registry's, for all its paths)")
    if password_typed:
        console.warning("a password given with --password is visible to other users of this host "
                        "(ps, /proc): use --password-stdin")
    if password_stdin:
        if password:
            raise UsageError("--password and --password-stdin are mutually exclusive")
        import sys

        password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    if not username:
        raise UsageError(f"logging in to {registry} needs a username: give --username",
                         hint="Run 'singpy registry login --help' for usage.")
    password = password or _ask_password()
    https = not no_https and not nohttps(os.environ)
    files.check_login(registry, Credentials(username=username, password=password), os.environ, https=https)
    home = host.capture().home
    path = files.credentials_file(authfile, home, os.environ)
    files.store_login(path, registry, Credentials(username=username, password=password))
    if not authfile:  # as Apptainer: the login listed in remote.yaml too (no secret there)
        from singpy.oci import loginlist

        loginlist.record(os.environ, home, _uri(uri, registry), insecure=not https, path=config)
    console.info(f"Token stored in {path}")


def _uri(uri: str, registry: str) -> str:
    """The entry's URI as Apptainer writes it: the scheme given, and the registry's host."""
    return f"{uri.split('://', 1)[0]}://{registry.split('/', 1)[0]}"


def _ask_password() -> str:
    """Apptainer's prompt, without echo on a terminal; an empty answer is refused."""
    import getpass
    import sys

    from singpy.errors import UsageError

    try:
        password = getpass.getpass("Password / Token: ", stream=sys.stderr)
    except EOFError:
        password = ""
    if not password:
        raise UsageError("a password is required (give it at the prompt or with --password-stdin)")
    return password


@registry_app.command("logout")
def logout_command(uri: str = URI, authfile: str = AUTHFILE) -> None:
    """Remove the login of a registry from the credentials file."""
    from singpy import console
    from singpy.host import host
    from singpy.oci import authfile as files

    registry = files.registry_of(uri)
    home = host.capture().home
    path = files.credentials_file(authfile, home, os.environ)
    if not authfile:
        from singpy.oci import loginlist

        loginlist.forget(os.environ, home, _uri(uri, registry), _STATE.get("config", ""))
    if not files.remove_login(path, registry):
        console.warning(f"There is no existing login to registry {registry!r}.")
        return
    console.info(f"Token removed from {path}")
    console.info("Logout succeeded")


@registry_app.command("list")
def list_command(authfile: str = typer.Option("", "--authfile", metavar="FILE", show_default=False,
                                             help="list the logins of this Docker-format file instead (with "
                                             "their usernames; a singpy extension)")) -> None:
    """List the registries you logged in to (Apptainer's table: URI and SECURE?, from remote.yaml)."""
    from singpy.console import escape
    from singpy.host import host
    from singpy.oci import authfile as files

    home = host.capture().home
    if authfile:
        rows = [(escape(registry), escape(user)) for registry, user in
                files.logins(files.credentials_file(authfile, home, os.environ))]
        header = ("REGISTRY", "USERNAME")
    else:
        from singpy.oci import loginlist

        rows = [(escape(uri), "\u2717!" if insecure else "\u2713")
                for uri, insecure in loginlist.listed(os.environ, home, _STATE.get("config", ""))]
        header = ("URI", "SECURE?")
    width = max([len(header[0]), *(len(first) for first, _ in rows)]) + 2  # Go's tabwriter, padding 2
    print()
    print(f"{header[0]:<{width}}{header[1]}")
    for first, second in rows:
        print(f"{first:<{width}}{second}")

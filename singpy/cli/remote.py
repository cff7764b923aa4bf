"""`singpy remote add|list|use|remove|status|login|logout|get-login-password`: Apptainer's remote endpoints
(singpy.library.remotes: remote.yaml), with its flags and their variables (cmd/internal/cli/remote.go)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import typer

from singpy.cli import registry
from singpy.cli.pull import variables
from singpy.cli.remotefile import config_option

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.library.remotes import Remotes

remote_app = typer.Typer(name="remote", help="Manage the remote endpoints of library:// images (remote.yaml).",
                         no_args_is_help=True)
_STATE = config_option(remote_app, "remote endpoint")

GLOBAL = typer.Option(False, "--global", "-g", help="edit the list of globally configured remote endpoints "
                      "(root only)")
TOKENFILE = typer.Option("", "--tokenfile", help="path to the file holding the auth token for login",
                         metavar="FILE")


def _context() -> tuple[Mapping[str, str], str, str]:
    from singpy.host import host

    info = host.capture()
    return info.env, info.home, _STATE.get("config", "")


def _target(global_: bool, exclusive: bool = False, *, synced: bool) -> Remotes:
    """The file a command edits: the user's (with the system's remotes merged in when `synced`, as Apptainer's
    `remote use` does; `add` and `remove` see the file alone), or (root only) the system's."""
    import os

    from singpy.library import remotes

    env, home, config = _context()
    if global_ or exclusive:
        if os.geteuid() != 0:
            raise remotes.RemoteError("unable to modify the global endpoint configuration: not root user")
        return remotes.load(remotes.system_path(env), system=True)
    if not synced:
        return remotes.load(config or remotes.user_path(env, home), system=False)
    return remotes.user_view(env, home, config)


@remote_app.command("add")
def add_command(name: str = typer.Argument(..., metavar="NAME"), uri: str = typer.Argument(..., metavar="URI"),
                global_: bool = GLOBAL, tokenfile: str = TOKENFILE,
                no_login: bool = typer.Option(False, "--no-login", help="skip automatic login step"),
                insecure: bool = typer.Option(False, "--insecure", "-i", help="allow connection to an insecure "
                                              "http remote", envvar=variables("ADD_INSECURE"), show_envvar=False),
                no_default: bool = typer.Option(False, "--no-default", "-n", help="do not designate the "
                                                "newly-added remote endpoint as the default")) -> None:
    """Add a remote endpoint (and log in to it, unless --no-login or --global)."""
    from urllib.parse import urlsplit

    from singpy import console
    from singpy.library import remotes

    if uri.startswith("https://") and insecure:
        console.info("--insecure ignored for https remote")
        insecure = False
    if uri.startswith("http://") and not insecure:
        raise remotes.RemoteError("http URI requires --insecure or APPTAINER_ADD_INSECURE=true")
    parts = urlsplit(uri if "://" in uri else f"//{uri}")
    target = _target(global_, synced=False)
    target.add(name, (parts.netloc + parts.path).rstrip("/"), insecure=insecure, make_default=not no_default)
    if global_ and not no_login:
        console.info("Global option detected. Will not automatically log into remote.")
    elif not no_login:
        _login(target, name, tokenfile)  # checked before anything is written: a refused token adds nothing
    remotes.save(target)
    console.info(f"Remote {name!r} added.")


@remote_app.command("remove")
def remove_command(name: str = typer.Argument(..., metavar="NAME"), global_: bool = GLOBAL) -> None:
    """Remove a remote endpoint."""
    from singpy import console
    from singpy.library import remotes

    target = _target(global_, synced=False)
    target.remove(name)
    remotes.save(target)
    console.info(f"Remote {name!r} removed.")


@remote_app.command("use")
def use_command(name: str = typer.Argument(..., metavar="NAME"), global_: bool = GLOBAL,
                exclusive: bool = typer.Option(False, "--exclusive", "-e", help="set the endpoint as exclusive "
                                               "(root user only, imply --global)")) -> None:
    """Set the default remote endpoint."""
    from singpy import console
    from singpy.library import remotes

    target = _target(global_, exclusive, synced=True)
    target.use(name, exclusive=exclusive)
    remotes.save(target)
    console.info(f"Remote {name!r} now in use.")


@remote_app.command("list")
def list_command() -> None:
    """List the remote endpoints: the user's and the system's."""
    from singpy.console import escape
    from singpy.library import remotes

    env, home, config = _context()
    view = remotes.user_view(env, home, config)
    rows = [("NAME", "URI", "DEFAULT?", "GLOBAL?", "EXCLUSIVE?", "SECURE?")]
    for name in sorted(view.remotes):
        remote = view.remotes[name]
        rows.append((escape(name), escape(str(remote.get("URI", ""))), "✓" if name == view.active else "",
                     "✓" if remote.get("System") else "", "✓" if remote.get("Exclusive") else "",
                     "✗!" if remote.get("Insecure") else "✓"))
    print()
    _table(rows)


@remote_app.command("status")
def status_command(name: str = typer.Argument("", metavar="[NAME]")) -> None:
    """Check the status of the services of a remote endpoint (default: the one in use), and its token."""
    from singpy import console
    from singpy.console import escape
    from singpy.library import endpoint, remotes, web

    env, home, config = _context()
    view = remotes.user_view(env, home, config)
    name, remote = (name, view.get(name)) if name else view.default()
    console.info(f"Checking status of remote: {name}")
    rows = [("SERVICE", "STATUS", "VERSION", "URI")]
    for service, uri in sorted(endpoint.services(name, remote, env).items()):
        try:
            answer = web.get_json(uri + "/version", env)
            version, state = str(answer.get("version", "")) if isinstance(answer, dict) else "", "OK"
        except remotes.RemoteError:
            version, state = "", "N/A"
        rows.append((escape(service.title()), state, escape(version), escape(uri)))  # the endpoint's words
    _table(rows)
    token = str(remote.get("Token") or "")
    if not token:
        print("\nNo authentication token set (logged out).")
        return
    try:
        endpoint.verify_token(name, remote, token, env)
    except remotes.RemoteError:
        print("\nAuthentication token is invalid (please login again).")
        raise
    print("\nValid authentication token set (logged in).")


@remote_app.command("login")
def login_command(
    context: typer.Context,
    name: str = typer.Argument("", metavar="[NAME]"),
    tokenfile: str = TOKENFILE,
    username: str = registry.USERNAME,
    password: str = registry.PASSWORD,
    password_stdin: bool = registry.PASSWORD_STDIN,
    insecure: bool = typer.Option(False, "--insecure", "-i", help="allow insecure login (a registry over HTTP)",
                                  envvar=variables("LOGIN_INSECURE"), show_envvar=False),
) -> None:
    """Log in to a remote endpoint with an access token (--tokenfile, or typed at the prompt); a docker:// or
    oras:// registry as `registry login` does (deprecated, as in Apptainer)."""
    from singpy.library import remotes

    env, home, config = _context()
    view = remotes.user_view(env, home, config)
    if name.startswith(("docker://", "oras://")) and name not in view.remotes:  # NGC's documented `remote login`
        _registry_login(context, name, tokenfile, username, password, password_stdin, insecure)
        return
    name = name or view.default()[0]
    if _login(view, name, tokenfile):
        remotes.save(view)
        from singpy import console

        console.info(f"Token stored in {view.path}")


def _registry_login(context: typer.Context, uri: str, tokenfile: str, username: str, password: str,
                    password_stdin: bool, insecure: bool) -> None:
    """Apptainer's `remote login` of a registry: a warning, then `registry login` (--insecure: over HTTP)."""
    from typer._click.core import ParameterSource

    from singpy import console
    from singpy.errors import UsageError

    if tokenfile:  # Apptainer's words
        raise UsageError("--tokenfile is only supported for login to a remote endpoint, not OCI (docker/oras) or "
                         "keyservers")
    console.warning("'remote login' is deprecated for registries or keyservers and will be removed in a future "
                    "release; running 'registry login'")
    typed = bool(password) and context.get_parameter_source("password") == ParameterSource.COMMANDLINE
    registry.login(uri, username, password, password_stdin=password_stdin, authfile="", no_https=insecure,
                   password_typed=typed, config=_STATE.get("config", ""))


@remote_app.command("logout")
def logout_command(name: str = typer.Argument("", metavar="[NAME]")) -> None:
    """Log out from a remote endpoint: its token is removed."""
    from singpy import console
    from singpy.library import remotes

    env, home, config = _context()
    view = remotes.user_view(env, home, config)
    remote = view.get(name) if name else view.default()[1]
    remote.pop("Token", None)
    remotes.save(view)
    console.info("Logout succeeded")


@remote_app.command("get-login-password")
def get_login_password_command() -> None:
    """Print the password for the OCI registry of the remote in use (for `docker login`, `registry login`)."""
    from singpy.library import endpoint, remotes, web

    env, home, config = _context()
    view = remotes.user_view(env, home, config)
    lib = endpoint.choose(view, env, host="", library="", https=True)
    try:
        user = web.get_json(lib.url + "/v1/rbac/users/current", env, token=lib.token)
    except web.HTTPError as error:
        if error.status == 401:
            raise remotes.RemoteError("must be logged in to retrieve user data: 'singpy remote login'") from None
        raise
    meta = user.get("oidc_user_meta") if isinstance(user, dict) else None
    secret = meta.get("secret") if isinstance(meta, dict) else None
    if not isinstance(secret, str) or not secret:
        raise remotes.RemoteError("no token was received from service")
    print(secret)


def _login(view: Remotes, name: str, tokenfile: str) -> bool:
    """Check the token (from `tokenfile`, or asked for) with the remote and set it. False: none was given."""
    from singpy.library import endpoint

    remote = view.get(name)
    env = _context()[0]
    token = _read_token(tokenfile) if tokenfile else _ask_token(endpoint.endpoint_url(remote))
    if not token:
        return False
    endpoint.verify_token(name, remote, token, env)
    from singpy import console

    console.info("Access Token Verified!")
    remote["Token"] = token
    return True


def _read_token(path: str) -> str:
    from singpy.host.hostfiles import read_text
    from singpy.library.remotes import RemoteError

    lines = read_text(path, what="token file", error=RemoteError, limit=1 << 16).strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise RemoteError(f"the token file {path} is empty")
    return token


def _ask_token(url: str) -> str:
    import getpass
    import sys

    print(f"Generate an access token at {url}/auth/tokens, and paste it here.")
    print("Token entered will be hidden for security.")
    if sys.stdin.isatty():
        return getpass.getpass("Access Token: ").strip()
    return sys.stdin.readline().strip()


def _table(rows: Sequence[Sequence[str]]) -> None:
    """Columns two spaces apart, as Go's tabwriter writes Apptainer's tables."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

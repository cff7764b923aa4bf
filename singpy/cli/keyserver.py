"""`singpy keyserver add|list|remove|login|logout`: the OpenPGP keyservers of the remote endpoints, kept in
remote.yaml as Apptainer keeps them (internal/app/apptainer/keyserver_*.go):

    Remotes:
        NAME:
            Keyservers:                    set by root in the system's remote.yaml (`keyserver add`)
                - URI: https://keys.example.org
                  Skip: false
                  External: true
                  Insecure: false
    Credentials:                           the user's logins (`keyserver login`), in the user's remote.yaml
        - URI: https://keys.example.org
          Auth: Bearer TOKEN             or Basic base64(user:password)
          Insecure: false
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from singpy.cli.key import ask_passphrase, warn_argv_password
from singpy.cli.keysource import active_keyservers, same_keyserver
from singpy.cli.remotefile import config_option

keyserver_app = typer.Typer(name="keyserver", help="Manage the OpenPGP keyservers of the remote endpoints.",
                            no_args_is_help=True)

INSECURE = typer.Option(False, "--insecure", "-i", help="allow insecure connection to keyserver")
_STATE = config_option(keyserver_app, "keyserver")


def _remotes(system: bool) -> Any:
    import os

    from singpy.host import host
    from singpy.library import remotes

    info = host.capture()
    if system:
        if os.geteuid() != 0:
            raise remotes.RemoteError("the keyservers are set in the global remote configuration: root only")
        return remotes.load(remotes.system_path(info.env), system=True)
    return remotes.user_view(info.env, info.home, _STATE.get("config", ""))


def _endpoint(view: Any, name: str) -> dict[str, Any]:
    from singpy.library.remotes import RemoteError

    remote: dict[str, Any] = view.get(name) if name else view.default()[1]
    if not remote.get("System"):
        raise RemoteError("current endpoint is not a system defined endpoint")
    return remote


@keyserver_app.command("add")
def add_command(args: list[str] = typer.Argument(..., metavar="[remoteName] <keyserver_url>"),  # noqa: B008
                order: int = typer.Option(0, "--order", "-o", help="define the keyserver order"),
                insecure: bool = INSECURE) -> None:
    """Add a keyserver (root user only)."""
    from singpy import console
    from singpy.errors import UsageError
    from singpy.library import remotes
    from singpy.signing import hkp

    if len(args) > 2:
        raise UsageError("keyserver add takes [remoteName] <keyserver_url>")
    name, uri = (args[0], args[1]) if len(args) == 2 else ("", args[0])
    if not uri.strip():
        raise remotes.RemoteError("invalid URI: cannot have empty URI")
    hkp.normalize(uri)
    system = _remotes(True)
    remote = _endpoint(system, name)
    servers = list(remote.get("Keyservers") or [])
    if any(same_keyserver(str(server.get("URI", "")), uri) and not server.get("Skip") for server in servers):
        raise remotes.RemoteError(f"{uri} is already configured")
    servers = [server for server in servers if not same_keyserver(str(server.get("URI", "")), uri)]
    most = len([server for server in servers if not server.get("Skip")]) + 1
    if order > most:
        raise remotes.RemoteError(f"order is out of range: maximum is {most}")
    servers.insert((order or most) - 1, {"URI": uri, "Skip": False, "External": True, "Insecure": insecure})
    remote["Keyservers"] = servers
    remotes.save(system)
    console.info(f"Keyserver {uri!r} added to the remote endpoint.")


@keyserver_app.command("remove")
def remove_command(args: list[str] = typer.Argument(..., metavar="[remoteName] <keyserver_url>")  # noqa: B008
                   ) -> None:
    """Remove a keyserver (root user only)."""
    from singpy import console
    from singpy.errors import UsageError
    from singpy.library import remotes

    if len(args) > 2:
        raise UsageError("keyserver remove takes [remoteName] <keyserver_url>")
    name, uri = (args[0], args[1]) if len(args) == 2 else ("", args[0])
    system = _remotes(True)
    remote = _endpoint(system, name)
    servers = list(remote.get("Keyservers") or [])
    kept = [server for server in servers if not same_keyserver(str(server.get("URI", "")), uri)]
    if len(kept) == len(servers):
        raise remotes.RemoteError(f"keyserver {uri} is not configured")
    remote["Keyservers"] = kept
    remotes.save(system)
    console.info(f"Keyserver {uri!r} removed from the remote endpoint.")


@keyserver_app.command("list")
def list_command(name: str = typer.Argument("", metavar="[remoteName]")) -> None:
    """List the keyservers of the remote endpoints."""
    from singpy.console import escape
    from singpy.library import remotes

    view = _remotes(False)
    names = [name] if name else sorted(view.remotes)
    if name and name not in view.remotes:
        raise remotes.RemoteError(f"no remote-endpoint with the name {name!r} found")
    for each in names:
        remote = view.remotes[each]
        print(f"\n{escape(each)} {'*' if remote.get('System') else ''}{'^' if each == view.active else ''}")
        for order, server in enumerate(active_keyservers(remote), start=1):
            print(f"   #{order}  {escape(str(server.get('URI', '')))}  {'' if server.get('Insecure') else '🔒'}"
                  .rstrip())
    print("\n(* = system endpoint, ^ = default endpoint)")


@keyserver_app.command("login")
def login_command(url: str = typer.Argument(..., metavar="<keyserver_url>"),
                  username: str = typer.Option("", "--username", "-u", help="username to authenticate with "
                                               "(required for Basic auth)"),
                  password: str = typer.Option("", "--password", "-p", help="password / token to authenticate "
                                               "with (visible to other users: prefer --password-stdin)"),
                  password_stdin: bool = typer.Option(False, "--password-stdin", help="take the password from "
                                                      "standard input"),
                  insecure: bool = INSECURE) -> None:
    """Log in to a keyserver: the credential is kept in your remote.yaml and sent to that keyserver only."""
    import base64

    from singpy import console
    from singpy.errors import UsageError
    from singpy.library import remotes
    from singpy.signing import hkp

    server = hkp.normalize(url)
    if password and password_stdin:
        raise UsageError("--password and --password-stdin are mutually exclusive")
    warn_argv_password(password)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    password = password or ask_passphrase("Password / Token: ")
    if not password:
        raise UsageError("a password or token is needed to log in")
    auth = f"Basic {base64.b64encode(f'{username}:{password}'.encode()).decode()}" if username \
        else f"Bearer {password}"
    hkp.check_login(server, auth)  # a credential the keyserver refuses is not kept
    mine = _user_file()
    mine.credentials = [cred for cred in mine.credentials
                        if not (isinstance(cred, dict) and same_keyserver(str(cred.get("URI", "")), server))]
    mine.credentials.append({"URI": server, "Auth": auth, "Insecure": insecure})
    remotes.save(mine)
    console.info(f"Token stored for keyserver {server}")


@keyserver_app.command("logout")
def logout_command(url: str = typer.Argument(..., metavar="<keyserver_url>")) -> None:
    """Log out from a keyserver."""
    from singpy import console
    from singpy.library import remotes
    from singpy.signing import hkp

    server = hkp.normalize(url)
    mine = _user_file()
    kept = [cred for cred in mine.credentials
            if not (isinstance(cred, dict) and same_keyserver(str(cred.get("URI", "")), server))]
    if len(kept) == len(mine.credentials):
        raise remotes.RemoteError(f"not logged in to keyserver {server}")
    mine.credentials = kept
    remotes.save(mine)
    console.info(f"Logged out from keyserver {server}")


def _user_file() -> Any:
    from singpy.host import host
    from singpy.library import remotes

    info = host.capture()
    return remotes.load(_STATE.get("config") or remotes.user_path(info.env, info.home), system=False)

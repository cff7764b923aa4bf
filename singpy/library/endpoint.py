"""A remote endpoint's services, its tokens, and which library a command talks to.

Service discovery as Apptainer's endpoint.GetAllServices: `https://URI/assets/config/config.prod.json`
(http:// for an Insecure remote) maps `NAMEAPI` to `{"uri": ...}`; `libraryAPI` is the library,
`tokenAPI` checks tokens (`GET /v1/token-status` with the token as a Bearer credential), `keystoreAPI` the
keyserver. The default remote of Apptainer's own configuration, cloud.apptainer.org, has no library.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from singpy.library import web
from singpy.library.remotes import RemoteError, Remotes
from singpy.record import Record

CONFIG_PATH = "/assets/config/config.prod.json"
NO_LIBRARY_URI = "cloud.apptainer.org"  # Apptainer's DefaultCloudURI: a keyserver only


class Library(Record):
    """The library a pull, push or search talks to."""

    url: str  # the library API's base URL
    token: str = ""
    remote: str = ""  # the remote it came from ("" for --library or library://HOST/)


def endpoint_url(remote: Mapping[str, Any]) -> str:
    uri = str(remote.get("URI") or "")
    if not uri:
        raise RemoteError("no URI set for endpoint")
    return ("http://" if remote.get("Insecure") else "https://") + uri.split("://", 1)[-1].rstrip("/")


def services(name: str, remote: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """{service: base URL} of the remote `name` (keystore named keyserver, as Apptainer does)."""
    url = endpoint_url(remote) + CONFIG_PATH
    try:
        answer = web.get_json(url, env)
    except RemoteError as error:
        raise RemoteError(f"can't discover the services of remote {name}: {error.message}") from None
    found: dict[str, str] = {}
    if isinstance(answer, dict):
        for key, value in answer.items():
            uri = value.get("uri") if isinstance(value, dict) else None
            if isinstance(key, str) and isinstance(uri, str) and uri:
                service = key.removesuffix("API")
                found["keyserver" if service == "keystore" else service] = uri.rstrip("/")
    return found


def verify_token(name: str, remote: Mapping[str, Any], token: str, env: Mapping[str, str]) -> None:
    """RemoteError unless the remote's token service accepts `token`."""
    found = services(name, remote, env)
    if "token" not in found:
        raise RemoteError(f"remote {name} has no authentication service: can't check the token")
    try:
        web.get_json(found["token"] + "/v1/token-status", env, token=token)
    except web.HTTPError as error:
        if error.status in (401, 403, 404):
            raise RemoteError(f"remote {name} refused the token ({error.status}): make a new one and log in "
                              f"again with 'singpy remote login --tokenfile FILE {name}'") from None
        raise


def library_service(name: str, remote: Mapping[str, Any], env: Mapping[str, str]) -> str:
    if str(remote.get("URI") or "") == NO_LIBRARY_URI:
        raise RemoteError(f"remote {name} ({NO_LIBRARY_URI}) has no library: add one with "
                          "'singpy remote add NAME URI', or name it with --library URL")
    found = services(name, remote, env)
    if "library" not in found:
        raise RemoteError(f"remote {name} has no library service")
    return found["library"]


def choose(view: Remotes, env: Mapping[str, str], *, host: str, library: str, https: bool) -> Library:
    """The library of a command: `--library URL`, else the reference's host, else the default remote's
    (with its token). An exclusive remote of the administrator's allows its own library only."""
    from singpy.errors import UsageError

    if library and host:
        raise UsageError("conflicting arguments: do not use --library with a library:// reference naming a host")
    explicit = library.rstrip("/") or (f"{'https' if https else 'http'}://{host}" if host else "")
    if not explicit:
        name, remote = view.default()
        return Library(url=library_service(name, remote, env), token=str(remote.get("Token") or ""), remote=name)
    if view.active and view.remotes.get(view.active, {}).get("Exclusive"):
        name, remote = view.default()
        own = library_service(name, remote, env)
        if web.origin(own) != web.origin(explicit):
            raise RemoteError(f"endpoint is set as exclusive by the system administrator: only {own} can be used")
    return Library(url=explicit)

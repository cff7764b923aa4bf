"""Apptainer's `remote.yaml`: the remote endpoints, which one is in use, their tokens.

Two files, in Apptainer's layout (internal/pkg/remote.Config, endpoint.Config):

    Active: NAME
    Remotes:
        NAME:
            URI: HOST[/PATH]          no scheme: https://, or http:// when Insecure
            Token: TOKEN              after `remote login` (user file only)
            System: false             set from the system file
            Exclusive: false          the administrator's choice: no other remote may be used
            Insecure: true            only when set
    Credentials: [...]               registry logins of older versions: kept as they are

* the user's: `$SINGPY_CONFIGDIR`, `$APPTAINER_CONFIGDIR` or `$SINGULARITY_CONFIGDIR`, else `~/.apptainer`,
  then `remote.yaml` (mode 0600: it holds tokens); `singpy remote --config FILE` names another;
* the system's: `remote.yaml` beside the configuration singpy reads (`--config DIR/singpy.conf` means
  `DIR/remote.yaml`; by default `/etc/singpy/remote.yaml`, or `/etc/apptainer/remote.yaml` on a host that
  runs on Apptainer's configuration), written by root only (`--global`), mode 0644.

The user's view is the user file with the system's remotes merged in (Config.SyncFrom): a system remote
is marked System, can't be removed by the user, and an Exclusive one is the only one that can be used.
Both files come from others (the system one from the administrator, the user's from whoever could write
it): read bounded, unknown keys refused as Apptainer's KnownFields decoder refuses them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from singpy.errors import SingpyError

FILE = "remote.yaml"
SYSTEM_DIR = "/etc/singpy"
_TOP_KEYS = ("Active", "Remotes", "Credentials")
_REMOTE_KEYS = ("URI", "Token", "System", "Exclusive", "Insecure", "Keyservers")
_LIMIT = 1 << 20


class RemoteError(SingpyError):
    """A remote that is not there, a remote.yaml that can't be read or written, an endpoint that refuses."""


class Remotes:
    """One remote.yaml's content (`system`: the administrator's file)."""

    def __init__(self, data: Mapping[str, Any], *, path: str, system: bool) -> None:
        self.path = path
        self.system = system
        self.active: str = data.get("Active") or ""
        self.remotes: dict[str, dict[str, Any]] = {name: dict(value) for name, value in
                                                   (data.get("Remotes") or {}).items()}
        self.credentials: list[Any] = list(data.get("Credentials") or [])

    def get(self, name: str) -> dict[str, Any]:
        if name not in self.remotes:
            known = ", ".join(sorted(self.remotes)) or "none"
            raise RemoteError(f"{name} is not a remote (known: {known}): add it with "
                              "'singpy remote add NAME URI', or see 'singpy remote list'")
        return self.remotes[name]

    def default(self) -> tuple[str, dict[str, Any]]:
        if not self.active:
            raise RemoteError("no default remote in use: add one with 'singpy remote add NAME URI', "
                              "or name the library with --library URL or library://HOST/...")
        return self.active, self.get(self.active)

    def add(self, name: str, uri: str, *, insecure: bool, make_default: bool) -> None:
        if not name.strip():
            raise RemoteError("invalid name: cannot have empty name")
        if name in self.remotes:
            raise RemoteError(f"{name} is already a remote: remove it first ('singpy remote remove {name}')")
        self.remotes[name] = {"URI": uri, "System": self.system, "Exclusive": False,
                              **({"Insecure": True} if insecure else {})}
        if make_default:
            self.use(name, exclusive=False)

    def use(self, name: str, *, exclusive: bool) -> None:
        """Config.SetDefault: an exclusive remote of the administrator's wins over the user's choice."""
        self.get(name)
        if exclusive and not self.system:
            raise RemoteError("exclusive can't be set by user")
        if name != self.active and not self.system:
            for other, remote in self.remotes.items():
                if remote.get("Exclusive"):
                    raise RemoteError(f"could not use {name}: remote {other} has been set exclusive by the "
                                      "system administrator")
        if exclusive and self.active in self.remotes and self.active != name:
            self.remotes[self.active]["Exclusive"] = False
        self.remotes[name]["Exclusive"] = exclusive
        self.active = name

    def remove(self, name: str) -> None:
        if self.get(name).get("System") and not self.system:
            raise RemoteError(f"{name} is global and can't be removed (only root can, with --global)")
        if self.active == name:
            self.active = ""
        del self.remotes[name]

    def sync_from(self, system: Remotes) -> None:
        """Merge the system's remotes in (Apptainer's Config.SyncFrom)."""
        for name, theirs in system.remotes.items():
            mine = self.remotes.get(name)
            if mine is not None and not mine.get("System"):
                continue  # the user's own remote of that name wins (Apptainer says so at info level)
            if mine is not None:
                mine.update(URI=theirs.get("URI", ""), Exclusive=bool(theirs.get("Exclusive")))
            else:
                self.remotes[name] = {"URI": theirs.get("URI", ""), "System": True,
                                      "Exclusive": bool(theirs.get("Exclusive")),
                                      **({"Insecure": True} if theirs.get("Insecure") else {})}
            if theirs.get("Keyservers"):  # the administrator's keyservers (`singpy keyserver add`) come along
                self.remotes[name]["Keyservers"] = theirs["Keyservers"]
            if theirs.get("Exclusive"):
                self.active = name
        if not self.active and system.active:
            self.active = system.active

    def to_yaml(self) -> str:
        """The file as Apptainer's yaml.Marshal writes it: its keys in its struct order, remotes sorted."""
        import yaml

        remotes = {name: _ordered(self.remotes[name]) for name in sorted(self.remotes)}
        data: dict[str, Any] = {"Active": self.active, "Remotes": remotes}
        if self.credentials:
            data["Credentials"] = self.credentials
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, indent=4, allow_unicode=True)


def _ordered(remote: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _REMOTE_KEYS:
        value = remote.get(key)
        if key in ("System", "Exclusive"):
            out[key] = bool(value)
        elif value:  # omitempty
            out[key] = value
    return out


def user_path(env: Mapping[str, str], home: str) -> str:
    from singpy.host.hostfiles import user_config_dir

    return os.path.join(user_config_dir(env, home), FILE)


def system_path(env: Mapping[str, str]) -> str:
    """remote.yaml beside the configuration singpy reads (`--config` sets SINGPY_CONFIG: singpy.cli.main)."""
    from singpy.config import sysconf

    conf = sysconf.default_path(env)
    return os.path.join(os.path.dirname(os.path.abspath(conf)) if conf else SYSTEM_DIR, FILE)


def load(path: str, *, system: bool) -> Remotes:
    """The remotes of `path` (none if it does not exist). RemoteError for anything else wrong with it."""
    import yaml

    from singpy.host.hostfiles import read_text

    if not os.path.lexists(path):
        return Remotes({}, path=path, system=system)
    text = read_text(path, what="remote configuration", error=RemoteError, limit=_LIMIT)
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        raise RemoteError(f"can't parse the remote configuration {path}: {str(error).splitlines()[0]}") from None
    _check(data, path)
    return Remotes(data, path=path, system=system)


def _check(data: Any, path: str) -> None:
    """The shape Apptainer's decoder accepts (KnownFields: an unknown key is an error)."""
    def bad(why: str) -> RemoteError:
        return RemoteError(f"can't use the remote configuration {path}: {why}")

    if not isinstance(data, dict):
        raise bad("it is not a YAML mapping")
    unknown = set(data) - set(_TOP_KEYS)
    if unknown:
        raise bad(f"unknown key {sorted(map(str, unknown))[0]!r}")
    if not isinstance(data.get("Active") or "", str) or not isinstance(data.get("Remotes") or {}, dict) \
            or not isinstance(data.get("Credentials") or [], list):
        raise bad("Active must be a name, Remotes a mapping and Credentials a list")
    for name, remote in (data.get("Remotes") or {}).items():
        if not isinstance(name, str) or not isinstance(remote, dict):
            raise bad(f"remote {name!r} is not a mapping")
        unknown = set(remote) - set(_REMOTE_KEYS)
        if unknown:
            raise bad(f"remote {name}: unknown key {sorted(map(str, unknown))[0]!r}")
        for key in ("URI", "Token"):
            if not isinstance(remote.get(key) or "", str):
                raise bad(f"remote {name}: {key} must be a string")


def user_view(env: Mapping[str, str], home: str, user_file: str = "") -> Remotes:
    """The user's remotes with the system's merged in: what pull, push, search and `remote list` see."""
    mine = load(user_file or user_path(env, home), system=False)
    mine.sync_from(load(system_path(env), system=True))
    return mine


def save(remotes: Remotes) -> None:
    """Write the file whole or not at all (a new file renamed over it): 0644 for the system's, else 0600."""
    from singpy.host.cachefiles import publish

    directory = os.path.dirname(remotes.path) or "."
    if not os.path.isdir(directory):
        try:
            os.makedirs(directory, mode=0o700)
        except OSError as error:
            raise RemoteError(f"can't create {directory}: {error.strerror}") from None
    try:  # every user reads the system's remotes
        publish(remotes.path, remotes.to_yaml().encode(), mode=0o644 if remotes.system else 0o600, durable=True)
    except OSError as error:
        raise RemoteError(f"can't write the remote configuration {remotes.path}: {error.strerror}") from None

"""Which keyserver singpy asks for keys, and what it gives: the `--url`, else the first keyserver of the remote
in use, with the login remote.yaml holds for it (Apptainer's keyserver client config). Shared by `singpy key`,
`singpy keyserver`, `singpy verify` and a `library://` pull's check; no typer here (a pull never loads it)."""

from __future__ import annotations

from typing import Any

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable

    from pysequoia import Cert


def same_keyserver(first: str, second: str) -> bool:
    """Whether two URIs name one keyserver; False where either names none (remote.yaml's Credentials also hold
    registry logins of older versions, `oras://registry.example.org`: never a keyserver's, never an error)."""
    from singpy.signing import hkp

    try:
        return hkp.normalize(first) == hkp.normalize(second)
    except hkp.KeyserverError:
        return False


def active_keyservers(remote: dict[str, Any]) -> list[dict[str, Any]]:
    return [server for server in remote.get("Keyservers") or [] if isinstance(server, dict) and not server.get("Skip")]


def choose_keyserver(url: str) -> tuple[str, str]:
    """(keyserver, its Authorization value): `--url`, else the first keyserver of the remote in use."""
    from singpy.host import host
    from singpy.library import remotes
    from singpy.signing import hkp

    info = host.capture()
    view = remotes.user_view(info.env, info.home)
    if not url:
        servers = active_keyservers(view.default()[1]) if view.active else []
        url = hkp.first_of([str(server.get("URI", "")) for server in servers])
    server = hkp.normalize(url)
    auth = next((str(cred.get("Auth") or "") for cred in view.credentials
                 if isinstance(cred, dict) and same_keyserver(str(cred.get("URI", "")), server)), "")
    return server, auth


def from_keyserver(url: str) -> Callable[[str], tuple[Cert, ...]]:
    """The keys a keyserver gives for a fingerprint or key ID (Apptainer's hybrid keyring): none when no
    keyserver is configured, or with a warning when it fails, as Apptainer's "failed to get key material"."""

    def fetch(wanted: str) -> tuple[Cert, ...]:
        from singpy import console
        from singpy.errors import SingpyError
        from singpy.signing import hkp, keyring

        try:
            server, auth = choose_keyserver(url)
        except hkp.KeyserverError as e:
            console.verbose(f"no keyserver asked for key {wanted}: {e.message}")
            return ()
        try:
            certs = keyring.parse_certs(hkp.fetch(server, wanted, auth=auth), f"the keyserver {server}'s answer")
        except SingpyError as e:
            console.warning(f"failed to get key material: {e.message}")
            return ()
        # a fingerprint asked for: only that key (a server may answer with more); a key ID may be a subkey's
        return tuple(cert for cert in certs if len(wanted) != 40 or keyring.fingerprint(cert) == wanted.upper())

    return fetch

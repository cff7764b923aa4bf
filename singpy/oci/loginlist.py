"""The registry logins Apptainer lists: `Credentials` entries of the user's remote.yaml.

`apptainer registry login docker://HOST` stores the secret in docker-config.json and records `{URI, Insecure}`
(never a secret) in ~/.apptainer/remote.yaml; `registry list` prints those entries, `logout` removes them. A
login into a file given with `--authfile` touches neither. singpy keeps the same entries, so that either
program lists the logins of the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit


def _same(first: str, second: str) -> bool:
    """Apptainer's remoteutil.SameURI: the same scheme and host[:port]."""
    try:
        one, two = urlsplit(first), urlsplit(second)
    except ValueError:
        return False
    return bool(one.netloc and two.netloc) and (one.scheme, one.netloc) == (two.scheme, two.netloc)


def record(env: Mapping[str, str], home: str, uri: str, *, insecure: bool, path: str = "") -> None:
    """Replace the entries of `uri`'s registry by one for it (Apptainer removes duplicates of older versions).
    `path`: the remote configuration to edit (`registry --config`), else the user's."""
    from singpy.library import remotes

    mine = remotes.load(path or remotes.user_path(env, home), system=False)
    mine.credentials = [entry for entry in mine.credentials if not _same(_uri_of(entry), uri)]
    mine.credentials.append({"URI": uri, "Insecure": insecure})
    remotes.save(mine)


def forget(env: Mapping[str, str], home: str, uri: str, path: str = "") -> None:
    from singpy.library import remotes

    mine = remotes.load(path or remotes.user_path(env, home), system=False)
    kept = [entry for entry in mine.credentials if not _same(_uri_of(entry), uri)]
    if len(kept) != len(mine.credentials):
        mine.credentials = kept
        remotes.save(mine)


def listed(env: Mapping[str, str], home: str, path: str = "") -> list[tuple[str, bool]]:
    """(URI, insecure) of each entry, in the file's order."""
    from singpy.library import remotes

    mine = remotes.load(path or remotes.user_path(env, home), system=False)
    return [(_uri_of(entry), bool(entry.get("Insecure"))) for entry in mine.credentials if isinstance(entry, dict)]


def _uri_of(entry: Any) -> str:
    return str(entry.get("URI") or "") if isinstance(entry, dict) else ""

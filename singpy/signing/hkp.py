"""The HTTP Keyserver Protocol (draft-shaw-openpgp-hkp), as Apptainer's key search|pull|push speak it.

    GET  /pks/lookup?op=index&options=mr&search=TEXT     machine-readable index ("info:", "pub:", "uid:" lines)
    GET  /pks/lookup?op=get&options=mr&search=0xFPR      the armored public key(s)
    POST /pks/add   keytext=ARMORED (form-encoded)         publish a public key

A keyserver is a stranger: every answer is read bounded and with a deadline, its index lines are parsed
strictly (anything else is skipped), its keys go through Sequoia before they reach a keyring, and what it
says is escaped before it is shown. A credential (`keyserver login`) travels only to the keyserver it was given for.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from singpy.errors import SingpyError
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import urllib.request
    from http.client import HTTPMessage
    from typing import IO

TIMEOUT = 30.0
_LIMIT = 16 << 20


class KeyserverError(SingpyError):
    """A keyserver that can't be reached, refuses, or answers with something that is not what was asked."""


class IndexEntry(Record):
    fingerprint: str  # uppercase hex, or the key ID the server gave
    algorithm: str
    bits: str
    created: str  # seconds since the epoch, as the server said
    user_ids: tuple[str, ...]


def normalize(uri: str) -> str:
    """A keyserver URI as Apptainer normalizes it: hkp:// means http on port 11371, hkps:// https; no path."""
    parts = urllib.parse.urlsplit(uri if "://" in uri else f"https://{uri}")
    scheme, netloc = parts.scheme, parts.netloc
    if scheme == "hkp":
        scheme, netloc = "http", netloc if parts.port else f"{netloc}:11371"
    elif scheme == "hkps":
        scheme = "https"
    if scheme not in ("http", "https") or not parts.hostname:
        raise KeyserverError(f"invalid keyserver URI {uri!r}: expected http(s)://, hkp(s):// or HOST[:PORT]")
    return f"{scheme}://{netloc}"


def _request(url: str, *, data: bytes | None = None, auth: str = "") -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    headers = {"User-Agent": "singpy"}
    if auth:  # "Bearer TOKEN" or "Basic ...": the credential `keyserver login` stored for this keyserver
        headers["Authorization"] = auth
    if data is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with _opener().open(request, timeout=TIMEOUT) as response:
            return response.status, _bounded(response.read(_LIMIT + 1))
    except urllib.error.HTTPError as error:
        return error.code, _bounded(error.read(4096))
    except (urllib.error.URLError, OSError, UnicodeError) as error:  # UnicodeError: a host name IDNA refuses
        reason = "not a valid host name" if isinstance(error, UnicodeError) else getattr(error, "reason", error)
        raise KeyserverError(f"can't reach the keyserver {_origin(url)}: {reason}") from None


def _opener() -> urllib.request.OpenerDirector:
    """An opener whose redirects carry the credential only to the origin it was given for (urllib's default
    handler copies every header onto the redirected request, to any host, https to http included)."""
    import urllib.request

    class SameOriginCredential(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                             headers: HTTPMessage, newurl: str) -> urllib.request.Request | None:
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            if new is not None and _origin(new.full_url) != _origin(req.full_url):
                new.remove_header("Authorization")
            return new

    return urllib.request.build_opener(SameOriginCredential())


def _bounded(body: bytes) -> bytes:
    if len(body) > _LIMIT:
        raise KeyserverError(f"the keyserver's answer is larger than {_LIMIT >> 20} MiB")
    return body


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _lookup(server: str, op: str, search: str, auth: str) -> tuple[int, bytes]:
    query = urllib.parse.urlencode({"op": op, "options": "mr", "search": search})
    return _request(f"{normalize(server)}/pks/lookup?{query}", auth=auth)


def _failed(status: int, body: bytes, what: str) -> KeyserverError:
    from singpy.console import escape

    said = escape(body.decode(errors="replace").strip().splitlines()[0][:200]) if body.strip() else ""
    if status == 401:
        return KeyserverError(f"{what}: unauthorized or missing token (see 'singpy keyserver login')")
    return KeyserverError(f"{what}: the keyserver answered {status}" + (f" ({said})" if said else ""))


def search(server: str, text: str, *, auth: str = "") -> list[IndexEntry]:
    """The keys whose user IDs or fingerprints match `text` (none: an empty list)."""
    status, body = _lookup(server, "index", text, auth)
    if status == 404:
        return []
    if status != 200:
        raise _failed(status, body, f"searching {text!r}")
    return parse_index(body.decode(errors="replace"))


def parse_index(text: str) -> list[IndexEntry]:
    """The machine-readable index: `pub:KEYID:ALGO:BITS:CREATED:EXPIRES:FLAGS` then its `uid:NAME:...` lines."""
    entries: list[IndexEntry] = []
    current = False  # whether uid lines now belong to the last entry (not to a pub line that was skipped)
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            current = len(fields) >= 2 and bool(fields[1])
            if current:
                fields += [""] * (5 - len(fields))
                entries.append(IndexEntry(fingerprint=fields[1].upper(), algorithm=fields[2], bits=fields[3],
                                          created=fields[4], user_ids=()))
        elif fields[0] == "uid" and len(fields) >= 2 and current:
            name = urllib.parse.unquote(fields[1])
            entries[-1] = entries[-1].replace(user_ids=(*entries[-1].user_ids, name))
    return entries


def fetch(server: str, fingerprint: str, *, auth: str = "") -> bytes:
    """The key material the server holds for `fingerprint` (a 40-digit fingerprint or a 16-digit key ID)."""
    query = fingerprint.upper().removeprefix("0X")
    if len(query) not in (16, 40) or any(char not in "0123456789ABCDEF" for char in query):
        raise KeyserverError(f"please provide a keyid (16 chars) or a full fingerprint (40 chars): {fingerprint!r}")
    status, body = _lookup(server, "get", f"0x{query}", auth)
    if status == 404:
        raise KeyserverError(f"no key matching {query} on the keyserver {normalize(server)}")
    if status != 200:
        raise _failed(status, body, f"pulling {query}")
    return body


def publish(server: str, armored: str, *, auth: str = "") -> str:
    """Upload a public key; the server's answer (if any) for the user to read."""
    data = urllib.parse.urlencode({"keytext": armored}).encode()
    status, body = _request(f"{normalize(server)}/pks/add", data=data, auth=auth)
    if status not in (200, 201, 202):
        raise _failed(status, body, "the keyserver did not accept the key")
    return body.decode(errors="replace").strip()


def check_login(server: str, auth: str) -> None:
    """Apptainer's keyserver login: the keyserver must answer 200 to a GET of its root with the credential."""
    status, _ = _request(f"{normalize(server)}/", auth=auth)
    if status != 200:
        raise KeyserverError(f"while login to {normalize(server)}: error response from server: {status}")


def first_of(servers: Sequence[str]) -> str:
    if not servers:
        raise KeyserverError("no keyserver configured: name one with --url URL, or ask your administrator to "
                             "add one ('singpy keyserver add URL')")
    return servers[0]

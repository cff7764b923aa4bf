"""A small real HKP keyserver (draft-shaw-openpgp-hkp) on 127.0.0.1, for `singpy key search|pull|push`.

    GET  /pks/lookup?op=get&search=0xFINGERPRINT|0xKEYID   the armored key, 404 when unknown
    GET  /pks/lookup?op=index&options=mr&search=TEXT       the machine-readable index of the matching keys
    POST /pks/add   keytext=ARMORED                          stores the key (401 without the token, when set)

Keys are parsed with Sequoia, as a keyserver would: what is stored is what a client sent, checked. It
runs in a thread of the test process; `requests` records every request (path, Authorization) so that a test
can check what singpy sent.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pysequoia

from tests.support.registry_http import serving


class Keyserver:
    def __init__(self, token: str = "") -> None:
        self.token = token
        self.keys: dict[str, pysequoia.Cert] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        self.url = ""
        self.redirect = ""  # set: every /pks/ request is answered 302 to this URL + its path (another server)

    def add(self, armored: bytes) -> str:
        cert = pysequoia.Cert.from_bytes(armored)
        fingerprint = str(cert.fingerprint).upper()
        self.keys[fingerprint] = cert if fingerprint not in self.keys else self.keys[fingerprint].merge(cert)
        return fingerprint

    def find(self, search: str) -> list[pysequoia.Cert]:
        query = search.upper().removeprefix("0X")
        return [cert for fingerprint, cert in self.keys.items() if fingerprint.endswith(query)] if query else []

    def index(self, search: str) -> str:
        text = search.lower().removeprefix("0x")
        found = [(fingerprint, cert) for fingerprint, cert in sorted(self.keys.items())
                 if text in fingerprint.lower() or any(text in str(user).lower() for user in cert.user_ids)]
        lines = [f"info:1:{len(found)}"]
        for fingerprint, cert in found:
            lines.append(f"pub:{fingerprint}:1:4096:1588023536::")
            lines += [f"uid:{urllib.parse.quote(str(user))}:1588023536::" for user in cert.user_ids]
        return "\n".join(lines) + "\n" if found else ""


def _handler(server: Keyserver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _answer(self, status: int, body: str, kind: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            server.requests.append(("GET", self.path, self.headers.get("Authorization", "")))
            parts = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parts.query))
            if parts.path == "/":  # what a client's login checks: the credential, if the server wants one
                authorized = not server.token or self.headers.get("Authorization") == f"Bearer {server.token}"
                return self._answer(200, "welcome") if authorized else self._answer(401, "unauthorized")
            if server.redirect and parts.path.startswith("/pks/"):
                self.send_response(302)
                self.send_header("Location", server.redirect + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            if parts.path != "/pks/lookup":
                return self._answer(404, "not found")
            if query.get("op") == "get":
                found = server.find(query.get("search", ""))
                if not found:
                    return self._answer(404, "No keys found")
                return self._answer(200, "".join(str(cert) for cert in found), "application/pgp-keys")
            if query.get("op") == "index":
                text = server.index(query.get("search", ""))
                return self._answer(200, text) if text else self._answer(404, "No keys found")
            return self._answer(501, "operation not implemented")

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            auth = self.headers.get("Authorization", "")
            server.requests.append(("POST", self.path, auth))
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
            if self.path != "/pks/add":
                return self._answer(404, "not found")
            if server.token and auth != f"Bearer {server.token}":
                return self._answer(401, "unauthorized")
            try:
                fingerprint = server.add(form.get("keytext", "").encode())
            except (RuntimeError, ValueError) as error:
                return self._answer(400, f"invalid key: {str(error).splitlines()[0]}")
            return self._answer(200, f"stored {fingerprint}")

    return Handler


@contextmanager
def running(token: str = "", host: str = "127.0.0.1") -> Iterator[Keyserver]:
    """A keyserver listening on `host` (a free port) until the block ends."""
    keyserver = Keyserver(token)
    with serving(_handler(keyserver), host) as httpd:
        keyserver.url = f"http://{host}:{httpd.server_address[1]}"
        yield keyserver

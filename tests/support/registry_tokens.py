"""The token server of the test registries: Docker's token protocol, JWTs (RS256, x5c header) made with openssl.

A Python http.server on a thread of this process, on 127.0.0.1 and a port the kernel chose; its key and
certificate are made when it starts. tests.support.registry re-exports every public name here.

TokenServer
    realm ("http://127.0.0.1:PORT/token"), service, issuer, cert_file (the registry's rootcertbundle)
    users {"alice": "wonderland"}, public_prefix "public/", lifetime (the "expires_in" it answers and the
    token's "exp"; docker-registry 2.8 accepts a token up to 60 s after its exp, so a short lifetime tests only
    the client's own renewal), expired (True: tokens carry an exp long past, so the registry answers 401
    invalid_token at once, while "expires_in" still says `lifetime`). Both are settable; a test that changes
    them on a fixture's server sets them back.
    requests -> list[TokenRequest]  (method, user: "" anonymous, scopes, granted: {repo: [actions]}, status,
                headers: lower-case names)
    token(user, access) -> str      a valid token, minted directly (access: [{"type", "name", "actions"}])
    GET /token?service=&scope=...  (Docker's token protocol) and POST /token (OAuth2 password grant:
    grant_type=password, username, password, service, scope) both answer {"token", "access_token", ...}.

`start_token_server(directory, **options)` starts one for a block (options: users, public_prefix, lifetime).
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.registry_http import Handler, serve, shutdown
from tests.support.registry_tls import openssl

USERNAME = "alice"  # the one user of every auth kind (basic and token), with pull and push
PASSWORD = "wonderland"
SERVICE = "singpy-test-registry"
ISSUER = "singpy-test-token-server"
REGISTRY_LEEWAY = 60  # seconds docker-registry 2.8 accepts a token after its "exp" (clock skew allowance)


class TokenRequest:
    """What the token server was asked and what it answered."""

    def __init__(self, *, method: str, user: str, scopes: list[str], granted: dict[str, list[str]], status: int,
                 headers: dict[str, str], service: str) -> None:
        self.method, self.user, self.scopes, self.granted = method, user, scopes, granted
        self.status, self.headers, self.service = status, headers, service

    def __repr__(self) -> str:
        return (f"TokenRequest({self.method} user={self.user!r} scopes={self.scopes} granted={self.granted} "
                f"status={self.status})")


class TokenServer:
    """Issues registry tokens (JWT, RS256, x5c header) for Docker's token protocol (see the module docstring)."""

    def __init__(self, directory: Path, *, users: Mapping[str, str] | None = None,
                 public_prefix: str = "public/", lifetime: int = 300) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.users = dict(users) if users is not None else {USERNAME: PASSWORD}
        self.public_prefix = public_prefix
        self.lifetime = lifetime
        self.expired = False  # True: tokens are born expired for the registry (see the module docstring)
        self.service, self.issuer = SERVICE, ISSUER
        self.key_file, self.cert_file = str(directory / "token.key"), str(directory / "token.crt")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key_file, "-out", self.cert_file,
                 "-days", "7", "-subj", "/CN=singpy test token issuer")
        pem = Path(self.cert_file).read_text()
        self._x5c = "".join(pem.split("-----")[2].split())  # the DER certificate, base64 (standard, padded)
        self._lock = threading.Lock()
        self._requests: list[TokenRequest] = []
        self._server, self._thread = serve("127.0.0.1", _TokenHandler, self)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.realm = f"{self.url}/token"

    def __repr__(self) -> str:
        return f"TokenServer({self.realm})"

    @property
    def requests(self) -> list[TokenRequest]:
        with self._lock:
            return list(self._requests)

    def record(self, request: TokenRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def grant(self, user: str, scopes: Sequence[str]) -> list[dict[str, Any]]:
        """The access entries for `scopes` ("repository:NAME:pull,push"): everything for a user, pull on
        public_prefix* for anonymous requests."""
        access: list[dict[str, Any]] = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, wanted = rest.rpartition(":")
            if kind != "repository" or not name:
                continue
            actions = [action for action in wanted.split(",") if action]
            if not user:
                actions = [action for action in actions if action == "pull" and name.startswith(self.public_prefix)]
            if actions:
                access.append({"type": "repository", "name": name, "actions": actions})
        return access

    def token(self, user: str, access: Sequence[Mapping[str, Any]], service: str | None = None) -> str:
        now = int(time.time())
        if self.expired:
            now -= self.lifetime + 2 * REGISTRY_LEEWAY
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {"iss": self.issuer, "sub": user, "aud": service or self.service, "exp": now + self.lifetime,
                  "nbf": now - 10, "iat": now, "jti": secrets.token_hex(16), "access": list(access)}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = openssl("dgst", "-sha256", "-sign", self.key_file, input=signing_input.encode())
        return f"{signing_input}.{_b64url(signature)}"

    def stop(self) -> None:
        shutdown(self._server, self._thread)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenHandler(Handler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        self._answer(self._basic_user(), query)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(length).decode(errors="replace"))
        if form.get("grant_type") != ["password"]:
            self.send_body(400, b'{"error":"unsupported_grant_type"}')
            return
        username, password = form.get("username", [""])[0], form.get("password", [""])[0]
        owner: TokenServer = self.server.owner
        user = username if owner.users.get(username) == password and username else None
        self._answer(user, {"scope": form.get("scope", []), "service": form.get("service", [])})

    def _basic_user(self) -> str | None:
        """"" for an anonymous request, the user for right credentials, None for wrong ones."""
        header = self.headers.get("Authorization", "")
        if not header:
            return ""
        scheme, _, value = header.partition(" ")
        owner: TokenServer = self.server.owner
        try:
            username, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except ValueError:
            return None
        return username if scheme.lower() == "basic" and owner.users.get(username) == password else None

    def _answer(self, user: str | None, query: Mapping[str, list[str]]) -> None:
        owner: TokenServer = self.server.owner
        scopes = [scope for value in query.get("scope", []) for scope in value.split()]  # repeated or spaced
        service = (query.get("service") or [owner.service])[0]
        headers = self.lowered_headers()
        if urllib.parse.urlsplit(self.path).path != "/token":
            self.send_body(404, b'{"errors":[{"code":"NOT_FOUND"}]}')
            return
        if user is None:
            owner.record(TokenRequest(method=self.command, user="?", scopes=scopes, granted={}, status=401,
                                      headers=headers, service=service))
            self.send_body(401, b'{"errors":[{"code":"UNAUTHORIZED","message":"wrong username or password"}]}',
                           headers={"WWW-Authenticate": 'Basic realm="singpy-tests"'})
            return
        access = owner.grant(user, scopes)
        token = owner.token(user, access, service)
        owner.record(TokenRequest(method=self.command, user=user, scopes=scopes, status=200, headers=headers,
                                  granted={entry["name"]: entry["actions"] for entry in access}, service=service))
        body = {"token": token, "access_token": token, "expires_in": owner.lifetime,
                "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.send_body(200, json.dumps(body).encode())


@contextlib.contextmanager
def start_token_server(directory: Path, **options: Any) -> Iterator[TokenServer]:
    """A TokenServer (options: users, public_prefix, lifetime), stopped when the block ends."""
    server = TokenServer(directory, **options)
    try:
        yield server
    finally:
        server.stop()


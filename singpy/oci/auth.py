"""Registry credentials and the WWW-Authenticate dance.

Where credentials come from, first found wins (Apptainer's and Docker's places):

1. `SINGPY_DOCKER_USERNAME`/`_PASSWORD`, `APPTAINER_DOCKER_...`, `SINGULARITY_DOCKER_...`;
2. `--authfile FILE`, in Docker's config.json format;
3. otherwise `$DOCKER_CONFIG/config.json` when DOCKER_CONFIG is set, else Apptainer's
   `~/.apptainer/docker-config.json` (where `apptainer registry login` stores them) and then
   `~/.docker/config.json`.

In a config file, `credHelpers[registry]` and then `credsStore` name a
`docker-credential-NAME` program (run as `NAME get` with the server on stdin)
when it is on PATH; then `auths` entries are read: `auth` (base64 "user:pass"),
`username`/`password`, or `identitytoken`. Keys are matched by host whatever
their spelling: "ghcr.io", "https://ghcr.io", "https://index.docker.io/v1/".
An identity token is kept as the password of the user `<token>` (Docker's
convention) and exchanged for access tokens with an OAuth2 refresh-token POST.

A registry answers 401 with challenges (RFC 7235): `Bearer realm=...,service=...,
scope=...` asks for a token from the realm (anonymous without credentials,
Basic credentials sent to the realm with them); `Basic` asks for the
credentials themselves. `Authenticator` answers them and caches what it got
(a token per scope, until it expires) for every thread of a pull: the lock
makes one thread fetch a token while the others wait for it.

Credentials and tokens travel only over TLS: for a registry reached over HTTPS,
a realm on plain http:// is refused before anything is sent (it would get the
password in clear, and hand back a token anyone on the path could read or
swap). Only a registry the user marked insecure (--no-https) may have one.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.oci.limits import parse_json
from singpy.oci.ref import DOCKER_HUB
from singpy.record import Record

ENV_PREFIXES = ("SINGPY_DOCKER_", "APPTAINER_DOCKER_", "SINGULARITY_DOCKER_")
DOCKER_HUB_KEY = "https://index.docker.io/v1/"  # how Docker names docker.io in config.json and to helpers
IDENTITY_TOKEN_USER = "<token>"  # Docker's username for "the password is an identity token"
LOGIN_HINT = ("log in with 'singpy registry login' or --docker-login, set SINGPY_DOCKER_USERNAME and "
              "SINGPY_DOCKER_PASSWORD, or name a credentials file with --authfile")
_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")
_CONFIG_LIMIT = 1 << 20  # a config.json of a few KB; 1 MiB is generous
_TOKEN_LIMIT = 1 << 20  # a token response (JWTs are a few KB)
_HELPER_TIMEOUT = 30  # seconds a credential helper may take (a keyring prompt, at most)
_DEFAULT_TOKEN_LIFE = 60  # seconds, when the token server does not say (distribution's token spec)
_TOKEN_MARGIN = 10  # seconds before expiry when a token is fetched again


class Credentials(Record):
    """A username and password (or identity token, with the username `<token>`)."""

    username: str
    password: str

    def __repr__(self) -> str:  # never print a password in a traceback or a debug line
        return f"Credentials(username={self.username!r}, password='***')"

    @property
    def basic(self) -> str:
        """The value of an `Authorization: Basic` header."""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")


class Challenge(Record):
    """One challenge of a WWW-Authenticate header: its scheme (lowercase) and parameters (keys lowercase)."""

    scheme: str
    params: tuple[tuple[str, str], ...] = ()

    def param(self, name: str) -> str | None:
        for key, value in self.params:
            if key == name:
                return value
        return None


class AuthFailure(Exception):
    """The registry or its token server refused us; `reason` says how (the caller names the image)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def find_credentials(registry: str, env: Mapping[str, str], *, authfile: str | None,
                     home: str) -> Credentials | None:
    """The credentials to use for `registry` ("docker.io", "ghcr.io", "host:5000"), or None for anonymous."""
    for prefix in ENV_PREFIXES:
        username, password = env.get(f"{prefix}USERNAME"), env.get(f"{prefix}PASSWORD")
        if username or password:
            return Credentials(username=username or "", password=password or "")
    if authfile is not None:
        if not os.path.lexists(authfile):
            console.warning(f"--authfile {authfile} does not exist: pulling anonymously")
            return None
        return _from_config(authfile, registry, env)
    if env.get("DOCKER_CONFIG"):
        candidates = [os.path.join(env["DOCKER_CONFIG"], "config.json")]
    else:
        from singpy.host.hostfiles import user_config_dir

        candidates = [os.path.join(user_config_dir(env, home), "docker-config.json"),
                      os.path.join(home, ".docker", "config.json")]
    for path in candidates:
        if os.path.lexists(path):
            found = _from_config(path, registry, env)
            if found is not None:
                return found
    return None


def prompt_credentials(registry: str) -> Credentials:
    """--docker-login: a username read from stdin, a password without echo (from the terminal when there is one)."""
    import getpass
    import sys

    sys.stderr.write(f"Enter Docker Username for {registry}: ")
    sys.stderr.flush()
    line = sys.stdin.readline()
    username = line.strip()
    if not username:
        raise ImageError("--docker-login: no username was given" if line else "--docker-login: stdin is closed")
    try:
        password = getpass.getpass("Enter Docker Password: ", stream=sys.stderr)
    except EOFError:
        raise ImageError("--docker-login: no password was given") from None
    return Credentials(username=username, password=password)


def normalized_host(key: str) -> str:
    """The registry a config.json key names: schemes and legacy paths dropped, Docker Hub's aliases merged."""
    text = key.strip().lower()
    for scheme in ("https://", "http://"):
        if text.startswith(scheme):
            text = text[len(scheme):].split("/", 1)[0]
            break
    text = text.rstrip("/")
    return DOCKER_HUB if text in _HUB_NAMES else text


def _from_config(path: str, registry: str, env: Mapping[str, str]) -> Credentials | None:
    config = _read_config(path)
    wanted = normalized_host(registry)
    helpers = config.get("credHelpers")
    if isinstance(helpers, dict):
        for key, helper in helpers.items():
            if isinstance(key, str) and isinstance(helper, str) and normalized_host(key) == wanted:
                found = _from_helper(helper, wanted, env)
                if found is not None:
                    return found
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        found = _from_helper(store, wanted, env)
        if found is not None:
            return found
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    for key, entry in auths.items():
        if isinstance(key, str) and normalized_host(key) == wanted and isinstance(entry, dict):
            found = _from_entry(entry, path, key)
            if found is not None:
                return found
    return None


def _read_config(path: str) -> dict[str, object]:
    from singpy.host.hostfiles import read_text, shown

    text = read_text(path, what="credentials file", error=ImageError, limit=_CONFIG_LIMIT)
    import json  # here: a cached image's HEAD request reads no JSON

    try:
        config = json.loads(text)
    except RecursionError:  # a local file, not the network's: parse_json's depth rule is not needed here
        raise ImageError(f"credentials file {shown(path)} is not valid JSON: nested too deeply") from None
    except ValueError as error:
        raise ImageError(f"credentials file {shown(path)} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ImageError(f"credentials file {shown(path)} is not a JSON object")
    return config


def _from_entry(entry: dict[str, object], path: str, key: str) -> Credentials | None:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials(username=IDENTITY_TOKEN_USER, password=token)
    encoded = entry.get("auth")
    if isinstance(encoded, str) and encoded:
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except ValueError:
            console.warning(f"ignoring the credentials for {key} in {path}: 'auth' is not base64 of user:password")
            return None
        username, colon, password = decoded.partition(":")
        if not colon:
            console.warning(f"ignoring the credentials for {key} in {path}: 'auth' holds no ':'")
            return None
        return Credentials(username=username, password=password.strip("\n"))
    user, secret = entry.get("username"), entry.get("password")
    if isinstance(user, str) and isinstance(secret, str) and (user or secret):
        return Credentials(username=user, password=secret)
    return None


def _from_helper(helper: str, registry: str, env: Mapping[str, str]) -> Credentials | None:
    """What `docker-credential-HELPER get` says for `registry`; None (and a verbose note) when it can't."""
    import subprocess

    from singpy.host.hostfiles import which

    program = f"docker-credential-{helper}"
    found = which(program, env.get("PATH", os.defpath)) if "/" not in helper else None
    if found is None:
        console.verbose(f"credential helper {program} is not on PATH: skipped")
        return None
    server = DOCKER_HUB_KEY if registry == DOCKER_HUB else registry
    try:
        done = subprocess.run([found, "get"], input=server.encode(), capture_output=True, env=dict(env),
                              timeout=_HELPER_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        console.warning(f"credential helper {program} did not answer within {_HELPER_TIMEOUT} s: skipped")
        return None
    except OSError as error:
        console.verbose(f"can't run credential helper {found}: {error.strerror}: skipped")
        return None
    if done.returncode != 0:
        said = done.stdout.decode(errors="replace").strip() or done.stderr.decode(errors="replace").strip()
        console.verbose(f"credential helper {program} has nothing for {server}: {said[:200]}")
        return None
    try:
        answer = parse_json(done.stdout, f"the answer of {program}", limit=_CONFIG_LIMIT)
    except ImageError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("Secret"), str):
        console.warning(f"credential helper {program} gave a malformed answer for {server}: skipped")
        return None
    username = answer.get("Username")
    return Credentials(username=username if isinstance(username, str) else "", password=answer["Secret"])


def parse_challenges(values: list[str]) -> list[Challenge]:
    """The challenges of WWW-Authenticate header values (RFC 7235), malformed parts skipped, never an error.

    `Bearer realm="https://auth.docker.io/token",service="registry.docker.io"` gives
    Challenge(scheme="bearer", params=(("realm", ...), ("service", ...))); several challenges may share a
    header and several headers may be given.
    """
    challenges: list[Challenge] = []
    for value in values:
        for scheme, params in _challenge_parts(value):
            challenges.append(Challenge(scheme=scheme.lower(), params=tuple(params)))
    return challenges


def _challenge_parts(value: str) -> list[tuple[str, list[tuple[str, str]]]]:
    found: list[tuple[str, list[tuple[str, str]]]] = []
    position, end = 0, len(value)
    while position < end:
        position = _skip(value, position, " \t,")
        token_end = _token_end(value, position)
        if token_end == position:  # not a token: skip one character (garbage never stops the parse)
            position += 1
            continue
        word = value[position:token_end]
        after = _skip(value, token_end, " \t")
        if after < end and value[after] == "=" and found:  # key=value of the current challenge
            param, position = _param_value(value, _skip(value, after + 1, " \t"))
            if param is not None:
                found[-1][1].append((word.lower(), param))
            continue
        found.append((word, []))  # a scheme (a token68 after it is ignored: Basic and Bearer have none)
        position = token_end
    return found


def _skip(text: str, position: int, characters: str) -> int:
    while position < len(text) and text[position] in characters:
        position += 1
    return position


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _token_end(text: str, position: int) -> int:
    while position < len(text) and text[position] in _TOKEN_CHARS:
        position += 1
    return position


def _param_value(text: str, position: int) -> tuple[str | None, int]:
    if position < len(text) and text[position] == '"':
        chars: list[str] = []
        position += 1
        while position < len(text):
            char = text[position]
            if char == "\\" and position + 1 < len(text):
                chars.append(text[position + 1])
                position += 2
                continue
            if char == '"':
                return "".join(chars), position + 1
            chars.append(char)
            position += 1
        return "".join(chars), position  # an unterminated string: what there is
    token_end = _token_end(text, position)
    if token_end == position:
        return None, position
    return text[position:token_end], token_end


# fetch(method, url, headers, body) -> (status, body bytes), at most `limit` bytes read: the registry's transport.
Fetch = Callable[[str, str, dict[str, str], bytes | None, int], tuple[int, bytes]]


class Authenticator:
    """The Authorization header for one repository of one registry, shared by all threads of a pull."""

    def __init__(self, *, credentials: Credentials | None, scope: str, fetch: Fetch, secure: bool = True) -> None:
        self.credentials = credentials
        self.scope = scope  # "repository:library/alpine:pull"
        self.secure = secure  # the registry is reached over HTTPS: so must its token realm be
        self._fetch = fetch
        self._lock = threading.Lock()
        self._header: str | None = None  # what to send now
        self._expires = 0.0  # time.monotonic() after which a Bearer token is fetched again
        self._challenge: Challenge | None = None  # the last Bearer challenge (to renew tokens without a 401)

    def header(self) -> str | None:
        """The Authorization value for the next request, or None (anonymous so far, or nothing asked yet)."""
        with self._lock:
            if self._header is not None and self._expires and time.monotonic() >= self._expires:
                if self._challenge is None:
                    return None
                self._bearer(self._challenge)  # renewed before it lapses: no 401 round trip
            return self._header

    def answer(self, challenges: list[Challenge], *, used: str | None) -> None:
        """Called on a 401 that carried `challenges`, for a request sent with Authorization `used`.

        Raises AuthFailure when there is nothing more to try (ImageError for a realm that would take the
        credentials or the token off TLS). Another thread may have answered the same
        challenge while this one waited for the lock: its header is then simply used.
        """
        with self._lock:
            if self._header is not None and self._header != used:
                return
            bearer = next((c for c in challenges if c.scheme == "bearer" and c.param("realm")), None)
            if bearer is not None:
                self._bearer(bearer)
                return
            if any(c.scheme == "basic" for c in challenges):
                if self.credentials is None:
                    raise AuthFailure("it needs credentials")
                if used == self.credentials.basic:
                    raise AuthFailure(f"the password of {self.credentials.username!r} was refused")
                self._header, self._expires = self.credentials.basic, 0.0
                return
            if not challenges:
                raise AuthFailure("it answered 401 without a WWW-Authenticate challenge")
            schemes = ", ".join(sorted({c.scheme for c in challenges}))
            raise AuthFailure(f"it asks for authentication singpy does not support ({schemes[:100]})")

    def refusal(self) -> str | None:
        """Why a request sent with the current header may have been refused (for the message), if we know."""
        with self._lock:
            header, credentials = self._header, self.credentials
        if header is None:
            return None
        if credentials is not None and header == credentials.basic:
            return f"the password of {credentials.username!r} was refused"
        if credentials is not None:
            return f"the token issued to {credentials.username!r} does not allow pulling it"
        return "an anonymous token does not allow pulling it"

    def _bearer(self, challenge: Challenge) -> None:
        """Fetch a token from the challenge's realm (the lock is held)."""
        from urllib.parse import urlencode, urlsplit

        realm = challenge.param("realm") or ""
        try:
            parts = urlsplit(realm)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname) and realm.isprintable()
        except ValueError:
            usable = False
        if not usable or " " in realm:
            raise AuthFailure(f"its token realm {realm[:100]!r} is not an http(s) URL")
        if self.secure and parts.scheme != "https":  # an ImageError, not a refusal: logging in would not help
            raise ImageError(f"the registry's token realm {realm[:100]} is plain HTTP: singpy sends credentials and "
                             "takes tokens only over HTTPS (--no-https is for a registry you trust on plain HTTP)")
        scopes = (challenge.param("scope") or self.scope).split()
        service = challenge.param("service")
        credentials = self.credentials
        headers: dict[str, str] = {}
        if credentials is not None and credentials.username == IDENTITY_TOKEN_USER:
            form = [("grant_type", "refresh_token"), ("refresh_token", credentials.password), ("client_id", "singpy")]
            form += [("service", service)] if service else []
            form += [("scope", " ".join(scopes))]
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            status, data = self._fetch("POST", realm, headers, urlencode(form).encode(), _TOKEN_LIMIT)
        else:
            query = ([("service", service)] if service else []) + [("scope", scope) for scope in scopes]
            if credentials is not None:
                headers["Authorization"] = credentials.basic
                query.append(("account", credentials.username))
            separator = "&" if parts.query else "?"
            status, data = self._fetch("GET", f"{realm}{separator}{urlencode(query)}", headers, None, _TOKEN_LIMIT)
        host = parts.netloc.rpartition("@")[2]
        if status in (401, 403):
            who = f"the credentials of {credentials.username!r}" if credentials is not None else "an anonymous token"
            raise AuthFailure(f"its token server {host} refused {who}")
        if status != 200:
            raise AuthFailure(f"its token server {host} answered HTTP {status}")
        token, life = _token_of(data, host)
        if token is None:
            raise AuthFailure(f"its token server {host} sent no token")
        self._header = f"Bearer {token}"
        self._expires = time.monotonic() + max(life - _TOKEN_MARGIN, 1)
        self._challenge = challenge


def _token_of(data: bytes, host: str) -> tuple[str | None, int]:
    try:
        answer = parse_json(data, "the answer", limit=_TOKEN_LIMIT)
    except ImageError as error:
        raise AuthFailure(f"its token server {host} sent no token: {error.message}") from None
    if not isinstance(answer, dict):
        return None, 0
    token = next((value for key in ("token", "access_token") if isinstance(value := answer.get(key), str) and value
                  and value.isprintable() and value.isascii()), None)
    life = answer.get("expires_in")
    if not isinstance(life, int) or isinstance(life, bool) or life < _DEFAULT_TOKEN_LIFE:
        life = _DEFAULT_TOKEN_LIFE  # the spec's minimum
    return token, min(life, 24 * 3600)

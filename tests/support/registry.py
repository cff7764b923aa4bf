"""Real OCI registries for the tests: Debian's docker-registry (the CNCF distribution registry, 2.8).

Each registry is `/usr/bin/docker-registry serve CONFIG` started as a child process listening on
127.0.0.1:<free port>, with its config, storage, certificates and log in a directory of its own, and
stopped by PID (SIGTERM, then SIGKILL, always reaped) when its fixture ends. The helper servers (token
server, blob host) are Python http.servers on threads of this process, on ports the kernel chose. Nothing
global is touched: no system service, no fixed port, skopeo runs with a HOME/TMPDIR/auth file of the
registry's own directory. Two copies of the suite can run at once.

USING THE FIXTURES. tests/conftest.py loads this module as a pytest plugin (`pytest_plugins`), so every
test can take the fixtures by name (each is defined as fixture_NAME and registered under NAME)::

    from tests.support.oci import busybox_image, write_layout
    from tests.support.registry import RegistryServer

    def test_pull(registry_plain: RegistryServer, tmp_path: Path) -> None:
        layout = write_layout(tmp_path / "layout", {"latest": busybox_image()})
        digest = registry_plain.push(layout, "pull/basic-1")       # -> "sha256:..." of the manifest
        ... singpy pull --no-https registry_plain.ref("pull/basic-1") ...

Do not also import the fixture_* functions into a test module: pytest would register a second copy there,
and that module would start registries of its own.
Each fixture needs only conftest's `workdir`. All are session-scoped: each kind of registry starts once per
session, on first use (~0.1 s; ~0.4 s with TLS or a token server, whose keys are made then). Tests stay
independent by using repository names of their own (e.g. "<module>/<test>"). Their directories live in
WORKDIR/registries/KIND-XXXX (world-readable: singpy as the unprivileged user reads ca_file).

FIXTURES
    registry_plain          RegistryServer: plain HTTP, anonymous pull and push.
    registry_basic          plain HTTP, Basic auth from an htpasswd file (bcrypt): USERNAME/PASSWORD
                            ("alice"/"wonderland") may pull and push; anything else gets 401.
    registry_token          plain HTTP, Bearer token auth through its `token_server` (TokenServer; JWT, RS256,
                            x5c header): anonymous requests get pull on "public/*" only; alice/wonderland
                            (Basic auth to the token endpoint) get pull and push on everything; a wrong password
                            gets 401 from the token server.
    registry_tls            HTTPS with a self-signed CA (`ca_file`, `cert_dir`), anonymous.
    registry_redirect       plain HTTP, Basic auth, blob GET/HEAD answered 307 to `blob_host`
                            (http://127.0.0.2:PORT, S3-like: refuses any request carrying Authorization).
    registry_redirect_token the same with token auth (the client holds a Bearer token it must not forward).

`start_registry(directory, *, auth="none"|"basic"|"token", tls=False, redirect=False, token_server=None)` is
the context manager behind them, for a test that needs a registry of its own or another combination (it
stops everything on exit; with auth="token" and no token_server it starts one). `start_token_server(dir)`.

RegistryServer
    host, port      "127.0.0.1:PORT", PORT (what goes in docker://HOST/name:tag)
    url             "http://127.0.0.1:PORT" or "https://..."
    https           whether it speaks TLS
    ca_file         the CA certificate a client must trust (SSL_CERT_FILE=...), None without TLS
    cert_dir        a directory holding only ca.crt (skopeo --cert-dir), None without TLS
    auth            "none", "basic" or "token"
    username, password   credentials with pull and push ("" when anonymous)
    token_server    TokenServer or None;  blob_host: BlobHost or None (redirect)
    storage         Path of the filesystem storage;  log: Path of the registry's log;  pid: its process
    ref(name, tag="latest") -> "docker://HOST/name:tag" ("...@sha256:..." when tag is a digest)
    push(layout, name, *, tag="latest", source_tag=None, format=None, all=True) -> digest
        `skopeo copy [--all] [--format v2s2|oci] oci:LAYOUT:SOURCE_TAG docker://HOST/NAME:TAG` with the TLS
        and credential flags this registry needs; returns the digest of the manifest (or index) pushed.
        format="v2s2" converts an OCI image to a Docker v2 schema2 manifest, and with all=True an OCI index to
        a Docker manifest list (gzip layers only). skopeo 1.9 cannot convert an index holding attestation
        manifests ("Unknown media type during manifest conversion"), nor read Docker media types from an OCI
        layout ("no descriptor found"): push those with upload(). Without `format` skopeo pushes the
        layout's bytes unchanged (an OCI manifest without "mediaType" keeps its digest), except that it
        gzips uncompressed layers (c/image compresses for docker:// destinations): upload() keeps them.
    upload(item, name, tag="latest") -> digest
        pushes a tests.support.oci Image or Index byte for byte through the registry API (blobs, then child
        manifests by digest, then the top one by tag; tag=None: by digest only). For Docker manifest lists,
        manifests without "mediaType", anything skopeo would rewrite.
    skopeo(*args, check=True) -> CompletedProcess   skopeo in this registry's environment
    tls_flags(side="") / creds_flags(side="") -> skopeo flags; side "src"/"dest" for copy, "" for inspect
    docker_config() -> dict    a ~/.docker/config.json {"auths": {HOST: {"auth": base64}}} for these creds

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

BlobHost (registry.blob_host; http://127.0.0.2:PORT; serves files of the registry's storage)
    url, host, requests -> list[BlobRequest] (method, path, digest, headers lower-case, status;
    .authorization and .range properties), requests_for(digest)
    Any request with an Authorization header: 400 with an S3-like XML error (and recorded).
    Range requests ("bytes=N-", "bytes=N-M") get 206.
    stall(digest, after=N) -> Stall: the next GET of that blob sends its headers (full Content-Length) and
        the first N bytes of its body (of the requested range, for a Range request), then holds the
        connection open until `stall.release()`, then closes it with the rest unsent. `stall.reached`
        (threading.Event) is set once the N bytes are flushed. Later requests are served normally: a resume
        shows up in requests_for(digest)[-1].range == "bytes=N-".
        Use a blob unique to the test (a layer of its own): the busybox layer is shared by many images.
    fail(digest, status=503, times=1, headers={"Retry-After": "1"}) -> the next `times` GETs of that blob
        get `status` with `headers` (for retry tests; HEAD requests are not failed).
    The fixtures release every stall at teardown.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import secrets
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.oci import Image, Index

REGISTRY = "/usr/bin/docker-registry"
SKOPEO = "/usr/bin/skopeo"
OPENSSL = "/usr/bin/openssl"
USERNAME = "alice"
PASSWORD = "wonderland"
SERVICE = "singpy-test-registry"
ISSUER = "singpy-test-token-server"
BLOB_HOST_ADDRESS = "127.0.0.2"  # another loopback address: another "host" for the client's redirect rules
START_TIMEOUT = 20.0
PORT_ATTEMPTS = 5
REGISTRY_LEEWAY = 60  # seconds docker-registry 2.8 accepts a token after its "exp" (clock skew allowance)
STALL_LIMIT = 300.0  # a stalled response is abandoned after this long even if no test releases it


class RegistryError(RuntimeError):
    """A server would not start, or a push failed (with what the tool said)."""


# --- the registry --------------------------------------------------------------------------------------------------


class RegistryServer:
    """A running docker-registry process (see the module docstring)."""

    def __init__(self, directory: Path, process: subprocess.Popen[bytes], port: int, *, https: bool,
                 ca_file: str | None, auth: str, username: str, password: str,
                 token_server: TokenServer | None, blob_host: BlobHost | None) -> None:
        self.directory = directory
        self.process = process
        self.pid = process.pid
        self.port = port
        self.host = f"127.0.0.1:{port}"
        self.https = https
        self.url = f"{'https' if https else 'http'}://{self.host}"
        self.ca_file = ca_file
        self.cert_dir = str(Path(ca_file).parent) if ca_file else None
        self.auth = auth
        self.username = username
        self.password = password
        self.token_server = token_server
        self.blob_host = blob_host
        self.storage = directory / "storage"
        self.log = directory / "registry.log"

    def __repr__(self) -> str:
        return f"RegistryServer({self.url}, auth {self.auth}, pid {self.pid})"

    def ref(self, name: str, tag: str = "latest") -> str:
        separator = "@" if tag.startswith("sha256:") else ":"
        return f"docker://{self.host}/{name}{separator}{tag}"

    def docker_config(self) -> dict[str, Any]:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"auths": {self.host: {"auth": token}}}

    # --- skopeo ---------------------------------------------------------------------------------------------------

    def tls_flags(self, side: str = "") -> list[str]:
        """skopeo's flags to reach this registry: side "src" or "dest" (copy), "" (inspect, delete)."""
        prefix = f"--{side}-" if side else "--"
        if not self.https:
            return [f"{prefix}tls-verify=false"]
        assert self.cert_dir is not None
        return [f"{prefix}cert-dir", self.cert_dir]

    def creds_flags(self, side: str = "") -> list[str]:
        prefix = f"--{side}-" if side else "--"
        return [f"{prefix}creds", f"{self.username}:{self.password}"] if self.username else []

    def skopeo(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run skopeo with an environment of this registry's own (no host auth file, no shared TMPDIR)."""
        home = self.directory / "skopeo-home"
        home.mkdir(exist_ok=True)
        auth_file = home / "auth.json"
        if not auth_file.exists():
            auth_file.write_text("{}")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home), "XDG_RUNTIME_DIR": str(home),
               "REGISTRY_AUTH_FILE": str(auth_file)}
        done = subprocess.run([SKOPEO, "--insecure-policy", *args], capture_output=True, text=True, env=env,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RegistryError(f"skopeo {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}")
        return done

    def push(self, layout: Path, name: str, *, tag: str = "latest", source_tag: str | None = None,
             format: str | None = None, all: bool = True) -> str:
        """Copy oci:LAYOUT:SOURCE_TAG to docker://HOST/NAME:TAG; the digest of what was pushed."""
        (self.directory / "skopeo-home").mkdir(exist_ok=True)
        digest_file = self.directory / "skopeo-home" / f"digest-{secrets.token_hex(8)}"
        flags = ["--all"] if all else []
        if format is not None:
            flags += ["--format", format]
        self.skopeo("copy", *flags, "--digestfile", str(digest_file), *self.tls_flags("dest"),
                    *self.creds_flags("dest"), f"oci:{layout}:{source_tag or tag}", self.ref(name, tag))
        try:
            return digest_file.read_text().strip()
        finally:
            digest_file.unlink()

    # --- the registry API, for what skopeo cannot push ------------------------------------------------------------

    def upload(self, item: Image | Index, name: str, tag: str | None = "latest") -> str:
        """Push `item` byte for byte through the distribution API; its digest."""
        self._upload(item, name)
        if tag is not None:
            self._put_manifest(name, tag, item.data, item.media_type)
        return item.digest

    def _upload(self, item: Image | Index, name: str) -> None:
        if isinstance(item, Index):
            for child in item.manifests:
                self._upload(child, name)
        else:
            for layer in item.layers:
                self._put_blob(name, layer.digest, layer.data)
            self._put_blob(name, item.config_digest, item.config_data)
        self._put_manifest(name, item.digest, item.data, item.media_type)

    def _put_blob(self, name: str, digest: str, data: bytes) -> None:
        try:
            self._call("HEAD", f"/v2/{name}/blobs/{digest}", name)
            return  # already there
        except urllib.error.HTTPError as error:
            if error.code == 307:
                return  # there, and served by the blob host
            if error.code != 404:
                raise
        started = self._call("POST", f"/v2/{name}/blobs/uploads/", name)
        location = urllib.parse.urljoin(self.url + "/", started.headers["Location"])
        separator = "&" if "?" in location else "?"
        self._call("PUT", f"{location}{separator}digest={urllib.parse.quote(digest)}", name, data,
                   "application/octet-stream")

    def _put_manifest(self, name: str, reference: str, data: bytes, media_type: str) -> None:
        self._call("PUT", f"/v2/{name}/manifests/{reference}", name, data, media_type)

    def _call(self, method: str, path: str, name: str, data: bytes | None = None,
              content_type: str | None = None) -> _Answer:
        url = path if path.startswith(("http://", "https://")) else self.url + path
        request = urllib.request.Request(url, data=data if data is not None else b"" if method in ("PUT", "POST")
                                         else None, method=method)
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.auth == "basic":
            request.add_header("Authorization", "Basic " + base64.b64encode(
                f"{self.username}:{self.password}".encode()).decode())
        elif self.auth == "token":
            assert self.token_server is not None
            token = self.token_server.token(self.username, [{"type": "repository", "name": name,
                                                             "actions": ["pull", "push"]}])
            request.add_header("Authorization", f"Bearer {token}")
        # Redirects are not followed: urllib would send our Authorization to the blob host, whose records
        # the tests read.
        opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(
            context=ssl.create_default_context(cafile=self.ca_file) if self.https else None))
        with opener.open(request, timeout=60) as answer:
            answer.read()
            return _Answer(answer.status, dict(answer.headers.items()))

    # --- lifetime -------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        stop_process(self.process)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx answer becomes an HTTPError for the caller


class _Answer:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers


# --- processes and ports -------------------------------------------------------------------------------------------


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaped. Only this process, by its PID."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now. Someone may take it before the registry binds it: the caller retries."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


# --- certificates --------------------------------------------------------------------------------------------------


def _openssl(*args: str, input: bytes | None = None) -> bytes:
    done = subprocess.run([OPENSSL, *args], input=input, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise RegistryError(f"openssl {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def make_tls(directory: Path) -> tuple[str, str, str]:
    """A self-signed CA and a server certificate for 127.0.0.1 / localhost signed by it (P-256 keys).

    Returns (ca_file, cert_file, key_file); ca_file is alone in directory/ca (skopeo's --cert-dir).
    """
    ca_dir = directory / "ca"
    ca_dir.mkdir(parents=True, exist_ok=True)
    for path in (directory, ca_dir):
        path.chmod(0o755)  # the CA certificate is for every client, the unprivileged test user's too
    ca_key, ca_file = directory / "ca.key", ca_dir / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca_file), "-days", "7", "-subj", "/CN=singpy tests CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    extensions = directory / "server.ext"
    extensions.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                          "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                          "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_file), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "7", "-extfile", str(extensions))
    Path(ca_file).chmod(0o644)
    return str(ca_file), str(cert), str(key)


# --- small HTTP servers on threads ---------------------------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a stalled handler must not hold up shutdown (stalls are released first anyway)
    owner: Any = None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: what matters is recorded by the owner."""

    def send_body(self, status: int, body: bytes, content_type: str = "application/json",
                  headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def lowered_headers(self) -> dict[str, str]:
        return {key.lower(): value for key, value in self.headers.items()}


def _serve(address: str, handler: type[_Handler], owner: object) -> tuple[_Server, threading.Thread]:
    server = _Server((address, 0), handler)
    server.owner = owner
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                              name=f"{type(owner).__name__}-{server.server_address[1]}")
    thread.start()
    return server, thread


def _shutdown(server: _Server, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(10)


# --- the token server ----------------------------------------------------------------------------------------------


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
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key_file, "-out", self.cert_file,
                 "-days", "7", "-subj", "/CN=singpy test token issuer")
        pem = Path(self.cert_file).read_text()
        self._x5c = "".join(pem.split("-----")[2].split())  # the DER certificate, base64 (standard, padded)
        self._lock = threading.Lock()
        self._requests: list[TokenRequest] = []
        self._server, self._thread = _serve("127.0.0.1", _TokenHandler, self)
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
        signature = _openssl("dgst", "-sha256", "-sign", self.key_file, input=signing_input.encode())
        return f"{signing_input}.{_b64url(signature)}"

    def stop(self) -> None:
        _shutdown(self._server, self._thread)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenHandler(_Handler):
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


# --- the blob host (a redirect target that behaves like S3) --------------------------------------------------------


class BlobRequest:
    """One request the blob host got (headers with lower-case names)."""

    def __init__(self, *, method: str, path: str, digest: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.digest, self.headers = method, path, digest, headers
        self.status = 0

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")

    @property
    def range(self) -> str | None:
        return self.headers.get("range")

    def __repr__(self) -> str:
        return f"BlobRequest({self.method} {self.digest or self.path} range={self.range} status={self.status})"


class Stall:
    """A blob response held after `after` bytes until release() (see BlobHost.stall)."""

    def __init__(self, digest: str, after: int) -> None:
        self.digest, self.after = digest, after
        self.reached = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()


class BlobHost:
    """Serves the files of a registry's storage on 127.0.0.2 like S3 serves pre-signed URLs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._requests: list[BlobRequest] = []
        self._stalls: dict[str, Stall] = {}
        self._all_stalls: list[Stall] = []
        self._failures: dict[str, tuple[int, int, dict[str, str]]] = {}
        self._server, self._thread = _serve(BLOB_HOST_ADDRESS, _BlobHandler, self)
        self.port = self._server.server_address[1]
        self.host = f"{BLOB_HOST_ADDRESS}:{self.port}"
        self.url = f"http://{self.host}"

    def __repr__(self) -> str:
        return f"BlobHost({self.url})"

    @property
    def requests(self) -> list[BlobRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, digest: str) -> list[BlobRequest]:
        return [request for request in self.requests if request.digest == digest]

    def stall(self, digest: str, after: int) -> Stall:
        stall = Stall(digest, after)
        with self._lock:
            self._stalls[digest] = stall
            self._all_stalls.append(stall)
        return stall

    def fail(self, digest: str, status: int = 503, times: int = 1, headers: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._failures[digest] = (status, times, dict(headers if headers is not None else {"Retry-After": "1"}))

    def record(self, request: BlobRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def take_stall(self, digest: str) -> Stall | None:
        with self._lock:
            return self._stalls.pop(digest, None)

    def take_failure(self, digest: str) -> tuple[int, dict[str, str]] | None:
        with self._lock:
            if digest not in self._failures:
                return None
            status, times, headers = self._failures[digest]
            if times <= 1:
                del self._failures[digest]
            else:
                self._failures[digest] = (status, times - 1, headers)
            return status, headers

    def stop(self) -> None:
        with self._lock:
            for stall in self._all_stalls:
                stall.release()
        _shutdown(self._server, self._thread)


_S3_AUTH_ERROR = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code><Message>Only one '
                  b"auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string "
                  b"parameter or the Authorization header should be specified</Message></Error>")


class _BlobHandler(_Handler):
    def do_GET(self) -> None:
        self._blob()

    def do_HEAD(self) -> None:
        self._blob()

    def _blob(self) -> None:
        owner: BlobHost = self.server.owner
        path = urllib.parse.urlsplit(self.path).path
        request = BlobRequest(method=self.command, path=path, digest=_digest_of(path),
                              headers=self.lowered_headers())
        owner.record(request)
        if request.authorization is not None:
            request.status = 400
            self.send_body(400, _S3_AUTH_ERROR, "application/xml")
            return
        failure = owner.take_failure(request.digest) if self.command == "GET" else None
        if failure is not None:
            request.status = failure[0]
            self.send_body(failure[0], b"<Error><Code>SlowDown</Code></Error>", "application/xml", failure[1])
            return
        target = (owner.root / path.lstrip("/")).resolve()
        if not target.is_relative_to(owner.root.resolve()) or not target.is_file():
            request.status = 404
            self.send_body(404, b"<Error><Code>NoSuchKey</Code></Error>", "application/xml")
            return
        data = target.read_bytes()
        status, start, end = _byte_range(request.range, len(data))
        request.status = status
        if status == 416:
            self.send_body(416, b"", headers={"Content-Range": f"bytes */{len(data)}"})
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        stall = owner.take_stall(request.digest) if self.command == "GET" else None
        if stall is None:
            self.wfile.write(data[start:end])
            return
        self.wfile.write(data[start:start + stall.after])
        self.wfile.flush()
        stall.reached.set()
        stall.released.wait(STALL_LIMIT)
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _digest_of(path: str) -> str:
    """The digest a storage path names: .../blobs/sha256/ab/abcdef.../data -> sha256:abcdef..."""
    parts = path.strip("/").split("/")
    if len(parts) >= 5 and parts[-1] == "data" and parts[-5] == "blobs":
        return f"{parts[-4]}:{parts[-2]}"
    return ""


def _byte_range(header: str | None, size: int) -> tuple[int, int, int]:
    """(status, start, end) for a Range header of the forms bytes=N- and bytes=N-M."""
    if not header or not header.startswith("bytes=") or "," in header:
        return 200, 0, size
    first, _, last = header[len("bytes="):].partition("-")
    try:
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return 200, 0, size
    if start >= size or start >= end:
        return 416, 0, 0
    return 206, start, end


# --- starting servers ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def start_token_server(directory: Path, **options: Any) -> Iterator[TokenServer]:
    """A TokenServer (options: users, public_prefix, lifetime), stopped when the block ends."""
    server = TokenServer(directory, **options)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def start_registry(directory: Path, *, auth: str = "none", tls: bool = False, redirect: bool = False,
                   token_server: TokenServer | None = None, username: str = USERNAME,
                   password: str = PASSWORD) -> Iterator[RegistryServer]:
    """A docker-registry in `directory` (created; holds config, storage, certificates, log), and the servers it
    needs, all stopped when the block ends.

    auth: "none" (anonymous pull and push), "basic" (htpasswd, bcrypt, one user) or "token" (Bearer tokens from
    `token_server`, or from one started here). tls: HTTPS with a CA of its own. redirect: blob requests are
    redirected to a BlobHost serving the storage.
    """
    if auth not in ("none", "basic", "token"):
        raise ValueError(f"unknown auth {auth!r}")
    with contextlib.ExitStack() as stack:
        directory.mkdir(parents=True, exist_ok=True)
        storage = directory / "storage"
        storage.mkdir(exist_ok=True)
        config: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"secret": secrets.token_hex(16), "headers": {"X-Content-Type-Options": ["nosniff"]}},
        }
        if auth == "basic":
            config["auth"] = {"htpasswd": {"realm": "singpy-tests", "path": _htpasswd(directory, username, password)}}
        elif auth == "token":
            if token_server is None:
                token_server = stack.enter_context(start_token_server(directory / "token-server"))
            config["auth"] = {"token": {"realm": token_server.realm, "service": token_server.service,
                                        "issuer": token_server.issuer, "rootcertbundle": token_server.cert_file}}
        else:
            username = password = ""
        ca_file = None
        if tls:
            ca_file, cert, key = make_tls(directory / "tls")
            config["http"]["tls"] = {"certificate": cert, "key": key}
        blob_host = None
        if redirect:
            blob_host = BlobHost(storage)
            stack.callback(blob_host.stop)
            config["middleware"] = {"storage": [{"name": "redirect", "options": {"baseurl": blob_host.url}}]}
        server = _launch(directory, config, https=tls, ca_file=ca_file, auth=auth, username=username,
                         password=password, token_server=token_server if auth == "token" else None,
                         blob_host=blob_host)
        stack.callback(server.stop)
        yield server


def _htpasswd(directory: Path, username: str, password: str) -> str:
    line = subprocess.run(["htpasswd", "-Bbn", username, password], capture_output=True, text=True,
                          check=True).stdout.strip()
    path = directory / "htpasswd"
    path.write_text(line + "\n")
    return str(path)


def _launch(directory: Path, config: dict[str, Any], **server: Any) -> RegistryServer:
    """Start the registry on a free port, retrying with another port if someone took it meanwhile."""
    log_path = directory / "registry.log"
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        config_path = directory / "config.yml"
        config_path.write_text(json.dumps({**config, "http": {**config["http"], "addr": f"127.0.0.1:{port}"}},
                                          indent=2))  # JSON is YAML
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            # A clean environment: REGISTRY_* variables would override the config file.
            process = subprocess.Popen([REGISTRY, "serve", str(config_path)], stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, env={"PATH": "/usr/bin:/bin"}, cwd=directory)
        registry = RegistryServer(directory, process, port, **server)
        try:
            ready = _wait_ready(registry)
        except BaseException:
            registry.stop()
            raise
        if ready:
            return registry
        registry.stop()
        with open(log_path, "rb") as log:
            log.seek(start)
            if b"address already in use" not in log.read():
                break
    raise RegistryError(f"docker-registry did not start; its log ({log_path}):\n"
                        f"{log_path.read_text(errors='replace')[-3000:]}")


def _wait_ready(registry: RegistryServer) -> bool:
    """Whether GET /v2/ answers (200, or 401 asking for credentials) before the process exits or times out."""
    deadline = time.monotonic() + START_TIMEOUT
    context = ssl.create_default_context(cafile=registry.ca_file) if registry.https else None
    while time.monotonic() < deadline and registry.process.poll() is None:
        try:
            with urllib.request.urlopen(f"{registry.url}/v2/", timeout=2, context=context) as answer:
                ready = answer.status == 200
        except urllib.error.HTTPError as error:
            ready = error.code == 401
        except OSError:
            ready = False  # not listening yet: try again
        if ready:
            return True
        time.sleep(0.05)
    return False


# --- fixtures ------------------------------------------------------------------------------------------------------


def _fixture_directory(workdir: Path, kind: str) -> Path:
    """A directory of the session's workdir, not pytest's tmp_path_factory: pytest makes its directories
    private (0700), and singpy run as the unprivileged test user must read the registry's ca_file."""
    parent = workdir / "registries"
    parent.mkdir(mode=0o755, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=parent))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session", name="registry_plain")
def fixture_registry_plain(workdir: Path) -> Iterator[RegistryServer]:
    """Plain HTTP, anonymous pull and push."""
    with start_registry(_fixture_directory(workdir, "plain")) as server:
        yield server


@pytest.fixture(scope="session", name="registry_basic")
def fixture_registry_basic(workdir: Path) -> Iterator[RegistryServer]:
    """Plain HTTP, Basic auth (htpasswd, bcrypt): alice / wonderland pull and push."""
    with start_registry(_fixture_directory(workdir, "basic"), auth="basic") as server:
        yield server


@pytest.fixture(scope="session", name="registry_token")
def fixture_registry_token(workdir: Path) -> Iterator[RegistryServer]:
    """Plain HTTP, Bearer token auth through its own `token_server`: anonymous pull on public/*, alice /
    wonderland pull and push on everything."""
    with start_registry(_fixture_directory(workdir, "token"), auth="token") as server:
        yield server


@pytest.fixture(scope="session", name="registry_tls")
def fixture_registry_tls(workdir: Path) -> Iterator[RegistryServer]:
    """HTTPS with a self-signed CA (ca_file, cert_dir: readable by everyone), anonymous pull and push."""
    with start_registry(_fixture_directory(workdir, "tls"), tls=True) as server:
        yield server


@pytest.fixture(scope="session", name="registry_redirect")
def fixture_registry_redirect(workdir: Path) -> Iterator[RegistryServer]:
    """Plain HTTP, Basic auth, blobs redirected to `blob_host` on 127.0.0.2 (refuses Authorization; stalls)."""
    with start_registry(_fixture_directory(workdir, "redirect"), auth="basic", redirect=True) as server:
        yield server


@pytest.fixture(scope="session", name="registry_redirect_token")
def fixture_registry_redirect_token(workdir: Path) -> Iterator[RegistryServer]:
    """Plain HTTP, token auth (its own `token_server`), blobs redirected to `blob_host` on 127.0.0.2."""
    with start_registry(_fixture_directory(workdir, "redirect-token"), auth="token", redirect=True) as server:
        yield server

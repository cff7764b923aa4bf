"""The docker-registry processes of the tests: RegistryServer (push, upload, skopeo) and start_registry.

Each registry is `/usr/bin/docker-registry serve CONFIG` started as a child process listening on
127.0.0.1:<free port>, with its config, storage, certificates and log in a directory of its own, and
stopped by PID (SIGTERM, then SIGKILL, always reaped) when its block ends. skopeo runs with a
HOME/TMPDIR/auth file of the registry's own directory. tests.support.registry re-exports every public name here.

`start_registry(directory, *, auth="none"|"basic"|"token", tls=False, redirect=False, token_server=None)` is
the context manager behind the registry_* fixtures, for a test that needs a registry of its own or another
combination (it stops everything on exit; with auth="token" and no token_server it starts one, with
tests.support.registry_tokens.start_token_server).

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
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.oci import Image, Index
from tests.support.registry_blobs import BlobHost
from tests.support.registry_tls import RegistryError, make_tls
from tests.support.registry_tokens import PASSWORD, USERNAME, TokenServer, start_token_server

REGISTRY = "/usr/bin/docker-registry"
SKOPEO = "/usr/bin/skopeo"
START_TIMEOUT = 20.0
PORT_ATTEMPTS = 5


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


# --- starting a registry -------------------------------------------------------------------------------------------


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

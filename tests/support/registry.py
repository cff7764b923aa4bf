"""The registry_* fixtures (a pytest plugin): real OCI registries for the tests, Debian's docker-registry 2.8.

Each registry is `/usr/bin/docker-registry serve CONFIG` (the CNCF distribution registry) started as a child
process listening on 127.0.0.1:<free port>, with its config, storage, certificates and log in a directory of
its own, and stopped by PID (SIGTERM, then SIGKILL, always reaped) when its fixture ends. The helper servers
(token server, blob host) are Python http.servers on threads of this process, on ports the kernel chose.
Nothing global is touched: no system service, no fixed port, skopeo runs with a HOME/TMPDIR/auth file of the
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

Every name below is importable from here (tests import RegistryServer, start_registry, USERNAME... from
tests.support.registry); each is documented in the module that owns it:

    tests.support.registry_server   RegistryServer (host, url, ref, push, upload, skopeo, tls_flags, creds_flags,
                                    docker_config), start_registry, stop_process, free_port
    tests.support.registry_tokens   TokenServer (realm, users, public_prefix, lifetime, expired, requests, token),
                                    TokenRequest, start_token_server, USERNAME, PASSWORD
    tests.support.registry_blobs    BlobHost (url, requests, requests_for, stall, fail), BlobRequest, Stall
    tests.support.registry_tls      make_tls, RegistryError
    tests.support.registry_http     the small HTTP server base the token server and the blob host share
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.registry_blobs import BLOB_HOST_ADDRESS, STALL_LIMIT, BlobHost, BlobRequest, Stall
from tests.support.registry_server import (
    PORT_ATTEMPTS,
    REGISTRY,
    SKOPEO,
    START_TIMEOUT,
    RegistryServer,
    free_port,
    start_registry,
    stop_process,
)
from tests.support.registry_tls import OPENSSL, RegistryError, make_tls
from tests.support.registry_tokens import (
    ISSUER,
    PASSWORD,
    REGISTRY_LEEWAY,
    SERVICE,
    USERNAME,
    TokenRequest,
    TokenServer,
    start_token_server,
)

__all__ = [
    "BLOB_HOST_ADDRESS", "ISSUER", "OPENSSL", "PASSWORD", "PORT_ATTEMPTS", "REGISTRY", "REGISTRY_LEEWAY", "SERVICE",
    "SKOPEO", "STALL_LIMIT", "START_TIMEOUT", "USERNAME", "BlobHost", "BlobRequest", "RegistryError",
    "RegistryServer", "Stall", "TokenRequest", "TokenServer", "free_port", "make_tls", "start_registry",
    "start_token_server", "stop_process",
]


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

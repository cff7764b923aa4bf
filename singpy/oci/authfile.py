"""`singpy registry login|logout|list`: credentials in Apptainer's file, checked with the registry first.

The file is `--authfile FILE` or else Apptainer's `~/.apptainer/docker-config.json`
(its internal/pkg/util/ociauth ChooseAuthFile), in Docker's config.json format:
`{"auths": {"HOST": {"auth": base64("user:password")}}}`, Docker Hub under the
key `https://index.docker.io/v1/`. Every other key of the file (credHelpers,
credsStore, other registries) is kept as it was. It is written whole or not at
all (a new 0600 file renamed over it: singpy.host.cachefiles.publish) in a
directory made 0700 if missing; singpy.oci.auth reads it on every pull and push.

Before anything is stored, the credentials are tried as Apptainer's
checkOCILogin tries them: `GET /v2/`, its 401 challenge answered (Basic, or a
Bearer token fetched from the realm with them), and `/v2/` asked again.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping

from singpy.errors import ImageError, UsageError
from singpy.oci.auth import DOCKER_HUB_KEY, Credentials, normalized_host
from singpy.oci.ref import DOCKER_HUB

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.transport import Transport

SCHEMES = ("docker://", "oras://")
_LIMIT = 1 << 16  # bytes of an answer to /v2/ or of a token read here


def credentials_file(authfile: str, home: str, env: Mapping[str, str]) -> str:
    """Where logins are kept: --authfile, else docker-config.json in ~/.apptainer (or $APPTAINER_CONFIGDIR)."""
    from singpy.host.hostfiles import user_config_dir

    return os.path.abspath(authfile) if authfile else os.path.join(user_config_dir(env, home), "docker-config.json")


def registry_of(uri: str) -> str:
    """HOST[:PORT][/PATH] of `docker://HOST` or `oras://HOST` (Docker Hub's names merged as docker.io)."""
    scheme = next((prefix for prefix in SCHEMES if uri.startswith(prefix)), "")
    rest = uri[len(scheme):].strip("/")
    if not scheme or not rest:
        raise UsageError(f"{uri[:100]!r} is not a registry: name it docker://HOST or oras://HOST",
                         hint="Run 'singpy registry login --help' for usage.")
    if not rest.isprintable() or any(char.isspace() for char in rest):
        raise UsageError(f"{uri[:100]!r} is not a registry: it holds spaces or control characters")
    host = normalized_host(rest.split("/", 1)[0])
    path = rest.split("/", 1)[1] if "/" in rest else ""
    return f"{host}/{path}" if path else host


def config_key(registry: str) -> str:
    """The auths key Docker and Apptainer write for `registry`."""
    return DOCKER_HUB_KEY if registry == DOCKER_HUB else registry


def read_config(path: str) -> dict[str, object]:
    """The file's JSON object ({} when there is no file)."""
    if not os.path.lexists(path):
        return {}
    from singpy.oci.auth import _read_config

    return _read_config(path)


def store_login(path: str, registry: str, credentials: Credentials) -> None:
    """Add (or replace) the login of `registry` in the file at `path`, every other entry kept."""
    config = read_config(path)
    auths = config.get("auths")
    if not isinstance(auths, dict):
        auths = {}
    for key in [key for key in auths if isinstance(key, str) and normalized_host(key) == registry]:
        del auths[key]  # one entry per registry, whatever spelling an older one had
    token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode("ascii")
    auths[config_key(registry)] = {"auth": token}
    config["auths"] = auths
    _write(path, config)


def remove_login(path: str, registry: str) -> bool:
    """Remove the login of `registry` from the file; False when there was none."""
    config = read_config(path)
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return False
    keys = [key for key in auths if isinstance(key, str) and normalized_host(key) == registry]
    if not keys:
        return False
    for key in keys:
        del auths[key]
    _write(path, config)
    return True


def logins(path: str) -> list[tuple[str, str]]:
    """(registry, username) of every login in the file, in its order (no password is ever returned)."""
    auths = read_config(path).get("auths")
    found: list[tuple[str, str]] = []
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        if not isinstance(key, str) or not isinstance(entry, dict):
            continue
        from singpy.oci.auth import _from_entry

        credentials = _from_entry(entry, path, key)
        if credentials is not None:
            found.append((normalized_host(key), credentials.username))
    return found


def _write(path: str, config: Mapping[str, object]) -> None:
    import json

    from singpy.host.cachefiles import make_private_dirs, publish

    directory = os.path.dirname(path)
    try:
        if not os.path.isdir(directory):
            make_private_dirs(directory, what="credentials directory")
        publish(path, (json.dumps(config, indent="\t") + "\n").encode())
    except OSError as error:
        raise ImageError(f"can't write the credentials file {path}: {error.strerror}") from None


def check_login(registry: str, credentials: Credentials, env: Mapping[str, str], *, https: bool) -> None:
    """Raise an ImageError unless `registry` accepts `credentials` (GET /v2/, its challenge answered)."""
    from singpy.oci.auth import Authenticator, AuthFailure, parse_challenges
    from singpy.oci.limits import Limits
    from singpy.oci.transport import Transport, TransportError

    host = registry.split("/", 1)[0]
    endpoint = "registry-1.docker.io" if host == DOCKER_HUB else host
    url = f"{'https' if https else 'http'}://{endpoint}/v2/"
    transport = Transport(env, Limits.from_env(env))

    def fetch(method: str, target: str, headers: dict[str, str], body: bytes | None,
              limit: int) -> tuple[int, bytes]:
        response = transport.request(method, target, headers, body)
        data = response.read(limit)
        transport.discard(target, response)
        return response.status, data

    authenticator = Authenticator(credentials=credentials, scope="", fetch=fetch, secure=https)
    try:
        status, challenges = _get(transport, url, {})
        if status == 401:
            authenticator.answer(parse_challenges(challenges), used=None)
            header = authenticator.header()
            status, _ = _get(transport, url, {"Authorization": header} if header else {})
    except AuthFailure as failure:
        raise ImageError(f"login to {registry} failed: {failure.reason}") from None
    except TransportError as error:
        advice = " (a private CA: set SSL_CERT_FILE; a plain-HTTP registry: use --no-https)" if error.tls else ""
        raise ImageError(f"can't reach registry {registry}: {error.reason}{advice}") from None
    finally:
        transport.close()
    if status == 200:
        return
    who = f"the password of {credentials.username!r} was refused" if status == 401 else f"it answered HTTP {status}"
    raise ImageError(f"login to {registry} failed: {who}")


def _get(transport: Transport, url: str, headers: dict[str, str]) -> tuple[int, list[str]]:
    """The status of GET `url` and its WWW-Authenticate values (the body is discarded)."""
    response = transport.request("GET", url, headers)
    challenges = response.headers.get_all("WWW-Authenticate") or []
    transport.discard(url, response)
    return response.status, challenges

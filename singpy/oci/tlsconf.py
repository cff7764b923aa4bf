"""The TLS trust of registry connections: which CA certificates verify a registry (singpy.oci.transport's rule).

Apart from transport.py so that singpy.oci.quickhead (a cached tag's check) verifies a registry exactly as
a pull does without importing http.client.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

from singpy.errors import ImageError

_CERTS_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")


def tls_context(env: Mapping[str, str], extra_files: tuple[str, ...] = (), *,
                system_dir_only: bool = False) -> ssl.SSLContext:
    """Verification against the system store, SSL_CERT_FILE/SSL_CERT_DIR and `extra_files` (a host's certs.d).

    `system_dir_only`: the system store's hashed directory alone where there is one, not its bundle file too
    (parsing the bundle costs 25-40 ms; the directory is looked up lazily). Debian's holds the same
    certificates; elsewhere it may hold fewer, never more: a caller that gets a verification failure asks
    again with the whole store (singpy.oci.quickhead leaves it to the full client).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates and host names
    defaults = ssl.get_default_verify_paths()
    system_file = defaults.openssl_cafile if os.path.isfile(defaults.openssl_cafile) else None
    system_dir = defaults.openssl_capath if os.path.isdir(defaults.openssl_capath) else None
    if system_dir_only and system_dir:
        system_file = None
    if system_file or system_dir:
        context.load_verify_locations(cafile=system_file, capath=system_dir)
    else:
        context.set_default_verify_paths()
    for variable, kind in (("SSL_CERT_FILE", "cafile"), ("SSL_CERT_DIR", "capath")):
        value = env.get(variable, "")
        for path in value.split(":") if kind == "capath" else [value]:
            if path:
                _load(context, variable, path, kind)
    for path in extra_files:
        _load(context, os.path.dirname(path), path, "cafile")
    return context


def host_ca_files(netloc: str) -> tuple[str, ...]:
    """The CA certificates podman and Docker trust for one registry: certs.d/HOST[:PORT]/*.crt."""
    found: list[str] = []
    for base in _CERTS_DIRS:
        directory = os.path.join(base, netloc)
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        found += [os.path.join(directory, name) for name in names if name.endswith(".crt")]
    return tuple(found)


def _load(context: ssl.SSLContext, origin: str, path: str, kind: str) -> None:
    try:
        if kind == "cafile":
            context.load_verify_locations(cafile=path)
        elif os.path.isdir(path):
            context.load_verify_locations(capath=path)
    except (OSError, ssl.SSLError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
        raise ImageError(f"can't load the CA certificates of {origin} from {path[:200]}: {reason}") from None

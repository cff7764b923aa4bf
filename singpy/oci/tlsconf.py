"""The TLS trust of registry connections: which CA certificates verify a registry (singpy.oci.transport's rule).

Apart from transport.py so that singpy.oci.quickhead (a cached tag's check) verifies a registry exactly as
a pull does without importing http.client. Built on `_ssl` (the C module `ssl` wraps), imported only where a
context is made (a cached tag's check over TLS may run on singpy.oci._tlscheck instead): importing `ssl` costs
~9 ms of Python (its enums, `socket`, `base64`) that a cached tag's check would otherwise spend on every run;
`ssl.SSLContext` is `_ssl._SSLContext` with Python methods added, so both verify alike.
"""

from __future__ import annotations

import os

from singpy.errors import ImageError

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    import _ssl
    import ssl
    from collections.abc import Mapping

_CERTS_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")


def tls_context(env: Mapping[str, str], extra_files: tuple[str, ...] = ()) -> ssl.SSLContext:
    """Verification against the system store, SSL_CERT_FILE/SSL_CERT_DIR and `extra_files` (a host's certs.d)."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies certificates and host names
    trust(context, env, extra_files)
    return context


def quick_context(env: Mapping[str, str], extra_files: tuple[str, ...] = ()) -> _ssl._SSLContext:
    """The same verification as tls_context's on a bare `_ssl` context (no `ssl` import), with the system
    store's hashed directory alone (see trust's `system_dir_only`): for singpy.oci.quickhead."""
    import _ssl

    context = _ssl._SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    context.verify_mode = _ssl.CERT_REQUIRED  # PROTOCOL_TLS_CLIENT's own defaults, said where they are relied on
    context.check_hostname = True
    trust(context, env, extra_files, system_dir_only=True)
    return context


def trust(context: _ssl._SSLContext, env: Mapping[str, str], extra_files: tuple[str, ...] = (), *,
          system_dir_only: bool = False) -> None:
    """Load into `context` the CA certificates a registry is verified against.

    `system_dir_only`: the system store's hashed directory alone where there is one, not its bundle file too
    (parsing the bundle costs 25-40 ms; OpenSSL looks the directory up lazily, by the issuer's name hash).
    Debian's holds the same certificates; elsewhere it may hold fewer, never more: a caller that gets a
    verification failure asks again with the whole store (singpy.oci.quickhead leaves it to the full client).
    singpy/oci/_tlscheck_tls.c's `system_trust` loads the same in the check's helper: a change here is a change
    there.
    """
    import _ssl

    _, default_file, _, default_dir = _ssl.get_default_verify_paths()  # OpenSSL's built-in paths
    system_file = default_file if os.path.isfile(default_file) else None
    system_dir = default_dir if os.path.isdir(default_dir) else None
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


def _load(context: _ssl._SSLContext, origin: str, path: str, kind: str) -> None:
    try:
        if kind == "cafile":
            context.load_verify_locations(cafile=path)
        elif os.path.isdir(path):
            context.load_verify_locations(capath=path)
    except OSError as error:  # _ssl.SSLError (ssl.SSLError) is an OSError
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
        raise ImageError(f"can't load the CA certificates of {origin} from {path[:200]}: {reason}") from None

"""The TLS of a cached tag's check (singpy.oci.quickhead), in a helper process or on the launcher's thread.

Where singpy.oci._tlscheck and its helper program were built (make setup: a compiler and OpenSSL's headers),
the whole exchange runs in `_tlscheck_helper` (`threaded`): loading OpenSSL, its first context, the handshake,
the request and the answer's head, on the other core while the launcher imports and prepares (issue 31: ~10
ms of the launcher's CPU over TLS; the helper may even be started as soon as the command line names an image,
singpy.oci.tagcheck.prepare_early). Elsewhere the check makes the same exchange through `_ssl`, the C module
`ssl` wraps, on the launcher's thread (`tls_object`, `TLSStream`). Both verify as a pull does
(singpy.oci.tlsconf), with `trust_env`'s one difference in how the trust is loaded.
"""

from __future__ import annotations

import _socket

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def ssl_waits() -> tuple[type[BaseException], ...]:
    """_ssl's want-read and want-write errors where _ssl is loaded (an https check), else none."""
    import sys

    ssl_module = sys.modules.get("_ssl")
    return (ssl_module.SSLWantReadError, ssl_module.SSLWantWriteError) if ssl_module else ()


def threaded(fd: int, host: str, request: bytes, endpoint: str, env: Mapping[str, str], *, left: float,
             waits: tuple[float, float], limit: int) -> Any:
    """The TLS exchange of `request` over socket `fd` (its connect() under way) handed to the check's helper
    (singpy/oci/_tlscheck.c: the request leaves on its `go()`, `result()` is the answer's head); None where the
    module or its helper was not built (`tls_object` on this thread, as before). `left`: seconds to the answer's
    deadline; `waits`: the connect's and each read's limits; `limit`: the head's bytes."""
    try:
        from singpy.oci import _tlscheck  # type: ignore[attr-defined]  # a C extension, built by make setup
    except ImportError:
        return None
    if _tlscheck.helper() is None:
        return None
    import os

    from singpy.oci.tlsconf import host_ca_files

    extra = b"\0".join(map(os.fsencode, host_ca_files(endpoint.removesuffix(":443"))))
    return _tlscheck.start(fd, host.encode("ascii"), request, *trust_variables(env), extra, *waits, left, limit)


def trust_variables(env: Mapping[str, str]) -> tuple[bytes, bytes]:
    """SSL_CERT_FILE and SSL_CERT_DIR of `env`, for the check's helper (which applies trust_env's rule itself);
    one started ahead (singpy.oci.tagcheck.prepare) loads them too, and its context is taken only for the same
    ones."""
    import os

    return os.fsencode(env.get("SSL_CERT_FILE", "")), os.fsencode(env.get("SSL_CERT_DIR", ""))


def tls_object(sock: _socket.socket, host: str, endpoint: str, env: Mapping[str, str]) -> Any:
    """The `_ssl` object over `sock`, verifying as a pull does (singpy.oci.quickhead._wrap says how; its
    handshake is the caller's)."""
    from singpy.oci.tlsconf import host_ca_files, quick_context

    context = quick_context(trust_env(env), host_ca_files(endpoint.removesuffix(":443")))
    return context._wrap_socket(sock, False, host)  # type: ignore[attr-defined]  # not in typeshed


def trust_env(env: Mapping[str, str]) -> Mapping[str, str]:
    """`env` for the quick context's trust: without SSL_CERT_FILE where it names the system's own bundle (as
    many sites' and CI's environments do): the system's hashed directory, which quick_context loads anyway,
    holds the same certificates, looked up by name when needed, where parsing the bundle costs ~20 ms of CPU
    (~140 CAs) on every run. A certificate the directory lacks fails the quick check; the full client, which
    loads the whole bundle, then asks again (and is the one to refuse a certificate)."""
    import _ssl
    import os

    bundle = env.get("SSL_CERT_FILE", "")
    if not bundle:
        return env
    _, system_file, _, system_dir = _ssl.get_default_verify_paths()
    if not os.path.isdir(system_dir) or os.path.realpath(bundle) != os.path.realpath(system_file):
        return env
    return {name: value for name, value in env.items() if name != "SSL_CERT_FILE"}


class TLSStream:
    """The socket calls quickhead's _exchange and _read_head make, over TLS (`_ssl` reads and writes; the TCP socket's
    timeout bounds each)."""

    def __init__(self, sock: _socket.socket, tls: Any) -> None:
        self._sock, self._tls = sock, tls

    def settimeout(self, seconds: float) -> None:
        self._sock.settimeout(seconds)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view):]

    def recv(self, size: int) -> bytes:
        return bytes(self._tls.read(size))

    def close(self) -> None:
        self._sock.close()



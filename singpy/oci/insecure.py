"""The transport of a registry marked `insecure = true` in registries.conf (singpy.oci.mirrors).

Kept apart from mirrors.py so that reading registries.conf (every run of a docker:// tag) does not import
the HTTP client: only a pull that asks an insecure endpoint loads it.
"""

from __future__ import annotations

import ssl

from singpy import console
from singpy.oci.transport import Transport


class Unverified(Transport):
    """HTTPS without certificate checks, for the one registry marked `insecure = true`."""

    _unverified: ssl.SSLContext | None = None

    def _context(self, netloc: str) -> ssl.SSLContext:
        if self._unverified is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            self._unverified = context
        return self._unverified


def answers_https(transport: Transport, host: str) -> bool:
    """Whether an insecure registry speaks HTTPS (else plain HTTP is used): containers/image's ping of /v2/."""
    from singpy.oci.transport import TransportError

    url = f"https://{host}/v2/"
    try:
        response = transport.request("GET", url, {})
    except TransportError as error:
        console.debug(f"{host} does not answer HTTPS ({error.reason}): plain HTTP, as it is marked insecure")
        return False
    transport.discard(url, response)
    return True

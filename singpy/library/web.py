"""The library's one HTTP(S) door: requests with the token, JSON answers, downloads through redirects.

A library hands an image file out by redirecting to object storage (a presigned URL of another host). The
token goes with a request only to the library's own origin (scheme, host and port), never to the host a
redirect names: the Sylabs client's rule (`samehost`), and what a presigned URL expects (S3 refuses a
second credential). TLS verifies against the system store plus SSL_CERT_FILE / SSL_CERT_DIR
(singpy.oci.tlsconf.tls_context); the proxy variables are honoured as for docker:// (`_connection`). Every
failure is one RemoteError naming the URL.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from singpy.library.remotes import RemoteError

TIMEOUT = 60.0  # seconds without a byte before giving up
MAX_REDIRECTS = 10
MAX_JSON = 16 << 20
USER_AGENT = "singpy (apptainer-compatible)"
_REDIRECTS = (301, 302, 303, 307, 308)


class HTTPError(RemoteError):
    """The server answered, with a status that is not success: `status` and the message it gave."""

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def request(method: str, url: str, env: Mapping[str, str], *, token: str = "", body: bytes | None = None,
            headers: Mapping[str, str] | None = None, stream: Any = None, length: int = -1,
            timeout: float = TIMEOUT) -> Any:
    """The open response to one request (no redirect followed); raises HTTPError on a 4xx/5xx. `timeout`:
    seconds the connection and each read may wait."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"can't use the URL {url[:200]}: not http:// or https://")
    try:
        port = parts.port
    except ValueError:
        raise RemoteError(f"can't use the URL {url[:200]}: bad port") from None
    connection, target, sent = _connection(parts, port, env, timeout)
    sent.update({"User-Agent": USER_AGENT, **(headers or {})})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if stream is not None:
        sent["Content-Length"] = str(length)
    try:
        connection.request(method, target, body=stream if stream is not None else body, headers=sent)
        response = connection.getresponse()
    except (OSError, http.client.HTTPException, UnicodeError) as error:  # UnicodeError: a host name IDNA refuses
        connection.close()
        raise RemoteError(f"can't reach {_shown(url)}: {_reason(error)}") from None
    if response.status >= 400:
        detail = _error_text(response)
        connection.close()
        raise HTTPError(f"{_shown(url)} answered {response.status} {response.reason}"
                        f"{': ' + detail if detail else ''}", status=response.status, detail=detail)
    return response


_BLOCK = 1 << 20  # bytes per read of an uploaded file (http.client's default, 8 KiB, means thousands of calls)


def _connection(parts: Any, port: int | None, env: Mapping[str, str],
                timeout: float = TIMEOUT) -> tuple[Any, str, dict[str, str]]:
    """The connection for a request to `parts` (a URL split), its request target and headers it needs.

    The proxy variables are honoured as for docker:// (singpy.oci.transport.proxy_for: https_proxy,
    http_proxy, all_proxy, no_proxy, in either case): https through a CONNECT tunnel, plain http by
    absolute URL, a proxy's credentials in Proxy-Authorization.
    """
    from singpy.errors import ImageError
    from singpy.oci.transport import proxy_for

    https = parts.scheme == "https"
    port = port or (443 if https else 80)
    try:
        proxy = proxy_for(parts.scheme, parts.hostname, port, env)
    except ImageError as error:
        raise RemoteError(error.message) from None
    host, connect_port = (proxy.host, proxy.port) if proxy is not None else (parts.hostname, port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers: dict[str, str] = {}
    if proxy is not None and proxy.authorization and not https:
        headers["Proxy-Authorization"] = proxy.authorization
    if not https:
        if proxy is not None:
            target = f"http://{parts.netloc.rpartition('@')[2]}{target}"
        return http.client.HTTPConnection(host, connect_port, timeout=timeout, blocksize=_BLOCK), target, headers
    from singpy.oci.tlsconf import tls_context

    connection = http.client.HTTPSConnection(host, connect_port, timeout=timeout, context=tls_context(env),
                                             blocksize=_BLOCK)
    if proxy is not None:
        tunnel = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
        connection.set_tunnel(parts.hostname, port, headers=tunnel)
    return connection, target, headers


def get_json(url: str, env: Mapping[str, str], *, token: str = "", method: str = "GET",
             data: Any = None, timeout: float = TIMEOUT) -> Any:
    """The JSON answer of `url` (its "data" member when the answer wraps it, as the library's do)."""
    body = json.dumps(data).encode() if data is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    response = request(method, url, env, token=token, body=body, headers=headers, timeout=timeout)
    try:
        raw = response.read(MAX_JSON + 1)
    except (OSError, http.client.HTTPException) as error:
        raise RemoteError(f"can't read the answer of {_shown(url)}: {_reason(error)}") from None
    finally:
        response.close()
    if len(raw) > MAX_JSON:
        raise RemoteError(f"the answer of {_shown(url)} is too large")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        raise RemoteError(f"the answer of {_shown(url)} is not JSON") from None
    return value.get("data", value) if isinstance(value, dict) else value


def download(url: str, env: Mapping[str, str], out: Any, *, token: str, progress: Any = None) -> int:
    """GET `url` into the binary file `out`, following redirects; the token only to `url`'s own origin.
    Returns the number of bytes written."""
    home = origin(url)
    for _ in range(MAX_REDIRECTS + 1):
        response = request("GET", url, env, token=token if origin(url) == home else "")
        if response.status in _REDIRECTS:
            location = response.getheader("Location") or ""
            response.close()
            if not location:
                raise RemoteError(f"{_shown(url)} redirected without a Location")
            url = urljoin(url, location)
            continue
        if response.status != 200:
            response.close()
            raise RemoteError(f"{_shown(url)} answered {response.status} {response.reason}")
        return _copy(response, out, url, progress)
    raise RemoteError(f"{_shown(url)}: stopped after {MAX_REDIRECTS} redirects")


def _copy(response: Any, out: Any, url: str, progress: Any) -> int:
    written = 0
    try:
        while chunk := response.read(1 << 20):
            out.write(chunk)
            written += len(chunk)
            if progress is not None:
                progress(len(chunk))
    except (OSError, http.client.HTTPException) as error:
        if isinstance(error, OSError) and error.errno is not None and not isinstance(error, TimeoutError):
            raise  # the disk, not the network: the caller says which file
        raise RemoteError(f"the download from {_shown(url)} failed: {_reason(error)}") from None
    finally:
        response.close()
    return written


def _error_text(response: Any) -> str:
    """The message of a library's JSON error ({"error": {"code", "message"}}), else nothing."""
    try:
        raw = response.read(1 << 16)
        value = json.loads(raw)
    except (OSError, ValueError, RecursionError, http.client.HTTPException):
        return ""
    error = value.get("error") if isinstance(value, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message[:300] if isinstance(message, str) else ""


def _shown(url: str) -> str:
    """The URL without its query (a presigned URL's signature is a credential)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"[:300]


def _reason(error: BaseException) -> str:
    import ssl

    if isinstance(error, ssl.SSLCertVerificationError):
        return (f"TLS certificate not trusted ({error.verify_message}): set SSL_CERT_FILE to the CA's "
                "certificate")
    if isinstance(error, UnicodeError):  # the IDNA codec refused the host name (a label of over 63 characters)
        return "not a valid host name"
    strerror = getattr(error, "strerror", None)
    return (strerror or str(error) or type(error).__name__)[:200]

"""A client of the OCI distribution protocol: manifests and blobs, verified, for one repository.

What a pull needs from a registry, and the ways registries differ, in one place:

* manifests are asked for with every media type singpy reads (OCI index and
  manifest, Docker v2 list and manifest) and checked by singpy.oci.manifest;
* every manifest and blob is verified against its digest (a manifest fetched
  by tag against Docker-Content-Digest when the registry sends one);
* 401 challenges are answered by singpy.oci.auth (Bearer tokens per scope,
  Basic); redirects (blob storage, CDNs) are followed, and Authorization goes
  only to the registry's own scheme, host and port, never to another host;
  a redirect from https to plain http is refused (the answer to a request
  made over TLS must not be one an attacker on the path can forge);
* 429 and 5xx answers and dropped connections are tried again as
  singpy.oci.retries says; how slow an answer may be and how JSON is parsed
  are singpy.oci.limits' rules; what a failure means, singpy.oci.regerrors';
* a blob is downloaded, resumed and verified by singpy.oci.blobfetch, over
  this client's requests.

`fetch_blob` is called from several threads at once on one Registry: each
thread has its own connections (singpy.oci.transport) and the token cache is
shared under a lock.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Mapping

from singpy.errors import ImageError
from singpy.oci.auth import LOGIN_HINT, Authenticator, AuthFailure, Credentials, parse_challenges
from singpy.oci.limits import Limits
from singpy.oci.manifest import ACCEPT, MANIFEST_LIMIT, Manifest, digest_hex, verified_manifest
from singpy.oci.ref import Reference, valid_digest, valid_tag
from singpy.oci.regerrors import ERROR_BODY_LIMIT, DigestMismatch, Unreachable, detail, error_codes
from singpy.oci.retries import RETRY_STATUSES, backoff, first, retry_after
from singpy.oci.transport import Origin, Transport, TransportError, _failure

CHUNK = 1 << 20  # bytes per read of a blob: few Python calls per MB
MAX_REDIRECTS = 10
_REDIRECT_STATUSES = frozenset((301, 302, 303, 307, 308))
_UPLOAD_METHODS = frozenset(("PUT", "PATCH", "POST"))


class Registry:
    """One repository of one registry (`ref`), with credentials found by the caller (or None: anonymous)."""

    def __init__(self, ref: Reference, *, env: Mapping[str, str], credentials: Credentials | None,
                 https: bool = True, transport: Transport | None = None) -> None:
        if ref.transport != "docker":
            raise ValueError(f"not a registry reference: {ref}")
        self.ref = ref
        self.host = ref.endpoint
        self.base = f"{'https' if https else 'http'}://{self.host}"
        try:
            self._origin = Origin(self.base).key
        except TransportError:  # a port over 65535: the reference grammar takes any digits, a URL does not
            raise ImageError(f"{self.host} is not a valid registry address (a port is a number up to 65535)") from None
        self.limits = Limits.from_env(env)
        self.transport = transport or Transport(env, self.limits)  # mirrors.py's skips TLS checks
        self._auth = Authenticator(credentials=credentials, scope=f"repository:{ref.repository}:pull",
                                   fetch=self._fetch_small, secure=https)
        self.sleep: Callable[[float], None] = time.sleep  # how retries wait

    def close(self) -> None:
        """Close the connections of all threads (none may be in use any more)."""
        self.transport.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- manifests ---------------------------------------------------------------------------------------------

    def manifest(self, reference: str) -> Manifest:
        """The manifest or index with tag or digest `reference`, verified and type-checked."""
        self._check_reference(reference)
        path = f"/v2/{self.ref.repository}/manifests/{reference}"
        data, response, _ = self._get_small(path, {"Accept": ACCEPT}, what=self._image(reference),
                                            limit=MANIFEST_LIMIT)
        content_type = (response.getheader("Content-Type") or "").partition(";")[0].strip().lower()
        sent_digest = (response.getheader("Docker-Content-Digest") or "").strip()
        return verified_manifest(reference, data, content_type, sent_digest, host=self.host,
                                 image=self._image(reference))

    def head_digest(self, reference: str) -> str | None:
        """The digest the registry reports for `reference` (HEAD: no body), or None when it reports none."""
        self._check_reference(reference)
        path = f"/v2/{self.ref.repository}/manifests/{reference}"
        response, url = self.request("HEAD", path, {"Accept": ACCEPT})
        status = response.status
        sent = (response.getheader("Docker-Content-Digest") or "").strip()
        self.transport.discard(url, response, limit=0)
        if status == 200:
            return sent if valid_digest(sent) else None
        self.raise_for(status, b"", url, self._image(reference), None)
        return None  # e.g. 405: a registry without HEAD (the caller asks with GET)

    # --- blobs -------------------------------------------------------------------------------------------------

    def blob_bytes(self, digest: str, limit: int = MANIFEST_LIMIT) -> bytes:
        """A small blob (an image config), verified, at most `limit` bytes."""
        self._check_digest(digest)
        data, _, source = self._get_small(self.blob_path(digest), {}, what=self.blob_name(digest), limit=limit)
        algorithm, _, expected = digest.partition(":")
        if digest_hex(algorithm, data) != expected:
            raise DigestMismatch(f"digest mismatch for blob {digest} from {source}: the download was discarded")
        return data

    def fetch_blob(self, digest: str, target: str, *, size: int | None,
                   progress: Callable[[int], None] | None = None) -> None:
        """Download blob `digest` to `target` (atomically, verified), resuming `target`.partial if there is one.

        `progress(n)` is called with the byte count of each chunk as it arrives, once at the start with the
        bytes a resumed partial file already holds, and with a negative count when a download restarts
        from zero (so a running sum is always the bytes held): singpy.oci.blobfetch.
        """
        self._check_digest(digest)
        from singpy.oci import blobfetch

        blobfetch.fetch_blob(self, digest, target, size=size, progress=progress)

    # --- requests ----------------------------------------------------------------------------------------------

    def _fetch_small(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
                     limit: int) -> tuple[int, bytes]:
        """For the token server: one request with retries, status and at most `limit` bytes of body."""
        tries = self.limits.retries
        for attempt in range(tries):
            try:
                response = self.transport.request(method, url, headers, body)
                if response.status in RETRY_STATUSES:
                    if attempt + 1 == tries:
                        self.transport.discard(url, response)
                        raise Unreachable(f"{Origin(url).netloc} (for registry {self.ref.registry}) answered HTTP "
                                          f"{response.status} {tries} times")
                    delay = first(retry_after(response), backoff(attempt))
                    self.transport.discard(url, response)
                    self.sleep(delay)
                    continue
                return response.status, self._read_small(response, url, limit, f"the answer of {Origin(url).netloc}")
            except TransportError as error:
                if not error.retriable or attempt + 1 == tries:
                    raise self.unreachable(error) from None
                self.sleep(backoff(attempt))
        raise AssertionError("unreachable")

    def _get_small(self, path: str, headers: dict[str, str], *, what: str,
                   limit: int) -> tuple[bytes, http.client.HTTPResponse, str]:
        """GET a body of at most `limit` bytes (a manifest, a config), tried again if the connection drops.

        Returns the body, the response (for its headers) and the host that sent it (after redirects).
        """
        tries = self.limits.retries
        for attempt in range(tries):
            response, url = self._get_checked("GET", path, headers, what=what)
            try:
                data = self._read_small(response, url, limit, what)
            except TransportError as error:
                if not error.retriable or attempt + 1 == tries:
                    raise self.unreachable(error) from None
                self.sleep(backoff(attempt))
                continue
            return data, response, Origin(url).netloc
        raise AssertionError("unreachable")

    def _get_checked(self, method: str, path: str, headers: dict[str, str], *,
                     what: str) -> tuple[http.client.HTTPResponse, str]:
        """A 200 response to `path` (redirects, auth and retries done); any other status is an ImageError."""
        response, url = self.request(method, path, headers)
        if response.status == 200:
            return response, url
        body = self.error_body(response, url)
        self.raise_for(response.status, body, url, what, response.reason)
        raise ImageError(f"registry {Origin(url).netloc} answered HTTP {response.status} for {what}"
                         f"{detail(body)}")

    def request(self, method: str, path: str, headers: dict[str, str],
                 range_from: int = 0, document: bool = True) -> tuple[http.client.HTTPResponse, str]:
        """Send `path` (of this registry) and follow: see exchange. Returns the final response and its URL."""
        return self.exchange(method, self.base + path, headers, range_from=range_from, document=document)

    def exchange(self, method: str, url: str, headers: dict[str, str], *, body: bytes | None = None,
                 range_from: int = 0, document: bool = True,
                 follow: bool = True) -> tuple[http.client.HTTPResponse, str]:
        """The one request loop of this client, a pull's and a push's (singpy.oci.oraspush): auth challenges
        answered once, retriable failures and statuses tried again, redirects followed unless not `follow`.

        `body` is sent with its Content-Length, again on each try (a push's chunk: bounded bytes in memory);
        an upload (PUT, PATCH, POST) without one says Content-Length: 0. Returns the final response (headers
        read) and its URL. `document`: see Transport.request.
        """
        tries = redirects = 0
        answered = False
        while True:
            send = dict(headers)
            if range_from:
                send["Range"] = f"bytes={range_from}-"
            if body is not None or method in _UPLOAD_METHODS:
                send["Content-Length"] = str(len(body or b""))
            to_registry = Origin(url).key == self._origin
            authorization = self._authorization() if to_registry else None
            if authorization:
                send["Authorization"] = authorization
            try:
                response = self.transport.request(method, url, send, body, document=document)
            except TransportError as error:
                tries += 1
                if not error.retriable or tries >= self.limits.retries:
                    raise self.unreachable(error) from None
                self.sleep(backoff(tries - 1))
                continue
            status = response.status
            if follow and status in _REDIRECT_STATUSES:
                location = response.getheader("Location") or ""
                self.transport.discard(url, response)
                redirects += 1
                url = self._redirect(url, location, redirects)
                continue
            if status == 401 and to_registry and not answered:
                challenges = parse_challenges(response.headers.get_all("WWW-Authenticate") or [])
                self.transport.discard(url, response)
                answered = True
                try:
                    self._auth.answer(challenges, used=authorization)
                except AuthFailure as failure:
                    raise self._denied(failure.reason) from None
                continue
            if status in RETRY_STATUSES and tries + 1 < self.limits.retries:
                delay = first(retry_after(response), backoff(tries))
                self.transport.discard(url, response)
                tries += 1
                self.sleep(delay)
                continue
            return response, url

    def _authorization(self) -> str | None:
        try:
            return self._auth.header()
        except AuthFailure as failure:
            raise self._denied(failure.reason) from None

    def _redirect(self, url: str, location: str, count: int) -> str:
        from urllib.parse import urljoin

        if count > MAX_REDIRECTS:
            raise ImageError(f"registry {self.host} redirected more than {MAX_REDIRECTS} times for {self.ref}")
        if not location or not location.isprintable() or not location.isascii():
            raise ImageError(f"registry {Origin(url).netloc} sent a redirect without a usable Location")
        try:
            target = urljoin(url, location.strip())
            scheme = Origin(target).scheme
        except (TransportError, ValueError):
            raise ImageError(f"registry {Origin(url).netloc} redirected to {location[:100]!r}, "
                             "which is not an http(s) URL") from None
        if scheme == "http" and url.startswith("https:"):
            raise ImageError(f"{Origin(url).netloc} (for registry {self.ref.registry}) redirected from HTTPS to "
                             f"plain HTTP ({target[:100]}): refused, the answer could be forged by anyone on the path")
        return target

    def _read_small(self, response: http.client.HTTPResponse, url: str, limit: int, what: str) -> bytes:
        """The whole body, at most `limit` bytes (a larger one is an ImageError and the connection is closed)."""
        length = response.getheader("Content-Length", "")
        if length.isascii() and length.isdigit() and int(length) > limit:
            self.transport.close_connection(url)
            raise ImageError(f"{what} from {Origin(url).netloc} is larger than {limit >> 20} MiB ({length} bytes)")
        chunks: list[bytes] = []
        total = 0
        try:
            while total <= limit:
                chunk = response.read(min(CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        except (OSError, http.client.HTTPException) as error:
            self.transport.close_connection(url)
            raise _failure(Origin(url).netloc, error, connecting=False) from None
        if total > limit:
            self.transport.close_connection(url)
            raise ImageError(f"{what} from {Origin(url).netloc} is larger than {limit >> 20} MiB")
        return b"".join(chunks)

    def error_body(self, response: http.client.HTTPResponse, url: str) -> bytes:
        try:
            return self._read_small(response, url, ERROR_BODY_LIMIT, "an error response")
        except (ImageError, TransportError):
            return b""

    # --- errors ------------------------------------------------------------------------------------------------

    def raise_for(self, status: int, body: bytes, url: str, what: str, reason: str | None) -> None:
        """Raise the ImageError a user should see for `status` (returns for the statuses it does not know)."""
        codes = error_codes(body)
        if status == 404 or codes & {"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"}:
            raise ImageError(f"{what} not found in registry {self.ref.registry}{detail(body)}")
        if status in (401, 403):
            if Origin(url).key != self._origin:
                raise self._denied(f"{Origin(url).netloc} answered HTTP {status}{detail(body)}")
            refusal = self._auth.refusal() if status == 401 else None
            raise self._denied(f"{refusal or f'HTTP {status}'}{detail(body)}")
        if status == 429 or status >= 500:
            raise Unreachable(f"registry {Origin(url).netloc} answered HTTP {status} "
                             f"{(reason or '').strip()[:60]} for {what} after {self.limits.retries} tries"
                             f"{detail(body)}"
                             .replace("  ", " "))

    def _denied(self, reason: str) -> ImageError:
        credentials = self._auth.credentials
        # How to log in is part of the message, not a hint: it is what the user needs to do next.
        advice = (f"check the credentials of {credentials.username!r} or " if credentials
                  else "the image may not exist, or it needs credentials: ") + LOGIN_HINT
        return ImageError(f"access to {self.ref} denied by {self.ref.registry}: {reason} ({advice})")

    def unreachable(self, error: TransportError) -> ImageError:
        if error.slow:  # Unreachable: a cached image may still run
            return Unreachable(f"{error.host} (for registry {self.ref.registry}) is too slow: {error.reason}")
        if error.malformed:
            return ImageError(f"{error.host} (for registry {self.ref.registry}) sent a malformed HTTP response: "
                              f"{error.reason}")
        if error.tls:
            return ImageError(f"can't make a TLS connection to {error.host}: {error.reason} (a private CA: set "
                              "SSL_CERT_FILE to its certificate; a plain-HTTP registry: use --no-https)")
        if error.host == self.host:
            return Unreachable(f"can't reach registry {error.host}: {error.reason}")
        return Unreachable(f"can't reach {error.host} (for registry {self.ref.registry}): {error.reason}")

    def _image(self, reference: str) -> str:
        separator = "@" if valid_digest(reference) else ":"
        return f"image docker://{self.ref.registry}/{self.ref.repository}{separator}{reference}"

    def blob_name(self, digest: str) -> str:
        return f"blob {digest} of docker://{self.ref.registry}/{self.ref.repository}"

    def blob_path(self, digest: str) -> str:
        return f"/v2/{self.ref.repository}/blobs/{digest}"

    def _check_reference(self, reference: str) -> None:
        if not (valid_digest(reference) or valid_tag(reference)):
            raise ImageError(f"{reference[:100]!r} is neither a tag nor a sha256 digest")

    def _check_digest(self, digest: str) -> None:
        if not valid_digest(digest):
            raise ImageError(f"unsupported digest {digest[:100]!r} in the manifest of {self.ref}")

"""A client of the OCI distribution protocol: manifests and blobs, verified, for one repository.

What a pull needs from a registry, and the ways registries differ, in one place:

* manifests are asked for with every media type singpy reads (OCI index and
  manifest, Docker v2 list and manifest); the type is taken from the body's
  `mediaType`, else from Content-Type, else inferred (`manifests` means an
  index, `layers` a manifest: OCI lets `mediaType` out); Docker's schema 1 is
  refused by name. The JSON is untrusted: sizes are bounded (4 MiB) and every
  field used later is type-checked here, so a malformed manifest is one
  ImageError, never a KeyError;
* every manifest and blob is verified against its digest (a manifest fetched
  by tag against Docker-Content-Digest when the registry sends one);
* 401 challenges are answered by singpy.oci.auth (Bearer tokens per scope,
  Basic); redirects (blob storage, CDNs) are followed, and Authorization goes
  only to the registry's own scheme, host and port, never to another host;
  a redirect from https to plain http is refused (the answer to a request
  made over TLS must not be one an attacker on the path can forge);
* 429 and 5xx answers and dropped connections are tried again, limits.retries
  in all, after an exponential backoff or the Retry-After the server asked for
  (capped at RETRY_AFTER_CAP); how slow an answer may be and how JSON is
  parsed are singpy.oci.limits' rules;
* a blob goes to TARGET.partial, opened for appending: a cut download (this
  run's or an earlier one's) is resumed with `Range: bytes=N-`, the bytes
  already there hashed first; a server that answers 200 instead of 206 (or
  416) restarts it from zero; tries in a row that bring no byte beyond the
  furthest one had are bounded (a registry that ignores Range and cuts every
  answer short fails the pull). It is fsynced and renamed to TARGET only once
  verified; a mismatch removes it.

`fetch_blob` is called from several threads at once on one Registry: each
thread has its own connections (singpy.oci.transport) and the token cache is
shared under a lock.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import random
import time
from collections.abc import Callable, Mapping

from singpy.errors import ImageError
from singpy.oci.auth import LOGIN_HINT, Authenticator, AuthFailure, Credentials, parse_challenges
from singpy.oci.limits import RETRIES, Limits, parse_json
from singpy.oci.ref import Reference, valid_digest, valid_tag
from singpy.oci.transport import Origin, Transport, TransportError, _failure
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
SCHEMA1_TYPES = ("application/vnd.docker.distribution.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v1+prettyjws")
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

MANIFEST_LIMIT = 4 << 20  # bytes of a manifest, an index or a config (real ones are a few KB)
CHUNK = 1 << 20  # bytes per read of a blob: few Python calls per MB
MAX_TRIES = RETRIES  # the default of limits.retries (SINGPY_PULL_RETRIES)
BACKOFF_BASE = 0.5  # seconds before the 2nd try, doubled for each further one ...
BACKOFF_CAP = 8.0  # ... up to this
RETRY_AFTER_CAP = 60.0  # seconds: a longer Retry-After is shortened to this
MAX_REDIRECTS = 10
_RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))
_REDIRECT_STATUSES = frozenset((301, 302, 303, 307, 308))
_ERROR_BODY_LIMIT = 1 << 16  # bytes of an error response read for its message
def _hasher(algorithm: str, data: bytes = b"") -> Any:
    """A new hash object (hashlib is imported when a digest is computed: not for a HEAD request)."""
    import hashlib

    return hashlib.new(algorithm, data)


def _hex(algorithm: str, data: bytes) -> str:
    return str(_hasher(algorithm, data).hexdigest())
_ROOM_HINT = "set SINGPY_CACHEDIR (or APPTAINER_CACHEDIR) to a directory on a filesystem with room"
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW


class Unreachable(ImageError):
    """The registry (or the host it sent us to) could not be reached, or kept failing (429/5xx) on every try.

    Distinct from a refusal or a missing image: a cached image may still run (singpy.oci.pull).
    """


class DigestMismatch(ImageError):
    """Bytes that are not what their digest names (singpy.oci.mirrors tells a lying mirror from a down one)."""


class CantWrite(ImageError):
    """The cache could not be written: another endpoint would not help (singpy.oci.mirrors)."""


class Manifest(Record):
    """A manifest or index as the registry sent it, verified."""

    media_type: str  # one of INDEX_TYPES or MANIFEST_TYPES
    digest: str  # "sha256:..." of `data`
    data: bytes  # the exact bytes (what the digest covers)
    body: dict[str, Any]  # the parsed JSON object, its descriptors type-checked

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


class Registry:
    """One repository of one registry (`ref`), with credentials found by the caller (or None: anonymous)."""

    def __init__(self, ref: Reference, *, env: Mapping[str, str], credentials: Credentials | None,
                 https: bool = True, transport: Transport | None = None) -> None:
        if ref.transport != "docker":
            raise ValueError(f"not a registry reference: {ref}")
        self.ref = ref
        self.host = ref.endpoint
        self.base = f"{'https' if https else 'http'}://{self.host}"
        self._origin = Origin(self.base).key
        self.limits = Limits.from_env(env)
        self._transport = transport or Transport(env, self.limits)  # mirrors.py's skips TLS checks
        self._auth = Authenticator(credentials=credentials, scope=f"repository:{ref.repository}:pull",
                                   fetch=self._fetch_small, secure=https)
        self.sleep: Callable[[float], None] = time.sleep  # how retries wait

    def close(self) -> None:
        """Close the connections of all threads (none may be in use any more)."""
        self._transport.close()

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
        return self._verified_manifest(reference, data, content_type, sent_digest)

    def head_digest(self, reference: str) -> str | None:
        """The digest the registry reports for `reference` (HEAD: no body), or None when it reports none."""
        self._check_reference(reference)
        path = f"/v2/{self.ref.repository}/manifests/{reference}"
        response, url = self._request("HEAD", path, {"Accept": ACCEPT})
        status = response.status
        sent = (response.getheader("Docker-Content-Digest") or "").strip()
        self._transport.discard(url, response, limit=0)
        if status == 200:
            return sent if valid_digest(sent) else None
        self._raise_for(status, b"", url, self._image(reference), None)
        return None  # e.g. 405: a registry without HEAD (the caller asks with GET)

    def _verified_manifest(self, reference: str, data: bytes, content_type: str, sent_digest: str) -> Manifest:
        image = self._image(reference)
        algorithm = reference.partition(":")[0] if valid_digest(reference) else "sha256"
        digest = f"{algorithm}:{_hex(algorithm, data)}"
        if valid_digest(reference) and digest != reference:
            raise DigestMismatch(f"digest mismatch for manifest {reference} from {self.host}: it has {digest}")
        if valid_digest(sent_digest) and sent_digest.partition(":")[0] == algorithm and sent_digest != digest:
            raise DigestMismatch(f"digest mismatch for the manifest of {image} from {self.host}: the registry says "
                             f"{sent_digest}, the content has {digest}")
        body = parse_json(data, f"the manifest of {image} from {self.host}", limit=MANIFEST_LIMIT)
        if not isinstance(body, dict):
            raise ImageError(f"malformed manifest for {image} from {self.host}: not a JSON object")
        media_type = _media_type(body, content_type)
        if media_type in SCHEMA1_TYPES:
            raise ImageError(f"{image} has a Docker schema 1 manifest, a format deprecated since 2017 that singpy "
                             "does not read", hint="push the image again with a current docker, podman or skopeo")
        if media_type not in INDEX_TYPES + MANIFEST_TYPES:
            raise ImageError(f"{image} is not a container image: its manifest is of type {media_type[:100]!r}")
        problem = manifest_problem(body, media_type)
        if problem:
            raise ImageError(f"malformed manifest for {image} from {self.host}: {problem}")
        return Manifest(media_type=media_type, digest=digest, data=data, body=body)

    # --- blobs -------------------------------------------------------------------------------------------------

    def blob_bytes(self, digest: str, limit: int = MANIFEST_LIMIT) -> bytes:
        """A small blob (an image config), verified, at most `limit` bytes."""
        self._check_digest(digest)
        data, _, source = self._get_small(self._blob_path(digest), {}, what=self._blob(digest), limit=limit)
        algorithm, _, expected = digest.partition(":")
        if _hex(algorithm, data) != expected:
            raise DigestMismatch(f"digest mismatch for blob {digest} from {source}: the download was discarded")
        return data

    def fetch_blob(self, digest: str, target: str, *, size: int | None,
                   progress: Callable[[int], None] | None = None) -> None:
        """Download blob `digest` to `target` (atomically, verified), resuming `target`.partial if there is one.

        `progress(n)` is called with the byte count of each chunk as it arrives, once at the start with the
        bytes a resumed partial file already holds, and with a negative count when a download restarts
        from zero (so a running sum is always the bytes held).
        """
        self._check_digest(digest)
        partial = f"{target}.partial"
        try:
            fd = os.open(partial, _FILE_FLAGS, 0o644)
        except OSError as error:
            raise CantWrite(f"can't write {partial}: {error.strerror}") from None
        try:
            _Download(self, digest, fd, partial, size, progress).run()
            os.fsync(fd)
        except OSError as error:  # writing: reading failures are TransportErrors, handled in run()
            full = error.errno in (errno.ENOSPC, errno.EDQUOT)
            if full:
                _remove(partial)  # the space goes back; a resume would fail the same way
            raise CantWrite(f"can't write {partial}: {error.strerror}", hint=_ROOM_HINT if full else None) from None
        finally:
            os.close(fd)
        try:
            os.rename(partial, target)
        except OSError as error:
            raise CantWrite(f"can't rename {partial} to {target}: {error.strerror}") from None

    # --- requests ----------------------------------------------------------------------------------------------

    def _fetch_small(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
                     limit: int) -> tuple[int, bytes]:
        """For the token server: one request with retries, status and at most `limit` bytes of body."""
        tries = self.limits.retries
        for attempt in range(tries):
            try:
                response = self._transport.request(method, url, headers, body)
                if response.status in _RETRY_STATUSES:
                    if attempt + 1 == tries:
                        self._transport.discard(url, response)
                        raise Unreachable(f"{Origin(url).netloc} (for registry {self.ref.registry}) answered HTTP "
                                          f"{response.status} {tries} times")
                    delay = _first(_retry_after(response), _backoff(attempt))
                    self._transport.discard(url, response)
                    self.sleep(delay)
                    continue
                return response.status, self._read_small(response, url, limit, f"the answer of {Origin(url).netloc}")
            except TransportError as error:
                if not error.retriable or attempt + 1 == tries:
                    raise self._unreachable(error) from None
                self.sleep(_backoff(attempt))
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
                    raise self._unreachable(error) from None
                self.sleep(_backoff(attempt))
                continue
            return data, response, Origin(url).netloc
        raise AssertionError("unreachable")

    def _get_checked(self, method: str, path: str, headers: dict[str, str], *,
                     what: str) -> tuple[http.client.HTTPResponse, str]:
        """A 200 response to `path` (redirects, auth and retries done); any other status is an ImageError."""
        response, url = self._request(method, path, headers)
        if response.status == 200:
            return response, url
        body = self._error_body(response, url)
        self._raise_for(response.status, body, url, what, response.reason)
        raise ImageError(f"registry {Origin(url).netloc} answered HTTP {response.status} for {what}"
                         f"{_detail(body)}")

    def _request(self, method: str, path: str, headers: dict[str, str],
                 range_from: int = 0, document: bool = True) -> tuple[http.client.HTTPResponse, str]:
        """Send and follow: auth challenges answered once, redirects followed, retriable failures retried.

        Returns the final response (headers read) and its URL. `document`: see Transport.request.
        """
        url = self.base + path
        tries = redirects = 0
        answered = False
        while True:
            send = dict(headers)
            if range_from:
                send["Range"] = f"bytes={range_from}-"
            to_registry = Origin(url).key == self._origin
            authorization = self._authorization() if to_registry else None
            if authorization:
                send["Authorization"] = authorization
            try:
                response = self._transport.request(method, url, send, document=document)
            except TransportError as error:
                tries += 1
                if not error.retriable or tries >= self.limits.retries:
                    raise self._unreachable(error) from None
                self.sleep(_backoff(tries - 1))
                continue
            status = response.status
            if status in _REDIRECT_STATUSES:
                location = response.getheader("Location") or ""
                self._transport.discard(url, response)
                redirects += 1
                url = self._redirect(url, location, redirects)
                continue
            if status == 401 and to_registry and not answered:
                challenges = parse_challenges(response.headers.get_all("WWW-Authenticate") or [])
                self._transport.discard(url, response)
                answered = True
                try:
                    self._auth.answer(challenges, used=authorization)
                except AuthFailure as failure:
                    raise self._denied(failure.reason) from None
                continue
            if status in _RETRY_STATUSES and tries + 1 < self.limits.retries:
                delay = _first(_retry_after(response), _backoff(tries))
                self._transport.discard(url, response)
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
        if length.isdigit() and int(length) > limit:
            self._transport.close_connection(url)
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
            self._transport.close_connection(url)
            raise _failure(Origin(url).netloc, error, connecting=False) from None
        if total > limit:
            self._transport.close_connection(url)
            raise ImageError(f"{what} from {Origin(url).netloc} is larger than {limit >> 20} MiB")
        return b"".join(chunks)

    def _error_body(self, response: http.client.HTTPResponse, url: str) -> bytes:
        try:
            return self._read_small(response, url, _ERROR_BODY_LIMIT, "an error response")
        except (ImageError, TransportError):
            return b""

    # --- errors ------------------------------------------------------------------------------------------------

    def _raise_for(self, status: int, body: bytes, url: str, what: str, reason: str | None) -> None:
        """Raise the ImageError a user should see for `status` (returns for the statuses it does not know)."""
        codes = _error_codes(body)
        if status == 404 or codes & {"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"}:
            raise ImageError(f"{what} not found in registry {self.ref.registry}{_detail(body)}")
        if status in (401, 403):
            if Origin(url).key != self._origin:
                raise self._denied(f"{Origin(url).netloc} answered HTTP {status}{_detail(body)}")
            refusal = self._auth.refusal() if status == 401 else None
            raise self._denied(f"{refusal or f'HTTP {status}'}{_detail(body)}")
        if status == 429 or status >= 500:
            raise Unreachable(f"registry {Origin(url).netloc} answered HTTP {status} "
                             f"{(reason or '').strip()[:60]} for {what} after {self.limits.retries} tries"
                             f"{_detail(body)}"
                             .replace("  ", " "))

    def _denied(self, reason: str) -> ImageError:
        credentials = self._auth.credentials
        # How to log in is part of the message, not a hint: it is what the user needs to do next.
        advice = (f"check the credentials of {credentials.username!r} or " if credentials
                  else "the image may not exist, or it needs credentials: ") + LOGIN_HINT
        return ImageError(f"access to {self.ref} denied by {self.ref.registry}: {reason} ({advice})")

    def _unreachable(self, error: TransportError) -> ImageError:
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

    def _blob(self, digest: str) -> str:
        return f"blob {digest} of docker://{self.ref.registry}/{self.ref.repository}"

    def _blob_path(self, digest: str) -> str:
        return f"/v2/{self.ref.repository}/blobs/{digest}"

    def _check_reference(self, reference: str) -> None:
        if not (valid_digest(reference) or valid_tag(reference)):
            raise ImageError(f"{reference[:100]!r} is neither a tag nor a sha256 digest")

    def _check_digest(self, digest: str) -> None:
        if not valid_digest(digest):
            raise ImageError(f"unsupported digest {digest[:100]!r} in the manifest of {self.ref}")


class _Download:
    """One blob into an open .partial file: the state a resume needs, and the loop."""

    def __init__(self, registry: Registry, digest: str, fd: int, partial: str, size: int | None,
                 progress: Callable[[int], None] | None) -> None:
        self.registry = registry
        self.digest = digest
        self.algorithm, _, self.expected = digest.partition(":")
        self.fd = fd
        self.partial = partial
        self.size = size
        self.progress = progress or _ignore
        self.hasher = _hasher(self.algorithm)
        self.held = 0  # bytes in the file, all hashed
        self.source = registry.host  # who sent the bytes (named in a mismatch)
        self.fresh = True  # every byte held came from this download (no partial file of an earlier run)
        self.furthest = 0  # the most bytes held at any time: only bytes beyond it are progress

    def run(self) -> None:
        self._hash_existing()
        self.fresh = self.held == 0
        self.furthest = self.held
        tries, limit = 0, self.registry.limits.retries
        while True:
            if self.size is not None and self.held >= self.size:
                if self._verified():
                    return
                if self.fresh:
                    self._mismatch()
                self._restart()  # a partial file from an earlier run that was wrong: one fresh download
                self.fresh = True
                continue
            try:
                complete = self._one_request()
            except TransportError as error:
                tries = self._tried(tries)
                if not error.retriable or tries >= limit:
                    raise self.registry._unreachable(error) from None
                self.registry.sleep(_backoff(tries - 1 if tries else 0))
                continue
            if complete is None:  # the server ignored or refused the Range: from zero again
                self._restart()
                self.fresh = True
                continue
            if self.size is not None and self.held < self.size:  # the body ended early: go on from there
                tries = self._tried(tries)
                if tries >= limit:
                    raise ImageError(f"blob {self.digest} from {self.source} ends after {self.held} of its "
                                     f"{self.size} bytes, {limit} times in a row (the limit is SINGPY_PULL_RETRIES)")
                if tries:
                    self.registry.sleep(_backoff(tries - 1))
                continue
            if self._verified():
                return
            if self.fresh:
                self._mismatch()
            self._restart()
            self.fresh = True

    def _tried(self, tries: int) -> int:
        """The count of tries in a row without progress, after one more: a restart from zero (a registry that
        ignores Range) brings bytes, but none beyond the furthest already had, so it is not progress."""
        if self.held > self.furthest:
            self.furthest = self.held
            return 0
        return tries + 1

    def _one_request(self) -> bool | None:
        """One GET from `held` on; True when the body ended, None when the download must restart from zero."""
        registry = self.registry
        response, url = registry._request("GET", registry._blob_path(self.digest), {}, range_from=self.held,
                                          document=False)
        self.source = Origin(url).netloc
        status = response.status
        if self.held and status == 416:  # the partial may already be whole (the size was not known)
            registry._transport.discard(url, response)
            if self._verified():
                return True
            if self.fresh:  # the registry's blob ends before its announced size, and is not the one asked for
                self._mismatch()
            return None
        if self.held and status == 200:
            registry._transport.discard(url, response, limit=0)
            return None
        if self.held and status == 206:
            if _range_start(response.getheader("Content-Range") or "") != self.held:
                registry._transport.discard(url, response, limit=0)
                return None
        elif status != 200:
            body = registry._error_body(response, url)
            registry._raise_for(status, body, url, registry._blob(self.digest), response.reason)
            raise ImageError(f"registry {self.source} answered HTTP {status} for {registry._blob(self.digest)}"
                             f"{_detail(body)}")
        self._stream(response, url)
        return True

    def _stream(self, response: http.client.HTTPResponse, url: str) -> None:
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        update, fd, progress = self.hasher.update, self.fd, self.progress
        limit = self.size
        try:
            while True:
                try:
                    count = response.readinto(buffer)
                except (OSError, http.client.HTTPException) as error:
                    self.registry._transport.close_connection(url)
                    raise _failure(Origin(url).netloc, error, connecting=False) from None
                if not count:
                    return
                chunk = view[:count]
                update(chunk)
                written = 0
                while written < count:  # an OSError here is the disk's: fetch_blob names the file
                    written += os.write(fd, chunk[written:])
                self.held += count
                progress(count)
                if limit is not None and self.held > limit:  # more than announced: stop here, it can't verify
                    self.registry._transport.close_connection(url)
                    return
        finally:
            view.release()

    def _hash_existing(self) -> None:
        """Hash what an earlier download left in the partial file."""
        size = os.fstat(self.fd).st_size
        if not size:
            return
        with open(self.partial, "rb", buffering=0) as existing:
            buffer = bytearray(CHUNK)
            while True:
                count = existing.readinto(buffer)
                if not count:
                    break
                with memoryview(buffer) as view:
                    self.hasher.update(view[:count])
                self.held += count
        self.progress(self.held)

    def _verified(self) -> bool:
        return bool(self.hasher.copy().hexdigest() == self.expected)

    def _restart(self) -> None:
        os.ftruncate(self.fd, 0)
        self.progress(-self.held)
        self.held = 0
        self.hasher = _hasher(self.algorithm)

    def _mismatch(self) -> None:
        _remove(self.partial)
        raise DigestMismatch(f"digest mismatch for blob {self.digest} from {self.source}: the download was discarded")


def _ignore(count: int) -> None:
    pass


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _range_start(content_range: str) -> int | None:
    """N of "bytes N-M/TOTAL" (None when it is not that)."""
    unit, _, spec = content_range.strip().partition(" ")
    start = spec.partition("-")[0]
    return int(start) if unit.lower() == "bytes" and start.isdigit() and len(start) < 20 else None


def _backoff(tries: int) -> float:
    delay: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(tries, 10))
    return delay + random.uniform(0, delay / 4)  # jitter, so that 32 pulls do not retry in step


def _first(asked: float | None, otherwise: float) -> float:
    """The delay the server asked for (0 included), else `otherwise`."""
    return otherwise if asked is None else asked


def _retry_after(response: http.client.HTTPResponse) -> float | None:
    """Retry-After in seconds (a number or an HTTP date), capped; None when absent or unreadable."""
    value = (response.getheader("Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return min(float(value[:6]), RETRY_AFTER_CAP)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, min(when.timestamp() - time.time(), RETRY_AFTER_CAP))


def _error_codes(body: bytes) -> set[str]:
    errors = _errors(body)
    return {code for item in errors if isinstance(code := item.get("code"), str)}


def _errors(body: bytes) -> list[dict[str, Any]]:
    """The `errors` of a registry's error body; [] when it has none or is not JSON (an HTML page, garbage)."""
    try:
        parsed = parse_json(body, "an error response", limit=_ERROR_BODY_LIMIT) if body else None
    except ImageError:
        return []
    errors = parsed.get("errors") if isinstance(parsed, dict) else None
    return [item for item in errors if isinstance(item, dict)] if isinstance(errors, list) else []


def _detail(body: bytes) -> str:
    """": CODE: message" from a registry's JSON error body, printable and short ("" when there is none)."""
    for item in _errors(body):
        code, message = item.get("code"), item.get("message")
        parts = [part for part in (code, message) if isinstance(part, str) and part]
        if parts:
            text = ": ".join(parts)
            text = "".join(char if char.isprintable() else " " for char in text)[:200]
            return f" ({text})"
    return ""


def _media_type(body: dict[str, Any], content_type: str) -> str:
    """What the manifest is: its `mediaType`, else what its fields say (Content-Type picks Docker or OCI)."""
    declared = body.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    if body.get("schemaVersion") == 1 or "fsLayers" in body:
        return SCHEMA1_TYPES[0]
    if "manifests" in body:
        return content_type if content_type in INDEX_TYPES else OCI_INDEX
    if "layers" in body or "config" in body:
        return content_type if content_type in MANIFEST_TYPES else OCI_MANIFEST
    return content_type or "unknown"


def manifest_problem(body: dict[str, Any], media_type: str) -> str | None:
    """What is wrong with a parsed manifest or index of `media_type` (None when nothing is)."""
    version = body.get("schemaVersion")
    if version != 2 or isinstance(version, bool):
        return f"schemaVersion is {str(version)[:20]}, not 2"
    if media_type in INDEX_TYPES:
        return _descriptors_problem(body, "manifests")
    problem = descriptor_problem(body.get("config"))
    if problem:
        return f"config{problem}"
    return _descriptors_problem(body, "layers")


def _descriptors_problem(body: dict[str, Any], key: str) -> str | None:
    """What is wrong with the list of descriptors `body[key]` (None when nothing is)."""
    items = body.get(key)
    if not isinstance(items, list):
        return f"'{key}' is not a list"
    for position, item in enumerate(items):
        problem = descriptor_problem(item)
        if problem:
            return f"{key}[{position}]{problem}"
    return None


def descriptor_problem(item: object) -> str | None:
    """What is wrong with an OCI descriptor (" is not an object", ".size is ..."), or None."""
    if not isinstance(item, dict):
        return " is not an object"
    if not isinstance(item.get("mediaType"), str):
        return ".mediaType is not a string"
    digest = item.get("digest")
    if not isinstance(digest, str) or not valid_digest(digest):
        return f".digest {str(digest)[:80]!r} is not a sha256 digest"
    size = item.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return ".size is not a non-negative integer"
    platform = item.get("platform")
    if platform is not None:
        if not isinstance(platform, dict):
            return ".platform is not an object"
        for key in ("architecture", "os", "variant", "os.version"):
            if key in platform and not isinstance(platform[key], str):
                return f".platform.{key} is not a string"
        features = platform.get("os.features", [])
        if not isinstance(features, list) or not all(isinstance(feature, str) for feature in features):
            return ".platform.os.features is not a list of strings"
    annotations = item.get("annotations")
    if annotations is not None and not (isinstance(annotations, dict)
                                        and all(isinstance(value, str) for value in annotations.values())):
        return ".annotations is not an object of strings"
    urls = item.get("urls")
    if urls is not None and not (isinstance(urls, list) and all(isinstance(url, str) for url in urls)):
        return ".urls is not a list of strings"
    return None

"""`singpy push IMAGE.sif oras://HOST/REPO:TAG`: a SIF uploaded as Apptainer's ORAS artifact; `singpy delete
oras://...`: a manifest removed.

What is uploaded is what Apptainer's internal/pkg/client/oras uploads, so
each pulls what the other pushed: the config blob `{}` typed
`application/vnd.sylabs.sif.config.v1+json`, the SIF file as the one layer
(`application/vnd.sylabs.sif.layer.v1.sif`, annotated with its file name as
`org.opencontainers.image.title`), and an OCI image manifest naming both,
put under the tag.

Blobs go up with the distribution protocol's chunked upload (POST, then
PATCH chunks of CHUNK bytes with Content-Range, then PUT ?digest=): the
memory used is one chunk, whatever the size of the SIF; a blob the
repository already holds (HEAD answers 200) is not sent again. The client
is singpy.oci.registry's, asking for push scope: the same credentials, Bearer
tokens, TLS rules and limits as a pull; Authorization goes only to the
registry's own origin.

A delete is Apptainer's (go-containerregistry's remote.Delete): DELETE of the
manifest the reference names, by tag or by digest as given, with delete
scope. Many registries (Docker's distribution 2.x among them) delete by
digest only, and answer a tag with an error: that answer is the one line.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable, Mapping

from singpy.errors import ImageError
from singpy.oci.auth import Authenticator, Credentials
from singpy.oci.oras import EMPTY_CONFIG, SIF_CONFIG, SIF_LAYER, TITLE, as_oras, parse_ref, shown
from singpy.oci.ref import Reference
from singpy.oci.regerrors import detail
from singpy.oci.registry import Registry
from singpy.oci.transport import Origin

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.pull import PullOptions

CHUNK = 32 << 20  # bytes per PATCH: few requests for a large SIF, bounded memory
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class Uploader(Registry):
    """A registry client with push scope, and the requests that carry a body."""

    def __init__(self, ref: Reference, *, env: Mapping[str, str], credentials: Credentials | None,
                 https: bool = True, actions: str = "pull,push") -> None:
        super().__init__(ref, env=env, credentials=credentials, https=https)
        self._auth = Authenticator(credentials=credentials, scope=f"repository:{ref.repository}:{actions}",
                                   fetch=self._fetch_small, secure=https)

    def send(self, method: str, url: str, headers: dict[str, str],
             body: bytes | None = None) -> http.client.HTTPResponse:
        """One request of an upload, through the client's one loop (Registry.exchange: a 401 answered once,
        retriable failures tried again); no redirect is followed: an upload answered 3xx is an error."""
        return self.exchange(method, url, headers, body=body, follow=False)[0]

    def expect(self, response: http.client.HTTPResponse, url: str, statuses: tuple[int, ...], what: str,
               action: str = "upload") -> None:
        """Nothing when the answer is one of `statuses` (its body discarded), else the ImageError it means."""
        if response.status in statuses:
            self.transport.discard(url, response)
            return
        body = self.error_body(response, url)
        self.raise_for(response.status, body, url, what, response.reason)
        raise ImageError(f"registry {Origin(url).netloc} answered HTTP {response.status} to the {action} of "
                         f"{what}{detail(body)}")

    def location(self, response: http.client.HTTPResponse, url: str) -> str:
        """Where the upload goes on (the Location of a 202), absolute, never from HTTPS down to HTTP."""
        from urllib.parse import urljoin

        location = (response.getheader("Location") or "").strip()
        if not location or not location.isprintable() or not location.isascii():
            raise ImageError(f"registry {Origin(url).netloc} started an upload without a usable Location")
        target = urljoin(url, location)
        if url.startswith("https:") and not target.startswith("https:"):
            raise ImageError(f"registry {Origin(url).netloc} moved the upload from HTTPS to {target[:100]}: refused")
        return target

    def has_blob(self, digest: str) -> bool:
        url = self.base + self.blob_path(digest)
        response = self.send("HEAD", url, {})
        self.transport.discard(url, response, limit=0)
        return response.status == 200

    def upload(self, digest: str, size: int, read: Callable[[int], bytes],
               progress: Callable[[int], None] | None = None) -> None:
        """Blob `digest` of `size` bytes, read from `read(n)`, unless the repository has it already."""
        what = f"blob {digest[:19]} to {self.ref.registry}/{self.ref.repository}"
        if self.has_blob(digest):
            if progress is not None:
                progress(size)
            return
        start = self.base + f"/v2/{self.ref.repository}/blobs/uploads/"
        response = self.send("POST", start, {})
        url = self.location(response, start) if response.status == 202 else start
        self.expect(response, start, (202,), what)
        sent = 0
        while sent < size:
            chunk = read(min(CHUNK, size - sent))
            if not chunk:
                raise ImageError(f"the file ended after {sent} of {size} bytes while it was uploaded")
            headers = {"Content-Type": "application/octet-stream",
                       "Content-Range": f"{sent}-{sent + len(chunk) - 1}"}
            response = self.send("PATCH", url, headers, chunk)
            next_url = self.location(response, url) if response.status == 202 else url
            self.expect(response, url, (202,), what)
            url, sent = next_url, sent + len(chunk)
            if progress is not None:
                progress(len(chunk))
        separator = "&" if "?" in url else "?"
        final = f"{url}{separator}digest={digest.replace(':', '%3A')}"
        response = self.send("PUT", final, {"Content-Type": "application/octet-stream"}, b"")
        self.expect(response, final, (201, 204), what)

    def put_manifest(self, tag: str, data: bytes) -> None:
        url = self.base + f"/v2/{self.ref.repository}/manifests/{tag}"
        response = self.send("PUT", url, {"Content-Type": OCI_MANIFEST}, data)
        self.expect(response, url, (201, 200), f"the manifest of {self.ref.registry}/{self.ref.repository}:{tag}")

    def delete_manifest(self, reference: str) -> None:
        url = self.base + f"/v2/{self.ref.repository}/manifests/{reference}"
        response = self.send("DELETE", url, {})
        self.expect(response, url, (202, 200), f"{self.ref.registry}/{self.ref.repository}"
                    f"{'@' if ':' in reference else ':'}{reference}", action="delete")  # a tag has no ':'


def manifest_for(digest: str, size: int, title: str) -> bytes:
    """The manifest Apptainer writes for a SIF (go-containerregistry's field order, compact JSON)."""
    import hashlib
    import json

    config = f"sha256:{hashlib.sha256(EMPTY_CONFIG).hexdigest()}"
    body = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": SIF_CONFIG, "size": len(EMPTY_CONFIG), "digest": config},
            "layers": [{"mediaType": SIF_LAYER, "size": size, "digest": digest, "annotations": {TITLE: title}}]}
    return json.dumps(body, separators=(",", ":")).encode()


def sif_arch(path: str) -> str:
    """The architecture of the SIF's primary partition; an ImageError for a file that is not a SIF."""
    from singpy.errors import SifError
    from singpy.image.sif import read_sif

    try:
        arch = read_sif(path).primary_partition().arch
    except SifError as error:
        raise ImageError(f"can't push {path}: it is not a usable SIF ({error.message})") from None
    if arch == "unknown":
        raise ImageError(f"can't push {path}: unknown architecture in the SIF file")
    return arch


def push(path: str, text: str, options: PullOptions, env: Mapping[str, str], home: str) -> str:
    """Upload the SIF `path` to `oras://...`; returns the summary line."""
    import hashlib

    from singpy.host.hostfiles import open_regular
    from singpy.oci.progress import Steps
    from singpy.oci.pull import nohttps

    ref = parse_ref(text)
    if ref.digest:
        raise ImageError(f"can't push to {text[:100]}: name a tag, not a digest (the registry computes it)")
    path = os.path.abspath(path)
    # a regular file, checked before it is opened: a FIFO or a device named by mistake never blocks the push
    with os.fdopen(open_regular(path, what="image", error=ImageError), "rb") as handle:
        sif_arch(path)
        hasher, size = hashlib.sha256(), 0
        while chunk := handle.read(1 << 20):
            hasher.update(chunk)
            size += len(chunk)
        digest = f"sha256:{hasher.hexdigest()}"
        handle.seek(0)
        client = Uploader(ref, env=env, credentials=_credentials(ref, options, env, home),
                          https=options.https and not nohttps(env))
        try:
            with client:
                # the config first: a refusal is then the one line printed, before any progress
                client.upload(f"sha256:{hashlib.sha256(EMPTY_CONFIG).hexdigest()}", len(EMPTY_CONFIG),
                              _reader(EMPTY_CONFIG))
                with Steps(f"Pushing {path} to {shown(ref)}") as steps:
                    client.upload(digest, size, handle.read, steps.transfer(f"SIF {digest[:19]}", size))
                client.put_manifest(ref.tag or "latest", manifest_for(digest, size, os.path.basename(path)))
        except ImageError as error:
            raise as_oras(_refused(error), ref) from None
    return f"pushed {path} to {shown(ref)} ({digest})"


def delete(text: str, options: PullOptions, env: Mapping[str, str], home: str, *, arch: str) -> str:
    """Delete the manifest `oras://...` names from its registry; the line that says so (Apptainer's words:
    `arch`, which Apptainer passes too, selects nothing in a delete)."""
    from singpy.oci.pull import nohttps

    ref = parse_ref(text)
    client = Uploader(ref, env=env, credentials=_credentials(ref, options, env, home),
                      https=options.https and not nohttps(env), actions="delete")
    try:
        with client:
            client.delete_manifest(ref.digest or ref.tag or "latest")
    except ImageError as error:
        raise as_oras(_refused(error, "deleting it"), ref) from None
    return f"Image {shown(ref).removeprefix('oras://')} ({arch}) deleted."


def _refused(error: ImageError, doing: str = "pushing to it") -> ImageError:
    """The pull client's words for a refusal, said of a push (or of what `doing` says)."""
    if "does not allow pulling it" not in error.message:
        return error
    return type(error)(error.message.replace("does not allow pulling it", f"does not allow {doing}"),
                       hint=error.hint)


def _reader(data: bytes) -> Callable[[int], bytes]:
    import io

    return io.BytesIO(data).read


def _credentials(ref: Reference, options: PullOptions, env: Mapping[str, str], home: str) -> Credentials | None:
    from singpy.oci import auth

    if options.login:
        return auth.prompt_credentials(ref.registry)
    return auth.find_credentials(ref.registry, env, authfile=options.authfile or None, home=home)

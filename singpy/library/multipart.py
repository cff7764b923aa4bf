"""A large image uploaded to a library in parts, as scs-library-client's postFileV2Multipart does it.

    POST v2/imagefile/ID/_multipart           {filesize}  -> {uploadID, totalParts, partSize, options}
    PUT  v2/imagefile/ID/_multipart           {partSize, uploadID, partNumber, sha256sum} -> {presignedURL}
         PUT the part there (object storage: no token; x-amz-content-sha256 unless options.s3compliant=false)
         -> its ETag
    PUT  v2/imagefile/ID/_multipart_complete  {uploadID, completedParts: [{partNumber, token: ETag}]}
    PUT  v2/imagefile/ID/_multipart_abort     {uploadID}: after any failure of a part (or an interrupt)

The client tries it only for a file larger than S3's usual part (64 MiB); the library says the part size.
A library that does not offer it (404 to the first request) gets the single upload (singpy.library.push).
Everything the library answers is checked before it is used: the parts it announces must cover the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from singpy.errors import ImageError
from singpy.library import client, web
from singpy.library.endpoint import Library
from singpy.library.remotes import RemoteError

MINIMUM_PART_SIZE = 64 * 1024 * 1024  # the client's minimumPartSize: smaller files go in one piece
MAX_PARTS = 10000  # S3's limit: a library announcing more is not believed
_BLOCK = 1 << 20


def upload(lib: Library, path: str, image_id: str, size: int, env: Mapping[str, str]) -> bool:
    """The file `path` uploaded in parts; False (nothing sent) when the library does not offer multipart."""
    route = f"v2/imagefile/{image_id}"
    try:
        started = web.get_json(client.url(lib, f"{route}/_multipart"), env, token=lib.token, method="POST",
                               data={"filesize": size})
    except web.HTTPError as error:
        if error.status == 404:
            return False
        raise client.refused(error, route) from None
    upload_id, total, part_size, s3_compliant = _announced(lib, started, size)
    completed = []
    try:
        with open(path, "rb") as source:
            for number in range(1, total + 1):
                offset = (number - 1) * part_size
                part = Part(source, offset, min(part_size, size - offset), number)
                completed.append({"partNumber": number, "token": part.send(lib, route, upload_id, s3_compliant, env)})
    except BaseException as error:  # a refused part, the disk, Ctrl-C: the library drops what it holds
        _abort(lib, route, upload_id, env)
        if isinstance(error, OSError):
            raise ImageError(f"can't read {path}: {error.strerror}") from None
        raise
    client.call(lib, f"{route}/_multipart_complete", env, "PUT", {"uploadID": upload_id, "completedParts": completed})
    return True


def _announced(lib: Library, started: Any, size: int) -> tuple[str, int, int, bool]:
    """The upload id, part count, part size and S3 mode the library announced, if they describe `size` bytes."""
    data = started if isinstance(started, dict) else {}
    upload_id, total, part_size = data.get("uploadID"), data.get("totalParts"), data.get("partSize")
    options = data.get("options")
    options = options if isinstance(options, dict) else {}
    if not (isinstance(upload_id, str) and upload_id and isinstance(total, int) and isinstance(part_size, int)
            and 0 < total <= MAX_PARTS and part_size > 0 and (total - 1) * part_size < size <= total * part_size):
        raise RemoteError(f"the library {lib.url} announced a multipart upload that does not fit the file "
                          f"({size} bytes): {str(total)[:20]} parts of {str(part_size)[:20]} bytes")
    return upload_id, total, part_size, options.get("s3compliant", "") in ("", "true")


class Part:
    """One part of the file: its bytes read from `source` at `offset`, twice (hashed, then sent), never held."""

    def __init__(self, source: Any, offset: int, length: int, number: int) -> None:
        self.source, self.offset, self.length, self.number = source, offset, length, number
        self.left = 0

    def send(self, lib: Library, route: str, upload_id: str, s3_compliant: bool, env: Mapping[str, str]) -> str:
        """PUT the part to the URL the library gives for it; its ETag."""
        checksum = self._sha256() if s3_compliant else ""
        answer = client.call(lib, f"{route}/_multipart", env, "PUT", {
            "partSize": self.length, "uploadID": upload_id, "partNumber": self.number, "sha256sum": checksum})
        target = answer.get("presignedURL") if isinstance(answer, dict) else None
        if not isinstance(target, str) or not target.startswith(("http://", "https://")):
            raise RemoteError(f"the library {lib.url} gave no URL for part {self.number}")
        token = lib.token if web.origin(target) == web.origin(lib.url) else ""  # never to object storage
        self.source.seek(self.offset)
        self.left = self.length
        headers = {"x-amz-content-sha256": checksum} if checksum else {}
        try:
            response = web.request("PUT", target, env, token=token, stream=self, length=self.length,
                                   headers=headers)
        except web.HTTPError as error:
            raise RemoteError(f"part {self.number} of the upload was refused: {error.message}") from None
        try:
            response.read()
        finally:
            response.close()
        if response.status != 200:
            raise RemoteError(f"the object store answered {response.status} to part {self.number}")
        return str(response.getheader("ETag") or "")

    def read(self, count: int = -1) -> bytes:
        """At most `count` of the part's bytes (http.client reads the body in blocks until b"")."""
        count = self.left if count < 0 else min(count, self.left)
        chunk = self.source.read(count) if count else b""
        if count and not chunk:
            raise OSError(5, "the file ended before the part (did it change during the push?)")
        self.left -= len(chunk)
        return bytes(chunk)

    def _sha256(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        self.source.seek(self.offset)
        self.left = self.length
        while chunk := self.read(_BLOCK):
            digest.update(chunk)
        return digest.hexdigest()


def _abort(lib: Library, route: str, upload_id: str, env: Mapping[str, str]) -> None:
    """Tell the library to drop the parts it holds; its own failure is only noted (the first error is the one)."""
    from singpy import console

    try:
        client.call(lib, f"{route}/_multipart_abort", env, "PUT", {"uploadID": upload_id})
    except RemoteError as error:
        console.debug(f"aborting the multipart upload {upload_id}: {error.message}")

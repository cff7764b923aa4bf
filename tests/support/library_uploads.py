"""Uploads to the test library (tests.support.library_server): the single one and the multipart one, written
from scs-library-client's client/push.go (postFileV2, postFileV2Multipart) and the S3 rules it relies on.

    POST v2/imagefile/ID                      {filesize, sha256sum, md5sum} -> {uploadURL}; PUT the file there
    PUT  v2/imagefile/ID/_complete
    POST v2/imagefile/ID/_multipart           {filesize} -> {uploadID, totalParts, partSize, options}
                                              (404 when `library.multipart_offered` is False)
    PUT  v2/imagefile/ID/_multipart           {partSize, uploadID, partNumber, sha256sum} -> {presignedURL}
    PUT  v2/imagefile/ID/_multipart_complete  {uploadID, completedParts: [{partNumber, token}]}
    PUT  v2/imagefile/ID/_multipart_abort     {uploadID}

Strict: a part must be announced before it is sent, with the size its number must have (`library.part_size`
each, the rest in the last) and its sha256, which object storage checks against the bytes and the
x-amz-content-sha256 header; completion needs every part, in order, each with the ETag object storage gave,
and the parts put together must be the image's announced size and hash. An aborted upload accepts nothing
more and its parts are removed. `library.refuse_part = N` makes object storage refuse part N (500).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from tests.support.library_routes import ROUTES as API_ROUTES
from tests.support.library_routes import Query, _json, _owner_check
from tests.support.library_store import sif_arch

_HEX = re.compile(r"[a-f0-9]{64}")


def _owned_image(handler: Any, image_id: str, user: str) -> dict[str, Any] | None:
    """The image `image_id`, when the user may write it (else the refusal is sent and None returned)."""
    store = handler.library.store
    found = store.images.get(image_id)
    if found is None:
        handler.fail(404, f"no image {image_id}")
        return None
    return found if _owner_check(handler, found["entityName"], user) else None


def upload(handler: Any, image_id: str, query: Query, user: str) -> None:
    """POST v2/imagefile/ID: the presigned URL to PUT the whole file to."""
    found = _owned_image(handler, image_id, user)
    if found is None:
        return
    body = _json(handler)
    if f"sha256.{body.get('sha256sum')}" != found["hash"] or not isinstance(body.get("filesize"), int):
        handler.fail(400, "the sha256sum is not the image's hash, or no filesize")
        return
    handler.library.uploads[image_id] = {"filesize": body["filesize"], "sha256sum": body["sha256sum"]}
    handler.answer({"uploadURL": handler.library.sign("PUT", image_id)})


def complete(handler: Any, image_id: str, query: Query, user: str) -> None:
    found = _owned_image(handler, image_id, user)
    done = handler.library.uploads.get(image_id, {})
    if found is None:
        return
    if "stored" not in done:
        handler.fail(400, "no upload to complete")
        return
    _uploaded(handler, found, done["filesize"], done["arch"])


def _uploaded(handler: Any, image: dict[str, Any], size: int, arch: str) -> None:
    image.update(uploaded=True, size=size, arch=arch)
    handler.answer({"quota": {"quotaTotal": 0, "quotaUsage": size}, "containerUrl": ""})


def multipart_start(handler: Any, image_id: str, query: Query, user: str) -> None:
    library = handler.library
    if not library.multipart_offered:
        handler.fail(404, "multipart uploads are not offered")
        return
    if _owned_image(handler, image_id, user) is None:
        return
    size = _json(handler).get("filesize")
    if not isinstance(size, int) or size <= 0:
        handler.fail(400, "no filesize")
        return
    upload_id = os.urandom(8).hex()
    total = -(-size // library.part_size)
    library.multiparts[upload_id] = {"image": image_id, "filesize": size, "total": total, "announced": {},
                                     "stored": {}, "state": "open"}
    handler.answer({"uploadID": upload_id, "totalParts": total, "partSize": library.part_size,
                    "options": {"s3compliant": "true"}})


def _open_upload(handler: Any, image_id: str, body: dict[str, Any]) -> dict[str, Any] | None:
    upload: dict[str, Any] | None = handler.library.multiparts.get(str(body.get("uploadID") or ""))
    if upload is None or upload["image"] != image_id or upload["state"] != "open":
        handler.fail(404, "no such open upload for this image")
        return None
    return upload


def part_size(library: Any, upload: dict[str, Any], number: int) -> int:
    """The size part `number` must have: the announced part size, the rest of the file for the last one."""
    size: int = min(library.part_size, upload["filesize"] - (number - 1) * library.part_size)
    return size


def multipart_part(handler: Any, image_id: str, query: Query, user: str) -> None:
    """PUT v2/imagefile/ID/_multipart: a part announced (size, sha256), answered with its presigned URL."""
    body = _json(handler)
    if _owned_image(handler, image_id, user) is None or (upload := _open_upload(handler, image_id, body)) is None:
        return
    number = body.get("partNumber")
    if not isinstance(number, int) or not 1 <= number <= upload["total"]:
        handler.fail(400, f"part number {number!r} is not between 1 and {upload['total']}")
    elif body.get("partSize") != part_size(handler.library, upload, number):
        handler.fail(400, f"part {number} must be {part_size(handler.library, upload, number)} bytes")
    elif not _HEX.fullmatch(str(body.get("sha256sum") or "")):
        handler.fail(400, "no sha256sum of the part")
    else:
        upload["announced"][number] = body["sha256sum"]
        handler.answer({"presignedURL": handler.library.sign("PART", f"{body['uploadID']}.{number}")})


def multipart_complete(handler: Any, image_id: str, query: Query, user: str) -> None:
    body = _json(handler)
    found = _owned_image(handler, image_id, user)
    if found is None or (upload := _open_upload(handler, image_id, body)) is None:
        return
    listed = body.get("completedParts")
    wanted = [{"partNumber": number, "token": upload["stored"].get(number, {}).get("etag")}
              for number in range(1, upload["total"] + 1)]
    if listed != wanted or None in (part["token"] for part in wanted):
        handler.fail(400, "the completed parts are not every part, in order, with the ETags object storage gave")
        return
    target = handler.library.store.object_path("incoming-" + str(body["uploadID"]))
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for number in range(1, upload["total"] + 1):
            data = upload["stored"][number]["path"].read_bytes()
            digest.update(data)
            out.write(data)
    _drop_parts(upload, "completed")
    if target.stat().st_size != upload["filesize"] or f"sha256.{digest.hexdigest()}" != found["hash"]:
        target.unlink()
        handler.fail(400, "the parts are not the image's size and hash")
        return
    stored = target.rename(handler.library.store.object_path(digest.hexdigest()))
    _uploaded(handler, found, upload["filesize"], sif_arch(stored))


def multipart_abort(handler: Any, image_id: str, query: Query, user: str) -> None:
    body = _json(handler)
    if _owned_image(handler, image_id, user) is None or (upload := _open_upload(handler, image_id, body)) is None:
        return
    _drop_parts(upload, "aborted")
    handler.answer({})


def _drop_parts(upload: dict[str, Any], state: str) -> None:
    for part in upload["stored"].values():
        part["path"].unlink(missing_ok=True)
    upload["state"] = state


def store_part(handler: Any, name: str, data: bytes) -> None:
    """Object storage's PUT of part UPLOAD_ID.N (signature, no Authorization already checked by the caller)."""
    library = handler.library
    upload_id, _, number_text = name.partition(".")
    upload = library.multiparts.get(upload_id)
    number = int(number_text) if number_text.isdigit() else 0
    if upload is None or upload["state"] != "open" or number not in upload["announced"]:
        handler.fail(404, "no such part announced in an open upload")
        return
    if number == library.refuse_part:
        handler.fail(500, "we encountered an internal error, please try again")
        return
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != part_size(library, upload, number) or \
            digest != upload["announced"][number] or handler.headers.get("x-amz-content-sha256") != digest:
        handler.fail(400, "the part is not the size and sha256 announced (XAmzContentSHA256Mismatch)")
        return
    path = library.store.root / f"part-{upload_id}-{number}"
    path.write_bytes(data)
    upload["stored"][number] = {"etag": _etag(data), "path": path}  # recorded before the answer: then complete
    _stored(handler, data)


def store_upload(handler: Any, image_id: str, data: bytes) -> None:
    """Object storage's PUT of a whole file (a single upload)."""
    announced = handler.library.uploads.get(image_id, {})
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != announced.get("filesize") or digest != announced.get("sha256sum"):
        handler.fail(400, "the body is not the size and sha256 announced")
        return
    path = handler.library.store.object_path(digest)
    path.write_bytes(data)
    announced.update(stored=str(path), arch=sif_arch(path))
    _stored(handler, data)


def _etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'  # noqa: S324 - S3's ETag is the MD5 of the bytes


def _stored(handler: Any, data: bytes) -> None:
    """Object storage's answer to a PUT it kept: 200 with the ETag."""
    handler.send_response(200)
    handler.send_header("ETag", _etag(data))
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _by_action(actions: dict[str, Any]) -> Any:
    """A route for v2/imagefile/ID[/ACTION] that hands ID to the function of ACTION."""
    def route(handler: Any, rest: str, query: Query, user: str) -> None:
        image_id, _, action = rest.partition("/")
        function = actions.get(action)
        if function is None:
            handler.fail(404, f"no route v2/imagefile/{rest}")
            return
        function(handler, image_id, query, user)
    return route


ROUTES = (
    *API_ROUTES,
    ("POST", "/v2/imagefile/", _by_action({"": upload, "_multipart": multipart_start})),
    ("PUT", "/v2/imagefile/", _by_action({"_complete": complete, "_multipart": multipart_part,
                                          "_multipart_complete": multipart_complete,
                                          "_multipart_abort": multipart_abort})),
)

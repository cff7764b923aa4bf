"""The library's routes, as container-library-client calls them (client/api.go, pull.go, push.go, search.go).

    GET  version                               {"version", "apiVersion"}: 2.0.0-alpha.2 has per-arch tags
    GET  v1/images/PATH:TAG?arch=ARCH          an image's metadata (hash = sha256.HEX of the whole file)
    GET  v1/imagefile/PATH:TAG?arch=ARCH       303 to the file in object storage (or the file itself)
    GET  v1/containers/PATH                    a container, with its archTags {arch: {tag: image id}}
    GET|POST v1/entities, v1/collections, v1/containers, v1/images       looked up, created when missing
    POST v2/imagefile/ID {filesize, sha256sum, md5sum}  -> uploadURL (presigned: PUT there, no token)
    PUT  v2/imagefile/ID/_complete
    POST|PUT v2/imagefile/ID/_multipart, PUT .../_multipart_complete, .../_multipart_abort: large files (multipart.py)
    POST v2/tags/CONTAINER_ID {Arch, Tag, ImageID}
    GET  v1/search?value=&arch=&signed=
    DELETE v1/images/PATH:TAG?arch=ARCH        the image a tag names (container-library-client's DeleteImage)

Answers wrap their object in {"data": ...}; errors are {"error": {"code", "message"}}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from singpy.library import web
from singpy.library.endpoint import Library
from singpy.library.ref import LibraryRef
from singpy.library.remotes import RemoteError

ARCH_TAGS_VERSION = (2, 0, 0)  # 2.0.0-alpha.2 and later: per-architecture tags and the v2 upload


class NotFound(RemoteError):
    """The library has no such image (for that architecture)."""


def url(lib: Library, path: str, **query: str) -> str:
    return f"{lib.url}/{path}" + (f"?{urlencode(query)}" if query else "")


def get_image(lib: Library, ref: LibraryRef, arch: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The metadata of `ref` for `arch`: NotFound naming the architectures it exists for, if any."""
    try:
        image = web.get_json(url(lib, f"v1/images/{ref.name}", arch=arch), env, token=lib.token)
    except web.HTTPError as error:
        if error.status == 404:
            raise NotFound(_missing(lib, ref, arch, env)) from None
        raise refused(error, ref) from None
    if not isinstance(image, dict) or not isinstance(image.get("hash"), str) or not image.get("uploaded", True):
        raise NotFound(f"{ref} is not in the library {lib.url} for {arch} (not uploaded)")
    return image


def _missing(lib: Library, ref: LibraryRef, arch: str, env: Mapping[str, str]) -> str:
    """Why `ref` is not there, in the words that say what to do."""
    try:
        container = web.get_json(url(lib, f"v1/containers/{ref.path}"), env, token=lib.token)
    except RemoteError:
        return f"{ref} does not exist in the library {lib.url}: check the name (singpy search NAME)"
    arch_tags = container.get("archTags") if isinstance(container, dict) else None
    if not isinstance(arch_tags, dict):  # the library's answer, whatever it holds
        arch_tags = {}
    others = sorted(str(other) for other, tags in arch_tags.items()
                    if other != arch and isinstance(tags, dict) and ref.tag in tags)
    if others:
        return (f"{ref} exists for {', '.join(others)}, not {arch}: pull it with --arch "
                f"{others[0]} (it runs on a {others[0]} host only)")
    tags = sorted({str(tag) for tags in arch_tags.values() if isinstance(tags, dict) for tag in tags})
    known = f" (tags: {', '.join(tags[:10])})" if tags else ""
    return f"{ref}: no tag {ref.tag} in the library {lib.url} for {arch}{known}: name an existing tag"


def refused(error: web.HTTPError, ref: LibraryRef | str) -> RemoteError:
    detail = f": {error.detail}" if error.detail else ""
    if error.status == 401:
        return RemoteError(f"the library refused the token for {ref} ({error.status}{detail}): "
                           "log in again with 'singpy remote login --tokenfile FILE'")
    if error.status == 403:
        return RemoteError(f"the library does not let this token's user write {ref} ({error.status}{detail}): "
                           "push to an entity of your own")
    return error


def download(lib: Library, ref: LibraryRef, arch: str, env: Mapping[str, str], out: Any,
             progress: Any = None) -> int:
    try:
        return web.download(url(lib, f"v1/imagefile/{ref.name}", arch=arch), env, out, token=lib.token,
                            progress=progress)
    except web.HTTPError as error:
        if error.status == 404:
            raise NotFound(_missing(lib, ref, arch, env)) from None
        raise refused(error, ref) from None


def delete_image(lib: Library, ref: LibraryRef, arch: str, env: Mapping[str, str], timeout: float) -> None:
    """Remove the image `ref` names for `arch` from the library; NotFound when there is none."""
    try:
        web.get_json(url(lib, f"v1/images/{ref.name}", arch=arch), env, token=lib.token, method="DELETE",
                     timeout=timeout)
    except web.HTTPError as error:
        if error.status == 404:
            raise NotFound(_missing(lib, ref, arch, env)) from None
        if error.status == 403:
            raise RemoteError(f"the library does not let this token's user delete {ref} ({error.status}"
                              f"{': ' + error.detail if error.detail else ''})") from None
        raise refused(error, ref) from None


def call(lib: Library, route: str, env: Mapping[str, str], method: str, data: Any) -> Any:
    """The JSON answer of a write to the library's `route` (a refusal said in the words of `refused`)."""
    try:
        return web.get_json(url(lib, route), env, token=lib.token, method=method, data=data)
    except web.HTTPError as error:
        raise refused(error, route) from None


def api_version(lib: Library, env: Mapping[str, str]) -> tuple[int, ...]:
    """The library's API version (0,) when it does not say; "2.0.0-alpha.2" is (2, 0, 0)."""
    try:
        answer = web.get_json(url(lib, "version"), env, token=lib.token)
    except RemoteError:
        return (0,)
    text = str(answer.get("apiVersion") or "") if isinstance(answer, dict) else ""
    numbers = text.split("-", 1)[0].split(".")
    return tuple(int(part) for part in numbers if part.isascii() and part.isdigit() and len(part) < 10) or (0,)


def search(lib: Library, value: str, arch: str, signed: bool, env: Mapping[str, str]) -> dict[str, Any]:
    query = {"value": value, "arch": arch, **({"signed": "true"} if signed else {})}
    try:
        answer = web.get_json(url(lib, "v1/search", **query), env, token=lib.token)
    except web.HTTPError as error:
        raise refused(error, lib.url) from None
    return answer if isinstance(answer, dict) else {}


def find_or_create(lib: Library, kind: str, lookup: str, body: dict[str, str], env: Mapping[str, str]) -> str:
    """The id of the entity, collection or container `lookup`, created with `body` when missing."""
    try:
        found = web.get_json(url(lib, f"v1/{kind}/{lookup}"), env, token=lib.token)
    except web.HTTPError as error:
        if error.status != 404:
            raise refused(error, lookup) from None
        try:
            found = web.get_json(url(lib, f"v1/{kind}"), env, token=lib.token, method="POST",
                                 data={**body, "description": "No description"})
        except web.HTTPError as error:
            raise refused(error, lookup) from None
    identifier = found.get("id") if isinstance(found, dict) else None
    if not isinstance(identifier, str) or not identifier:
        raise RemoteError(f"the library gave no id for {lookup}")
    return identifier

"""`singpy push IMAGE.sif library://ENTITY/COLLECTION/CONTAINER[:TAG,...]`, as container-library-client's
UploadImage does it (its legacy path: the one for a library without an OCI registry behind it).

The entity, collection and container are looked up and created when missing, the image record made for
the file's hash, the file uploaded to the presigned URL the library gives (object storage: no token goes
there, in parts for a large file when the library offers it: singpy.library.multipart) and the upload
completed, then each tag set for the SIF's architecture. An image the library has
already is not sent again. A push needs the token of a remote (`singpy remote login`).

Apptainer refuses to push an image it can't verify unless --allow-unsigned. singpy refuses a SIF without any
signature object unless --allow-unsigned (`singpy sign` signs it); one that carries signatures is pushed as it
is, not verified first (the library and whoever pulls verify them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from singpy import console
from singpy.errors import ImageError
from singpy.library import client, endpoint, multipart, remotes, web
from singpy.library.ref import LibraryRef, parse
from singpy.library.remotes import RemoteError

UNSIGNED_HINT = "sign it first (singpy can't sign yet), or push it with --allow-unsigned (-U)"


def push(path: str, text: str, env: Mapping[str, str], home: str, *, library: str = "", https: bool = True,
         allow_unsigned: bool = False, description: str = "") -> str:
    """Upload the SIF `path` as `text`. Returns a summary."""
    ref = parse(text, push=True)
    arch, signed = _checked_sif(path, allow_unsigned)
    view = remotes.user_view(env, home)
    lib = endpoint.choose(view, env, host=ref.host, library=library, https=https)
    if not lib.token:
        raise RemoteError(f"can't push {ref}: no authentication token, log in with 'singpy remote login "
                          "--tokenfile FILE'")
    if client.api_version(lib, env) < client.ARCH_TAGS_VERSION:
        raise RemoteError(f"the library {lib.url} is too old for singpy's push (API 2.0.0-alpha.2 or later)")
    sha256, md5, size = _checksums(path)
    container = _container(lib, ref, env)
    image = _image(lib, ref, arch, container, f"sha256.{sha256}", description, env)
    if not image.get("uploaded"):
        _upload(lib, path, str(image["id"]), size, sha256, md5, env)
    for tag in ref.tag.split(","):
        client.call(lib, f"v2/tags/{container}", env, "POST", {"Arch": arch, "Tag": tag, "ImageID": image["id"]})
    if not signed:  # said once it is done: an error before it stays the one line a failure prints
        console.warning(f"{path} is not signed: pushed without verification (--allow-unsigned)")
    return f"pushed {path} to {ref} ({arch})"


def _checked_sif(path: str, allow_unsigned: bool) -> tuple[str, bool]:
    """The SIF's architecture and whether it is signed; ImageError for a file that is no SIF, or unsigned
    without allow_unsigned."""
    from singpy.errors import SifError
    from singpy.image.sif import DATA_SIGNATURE, read_sif

    try:
        image = read_sif(path)
        arch = image.primary_partition().arch
    except SifError as error:
        raise ImageError(f"can't push {path}: {error.message}") from None
    signed = bool(image.find(DATA_SIGNATURE))
    if not signed and not allow_unsigned:
        raise ImageError(f"can't push {path}: it is not signed; {UNSIGNED_HINT}")
    if arch == "unknown":
        raise ImageError(f"can't push {path}: unknown architecture in the SIF file")
    return arch, signed


def _checksums(path: str) -> tuple[str, str, int]:
    import hashlib

    sha256, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    try:
        with open(path, "rb") as source:
            while chunk := source.read(1 << 20):
                sha256.update(chunk)
                md5.update(chunk)
                size += len(chunk)
    except OSError as error:
        raise ImageError(f"can't read {path}: {error.strerror}") from None
    return sha256.hexdigest(), md5.hexdigest(), size


def _container(lib: endpoint.Library, ref: LibraryRef, env: Mapping[str, str]) -> str:
    entity, collection, name = ref.path.split("/")
    entity_id = client.find_or_create(lib, "entities", entity, {"name": entity}, env)
    collection_id = client.find_or_create(lib, "collections", f"{entity}/{collection}",
                                          {"name": collection, "entity": entity_id}, env)
    return client.find_or_create(lib, "containers", ref.path, {"name": name, "collection": collection_id}, env)


def _image(lib: endpoint.Library, ref: LibraryRef, arch: str, container: str, hash_tag: str, description: str,
           env: Mapping[str, str]) -> dict[str, Any]:
    try:
        return client.get_image(lib, LibraryRef(host=ref.host, path=ref.path, tag=hash_tag), arch, env)
    except client.NotFound:
        pass
    image = client.call(lib, "v1/images", env, "POST", {"hash": hash_tag, "container": container,
                                                  "description": description or "No description"})
    if not isinstance(image, dict) or not isinstance(image.get("id"), str):
        raise RemoteError(f"the library gave no id for the image of {ref}")
    return image


def _upload(lib: endpoint.Library, path: str, image_id: str, size: int, sha256: str, md5: str,
            env: Mapping[str, str]) -> None:
    if size > multipart.MINIMUM_PART_SIZE and multipart.upload(lib, path, image_id, size, env):
        return  # in parts (a library without multipart answers 404: the single upload below)
    answer = client.call(lib, f"v2/imagefile/{image_id}", env, "POST",
                   {"filesize": size, "sha256sum": sha256, "md5sum": md5})
    upload_url = answer.get("uploadURL") if isinstance(answer, dict) else None
    if not isinstance(upload_url, str) or not upload_url.startswith(("http://", "https://")):
        raise RemoteError(f"the library {lib.url} gave no upload URL")
    token = lib.token if web.origin(upload_url) == web.origin(lib.url) else ""  # never to object storage
    try:
        with open(path, "rb") as source:
            response = web.request("PUT", upload_url, env, token=token, stream=source, length=size,
                                   headers={"Content-Type": "application/octet-stream"})
            response.read()
            response.close()
    except OSError as error:
        raise ImageError(f"can't read {path}: {error.strerror}") from None
    if response.status != 200:
        raise RemoteError(f"the object store answered {response.status} to the upload of {path}")
    client.call(lib, f"v2/imagefile/{image_id}/_complete", env, "PUT", {})

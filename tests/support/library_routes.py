"""The routes of the test library (tests.support.library_server), one function each, written from the
client's source (container-library-client client/*.go; Apptainer's endpoint and user services).

Each takes (handler, the rest of the path after its prefix, the query, the user: "" when anonymous) and
runs with the store's lock held.
"""

from __future__ import annotations

import json
import re
from typing import Any

_HASH = re.compile(r"sha256\.[a-f0-9]{64}")
Query = dict[str, list[str]]


def _one(query: Query, key: str) -> str:
    return query.get(key, [""])[0]


def _json(handler: Any) -> dict[str, Any]:
    try:
        value = json.loads(handler.body() or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def version(handler: Any, rest: str, query: Query, user: str) -> None:
    handler.answer({"version": "1.0.0-singpy-tests", "apiVersion": "2.0.0-alpha.2"})


def discovery(handler: Any, rest: str, query: Query, user: str) -> None:
    """config.prod.json: the endpoint's services (not wrapped in "data": Apptainer reads the map itself)."""
    url = handler.library.url
    services = {"libraryAPI": {"uri": url}, "keystoreAPI": {"uri": url}, "tokenAPI": {"uri": url}}
    handler.send_body(200, json.dumps(services).encode())


def token_status(handler: Any, rest: str, query: Query, user: str) -> None:
    if not user:
        handler.fail(401, "no token")
        return
    handler.answer({"status": "valid"})


def current_user(handler: Any, rest: str, query: Query, user: str) -> None:
    if not user:
        handler.fail(401, "must be logged in")
        return
    handler.send_body(200, json.dumps({"username": user, "email": f"{user}@example.org", "realname": user,
                                       "oidc_user_meta": {"secret": f"oci-secret-of-{user}"}}).encode())


def _split(rest: str) -> tuple[str, str]:
    path, _, tag = rest.partition(":")
    return path, tag or "latest"


def image(handler: Any, rest: str, query: Query, user: str) -> None:
    path, tag = _split(rest)
    found = handler.library.store.resolve(path, tag, _one(query, "arch"))
    if found is None:
        handler.fail(404, f"image {rest} not found for {_one(query, 'arch') or 'any architecture'}")
        return
    handler.answer({**found, "tags": handler.library.store.tags_of(found)})


def image_file(handler: Any, rest: str, query: Query, user: str) -> None:
    path, tag = _split(rest)
    found = handler.library.store.resolve(path, tag, _one(query, "arch"))
    if found is None:
        handler.fail(404, f"image {rest} not found")
        return
    location = handler.library.sign("GET", found["hash"].removeprefix("sha256."))
    handler.send_body(303, b"", headers={"Location": location})


def lookup(kind: str) -> Any:
    def route(handler: Any, rest: str, query: Query, user: str) -> None:
        found = getattr(handler.library.store, kind).get(rest)
        if found is None:
            handler.fail(404, f"{rest} not found")
            return
        handler.answer(found)
    return route


def _owner_check(handler: Any, entity_name: str, user: str) -> bool:
    entity = handler.library.store.entities.get(entity_name)
    if entity is None or entity["owner"] != user:
        handler.fail(403, f"{user} may not write in {entity_name}")
        return False
    return True


def create_entity(handler: Any, rest: str, query: Query, user: str) -> None:
    name = str(_json(handler).get("name") or "")
    if name != user:
        handler.fail(403, f"{user} may not create the entity {name}")
        return
    if name in handler.library.store.entities:
        handler.fail(409, f"{name} exists")
        return
    handler.answer(handler.library.store.make_entity(name, user))


def create_collection(handler: Any, rest: str, query: Query, user: str) -> None:
    body = _json(handler)
    store = handler.library.store
    entity = next((one for one in store.entities.values() if one["id"] == body.get("entity")), None)
    if entity is None:
        handler.fail(400, "no such entity")
    elif _owner_check(handler, entity["name"], user):
        handler.answer(store.make_collection(entity, str(body.get("name") or "")))


def create_container(handler: Any, rest: str, query: Query, user: str) -> None:
    body = _json(handler)
    store = handler.library.store
    collection = next((one for one in store.collections.values() if one["id"] == body.get("collection")), None)
    if collection is None:
        handler.fail(400, "no such collection")
    elif _owner_check(handler, collection["entityName"], user):
        handler.answer(store.make_container(collection, str(body.get("name") or "")))


def create_image(handler: Any, rest: str, query: Query, user: str) -> None:
    body = _json(handler)
    store = handler.library.store
    container = store.container_by_id(str(body.get("container") or ""))
    if container is None or not _HASH.fullmatch(str(body.get("hash") or "")):
        handler.fail(400, "no such container, or not a sha256 hash")
    elif _owner_check(handler, container["entityName"], user):
        handler.answer(store.make_image(container, str(body["hash"]), str(body.get("description") or "")))


def upload(handler: Any, rest: str, query: Query, user: str) -> None:
    """POST v2/imagefile/ID: the presigned URL to PUT the file to (multipart is not offered: 404)."""
    store = handler.library.store
    found = store.images.get(rest)
    if found is None:
        handler.fail(404, f"no image {rest}")
        return
    container = store.container_by_id(found["container"])
    if not _owner_check(handler, container["entityName"], user):
        return
    body = _json(handler)
    if f"sha256.{body.get('sha256sum')}" != found["hash"] or not isinstance(body.get("filesize"), int):
        handler.fail(400, "the sha256sum is not the image's hash, or no filesize")
        return
    handler.library.uploads[rest] = {"filesize": body["filesize"], "sha256sum": body["sha256sum"]}
    handler.answer({"uploadURL": handler.library.sign("PUT", rest)})


def complete(handler: Any, rest: str, query: Query, user: str) -> None:
    image_id = rest.removesuffix("/_complete")
    store = handler.library.store
    found = store.images.get(image_id)
    done = handler.library.uploads.get(image_id, {})
    if found is None or not rest.endswith("/_complete") or "stored" not in done:
        handler.fail(404 if found is None else 400, "no upload to complete")
        return
    if not _owner_check(handler, found["entityName"], user):
        return
    found.update(uploaded=True, size=done["filesize"], arch=done["arch"])
    handler.answer({"quota": {"quotaTotal": 0, "quotaUsage": done["filesize"]}, "containerUrl": ""})


def tags(handler: Any, rest: str, query: Query, user: str) -> None:
    container = handler.library.store.container_by_id(rest)
    if container is None:
        handler.fail(404, "no such container")
        return
    handler.answer(container["archTags"])


def set_tag(handler: Any, rest: str, query: Query, user: str) -> None:
    store = handler.library.store
    container = store.container_by_id(rest)
    body = _json(handler)
    found = store.images.get(str(body.get("ImageID") or ""))
    if container is None or found is None or found["container"] != rest or not found["uploaded"]:
        handler.fail(404, "no such container or uploaded image")
        return
    if not _owner_check(handler, container["entityName"], user):
        return
    if body.get("Arch") != found["arch"]:
        handler.fail(400, f"the image is {found['arch']}, not {body.get('Arch')}")
        return
    container["archTags"].setdefault(found["arch"], {})[str(body.get("Tag"))] = found["id"]
    handler.answer({})


def search(handler: Any, rest: str, query: Query, user: str) -> None:
    value, arch = _one(query, "value").lower(), _one(query, "arch")
    if len(value) < 3:
        handler.fail(400, "search for at least 3 characters")
        return
    store = handler.library.store
    found = []
    for path, container in store.containers.items():
        if value not in path.lower() or _one(query, "signed") == "true":
            continue  # no image of this library is signed
        for identifier in set(container["archTags"].get(arch, {}).values()):
            one = store.images[identifier]
            found.append({**one, "tags": store.tags_of(one)})
    handler.answer({"entity": [], "collection": [], "container": [], "image": found})


ROUTES = (
    ("GET", "/version", version),
    ("GET", "/assets/config/config.prod.json", discovery),
    ("GET", "/v1/token-status", token_status),
    ("GET", "/v1/rbac/users/current", current_user),
    ("GET", "/v1/images/", image),
    ("GET", "/v1/imagefile/", image_file),
    ("GET", "/v1/entities/", lookup("entities")),
    ("GET", "/v1/collections/", lookup("collections")),
    ("GET", "/v1/containers/", lookup("containers")),
    ("POST", "/v1/entities", create_entity),
    ("POST", "/v1/collections", create_collection),
    ("POST", "/v1/containers", create_container),
    ("POST", "/v1/images", create_image),
    ("POST", "/v2/imagefile/", upload),
    ("PUT", "/v2/imagefile/", complete),
    ("GET", "/v2/tags/", tags),
    ("POST", "/v2/tags/", set_tag),
    ("GET", "/v1/search", search),
)

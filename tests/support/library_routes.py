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


def _resolved(handler: Any, rest: str, query: Query) -> dict[str, Any] | None:
    """The uploaded image PATH:TAG of `rest` for the query's arch (else the 404 is sent and None returned)."""
    path, tag = _split(rest)
    found: dict[str, Any] | None = handler.library.store.resolve(path, tag, _one(query, "arch"))
    if found is None:
        handler.fail(404, f"image {rest} not found for {_one(query, 'arch') or 'any architecture'}")
    return found


def image(handler: Any, rest: str, query: Query, user: str) -> None:
    if (found := _resolved(handler, rest, query)) is not None:
        handler.answer({**found, "tags": handler.library.store.tags_of(found)})


def image_file(handler: Any, rest: str, query: Query, user: str) -> None:
    if (found := _resolved(handler, rest, query)) is not None:
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


def _create_under(handler: Any, user: str, body: dict[str, Any], parent_kind: str, parents: dict[str, Any],
                  make: Any) -> None:
    """A collection or container made under the parent whose id `body` names, in an entity of the user's."""
    parent = next((one for one in parents.values() if one["id"] == body.get(parent_kind)), None)
    if parent is None:
        handler.fail(400, f"no such {parent_kind}")
    elif _owner_check(handler, parent.get("entityName", parent["name"]), user):
        handler.answer(make(parent, str(body.get("name") or "")))


def create_collection(handler: Any, rest: str, query: Query, user: str) -> None:
    store = handler.library.store
    _create_under(handler, user, _json(handler), "entity", store.entities, store.make_collection)


def create_container(handler: Any, rest: str, query: Query, user: str) -> None:
    store = handler.library.store
    _create_under(handler, user, _json(handler), "collection", store.collections, store.make_container)


def create_image(handler: Any, rest: str, query: Query, user: str) -> None:
    body = _json(handler)
    store = handler.library.store
    container = store.container_by_id(str(body.get("container") or ""))
    if container is None or not _HASH.fullmatch(str(body.get("hash") or "")):
        handler.fail(400, "no such container, or not a sha256 hash")
    elif _owner_check(handler, container["entityName"], user):
        handler.answer(store.make_image(container, str(body["hash"]), str(body.get("description") or "")))


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


def delete_image(handler: Any, rest: str, query: Query, user: str) -> None:
    """DELETE v1/images/PATH:TAG?arch=ARCH (container-library-client's DeleteImage: both required): the image
    the tag names for that architecture, with every tag naming it; its owner only."""
    if not _one(query, "arch") or not rest:
        handler.fail(400, "imageRef and arch are required")
        return
    found = _resolved(handler, rest, query)
    store = handler.library.store
    if found is None or not _owner_check(handler, found["entityName"], user):
        return
    container = store.container_by_id(found["container"])
    for tags in (container["archTags"].get(found["arch"], {}), container["imageTags"]):
        for tag in [tag for tag, identifier in tags.items() if identifier == found["id"]]:
            del tags[tag]
    container["images"].remove(found["id"])
    del store.images[found["id"]]
    handler.answer(None)


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
    ("GET", "/v2/tags/", tags),
    ("POST", "/v2/tags/", set_tag),
    ("GET", "/v1/search", search),
    ("DELETE", "/v1/images/", delete_image),
)

"""Registry mirrors, blocked and insecure registries from containers' registries.conf (issue 25).

Sites run pull-through caches for Docker Hub and air-gapped clusters have only a mirror; Apptainer
(through containers/image) and podman read their addresses from registries.conf(5), version 2, and so
does singpy, with containers/image's rules (pkg/sysregistriesv2, written down here from its v5 code):

* Files. `$CONTAINERS_REGISTRIES_CONF` (it must exist) or else `$HOME/.config/containers/registries.conf`
  when it exists or else `/etc/containers/registries.conf` (may be missing); then the `*.conf` drop-ins
  of `/etc/containers/registries.conf.d` and `$HOME/.config/containers/registries.conf.d`, each directory
  in name order, the system one first (only the user's directory when the user's file is the one read).
  A drop-in's `[[registry]]` replaces the whole entry of the same prefix. $HOME is the environment's,
  as containers/image reads it (the passwd home when it is unset). singpy.oci.regfiles finds and reads
  them; this module parses those that may define a registry.
* `[[registry]]`: `prefix` (default: `location`), `location`, `insecure`, `blocked`,
  `mirror-by-digest-only`, and `[[registry.mirror]]` tables (`location`, `insecure`,
  `pull-from-mirror` = all | digest-only | tag-only). The entry whose prefix matches the image's name
  (docker.io/library/debian) and is the longest wins; a prefix matches a whole name or its start up to
  a '/', ':' or '@'; `*.example.com` matches the hosts below example.com (its location must be empty:
  the image's own host). The matched prefix is replaced by an endpoint's location: prefix
  `docker.io/library` with location `mirror:5000/hub` sends `debian` to `mirror:5000/hub/debian`.
* Endpoints: the mirrors in order (only for a reference by digest with `mirror-by-digest-only`; a
  mirror's `pull-from-mirror` keeps it to digests or to tags), then the location itself. An endpoint is
  blocked when the entry matching *its* name is; the location is also when its own entry is, even where
  it names another host (containers/image would ask it): `blocked = true` means only mirrors are asked.
  `insecure = true` (the endpoint's own) means: HTTPS without verifying the certificate, and plain HTTP
  when HTTPS gets no answer (containers/image pings /v2/ the same way).
* Version 1 files (`[registries.insecure]`, `[registries.block]`) are read as the entries they mean;
  a drop-in must be version 2. `unqualified-search-registries` and `[aliases]` are ignored: Apptainer
  names an unqualified image docker.io/library/NAME before containers/image sees it, and so does singpy.

`Mirrored` is the registry client pull.py gets when an entry applies: each request goes to the first
endpoint that has not failed yet, and to the next one when it fails (unreachable, refused, missing the
image, a blob that does not match its digest: the download is discarded, never used). A manifest that
does not match its digest stops the pull: it would decide which blobs are trusted. Credentials for an
endpoint are its own host's (auth files); the ones given for the image's registry (--docker-login,
SINGPY_DOCKER_USERNAME...) go only to that registry, as containers/image does. The cache does not
change: blobs and SIFs are keyed by digest and references by the name as the user wrote it, so a
mirror and the origin share cached images.
"""

from __future__ import annotations

from singpy import console
from singpy.errors import ImageError
from singpy.oci import regfiles
from singpy.oci.ref import Reference, parse
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from singpy.oci.auth import Credentials

PULL_FROM = ("all", "digest-only", "tag-only")
_V2_KEYS = ("registry", "unqualified-search-registries", "aliases", "short-name-mode", "credential-helpers")


class Endpoint(Record):
    location: str  # host[:port][/path]; "" for the primary of a wildcard prefix: the image's own host
    insecure: bool = False
    pull_from_mirror: str = "all"


class Entry(Record):
    """One [[registry]] table, checked."""

    prefix: str
    location: str
    insecure: bool = False
    blocked: bool = False
    mirror_by_digest_only: bool = False
    mirrors: tuple[Endpoint, ...] = ()
    source: str = ""  # the file it came from (named when it blocks a pull)


class Source(Record):
    """Where one endpoint serves the image: its name there, and how to reach it."""

    reference: Reference
    insecure: bool
    mirror: bool
    blocked: str = ""  # "PREFIX is blocked in FILE" when the entry matching this endpoint's name blocks it


# --- the files ----------------------------------------------------------------------------------------------------


def load(env: Mapping[str, str], home: str) -> tuple[Entry, ...] | None:
    """The [[registry]] entries of registries.conf and its drop-ins, by prefix; None when no file exists."""
    found = regfiles.files(env, home)
    if found is None:
        return None
    merged: dict[str, Entry] = {}
    for path, drop_in in found:
        merged.update((entry.prefix, entry) for entry in _read(path, drop_in=drop_in))
    return tuple(merged[prefix] for prefix in sorted(merged))


def _read(path: str, *, drop_in: bool) -> list[Entry]:
    from singpy.host.hostfiles import shown

    text = regfiles.read(path)
    if not regfiles.may_name_registries(text):
        return []  # Debian's registries.conf (all comments), shortnames.conf (aliases): no entry to parse
    import tomllib  # only here: a run without registries.conf entries never loads it

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        import re

        message = str(error)
        where = re.search(r"\s*\(at line (\d+), column \d+\)$", message)
        line = f":{where.group(1)}" if where else ""
        raise ImageError(f"{shown(path)}{line}: not valid TOML: {message[:where.start()] if where else message}") \
            from None
    return parse_config(data, shown(path), text, drop_in=drop_in)


def parse_config(data: dict[str, Any], path: str, text: str = "", *, drop_in: bool = False) -> list[Entry]:
    """The checked entries of one parsed file (`text`: its lines, to name the line of a bad table)."""
    v1 = data.get("registries")
    if v1 is not None:
        if drop_in:
            raise ImageError(f"{path}: a drop-in must be in the version 2 format ([[registry]] tables), "
                             "not [registries.*]")
        if any(key in data for key in _V2_KEYS):
            raise ImageError(f"{path}: [registries.*] (version 1) and [[registry]] (version 2) can't be mixed")
        return _finish(_from_v1(v1, path), path, text)
    tables = data.get("registry", [])
    if not isinstance(tables, list) or not all(isinstance(table, dict) for table in tables):
        raise ImageError(f"{path}: 'registry' must be [[registry]] tables")
    return _finish([_entry(table, path, _line(text, number)) for number, table in enumerate(tables)], path, text)


def _line(text: str, number: int) -> str:
    """":LINE" of the header of the `number`th [[registry]] table in `text` ("" when it can't be told)."""
    import re

    headers = [index for index, line in enumerate(text.splitlines(), 1)
               if re.match(r"\s*\[\[\s*registry\s*\]\]", line)]
    return f":{headers[number]}" if number < len(headers) else ""


def _entry(table: dict[str, Any], path: str, line: str) -> Entry:
    def fail(problem: str) -> ImageError:
        return ImageError(f"{path}{line}: [[registry]] {table.get('prefix') or table.get('location') or ''}"
                          f"{' ' if table.get('prefix') or table.get('location') else ''}{problem}")

    prefix = _location(table, "prefix", fail)
    location = _location(table, "location", fail)
    if "pull-from-mirror" in table:
        raise fail("has 'pull-from-mirror', which only a [[registry.mirror]] may have")
    if not prefix:
        if not location:
            raise fail("has neither 'prefix' nor 'location'")
        prefix = location
    elif not location and not prefix.startswith("*."):
        raise fail("has no 'location' (only a wildcard prefix '*.example.com' may go without)")
    if prefix.startswith("*.") and location:
        raise fail("has a wildcard prefix and a 'location': the image's own host is the location of '*.' prefixes")
    by_digest = _flag(table, "mirror-by-digest-only", fail)
    mirrors = table.get("mirror", [])
    if not isinstance(mirrors, list) or not all(isinstance(mirror, dict) for mirror in mirrors):
        raise fail("'mirror' must be [[registry.mirror]] tables")
    endpoints = []
    for mirror in mirrors:
        where = _location(mirror, "location", fail)
        if not where:
            raise fail("has a mirror without 'location'")
        pull_from = mirror.get("pull-from-mirror", "") or "all"
        if pull_from not in PULL_FROM:
            raise fail(f"mirror {where}: 'pull-from-mirror' is {str(pull_from)[:40]!r}, not one of "
                       f"{', '.join(PULL_FROM)}")
        if by_digest and "pull-from-mirror" in mirror:
            raise fail(f"mirror {where}: 'pull-from-mirror' can't be set with 'mirror-by-digest-only'")
        endpoints.append(Endpoint(location=where, insecure=_flag(mirror, "insecure", fail), pull_from_mirror=pull_from))
    return Entry(prefix=prefix, location=location, insecure=_flag(table, "insecure", fail),
                 blocked=_flag(table, "blocked", fail), mirror_by_digest_only=by_digest, mirrors=tuple(endpoints),
                 source=path)


def _location(table: dict[str, Any], key: str, fail: Callable[[str], ImageError]) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise fail(f"'{key}' must be a string")
    value = value.rstrip("/")
    if value.startswith(("http://", "https://")):
        raise fail(f"'{key}' is {value[:80]!r}: a location has no URL scheme (insecure = true for plain HTTP)")
    if any(char.isspace() or not char.isprintable() for char in value):
        raise fail(f"'{key}' contains spaces or control characters")
    return value


def _flag(table: dict[str, Any], key: str, fail: Callable[[str], ImageError]) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise fail(f"'{key}' must be true or false")
    return value


def _from_v1(v1: object, path: str) -> list[Entry]:
    """[registries.block] and [registries.insecure] as the entries containers/image makes of them."""
    found: dict[str, dict[str, bool]] = {}
    for kind in ("block", "insecure"):
        table = v1.get(kind, {}) if isinstance(v1, dict) else None
        hosts = table.get("registries", []) if isinstance(table, dict) else None
        if not isinstance(hosts, list) or not all(isinstance(host, str) for host in hosts):
            raise ImageError(f"{path}: [registries.{kind}] registries must be a list of strings")
        for host in hosts:
            found.setdefault(host.rstrip("/"), {})["blocked" if kind == "block" else "insecure"] = True
    return [Entry(prefix=host, location=host, source=path, blocked=flags.get("blocked", False),
                  insecure=flags.get("insecure", False)) for host, flags in found.items()]


def _finish(entries: list[Entry], path: str, text: str) -> list[Entry]:
    """containers/image's post-processing: one location can't be both secure and insecure, or blocked and not;
    of entries with the same prefix the first counts."""
    by_location: dict[str, Entry] = {}
    for entry in entries:
        other = by_location.setdefault(entry.location or entry.prefix, entry)
        for field in ("insecure", "blocked"):
            if getattr(other, field) != getattr(entry, field):
                raise ImageError(f"{path}: registry {entry.location or entry.prefix} is defined more than once "
                                 f"with different '{field}' settings")
    first: dict[str, Entry] = {}
    for entry in entries:
        first.setdefault(entry.prefix, entry)
    return list(first.values())


# --- matching -----------------------------------------------------------------------------------------------------


def matched(name: str, prefix: str) -> int:
    """The length of `name` (host/repository) that `prefix` matches, or -1 (containers/image's refMatchingPrefix)."""
    if prefix.startswith("*."):
        index = name.find(prefix[1:])
        if index == -1 or "/" in name[:index]:
            return -1
        index += len(prefix) - 1
        return index if index == len(name) or name[index] in ":/@" else -1
    if name == prefix:
        return len(prefix)
    # containers/image lets example.com match example.com:5000 too (it warns not to rely on that): kept alike
    return len(prefix) if name.startswith(prefix) and name[len(prefix)] in ":/@" else -1


def find(entries: tuple[Entry, ...], name: str) -> Entry | None:
    """The entry with the longest prefix matching `name`; of two as long, the first by prefix."""
    best: Entry | None = None
    for entry in entries:
        if matched(name, entry.prefix) != -1 and (best is None or len(entry.prefix) > len(best.prefix)):
            best = entry
    return best


def sources(entries: tuple[Entry, ...], entry: Entry, ref: Reference) -> list[Source]:
    """The endpoints to ask for `ref`, in order: the mirrors its kind of reference may use, then the location."""
    digested = ref.digest is not None
    chosen = [mirror for mirror in entry.mirrors
              if (digested if entry.mirror_by_digest_only else
                  {"all": True, "digest-only": digested, "tag-only": not digested}[mirror.pull_from_mirror])]
    found = []
    for endpoint, mirror in [*((mirror, True) for mirror in chosen),
                             (Endpoint(location=entry.location, insecure=entry.insecure), False)]:
        physical = _rewrite(ref, entry, endpoint.location)
        # The entry of the endpoint's own name decides (containers/image); the primary's own entry, too: its
        # location is what `blocked` names, even where the location is another host (containers/image asks it)
        owner = entry if not mirror and entry.blocked else find(entries, f"{physical.registry}/{physical.repository}")
        unused = " (its mirrors are not for this kind of reference: see their pull-from-mirror or the " \
            "registry's mirror-by-digest-only)" if entry.mirrors and not chosen else ""
        found.append(Source(reference=physical, insecure=endpoint.insecure, mirror=mirror,
                            blocked=f"{owner.prefix} is blocked in {owner.source}{'' if mirror else unused}"
                            if owner is not None and owner.blocked else ""))
    return found


def _rewrite(ref: Reference, entry: Entry, location: str) -> Reference:
    """`ref` with the prefix `entry` matched replaced by `location` (unchanged for an empty one)."""
    if not location:
        return ref
    name = f"{ref.registry}/{ref.repository}"
    text = location + name[matched(name, entry.prefix):]
    host = text.partition("/")[0]
    if not ("." in host or ":" in host or host == "localhost"):
        raise ImageError(f"{entry.source}: [[registry]] {entry.prefix}: location {location!r} does not start "
                         "with a registry host (one with a '.' or a ':', or localhost)")
    suffix = (f":{ref.tag}" if ref.tag is not None else "") + (f"@{ref.digest}" if ref.digest else "")
    try:
        return parse(f"docker://{text}{suffix}")
    except ImageError as error:
        raise ImageError(f"{entry.source}: [[registry]] {entry.prefix} with location {location!r} turns {ref} "
                         f"into a {error.message}") from None


# --- the client ---------------------------------------------------------------------------------------------------


def registry_for(ref: Reference, *, env: Mapping[str, str], home: str, https: bool,
                 credentials: Callable[[Reference, Mapping[str, str]], Credentials | None]) -> Any:
    """The client pull.py uses for `ref`: a plain Registry when no registries.conf entry changes anything.

    `credentials(reference, env)` finds those of the reference's registry in `env` and the auth files.
    """
    from singpy.oci.registry import Registry

    entries = load(env, home)
    entry = find(entries, f"{ref.registry}/{ref.repository}") if entries else None
    if entries is None or entry is None or _plain(ref, entry):
        return Registry(ref, env=env, credentials=credentials(ref, env), https=https)
    return Mirrored(ref, sources(entries, entry, ref), env=env, https=https, credentials=credentials)


def is_direct(ref: Reference, *, env: Mapping[str, str], home: str) -> bool:
    """Whether `ref` is asked of its own registry alone, as registries.conf says nothing that changes it
    (registry_for gives a plain Registry): singpy.oci.quickhead may then check a cached tag by itself."""
    entries = load(env, home)
    entry = find(entries, f"{ref.registry}/{ref.repository}") if entries else None
    return entry is None or _plain(ref, entry)


def _plain(ref: Reference, entry: Entry) -> bool:
    return (not entry.mirrors and not entry.blocked and not entry.insecure
            and _rewrite(ref, entry, entry.location) == ref)


class Mirrored:
    """What pull.py asks a Registry, asked of each endpoint in turn (see the module's docstring)."""

    def __init__(self, ref: Reference, endpoints: list[Source], *, env: Mapping[str, str], https: bool,
                 credentials: Callable[[Reference, Mapping[str, str]], Credentials | None]) -> None:
        self.ref = ref
        self.endpoints = endpoints
        self._env = env
        self._https = https
        self._credentials = credentials
        self._clients: dict[int, Any] = {}
        self._failed: dict[int, ImageError] = {}  # endpoints not asked again in this pull
        import threading  # here: reading registries.conf (a cached tag's check) needs no thread
        self._lock = threading.Lock()

    def manifest(self, reference: str) -> Any:
        return self._each(lambda client: client.manifest(reference), manifest=True)

    def head_digest(self, reference: str) -> str | None:
        result: str | None = self._each(lambda client: client.head_digest(reference), manifest=True)
        return result

    def blob_bytes(self, digest: str, limit: int = 4 << 20) -> bytes:
        result: bytes = self._each(lambda client: client.blob_bytes(digest, limit), manifest=False)
        return result

    def fetch_blob(self, digest: str, target: str, *, size: int | None,
                   progress: Callable[[int], None] | None = None) -> None:
        self._each(lambda client: client.fetch_blob(digest, target, size=size, progress=progress), manifest=False)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> Mirrored:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _each(self, call: Callable[[Any], Any], *, manifest: bool) -> Any:
        from singpy.image.tools import Interrupted
        from singpy.oci.regerrors import CantWrite, DigestMismatch

        failures: list[tuple[Source, ImageError]] = []
        for index, source in enumerate(self.endpoints):
            if source.blocked:
                failures.append((source, ImageError(f"registry {source.blocked}")))
                continue
            with self._lock:
                failed = self._failed.get(index)
            if failed is not None:
                failures.append((source, failed))
                continue
            try:
                return call(self._client(index))
            except (CantWrite, Interrupted):
                raise  # this host's trouble: no endpoint would do better
            except DigestMismatch as error:
                if manifest:
                    raise
                console.warning(f"{error.message}; {source.reference.registry} is not asked again for "
                                f"{self.ref}")
                failure: ImageError = error
            except ImageError as error:
                console.debug(f"{source.reference.registry} failed for {self.ref}: {error.message}")
                failure = error
            with self._lock:
                self._failed.setdefault(index, failure)
            failures.append((source, failure))
        raise _combined(self.ref, failures)

    def _client(self, index: int) -> Any:
        """The Registry of endpoint `index`, made on first use (an insecure one is probed then)."""
        from singpy.oci.auth import ENV_PREFIXES
        from singpy.oci.insecure import Unverified, answers_https
        from singpy.oci.limits import Limits
        from singpy.oci.registry import Registry

        with self._lock:
            client = self._clients.get(index)
            if client is None:
                source = self.endpoints[index]
                https, transport = self._https, None
                if https and source.insecure:
                    transport = Unverified(self._env, Limits.from_env(self._env))
                    https = answers_https(transport, source.reference.endpoint)
                # Credentials given for the image's registry (SINGPY_DOCKER_USERNAME...) are not a mirror's
                env = self._env if source.reference.registry == self.ref.registry else \
                    {key: value for key, value in self._env.items()
                     if not (key.startswith(ENV_PREFIXES) and key.endswith(("USERNAME", "PASSWORD")))}
                client = self._clients[index] = Registry(
                    source.reference, env=self._env, credentials=self._credentials(source.reference, env),
                    https=https, transport=transport if https else None)
            return client


def _combined(ref: Reference, failures: list[tuple[Source, ImageError]]) -> ImageError:
    """One error for every endpoint's: the last one's (the primary's), the mirrors' in parentheses."""
    from singpy.oci.regerrors import Unreachable

    source, last = failures[-1]
    if len(failures) == 1:
        return last if not source.blocked else ImageError(f"can't pull {ref}: {last.message}")
    others = "; ".join(f"{source.reference.registry}: {error.message}" for source, error in failures[:-1])
    message = f"{last.message} (mirrors also failed: {others})"
    if source.blocked:
        message = f"can't pull {ref}: {message}"
    tried = [error for source, error in failures if not source.blocked]
    kind = Unreachable if tried and all(isinstance(error, Unreachable) for error in tried) else ImageError
    return kind(message, hint=last.hint)

"""Image references as users type them: `docker://alpine`, `oci:DIR:TAG`, `oci-archive:FILE`, `docker-archive:FILE`.

Registry references follow docker/distribution's grammar and normalization
(github.com/distribution/reference): the first path component names a
registry when it contains a '.' or a ':' or is `localhost` (or has capital
letters, which repository names never have); otherwise the registry is
`docker.io`, where a single name means `library/NAME`. A tag defaults to
`latest` unless a digest is given; `name:tag@digest` keeps both and is
fetched by the digest (the tag is only shown).

Local references keep the path absolute. `oci:` and `oci-archive:` take an
optional `:TAG` (an image's `org.opencontainers.image.ref.name`) and
`docker-archive:` an optional `:REPO:TAG` or `:@INDEX` (held in `tag`, as
typed). A path may itself contain ':', so the suffix is split off only when
the whole text is not an existing path and what follows the colon is a valid
tag.

`is_image_uri` is called by the command line on every image argument: it
imports nothing and looks at a prefix only.
"""

from __future__ import annotations

import os

from singpy.constants import IMAGE_URI_PREFIXES
from singpy.errors import ImageError
from singpy.record import Record

TRANSPORTS = ("docker", "oci", "oci-archive", "docker-archive")
DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"  # where docker.io's API is served
_DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io")
_MAX_NAME = 255  # distribution's limit on registry + repository
_SHOWN = 100  # characters of a reference quoted in a message

# distribution/reference's grammar, component by component.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGESTS = {"sha256": 64, "sha512": 128}  # the algorithms singpy verifies, and their hex lengths
# An OCI layout's ref.name (image-spec annotations.md), without ':' (it separates the tag from a path).
_LAYOUT_TAG = r"[A-Za-z0-9]+(?:(?:[-._+@]|--)[A-Za-z0-9]+)*(?:/[A-Za-z0-9]+(?:(?:[-._+@]|--)[A-Za-z0-9]+)*)*"

# The grammar above checked without `re` on the path of every `docker://` run: importing it and compiling these
# patterns cost ~2.5 ms of a cached image's start-up (tests/unit/test_ref_grammar.py checks both agree).
_LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER_ALNUM | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_WORD = _ALNUM | {"_"}
_TAG_CHARS = _WORD | {".", "-"}
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")


class Reference(Record):
    """Where an image comes from. Only the fields of its transport are set."""

    transport: str  # one of TRANSPORTS
    registry: str = ""  # docker: "docker.io", "ghcr.io", "127.0.0.1:5000" (host lowercased)
    repository: str = ""  # docker: "library/alpine"
    tag: str | None = None  # docker: "latest" unless a digest was given; local: the suffix after the path
    digest: str | None = None  # docker: "sha256:..." given with '@' (what is fetched when set)
    path: str = ""  # local transports: the absolute path of the directory or archive

    def __str__(self) -> str:
        if self.transport == "docker":
            text = f"docker://{self.registry}/{self.repository}"
            if self.tag is not None:
                text += f":{self.tag}"
            if self.digest is not None:
                text += f"@{self.digest}"
            return text
        return f"{self.transport}:{self.path}" + (f":{self.tag}" if self.tag is not None else "")

    @property
    def endpoint(self) -> str:
        """host[:port] of the registry's API (Docker Hub's is not docker.io itself)."""
        return DOCKER_HUB_ENDPOINT if self.registry == DOCKER_HUB else self.registry

    @property
    def manifest_reference(self) -> str:
        """What to ask the registry for: the digest when one was given, else the tag."""
        return self.digest or self.tag or "latest"


def is_image_uri(text: str) -> bool:
    """Does `text` name an image by transport (rather than a SIF file or a sandbox directory)?"""
    return text.startswith(IMAGE_URI_PREFIXES)


def parse(text: str) -> Reference:
    """The reference `text`, checked and normalized; ImageError names what is wrong with it."""
    if text.startswith("docker://"):
        return _parse_docker(text, text[len("docker://"):])
    for transport in ("oci-archive", "docker-archive", "oci"):
        if text.startswith(f"{transport}:"):
            return _parse_local(text, transport, text[len(transport) + 1:])
    scheme, separator, _ = text.partition("://")
    if separator and scheme:
        raise ImageError(f"unknown transport {_shown(scheme)!r} in {_shown(text)}: singpy pulls docker://, oci:, "
                         "oci-archive: and docker-archive: images")
    raise ImageError(f"{_shown(text)!r} is not an image reference: it must start with docker://, oci:, oci-archive: "
                     "or docker-archive:")


def valid_digest(text: str) -> bool:
    """Is `text` a digest singpy can verify ("sha256:" + 64 lowercase hex digits, or sha512)?"""
    algorithm, separator, encoded = text.partition(":")
    length = _DIGESTS.get(algorithm)
    return (bool(separator) and length is not None and len(encoded) == length
            and all(char in "0123456789abcdef" for char in encoded))


def valid_tag(text: str) -> bool:
    """Is `text` a tag (_TAG: a letter, digit or '_', then up to 127 of those, '.' and '-')?"""
    return 0 < len(text) <= 128 and text[0] in _WORD and all(char in _TAG_CHARS for char in text)


def valid_domain(text: str) -> bool:
    """Does `text` match _DOMAIN: dot-separated host labels or a bracketed IPv6 address, then an optional :PORT?"""
    if text.startswith("["):
        close = text.find("]")
        if close < 2 or any(char not in _HEX and char != ":" for char in text[1:close]):
            return False
        rest = text[close + 1:]
        if rest and not rest.startswith(":"):
            return False
        return not rest or _valid_port(rest[1:])
    host, colon, port = text.partition(":")
    if colon and not _valid_port(port):
        return False
    return all(_valid_label(label) for label in host.split("."))


def _valid_port(text: str) -> bool:
    return bool(text) and all(char in _DIGITS for char in text)


def _valid_label(label: str) -> bool:
    """_DOMAIN_COMPONENT: letters and digits, with '-' inside but not at either end."""
    return (bool(label) and label[0] in _ALNUM and label[-1] in _ALNUM
            and all(char in _ALNUM or char == "-" for char in label))


def valid_repository(text: str) -> bool:
    """Does `text` match _PATH_COMPONENT(/_PATH_COMPONENT)*: lowercase letters and digits, runs of them joined by
    one of '.', '_', '__' or any number of '-'?"""
    return all(_valid_component(component) for component in text.split("/"))


def _valid_component(component: str) -> bool:
    if not component or component[0] not in _LOWER_ALNUM or component[-1] not in _LOWER_ALNUM:
        return False
    separator = ""
    for char in component:
        if char in _LOWER_ALNUM:
            if separator and separator not in (".", "_", "__") and separator.strip("-"):
                return False
            separator = ""
        else:
            separator += char
    return True


def _shown(text: str) -> str:
    """`text` for a one-line message: control characters escaped, long text cut."""
    text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 20]}...{text[-15:]}"


def _parse_docker(text: str, rest: str) -> Reference:
    def malformed(why: str) -> ImageError:
        return ImageError(f"malformed reference {_shown(text)}: {why}")

    if not rest:
        raise malformed("the image name is missing")
    if any(char.isspace() or not char.isprintable() for char in rest):
        raise malformed("it contains spaces or control characters")
    name, at, digest = rest.partition("@")
    if at and not valid_digest(digest):
        raise malformed(f"{_shown(digest)!r} is not a sha256 digest (sha256: and 64 lowercase hex digits)")
    tag: str | None = None
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:  # a ':' in the last component separates the tag (one in the first is a port)
        name, tag = name[:colon], name[colon + 1:]
        if not valid_tag(tag):
            raise malformed(f"{_shown(tag)!r} is not a valid tag (letters, digits, '_', '.' and '-', "
                            "at most 128, not starting with '.' or '-')")
    registry, repository = _split_registry(name)
    if not valid_domain(registry):
        raise malformed(f"{_shown(registry)!r} is not a valid registry host")
    registry = registry.lower()
    if registry in _DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not repository:
        raise malformed("the repository name is missing")
    if repository != repository.lower():
        raise malformed("repository names must be lowercase")
    if not valid_repository(repository):
        raise malformed(f"{_shown(repository)!r} is not a valid repository name (lowercase letters, digits and "
                        "separators '.', '_', '__', '-' between them, components separated by '/')")
    if len(registry) + 1 + len(repository) > _MAX_NAME:
        raise malformed(f"the name is longer than {_MAX_NAME} characters")
    if tag is None and not at:
        tag = "latest"
    return Reference(transport="docker", registry=registry, repository=repository, tag=tag,
                     digest=digest if at else None)


def _split_registry(name: str) -> tuple[str, str]:
    first, slash, remainder = name.partition("/")
    if slash and (any(char in first for char in ".:") or first == "localhost" or first != first.lower()):
        return first, remainder
    return DOCKER_HUB, name


def _parse_local(text: str, transport: str, rest: str) -> Reference:
    import re

    if not rest:
        raise ImageError(f"malformed reference {_shown(text)}: the path is missing")
    if "\0" in rest:
        raise ImageError(f"malformed reference {_shown(text)}: it contains a NUL byte")
    path, tag = rest, None
    if not os.path.lexists(rest):
        if transport == "docker-archive":
            path, tag = _split_docker_archive(rest)
        else:
            head, colon, tail = rest.rpartition(":")
            if colon and head and re.fullmatch(_LAYOUT_TAG, tail, flags=re.ASCII):
                path, tag = head, tail
    return Reference(transport=transport, path=os.path.abspath(os.path.expanduser(path)), tag=tag)


def _split_docker_archive(rest: str) -> tuple[str, str | None]:
    """FILE, FILE:@INDEX or FILE:REPO[:TAG] (the archive may hold several images)."""
    import re

    splits = [(rest[:position], rest[position + 1:]) for position, char in enumerate(rest) if char == ":" and position]
    valid = [(path, suffix) for path, suffix in splits
             if re.fullmatch(r"@[0-9]{1,6}", suffix) or (suffix and _is_docker_name(suffix))]
    for path, suffix in valid:  # an archive that exists decides where its name ends
        if os.path.lexists(path):
            return path, suffix
    return valid[0] if valid else (rest, None)


def _is_docker_name(text: str) -> bool:
    try:
        _parse_docker(text, text)
    except ImageError:
        return False
    return "@" not in text

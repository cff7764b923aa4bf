"""library:// references, as Apptainer reads them (internal/pkg/client/library.NormalizeLibraryRef).

`library://[HOST/]ENTITY/COLLECTION/CONTAINER[:TAG|:sha256.HEX]`: a fourth path component in front is the
library's host; shorter paths (`library://alpine`, `library://collection/container`) are the default
entity's, as the Sylabs library resolves them. A missing tag is `latest`. Every part is checked against the
client's patterns (container-library-client's IsRefPart, IsImageHash): they become URL paths and file names.
"""

from __future__ import annotations

import re

from singpy.errors import UsageError
from singpy.record import Record

PREFIX = "library://"
DEFAULT_TAG = "latest"
_PART = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_TAG = re.compile(r"[a-zA-Z0-9]+(?:[._-][a-zA-Z0-9]+)*")
_HASH = re.compile(r"sha256\.[a-f0-9]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")


class LibraryRef(Record):
    host: str  # "" for the remote's library
    path: str  # entity/collection/container (or fewer parts)
    tag: str  # a tag, or sha256.HEX

    @property
    def by_hash(self) -> bool:
        return self.tag.startswith("sha256.")

    @property
    def name(self) -> str:
        """`path:tag`, as the library's routes take it."""
        return f"{self.path}:{self.tag}"

    def __str__(self) -> str:
        return f"{PREFIX}{self.host + '/' if self.host else ''}{self.name}"


def is_library(text: str) -> bool:
    return text.startswith(PREFIX)


def parse(text: str, *, push: bool = False) -> LibraryRef:
    """The reference `text`; UsageError naming what is wrong. `push`: a push needs the three-part path and
    takes tags only (the hash is the file's)."""
    rest = text[len(PREFIX):] if is_library(text) else text
    host = ""
    if rest.count("/") > 2:
        host, rest = rest.split("/", 1)
        if not _HOST.fullmatch(host):
            raise _bad(text, f"{host!r} is not a host name")
    path, _, tag = rest.partition(":")
    parts = path.split("/")
    if not all(_PART.fullmatch(part) for part in parts):
        raise _bad(text, "each of ENTITY/COLLECTION/CONTAINER is lower-case letters and digits, "
                         "separated by . _ or -")
    if push and len(parts) != 3:
        raise _bad(text, "a push names ENTITY/COLLECTION/CONTAINER")
    if ":" in rest and not tag:
        raise _bad(text, "an empty tag")
    tag = tag or DEFAULT_TAG
    if tag.startswith("sha256."):
        if push or not _HASH.fullmatch(tag):
            raise _bad(text, "a hash is sha256. and 64 lower-case hex digits" if not push else
                       "a push takes tags, not a hash")
    elif not all(_TAG.fullmatch(one) for one in tag.split(",")) or ("," in tag and not push):
        raise _bad(text, f"{tag!r} is not a tag")
    return LibraryRef(host=host, path=path, tag=tag)


def default_name(ref: LibraryRef) -> str:
    """What `pull` names the file: CONTAINER_TAG.sif (Apptainer's uri.Filename)."""
    container = ref.path.rsplit("/", 1)[-1]
    return f"{container}_{ref.tag.split(',')[0]}.sif"


def _bad(text: str, why: str) -> UsageError:
    from singpy.console import escape

    return UsageError(f"malformed library reference {escape(text[:300])}: {why}",
                      hint="write library://[HOST/]ENTITY/COLLECTION/CONTAINER[:TAG]")

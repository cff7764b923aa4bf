"""library:// references as Apptainer's NormalizeLibraryRef reads them, and the checks singpy adds (the parts
become URL paths and file names)."""

from __future__ import annotations

import pytest

from singpy.errors import UsageError
from singpy.library.ref import LibraryRef, default_name, parse

HASH = "sha256." + "ab" * 32


@pytest.mark.parametrize(("text", "host", "path", "tag"), [
    ("library://sylabs/examples/blender", "", "sylabs/examples/blender", "latest"),
    ("library://sylabs/examples/blender:2.8", "", "sylabs/examples/blender", "2.8"),
    ("library://alpine", "", "alpine", "latest"),
    ("library://library.example.org:8443/e/c/k:v1", "library.example.org:8443", "e/c/k", "v1"),
    (f"library://e/c/k:{HASH}", "", "e/c/k", HASH),
])
def test_parse(text: str, host: str, path: str, tag: str) -> None:
    ref = parse(text)
    assert (ref.host, ref.path, ref.tag) == (host, path, tag)
    assert parse(str(ref)) == ref  # written back as it reads


@pytest.mark.parametrize("text", [
    "library://E/c/k", "library://e/c/k:", "library://e/../k", "library://e/c/k:sha256.xyz", "library://e//k",
    "library://e/c/k:a,b", "library://h$st/e/c/k", "library://e/c/k:tag;rm",
])
def test_refused(text: str) -> None:
    with pytest.raises(UsageError, match="malformed library reference"):
        parse(text)


def test_push_references() -> None:
    assert parse("library://e/c/k:a,b", push=True).tag == "a,b"
    for text in ("library://c/k:v1", f"library://e/c/k:{HASH}"):
        with pytest.raises(UsageError):
            parse(text, push=True)


def test_default_name() -> None:
    assert default_name(LibraryRef(host="", path="sylabs/examples/blender", tag="latest")) == "blender_latest.sif"
    assert default_name(parse(f"library://e/c/k:{HASH}")) == f"k_{HASH}.sif"

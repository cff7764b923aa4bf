"""singpy.oci.ref: image references as users type them, normalized as docker/distribution does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.oci.ref import Reference, is_image_uri, parse, valid_digest

DIGEST = "sha256:" + "0123456789abcdef" * 4


def error_of(text: str) -> str:
    with pytest.raises(ImageError) as caught:
        parse(text)
    return caught.value.message


@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest", "canonical"), [
    ("docker://alpine", "docker.io", "library/alpine", "latest", None, "docker://docker.io/library/alpine:latest"),
    ("docker://alpine:3.19", "docker.io", "library/alpine", "3.19", None, "docker://docker.io/library/alpine:3.19"),
    ("docker://nvidia/cuda:12.4.1-base-ubuntu22.04", "docker.io", "nvidia/cuda", "12.4.1-base-ubuntu22.04", None,
     "docker://docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04"),
    ("docker://docker.io/alpine", "docker.io", "library/alpine", "latest", None,
     "docker://docker.io/library/alpine:latest"),
    ("docker://index.docker.io/library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None,
     "docker://docker.io/library/ubuntu:22.04"),
    ("docker://ghcr.io/o/r:tag", "ghcr.io", "o/r", "tag", None, "docker://ghcr.io/o/r:tag"),
    ("docker://nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3", None,
     "docker://nvcr.io/nvidia/pytorch:24.05-py3"),
    (f"docker://host:5000/r@{DIGEST}", "host:5000", "r", None, DIGEST, f"docker://host:5000/r@{DIGEST}"),
    (f"docker://Host.Example:5000/a/b/c@{DIGEST}", "host.example:5000", "a/b/c", None, DIGEST,
     f"docker://host.example:5000/a/b/c@{DIGEST}"),
    ("docker://localhost/x", "localhost", "x", "latest", None, "docker://localhost/x:latest"),
    ("docker://localhost:5000/x:v1", "localhost:5000", "x", "v1", None, "docker://localhost:5000/x:v1"),
    ("docker://127.0.0.1:5000/a/b:c", "127.0.0.1:5000", "a/b", "c", None, "docker://127.0.0.1:5000/a/b:c"),
    ("docker://[::1]:5000/x", "[::1]:5000", "x", "latest", None, "docker://[::1]:5000/x:latest"),
    (f"docker://alpine:3.19@{DIGEST}", "docker.io", "library/alpine", "3.19", DIGEST,
     f"docker://docker.io/library/alpine:3.19@{DIGEST}"),
    ("docker://a__b/c.d-e--f:T_1.x-", "docker.io", "a__b/c.d-e--f", "T_1.x-", None,
     "docker://docker.io/a__b/c.d-e--f:T_1.x-"),
])
def test_registry_references(text: str, registry: str, repository: str, tag: str | None, digest: str | None,
                             canonical: str) -> None:
    ref = parse(text)
    assert (ref.transport, ref.registry, ref.repository, ref.tag, ref.digest) == \
        ("docker", registry, repository, tag, digest)
    assert str(ref) == canonical
    assert parse(canonical) == ref  # the canonical form parses to the same reference


def test_endpoints() -> None:
    assert parse("docker://alpine").endpoint == "registry-1.docker.io"
    assert parse("docker://ghcr.io/o/r").endpoint == "ghcr.io"
    assert parse("docker://127.0.0.1:5000/r").endpoint == "127.0.0.1:5000"


def test_a_digest_is_what_is_fetched() -> None:
    assert parse(f"docker://alpine:3.19@{DIGEST}").manifest_reference == DIGEST
    assert parse("docker://alpine:3.19").manifest_reference == "3.19"


@pytest.mark.parametrize(("text", "words"), [
    ("docker://Alpine", "repository names must be lowercase"),
    ("docker://ghcr.io/Owner/repo", "repository names must be lowercase"),
    ("docker://alpine@sha256:abc", "is not a sha256 digest"),
    ("docker://alpine@sha256:" + "A" * 64, "is not a sha256 digest"),
    ("docker://alpine@md5:" + "a" * 32, "is not a sha256 digest"),
    ("docker://alpine@", "is not a sha256 digest"),
    ("docker://", "the image name is missing"),
    ("docker://alpine:", "is not a valid tag"),
    ("docker://alpine:-x", "is not a valid tag"),
    ("docker://alpine:" + "t" * 129, "is not a valid tag"),
    ("docker://a b", "spaces or control characters"),
    ("docker://a\nb", "spaces or control characters"),
    ("docker://ghcr.io/", "the repository name is missing"),
    ("docker://a//b", "is not a valid repository name"),
    ("docker://-a/b", "is not a valid repository name"),
    ("docker://a_/b", "is not a valid repository name"),
    ("docker://a/b:c:d", "is not a valid repository name"),
    ("docker://bad_host.io/x", "is not a valid registry host"),
    ("docker://host:port/x", "is not a valid registry host"),
    ("docker://ghcr.io/" + "a" * 250, "longer than 255"),
])
def test_malformed_registry_references(text: str, words: str) -> None:
    message = error_of(text)
    assert message.startswith("malformed reference docker://")
    assert words in message
    assert "\n" not in message


def test_unknown_transports_name_the_transport() -> None:
    assert error_of("foo://x") == ("unknown transport 'foo' in foo://x: singpy pulls docker://, oci:, oci-archive: "
                                   "and docker-archive: images")
    assert error_of("library://alpine").startswith("unknown transport 'library' in library://alpine:")
    assert "is not an image reference" in error_of("alpine")


def test_long_input_is_cut_in_messages() -> None:
    message = error_of("docker://" + "x" * 5000 + "@sha256:1")
    assert len(message) < 400


@pytest.mark.parametrize("text", ["docker://alpine", "oci:dir", "oci-archive:x.tar", "docker-archive:x.tar"])
def test_is_image_uri(text: str) -> None:
    assert is_image_uri(text)


@pytest.mark.parametrize("text", ["alpine", "image.sif", "/path/to/sandbox", "docker:alpine", "library://x",
                                  "ocifile", "shub://x"])
def test_is_not_image_uri(text: str) -> None:
    assert not is_image_uri(text)


def test_local_references_are_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse("oci:layout") == Reference(transport="oci", path=str(tmp_path / "layout"))
    assert parse("oci:layout:v1") == Reference(transport="oci", path=str(tmp_path / "layout"), tag="v1")
    assert parse("oci-archive:x.tar") == Reference(transport="oci-archive", path=str(tmp_path / "x.tar"))
    assert parse("oci-archive:/a/x.tar:latest") == Reference(transport="oci-archive", path="/a/x.tar", tag="latest")
    assert str(parse("oci-archive:/a/x.tar:latest")) == "oci-archive:/a/x.tar:latest"
    assert str(parse("oci:/a/b")) == "oci:/a/b"


def test_a_colon_belongs_to_the_path_when_that_path_exists(tmp_path: Path) -> None:
    odd = tmp_path / "dir:v1"
    odd.mkdir()
    assert parse(f"oci:{odd}") == Reference(transport="oci", path=str(odd))
    assert parse(f"oci:{odd}:v2") == Reference(transport="oci", path=str(odd), tag="v2")
    # Not a valid tag after the colon: all of it is the path.
    assert parse(f"oci:{tmp_path}/a:b c") == Reference(transport="oci", path=f"{tmp_path}/a:b c")


def test_layout_tags_may_hold_slashes(tmp_path: Path) -> None:
    assert parse(f"oci:{tmp_path}/l:ns/name-1.0") == Reference(transport="oci", path=f"{tmp_path}/l",
                                                                 tag="ns/name-1.0")


def test_docker_archive_references(tmp_path: Path) -> None:
    archive = tmp_path / "a:b.tar"
    archive.write_bytes(b"")
    assert parse(f"docker-archive:{archive}") == Reference(transport="docker-archive", path=str(archive))
    assert parse(f"docker-archive:{archive}:busybox:latest") == Reference(
        transport="docker-archive", path=str(archive), tag="busybox:latest")
    assert parse(f"docker-archive:{archive}:@1") == Reference(transport="docker-archive", path=str(archive), tag="@1")
    assert parse("docker-archive:/no/x.tar:docker.io/library/busybox:1") == Reference(
        transport="docker-archive", path="/no/x.tar", tag="docker.io/library/busybox:1")
    assert str(parse(f"docker-archive:{archive}:@1")) == f"docker-archive:{archive}:@1"


@pytest.mark.parametrize("text", ["oci:", "oci-archive:", "docker-archive:"])
def test_local_references_need_a_path(text: str) -> None:
    assert error_of(text) == f"malformed reference {text}: the path is missing"


def test_a_nul_byte_is_refused() -> None:
    assert "NUL" in error_of("oci:/a\0b")


def test_home_is_expanded() -> None:
    assert parse("oci:~/layout").path == os.path.expanduser("~/layout")


def test_valid_digest() -> None:
    assert valid_digest(DIGEST)
    assert valid_digest("sha512:" + "a" * 128)
    assert not valid_digest("sha256:" + "a" * 63)
    assert not valid_digest("sha256:" + "g" * 64)
    assert not valid_digest("sha256:../../etc/passwd")
    assert not valid_digest("a" * 64)

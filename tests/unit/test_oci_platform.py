"""Platforms: --arch values as Apptainer accepts them, and the choice of an image from an index."""

from __future__ import annotations

import os
from typing import Any

import pytest

from singpy.errors import ImageError
from singpy.oci.platform import Platform, choose, config_matches, host_platform, parse_arch
from tests.support import oci

ARM64 = Platform(architecture="arm64", variant="v8")
AMD64 = Platform(architecture="amd64")


@pytest.mark.parametrize("text, expected", [
    ("amd64", "linux/amd64"), ("x86_64", "linux/amd64"), ("X86_64", "linux/amd64"), ("linux/amd64", "linux/amd64"),
    ("arm64", "linux/arm64/v8"), ("aarch64", "linux/arm64/v8"), ("arm64/v8", "linux/arm64/v8"),
    ("linux/arm64", "linux/arm64/v8"), ("arm64v8", "linux/arm64/v8"),
    ("arm", "linux/arm"), ("arm/v7", "linux/arm/v7"), ("linux/arm/7", "linux/arm/v7"), ("armhf", "linux/arm/v7"),
    ("armel", "linux/arm/v6"), ("arm32v5", "linux/arm/v5"), ("arm32v6", "linux/arm/v6"),
    ("386", "linux/386"), ("i386", "linux/386"), ("ppc64le", "linux/ppc64le"), ("s390x", "linux/s390x"),
    ("riscv64", "linux/riscv64"), ("mips64le", "linux/mips64le"), ("loong64", "linux/loong64"),
])
def test_arch_values_apptainer_accepts(text: str, expected: str) -> None:
    assert str(parse_arch(text)) == expected


@pytest.mark.parametrize("text", ["", "sparc", "arm/v9", "arm64/v7", "linux/", "/amd64", "linux/amd64/v2/x",
                                  "windows/amd64", "amd64/v2 x", "armv7;rm"])
def test_bad_arch_is_one_error(text: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_arch(text)
    assert "\n" not in caught.value.message


def test_host_platform_is_this_machine() -> None:
    machine = os.uname().machine
    expected = {"x86_64": "linux/amd64", "aarch64": "linux/arm64/v8", "ppc64le": "linux/ppc64le",
                "s390x": "linux/s390x", "riscv64": "linux/riscv64"}.get(machine)
    if expected is None:
        pytest.skip(f"no expectation written for {machine}")
    assert str(host_platform()) == expected


def _index(*platforms: dict[str, Any], attestation: bool = False) -> dict[str, Any]:
    manifests = [{"mediaType": oci.OCI_MANIFEST, "digest": f"sha256:{index:064x}", "size": 1, "platform": platform}
                 for index, platform in enumerate(platforms, 1)]
    if attestation:
        manifests.insert(0, {"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": 1,
                             "platform": {"os": "unknown", "architecture": "unknown"},
                             "annotations": {"vnd.docker.reference.type": "attestation-manifest"}})
    return {"schemaVersion": 2, "manifests": manifests}


def test_arm64_with_or_without_v8_is_the_same_platform() -> None:
    without = _index({"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"})
    assert choose(without, ARM64, source="x")["digest"].endswith("2")
    written = _index({"os": "linux", "architecture": "arm64", "variant": "v8"})
    assert choose(written, parse_arch("arm64"), source="x")["digest"].endswith("1")


def test_the_real_multiarch_index_of_the_test_images() -> None:
    index = oci.multiarch_index()
    for want, marker in ((AMD64, "linux/amd64\n"), (ARM64, "linux/arm64/v8\n")):
        chosen = choose(index.manifest, want, source="docker://x")
        image = next(item for item in index.manifests if item.digest == chosen["digest"])
        assert isinstance(image, oci.Image)
        markers = [entry.content.decode() for layer in image.layers for entry in layer.entries
                   if entry.name == "etc/platform-marker"]
        assert markers == [marker]


def test_attestations_are_skipped_and_never_listed() -> None:
    index = _index({"os": "linux", "architecture": "amd64"}, attestation=True)
    assert choose(index, AMD64, source="x")["digest"].endswith("1")
    with pytest.raises(ImageError) as caught:
        choose(index, parse_arch("ppc64le"), source="docker://example.org/img:1")
    assert caught.value.message == "no linux/ppc64le image in docker://example.org/img:1: it has linux/amd64"
    assert "--arch" in (caught.value.hint or "")


def test_error_lists_every_platform_once() -> None:
    index = _index({"os": "linux", "architecture": "amd64"}, {"os": "linux", "architecture": "arm64"},
                   {"os": "linux", "architecture": "arm64", "variant": "v8"},
                   {"os": "windows", "architecture": "amd64"})
    with pytest.raises(ImageError) as caught:
        choose(index, parse_arch("s390x"), source="docker://r/x")
    assert caught.value.message.endswith("it has linux/amd64, linux/arm64/v8, windows/amd64")


def test_os_must_be_linux() -> None:
    index = _index({"os": "windows", "architecture": "amd64"})
    with pytest.raises(ImageError):
        choose(index, AMD64, source="x")


def test_exact_variant_first_then_older_arm() -> None:
    index = _index({"os": "linux", "architecture": "arm", "variant": "v6"},
                   {"os": "linux", "architecture": "arm", "variant": "v7"},
                   {"os": "linux", "architecture": "amd64", "variant": "v3"},
                   {"os": "linux", "architecture": "amd64"})
    assert choose(index, parse_arch("arm/v7"), source="x")["digest"].endswith("2")
    assert choose(index, parse_arch("arm/v6"), source="x")["digest"].endswith("1")
    only_v5 = _index({"os": "linux", "architecture": "arm", "variant": "v5"})
    assert choose(only_v5, parse_arch("armhf"), source="x")["digest"].endswith("1")
    with pytest.raises(ImageError):  # a v7 image does not run on a v6 machine
        choose(_index({"os": "linux", "architecture": "arm", "variant": "v7"}), parse_arch("armel"), source="x")
    assert choose(index, AMD64, source="x")["digest"].endswith("4")  # the plain one before amd64/v3


def test_entry_without_platform_is_the_fallback() -> None:
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "1" * 64, "size": 1,
         "platform": {"os": "linux", "architecture": "s390x"}},
        {"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "2" * 64, "size": 1}]}
    assert choose(index, AMD64, source="x")["digest"] == "sha256:" + "2" * 64
    assert choose(index, parse_arch("s390x"), source="x")["digest"] == "sha256:" + "1" * 64


@pytest.mark.parametrize("index", [{}, {"manifests": "x"}, {"manifests": [1, 2]}, {"manifests": None}])
def test_malformed_index_is_one_error(index: dict[str, Any]) -> None:
    with pytest.raises(ImageError, match="malformed image index"):
        choose(index, AMD64, source="x")


def test_malformed_platform_objects_are_not_matched() -> None:
    index = {"manifests": [{"mediaType": oci.OCI_MANIFEST, "digest": "sha256:" + "1" * 64, "size": 1,
                            "platform": {"os": "linux", "architecture": 64}}]}
    with pytest.raises(ImageError, match="lists no platform"):
        choose(index, AMD64, source="x")


def test_config_matches() -> None:
    assert config_matches({"architecture": "amd64", "os": "linux"}, AMD64)
    assert not config_matches({"architecture": "arm64", "os": "linux"}, AMD64)
    assert config_matches({"architecture": "arm64", "os": "linux"}, ARM64)
    assert config_matches({"architecture": "arm64", "variant": "v8", "os": "linux"}, ARM64)
    assert config_matches({"architecture": "arm", "variant": "v6"}, parse_arch("arm/v7"))
    assert not config_matches({"architecture": "arm", "variant": "v7"}, parse_arch("arm/v6"))
    assert config_matches({}, AMD64)  # an image that declares nothing (Apptainer: a warning only)
    assert not config_matches({"architecture": "amd64", "os": "windows"}, AMD64)

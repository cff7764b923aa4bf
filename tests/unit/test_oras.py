"""oras:// references, the ORAS manifest singpy pushes and accepts, and the credentials file of `registry login`."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from singpy.errors import ImageError, UsageError
from singpy.oci import authfile
from singpy.oci.auth import Credentials, find_credentials
from singpy.oci.manifest import Manifest
from singpy.oci.oras import SIF_CONFIG, SIF_LAYER, SIF_LAYER_PROTO, as_oras, parse_ref, shown, sif_layer
from singpy.oci.oraspush import manifest_for
from singpy.oci.regerrors import Unreachable

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "expected"), [
    ("oras://ghcr.io/org/tool:1.0", "oras://ghcr.io/org/tool:1.0"),
    ("oras://127.0.0.1:5000/a/b", "oras://127.0.0.1:5000/a/b:latest"),
    ("oras://alpine", "oras://docker.io/library/alpine:latest"),
    (f"oras://host.org/x@{DIGEST}", f"oras://host.org/x@{DIGEST}"),
])
def test_references_normalize_as_apptainer_reads_them(text: str, expected: str) -> None:
    assert shown(parse_ref(text)) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("oras://", "malformed reference oras://: the image name is missing"),
    ("oras://host.org/UPPER:v1", "malformed reference oras://host.org/UPPER:v1: repository names must be lowercase"),
    ("docker://alpine", "is not an oras:// reference"),
])
def test_bad_references_name_the_oras_text(text: str, message: str) -> None:
    with pytest.raises(ImageError) as raised:
        parse_ref(text)
    assert message in raised.value.message


def test_errors_of_the_registry_client_name_the_oras_reference() -> None:
    ref = parse_ref("oras://h.org/a/b:v1")
    error = as_oras(Unreachable("image docker://h.org/a/b:v1 not found"), ref)
    assert isinstance(error, Unreachable) and error.message == "image oras://h.org/a/b:v1 not found"


def manifest(layers: list[dict[str, object]]) -> Manifest:
    body = {"schemaVersion": 2, "config": {"mediaType": SIF_CONFIG, "digest": DIGEST, "size": 2}, "layers": layers}
    return Manifest(media_type="application/vnd.oci.image.manifest.v1+json", digest=DIGEST, data=b"", body=body)


@pytest.mark.parametrize("media_type", [SIF_LAYER, SIF_LAYER_PROTO])
def test_the_one_sif_layer_is_accepted(media_type: str) -> None:
    layer = {"mediaType": media_type, "digest": DIGEST, "size": 10}
    assert sif_layer(manifest([layer]), parse_ref("oras://h.org/a")) == layer


@pytest.mark.parametrize(("layers", "message"), [
    ([], "its manifest has 0 layers, not one"),
    ([{"mediaType": SIF_LAYER, "digest": DIGEST, "size": 1}] * 2, "its manifest has 2 layers, not one"),
    ([{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": DIGEST, "size": 1}],
     "its layer is of type 'application/vnd.oci.image.layer.v1.tar+gzip'"),
    ([{"mediaType": "\x1b[31mred", "digest": DIGEST, "size": 1}], "its layer is of type '\\x1b[31mred'"),
    ([{"mediaType": SIF_LAYER, "digest": "sha512:" + "a" * 128, "size": 1}], "singpy stores sha256 digests only"),
])
def test_anything_else_is_refused(layers: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ImageError) as raised:
        sif_layer(manifest(layers), parse_ref("oras://h.org/a"))
    assert message in raised.value.message


def test_the_pushed_manifest_is_apptainers() -> None:
    data = manifest_for(DIGEST, 29814784, "ubuntu_latest.sif")
    empty = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # Apptainer's constant
    assert empty == "sha256:" + hashlib.sha256(b"{}").hexdigest()
    assert data == (
        b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",'
        b'"config":{"mediaType":"application/vnd.sylabs.sif.config.v1+json","size":2,"digest":"' + empty.encode()
        + b'"},"layers":[{"mediaType":"application/vnd.sylabs.sif.layer.v1.sif","size":29814784,"digest":"'
        + DIGEST.encode() + b'","annotations":{"org.opencontainers.image.title":"ubuntu_latest.sif"}}]}')


@pytest.mark.parametrize(("uri", "registry"), [
    ("docker://ghcr.io", "ghcr.io"), ("oras://127.0.0.1:5000/", "127.0.0.1:5000"),
    ("docker://index.docker.io", "docker.io"), ("oras://Host.ORG/team", "host.org/team"),
])
def test_registry_of_a_login_uri(uri: str, registry: str) -> None:
    assert authfile.registry_of(uri) == registry


@pytest.mark.parametrize("uri", ["ghcr.io", "docker://", "https://ghcr.io", "docker://a b"])
def test_a_login_needs_a_registry_uri(uri: str) -> None:
    with pytest.raises(UsageError):
        authfile.registry_of(uri)


def test_the_default_file_is_apptainers(tmp_path: Path) -> None:
    assert authfile.credentials_file("", "/home/u", {}) == "/home/u/.apptainer/docker-config.json"
    assert authfile.credentials_file("rel.json", "/home/u", {}) == os.path.abspath("rel.json")
    assert authfile.credentials_file("", "/home/u", {"APPTAINER_CONFIGDIR": "/c"}) == "/c/docker-config.json"


def test_store_remove_and_list_keep_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "made" / "config.json"
    authfile.store_login(str(path), "docker.io", Credentials(username="u", password="p:w"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"auths": {"https://index.docker.io/v1/": {"auth": "dTpwOnc="}}}
    assert find_credentials("docker.io", {}, authfile=str(path), home=str(tmp_path)) == \
        Credentials(username="u", password="p:w")
    config = json.loads(path.read_text())
    config["credsStore"] = ""
    config["auths"]["https://other.org"] = {"username": "o", "password": "x"}
    path.write_text(json.dumps(config))
    authfile.store_login(str(path), "other.org", Credentials(username="n", password="y"))
    written = json.loads(path.read_text())
    assert list(written["auths"]) == ["https://index.docker.io/v1/", "other.org"] and written["credsStore"] == ""
    assert authfile.logins(str(path)) == [("docker.io", "u"), ("other.org", "n")]
    assert authfile.remove_login(str(path), "docker.io")
    assert not authfile.remove_login(str(path), "docker.io")
    assert authfile.logins(str(path)) == [("other.org", "n")]
    assert authfile.logins(str(tmp_path / "none.json")) == []


def test_a_broken_credentials_file_is_an_error_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ImageError) as raised:
        authfile.store_login(str(path), "h.org", Credentials(username="u", password="p"))
    assert "is not valid JSON" in raised.value.message
    assert path.read_text() == "{not json"


def test_pull_names_the_file_as_apptainer() -> None:
    from singpy.cli.pull import pull_target

    assert pull_target(["oras://h.org/a/tool:1.0"], "", "/d") == ("/d/tool_1.0.sif", "oras://h.org/a/tool:1.0")
    assert pull_target(["oras://h.org/a/tool:1.0"], "n.sif", "/d") == ("/d/n.sif", "oras://h.org/a/tool:1.0")
    assert pull_target(["out.sif", "oras://h.org/a/tool"], "", "") == ("out.sif", "oras://h.org/a/tool")

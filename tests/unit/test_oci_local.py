"""Local image sources: OCI layouts, oci-archive and docker-archive files, read in place and distrusted."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.oci import local
from singpy.oci.platform import choose, parse_arch
from singpy.oci.ref import parse
from tests.support import oci

IMAGE = oci.busybox_image(extra=[oci.file("etc/motd", "hello\n")], env=["PATH=/bin", "A=1"], cmd=["sh"])
OTHER = oci.busybox_image(extra=[oci.file("etc/motd", "other\n")], cmd=["true"])


def source(text: str) -> local.LocalSource:
    return local.open_source(parse(text))


def layer_bytes(src: local.LocalSource, digest: str) -> bytes:
    with src.open_blob(digest) as stream:
        return stream.read()


def check_image(src: local.LocalSource, image: oci.Image, reference: str | None = None) -> None:
    """The manifest is the image's, verified, and every blob reads back as written."""
    manifest = src.manifest(reference)
    assert (manifest.digest, manifest.data, manifest.media_type) == (image.digest, image.data, image.media_type)
    assert src.blob_bytes(image.config_digest) == image.config_data
    for layer in image.layers:
        assert layer_bytes(src, layer.digest) == layer.data


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    return oci.write_layout(tmp_path / "layout", {"latest": IMAGE, "other": OTHER})


# --- oci: ----------------------------------------------------------------------------------------------------------


def test_layout_by_tag(layout: Path) -> None:
    check_image(source(f"oci:{layout}:latest"), IMAGE)
    check_image(source(f"oci:{layout}:other"), OTHER)
    check_image(source(f"oci:{layout}"), OTHER, "other")  # the caller's reference wins over the opened one


def test_layout_with_one_image_needs_no_tag(tmp_path: Path) -> None:
    check_image(source(f"oci:{oci.write_layout(tmp_path / 'one', untagged=[IMAGE])}"), IMAGE)
    check_image(source(f"oci:{oci.write_layout(tmp_path / 'named', {'v1': IMAGE})}"), IMAGE)


def test_several_images_and_no_tag_lists_the_tags(layout: Path) -> None:
    with pytest.raises(ImageError) as caught:
        source(f"oci:{layout}").manifest()
    assert caught.value.message == f"oci:{layout} holds 2 images: name one (it has latest, other)"
    assert f"oci:{layout}:TAG" in (caught.value.hint or "")


def test_unknown_tag_lists_the_tags(layout: Path) -> None:
    with pytest.raises(ImageError) as caught:
        source(f"oci:{layout}:nope").manifest()
    assert caught.value.message == f"no image 'nope' in oci:{layout}: it has latest, other"


def test_multiarch_index_then_platform_manifest_by_digest(tmp_path: Path) -> None:
    index = oci.multiarch_index()
    src = source(f"oci:{oci.write_layout(tmp_path / 'multi', {'multi': index})}:multi")
    top = src.manifest()
    assert (top.digest, top.media_type) == (index.digest, oci.OCI_INDEX)
    chosen = choose(top.body, parse_arch("arm64"), source=str(src.where))
    arm = next(item for item in index.manifests if item.digest == chosen["digest"])
    assert isinstance(arm, oci.Image)
    check_image(src, arm, chosen["digest"])


def test_untagged_platform_entries_make_index_json_the_index(tmp_path: Path) -> None:
    """A layout written with the platform manifests straight in index.json (no names) is itself the index."""
    index = oci.multiarch_index(attestations=False)
    path = oci.write_layout(tmp_path / "flat", untagged=list(index.manifests))
    top = source(f"oci:{path}").manifest()
    assert top.media_type == oci.OCI_INDEX
    assert top.data == (path / "index.json").read_bytes()
    assert top.digest == "sha256:" + hashlib.sha256(top.data).hexdigest()
    assert [entry["digest"] for entry in top.body["manifests"]] == [item.digest for item in index.manifests]


def test_manifest_without_media_type_field(tmp_path: Path) -> None:
    image = oci.busybox_image(media_type_field=False)
    manifest = source(f"oci:{oci.write_layout(tmp_path / 'bare', {'t': image})}:t").manifest()
    assert manifest.media_type == oci.OCI_MANIFEST and "mediaType" not in manifest.body


def test_docker_v2_media_types_in_a_layout(tmp_path: Path) -> None:
    image = oci.busybox_image(docker=True)
    listed = oci.Index([image], docker=True)
    src = source(f"oci:{oci.write_layout(tmp_path / 'docker', {'list': listed})}:list")
    assert src.manifest().media_type == oci.DOCKER_LIST
    assert src.manifest(image.digest).media_type == oci.DOCKER_MANIFEST


def test_corrupt_blobs_are_caught(layout: Path) -> None:
    config = layout / "blobs" / "sha256" / IMAGE.config_digest.removeprefix("sha256:")
    config.write_bytes(config.read_bytes().replace(b"A=1", b"A=2"))
    manifest = layout / "blobs" / "sha256" / IMAGE.digest.removeprefix("sha256:")
    manifest.write_bytes(manifest.read_bytes() + b" ")
    src = source(f"oci:{layout}:latest")
    with pytest.raises(ImageError, match=f"digest mismatch for manifest {IMAGE.digest} in oci:{layout}"):
        src.manifest()
    with pytest.raises(ImageError, match=f"digest mismatch for blob {IMAGE.config_digest}"):
        src.blob_bytes(IMAGE.config_digest)


def test_missing_blob(layout: Path) -> None:
    (layout / "blobs" / "sha256" / IMAGE.config_digest.removeprefix("sha256:")).unlink()
    with pytest.raises(ImageError, match=f"blob {IMAGE.config_digest} is missing from oci:{layout}"):
        source(f"oci:{layout}:latest").blob_bytes(IMAGE.config_digest)


@pytest.mark.parametrize("digest", ["sha256:../../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "0" * 32,
                                    "sha256:" + "0" * 63, "sha256:" + "0" * 64 + "/x"])
def test_malformed_digests_never_name_files(layout: Path, digest: str) -> None:
    src = source(f"oci:{layout}:latest")
    with pytest.raises(ImageError):
        src.blob_bytes(digest)
    with pytest.raises(ImageError):
        src.open_blob(digest)


def test_malformed_index_json(tmp_path: Path) -> None:
    cases = {"not-json": b"{", "a-list": b"[]", "bad-digest": json.dumps(
        {"schemaVersion": 2, "manifests": [{"mediaType": oci.OCI_MANIFEST, "digest": "sha256:../x", "size": 1}]}
    ).encode(), "deep": b"[" * 100000 + b"]" * 100000, "no-manifests": b'{"schemaVersion": 2}'}
    for name, data in cases.items():
        path = oci.write_layout(tmp_path / name, {"t": IMAGE})
        (path / "index.json").write_bytes(data)
        with pytest.raises(ImageError, match=f"oci:{path}"):
            source(f"oci:{path}:t").manifest()


def test_huge_index_json_is_not_read_whole(tmp_path: Path) -> None:
    path = oci.write_layout(tmp_path / "huge", {"t": IMAGE})
    with open(path / "index.json", "wb") as handle:
        handle.truncate(1 << 30)  # sparse: reading it whole would take a gigabyte
    with pytest.raises(ImageError, match="too large"):
        source(f"oci:{path}:t").manifest()


def test_fifo_in_the_layout_is_refused_without_waiting(tmp_path: Path) -> None:
    path = oci.write_layout(tmp_path / "fifo-index", {"t": IMAGE})
    (path / "index.json").unlink()
    os.mkfifo(path / "index.json")
    with pytest.raises(ImageError, match="index.json.*FIFO"):
        source(f"oci:{path}:t")
    path = oci.write_layout(tmp_path / "fifo-blob", {"t": IMAGE})
    blob = path / "blobs" / "sha256" / IMAGE.config_digest.removeprefix("sha256:")
    blob.unlink()
    os.mkfifo(blob)
    src = source(f"oci:{path}:t")
    with pytest.raises(ImageError, match="FIFO"):
        src.blob_bytes(IMAGE.config_digest)
    with pytest.raises(ImageError, match="FIFO"):
        src.open_blob(IMAGE.config_digest)


def test_links_out_of_the_layout_are_refused(tmp_path: Path) -> None:
    """A blob, or the blobs directory, that is a symbolic link is never followed, wherever it leads."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / IMAGE.config_digest.removeprefix("sha256:")
    secret.write_bytes(IMAGE.config_data)  # even the right bytes are not read through a link
    path = oci.write_layout(tmp_path / "linked-blob", {"t": IMAGE})
    blob = path / "blobs" / "sha256" / secret.name
    blob.unlink()
    blob.symlink_to(secret)
    with pytest.raises(ImageError, match="symbolic link"):
        source(f"oci:{path}:t").blob_bytes(IMAGE.config_digest)
    path = oci.write_layout(tmp_path / "linked-dir", {"t": IMAGE})
    shutil.rmtree(path / "blobs" / "sha256")
    (path / "blobs" / "sha256").symlink_to(outside)
    with pytest.raises(ImageError, match="symbolic link"):
        source(f"oci:{path}:t").blob_bytes(IMAGE.config_digest)


def test_not_a_layout(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="no such directory"):
        source(f"oci:{tmp_path / 'absent'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageError, match="is not an OCI image layout"):
        source(f"oci:{tmp_path / 'empty'}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ImageError, match="is not a directory"):
        source(f"oci:{tmp_path / 'file'}")
    path = oci.write_layout(tmp_path / "bad-layout-file", {"t": IMAGE})
    (path / "oci-layout").write_text("{}")
    with pytest.raises(ImageError, match="malformed oci-layout"):
        source(f"oci:{path}")


# --- oci-archive: --------------------------------------------------------------------------------------------------


def test_oci_archive(tmp_path: Path) -> None:
    archive = oci.write_oci_archive(tmp_path / "image.tar", {"latest": IMAGE, "other": OTHER})
    check_image(source(f"oci-archive:{archive}:latest"), IMAGE)
    check_image(source(f"oci-archive:{archive}:other"), OTHER)
    assert sorted(os.listdir(tmp_path)) == ["image.tar"]  # read in place: nothing extracted next to it


def test_oci_archive_streams_are_independent(tmp_path: Path) -> None:
    """Blobs of one archive read at once from several threads (the lead's parallel layers) stay correct."""
    archive = oci.write_oci_archive(tmp_path / "image.tar", {"latest": IMAGE})
    src = source(f"oci-archive:{archive}:latest")
    blobs = [IMAGE.config_digest, *(layer.digest for layer in IMAGE.layers)] * 3
    results: dict[int, bytes] = {}

    def read(position: int, digest: str) -> None:
        chunks = []
        with src.open_blob(digest) as stream:
            while chunk := stream.read(4096):
                chunks.append(chunk)
        results[position] = b"".join(chunks)

    threads = [threading.Thread(target=read, args=(position, digest)) for position, digest in enumerate(blobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {IMAGE.config_digest: IMAGE.config_data, **{layer.digest: layer.data for layer in IMAGE.layers}}
    assert [results[position] for position in range(len(blobs))] == [expected[digest] for digest in blobs]


def test_skopeo_made_oci_archive(tmp_path: Path) -> None:
    """What another tool writes: skopeo copy of a multi-platform image into an oci-archive."""
    index = oci.multiarch_index(attestations=False)
    layout = oci.write_layout(tmp_path / "layout", {"multi": index})
    archive = tmp_path / "skopeo.tar"
    subprocess.run(["skopeo", "copy", "--all", f"oci:{layout}:multi", f"oci-archive:{archive}:multi"], check=True,
                   capture_output=True)
    src = source(f"oci-archive:{archive}")
    top = src.manifest()
    chosen = choose(top.body, parse_arch("amd64"), source=src.where)
    manifest = src.manifest(chosen["digest"])
    assert manifest.digest == chosen["digest"]
    for layer in manifest.body["layers"]:
        assert hashlib.sha256(layer_bytes(src, layer["digest"])).hexdigest() == layer["digest"][7:]


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, data: bytes = b"", *, link: str = "", kind: bytes = tarfile.REGTYPE) -> tuple[
        tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def test_archive_links_only_lead_to_members(tmp_path: Path) -> None:
    """A member that is a link to a host file (absolute, or climbing with ..) reads as missing: never the host's."""
    layout = oci.write_layout(tmp_path / "layout", {"t": IMAGE})
    hex_name = IMAGE.digest.removeprefix("sha256:")
    for target in ("/etc/hostname", "../../../../../../etc/hostname"):
        members = [_member("oci-layout", (layout / "oci-layout").read_bytes()),
                   _member("index.json", (layout / "index.json").read_bytes()),
                   _member(f"blobs/sha256/{hex_name}", link=target, kind=tarfile.SYMTYPE)]
        archive = _tar(tmp_path / "evil.tar", members)
        with pytest.raises(ImageError, match=f"manifest {IMAGE.digest} is missing"):
            source(f"oci-archive:{archive}:t").manifest()


def test_archive_links_between_members_are_followed(tmp_path: Path) -> None:
    """docker save links duplicate layers: ../ID/layer.tar; a relative link to another member reads it."""
    layout = oci.write_layout(tmp_path / "layout", {"t": IMAGE})
    hex_name = IMAGE.digest.removeprefix("sha256:")
    members = [_member("oci-layout", (layout / "oci-layout").read_bytes()),
               _member("index.json", (layout / "index.json").read_bytes()),
               _member("elsewhere/manifest", (layout / "blobs" / "sha256" / hex_name).read_bytes()),
               _member(f"./blobs/sha256/{hex_name}", link="../../elsewhere/manifest", kind=tarfile.SYMTYPE)]
    archive = _tar(tmp_path / "linked.tar", members)
    assert source(f"oci-archive:{archive}:t").manifest().digest == IMAGE.digest


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_archive_is_refused_with_a_hint(tmp_path: Path, compression: str) -> None:
    archive = oci.write_oci_archive(tmp_path / "image.tar", {"latest": IMAGE})
    packed = tmp_path / f"image.tar.{compression}"
    packed.write_bytes(oci.compress(archive.read_bytes(), compression))
    with pytest.raises(ImageError) as caught:
        source(f"oci-archive:{packed}")
    assert caught.value.message.startswith(f"oci-archive:{packed} is a {compression}-compressed archive")
    assert caught.value.hint


def test_archive_that_is_not_one(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(ImageError, match="is not a tar archive"):
        source(f"oci-archive:{junk}")
    empty = tmp_path / "empty.tar"
    empty.touch()
    with pytest.raises(ImageError, match="is not a tar archive"):
        source(f"oci-archive:{empty}")
    fifo = tmp_path / "fifo.tar"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="FIFO"):
        source(f"oci-archive:{fifo}")
    with pytest.raises(ImageError, match="no such file"):
        source(f"oci-archive:{tmp_path / 'absent.tar'}")
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(oci.write_oci_archive(tmp_path / "whole.tar", {"t": IMAGE}).read_bytes()[:-300000])
    with pytest.raises(ImageError):
        src = source(f"oci-archive:{truncated}:t")
        for layer in IMAGE.layers:
            assert layer_bytes(src, layer.digest) == layer.data


# --- docker-archive: -----------------------------------------------------------------------------------------------


def test_docker_archive_synthesizes_a_registry_manifest(tmp_path: Path) -> None:
    archive = oci.write_docker_archive(tmp_path / "saved.tar", IMAGE)
    src = source(f"docker-archive:{archive}")
    manifest = src.manifest()
    assert manifest.media_type == oci.DOCKER_MANIFEST
    assert manifest.digest == "sha256:" + hashlib.sha256(manifest.data).hexdigest()
    assert manifest.data == json.dumps(manifest.body, sort_keys=True, separators=(",", ":")).encode()
    assert manifest.body["config"] == {"mediaType": oci.DOCKER_CONFIG, "size": len(IMAGE.config_data),
                                       "digest": IMAGE.config_digest}
    # docker save writes layers uncompressed: each digest is then the layer's diff_id
    assert manifest.body["layers"] == [{"mediaType": oci.DOCKER_LAYER["none"], "size": len(layer.tar),
                                        "digest": layer.diff_id} for layer in IMAGE.layers]
    assert src.blob_bytes(IMAGE.config_digest) == IMAGE.config_data
    assert [layer_bytes(src, layer.diff_id) for layer in IMAGE.layers] == [layer.tar for layer in IMAGE.layers]
    assert src.manifest(manifest.digest) == manifest


def test_docker_archive_gzip_layers(tmp_path: Path) -> None:
    """podman save --compress / older tools: layer files that are gzip streams keep the gzip media type."""
    layer = gzip.compress(IMAGE.layers[0].tar, mtime=0)
    manifest = [{"Config": "config.json", "RepoTags": ["x/y:1"], "Layers": ["layer.tar.gz"]}]
    archive = _tar(tmp_path / "gz.tar", [_member("config.json", IMAGE.config_data),
                                         _member("layer.tar.gz", layer),
                                         _member("manifest.json", json.dumps(manifest).encode())])
    body = source(f"docker-archive:{archive}").manifest().body
    assert body["layers"] == [{"mediaType": oci.DOCKER_LAYER["gzip"], "size": len(layer),
                               "digest": "sha256:" + hashlib.sha256(layer).hexdigest()}]


def test_docker_archive_chooses_by_name_or_index(tmp_path: Path) -> None:
    first = oci.write_docker_archive(tmp_path / "one.tar", IMAGE, repo_tags=["test/busybox:latest", "busybox:1"])
    for suffix in ("", ":test/busybox:latest", ":test/busybox", ":docker.io/test/busybox:latest", ":busybox:1",
                   ":docker.io/library/busybox:1", ":@0"):
        assert source(f"docker-archive:{first}{suffix}").manifest().body["config"]["digest"] == IMAGE.config_digest
    with pytest.raises(ImageError, match=r"no image 'busybox:2' in docker-archive:.*: it has test/busybox:latest"):
        source(f"docker-archive:{first}:busybox:2").manifest()
    with pytest.raises(ImageError, match="no image @1 in"):
        source(f"docker-archive:{first}:@1").manifest()


def test_docker_archive_with_several_images(tmp_path: Path) -> None:
    one = oci.write_docker_archive(tmp_path / "one.tar", IMAGE, repo_tags=["a/one:1"])
    two = oci.write_docker_archive(tmp_path / "two.tar", OTHER, repo_tags=[])
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    images = []
    for path in (one, two):
        with tarfile.open(path) as archive:
            for info in archive.getmembers():
                handle = archive.extractfile(info)
                data = handle.read() if handle else b""
                if info.name == "manifest.json":
                    images += json.loads(data)
                elif info.name != "repositories" and info.isreg():
                    members.append(_member(info.name, data))
    members.append(_member("manifest.json", json.dumps(images).encode()))
    both = _tar(tmp_path / "both.tar", members)
    with pytest.raises(ImageError) as caught:
        source(f"docker-archive:{both}").manifest()
    assert caught.value.message == f"docker-archive:{both} holds 2 images: name one (it has a/one:1; 1 without a name)"
    assert source(f"docker-archive:{both}:@1").manifest().body["config"]["digest"] == OTHER.config_digest
    assert source(f"docker-archive:{both}:a/one:1").manifest().body["config"]["digest"] == IMAGE.config_digest


def test_docker_archive_with_a_layout_inside_prefers_it(tmp_path: Path) -> None:
    archive = oci.write_docker_archive(tmp_path / "d25.tar", IMAGE, layout_inside=True)
    manifest = source(f"docker-archive:{archive}").manifest()
    assert manifest.media_type == oci.OCI_MANIFEST  # the index.json entry, not a manifest made from manifest.json
    named = source(f"docker-archive:{archive}:test/busybox:latest").manifest()
    assert named.digest == manifest.digest
    with pytest.raises(ImageError, match="no image 'test/busybox:2'"):
        source(f"docker-archive:{archive}:test/busybox:2").manifest()


def test_skopeo_made_docker_archive(tmp_path: Path) -> None:
    """skopeo's docker-archive (as docker save: layer.tar links between members) read back whole."""
    layout = oci.write_layout(tmp_path / "layout", {"t": IMAGE})
    archive = tmp_path / "skopeo.tar"
    subprocess.run(["skopeo", "copy", f"oci:{layout}:t", f"docker-archive:{archive}:some/name:tag"], check=True,
                   capture_output=True)
    src = source(f"docker-archive:{archive}:some/name:tag")
    manifest = src.manifest()
    config = json.loads(src.blob_bytes(manifest.body["config"]["digest"]))
    assert config["config"]["Env"] == ["PATH=/bin", "A=1"]
    for layer, descriptor in zip(IMAGE.layers, manifest.body["layers"], strict=True):
        assert layer_bytes(src, descriptor["digest"]) == layer.tar


@pytest.mark.parametrize("manifest_json", [b"{}", b"[]", b"[1]", b'[{"Config": "c", "Layers": "x"}]',
                                           b'[{"Config": 1, "Layers": []}]', b"not json",
                                           b'[{"Config": "c", "Layers": [], "RepoTags": "x"}]'])
def test_malformed_manifest_json(tmp_path: Path, manifest_json: bytes) -> None:
    archive = _tar(tmp_path / "bad.tar", [_member("manifest.json", manifest_json)])
    with pytest.raises(ImageError, match=f"docker-archive:{archive}"):
        source(f"docker-archive:{archive}").manifest()


def test_docker_archive_reads_a_layer_listed_many_times_once(tmp_path: Path) -> None:
    """900 times the same 32 MiB layer: hashed once (0.1 s), not 900 times (28 GB, most of a minute)."""
    layer = _member("layer.tar", b"\0" * (32 << 20))
    manifest = [{"Config": "config.json", "RepoTags": ["x/y:1"], "Layers": ["layer.tar"] * 900}]
    archive = _tar(tmp_path / "repeats.tar", [_member("manifest.json", json.dumps(manifest).encode()),
                                              _member("config.json", IMAGE.config_data), layer])
    started = time.monotonic()
    body = source(f"docker-archive:{archive}").manifest().body
    assert time.monotonic() - started < 10
    digest = "sha256:" + hashlib.sha256(layer[1] or b"").hexdigest()
    assert body["layers"] == [{"mediaType": oci.DOCKER_LAYER["none"], "size": 32 << 20, "digest": digest}] * 900


def test_docker_archive_of_too_many_layers_is_refused_before_reading_them(tmp_path: Path) -> None:
    manifest = [{"Config": "config.json", "RepoTags": None, "Layers": ["layer.tar"] * 1001}]
    archive = _tar(tmp_path / "many.tar", [_member("manifest.json", json.dumps(manifest).encode()),
                                           _member("config.json", b"{}")])  # no layer.tar: never opened
    with pytest.raises(ImageError, match="image 0 lists 1001 layers \\(singpy reads at most 1000\\)"):
        source(f"docker-archive:{archive}").manifest()


def test_docker_archive_missing_files(tmp_path: Path) -> None:
    manifest = [{"Config": "config.json", "RepoTags": None, "Layers": ["missing/layer.tar"]}]
    archive = _tar(tmp_path / "holes.tar", [_member("manifest.json", json.dumps(manifest).encode())])
    with pytest.raises(ImageError, match="the image config config.json is missing"):
        source(f"docker-archive:{archive}").manifest()
    archive = _tar(tmp_path / "holes2.tar", [_member("manifest.json", json.dumps(manifest).encode()),
                                             _member("config.json", b"{}")])
    with pytest.raises(ImageError, match="the layer missing/layer.tar is missing"):
        source(f"docker-archive:{archive}").manifest()
    empty = _tar(tmp_path / "nothing.tar", [_member("README", b"hi")])
    with pytest.raises(ImageError, match="is not a docker archive"):
        source(f"docker-archive:{empty}")

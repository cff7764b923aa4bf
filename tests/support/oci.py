"""OCI images for the tests, written byte for byte by us: the one import for the entry, image and writer helpers.

The helpers live in three modules, all re-exported here (import from tests.support.oci):
tests.support.oci_entries (Entry and its helpers, tar_bytes), tests.support.oci_images (Layer, Image, Index,
the media types, the busybox images) and tests.support.oci_layouts (the layout and archive writers).

Nothing here talks to a registry (tests/support/registry.py pushes what this writes). Everything is
deterministic: the same inputs give the same digests (fixed mtimes, gzip without a timestamp).

Layer entries (`Entry` records, like tar members) are made with the helpers::

    file("etc/motd", "hello\\n", mode=0o644, uid=0, gid=0)    directory("home/user", uid=1000, gid=1000)
    symlink("bin/sh", "busybox")                            hardlink("bin/ls2", "bin/ls")  (target = member name)
    whiteout("etc/motd")        -> "etc/.wh.motd"           opaque("opt")  -> "opt/.wh..wh..opq"
    char_device("dev/null", 1, 3)    block_device("dev/loop9", 7, 9)    fifo("run/fifo")
    file("usr/bin/su", b"...", mode=0o4755)                 (setuid/setgid/sticky bits kept as given)
    tree(path, exclude=(".singularity.d",))                 (a directory on disk, hard links detected)

Names are written exactly as given: "../../etc/x", "/etc/abs" or a symlink followed by a file under it make
the hostile layers a safe extractor must refuse or contain.

Images and indexes::

    layer = Layer([file("a", "1")], compression="gzip")     # "gzip" (default), "zstd" or "none"
    Layer.raw(data, media_type)                            # any other blob as a layer (an in-toto statement)
    image = Image([busybox_layer(), layer], architecture="amd64", variant="", os="linux",
                  env=["PATH=/bin", "A=1"],  # default [DEFAULT_PATH]; None: no Env at all
                  entrypoint=["/bin/sh", "-c"], cmd=["echo hi"], labels={"k": "v"}, working_dir="/tmp",
                  user="1000:1000",
                  docker=False,              # True: Docker v2 schema2 media types (manifest, config v1, tar.gzip)
                  media_type_field=True,     # False: an OCI manifest without its "mediaType" field
                  config_extra={...},        # merged into the config JSON last (override anything)
                  annotations={...}, descriptor_annotations={...}, platform={...})  # manifest / index entry
    index = Index([image_amd64, image_arm64, attestation(image_amd64)], docker=False)   # True: manifest list
    attestation(image)                       # buildkit's attestation manifest for it (platform unknown/unknown,
                                             # vnd.docker.reference.type=attestation-manifest, in-toto layer)
    busybox_layer(compression="gzip")        # busybox-static (tests.support.images), root-owned, no
                                             # /.singularity.d; built once per process
    busybox_image(extra=[file("etc/x", "y")], layers=[...], compression="gzip", **Image options)
                                             # busybox layer + a layer of `extra` (if any) + `layers`
    multiarch_index(docker=False, attestations=True)   # amd64 + arm64/v8, each with /etc/platform-marker
                                                       # (platform_marker("arm64", "v8") == "linux/arm64/v8\n");
                                                       # both hold the host's busybox, so either one runs here

Layer: .entries, .tar (uncompressed), .diff_id, .data (the blob), .digest, .size, .media_type(docker=False).
Image: .layers, .config (dict), .config_data, .config_digest, .manifest (dict), .data, .digest, .size,
.media_type, .platform, .descriptor() (its entry in an index), .blobs(). Index: .manifests, .manifest, .data,
.digest, .size, .media_type, .descriptor(), .blobs().

Writers (each returns the path it wrote)::

    write_layout(dir, {"latest": image, "multi": index})   # OCI image layout; adds to an existing one;
                                                           # tags go in index.json's ref.name annotations
    write_oci_archive(file.tar, {"latest": image})         # a tar of such a layout
    write_docker_archive(file.tar, image, repo_tags=["test/busybox:latest"], layout_inside=False)
        # `docker save` format: manifest.json, <config hex>.json, <id>/layer.tar (uncompressed), repositories;
        # layout_inside=True: Docker 25's, with oci-layout + index.json + blobs/sha256 (layers uncompressed)

skopeo reads what these write (oci:, oci-archive:, docker-archive:), except Docker media types inside an OCI
layout (c/image accepts only OCI media types in index.json); umoci 0.4.7 unpacks layouts without zstd layers.
Files are written with the process umask; pytest's tmp_path is private (0700): put images the unprivileged
profile must read under conftest's `workdir`.

Digests are "sha256:<hex>" strings.
"""

from __future__ import annotations

from tests.support.oci_entries import (
    MTIME,
    Entry,
    block_device,
    char_device,
    directory,
    fifo,
    file,
    hardlink,
    opaque,
    symlink,
    tar_bytes,
    tree,
    whiteout,
)
from tests.support.oci_images import (
    COMPRESSIONS,
    DEFAULT_PATH,
    DOCKER_CONFIG,
    DOCKER_LAYER,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    IN_TOTO,
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER,
    OCI_MANIFEST,
    PLATFORMS,
    Image,
    Index,
    Layer,
    attestation,
    busybox_entries,
    busybox_image,
    busybox_layer,
    canonical_json,
    compress,
    multiarch_index,
    platform_marker,
    sha256,
)
from tests.support.oci_layouts import REF_NAME, readable_layout, write_docker_archive, write_layout, write_oci_archive

__all__ = [
    "COMPRESSIONS", "DEFAULT_PATH", "DOCKER_CONFIG", "DOCKER_LAYER", "DOCKER_LIST", "DOCKER_MANIFEST", "IN_TOTO",
    "MTIME", "OCI_CONFIG", "OCI_INDEX", "OCI_LAYER", "OCI_MANIFEST", "PLATFORMS", "REF_NAME", "Entry", "Image",
    "Index", "Layer", "attestation", "block_device", "busybox_entries", "busybox_image", "busybox_layer",
    "canonical_json", "char_device", "compress", "directory", "fifo", "file", "hardlink", "multiarch_index",
    "opaque", "platform_marker", "sha256", "symlink", "tar_bytes", "tree", "whiteout", "write_docker_archive",
    "readable_layout", "write_layout", "write_oci_archive",
]

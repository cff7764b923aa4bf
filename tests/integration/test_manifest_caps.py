"""An image manifest lists at most MAX_LAYERS layers, whoever serves it; a layer listed twice is applied twice.

A registry, an OCI layout or an OCI archive that lists one small layer 1001 times is one FATAL line naming
the count and the limit, before any layer is fetched or applied (docker archives: test_pull_sources.py).
A layer repeated in a manifest is legal (umoci and Apptainer apply it again, in its place): it is downloaded
once and applied at each place it is listed.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.oci import Image, Layer, busybox_layer, file, whiteout, write_layout, write_oci_archive
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache


def _owned_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """An empty directory the profile's user owns, for what singpy writes and what it reads."""
    parent = workdir / "manifest-caps"
    parent.mkdir(exist_ok=True)
    parent.chmod(0o755)
    path = parent / f"{singpy.profile}-{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _cache_env(singpy: Singpy, workdir: Path, name: str) -> dict[str, str]:
    return singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"caps-{name}-{uuid.uuid4().hex[:8]}")))


def test_a_manifest_at_the_limit_is_accepted() -> None:
    from singpy.oci import manifest

    assert manifest.MAX_LAYERS == 1000
    at_limit = Image([Layer([file("a", "1")])] * manifest.MAX_LAYERS).manifest
    assert manifest.manifest_problem(at_limit, manifest.OCI_MANIFEST) is None


@pytest.mark.parametrize("source", ["registry", "oci", "oci-archive"])
def test_a_manifest_listing_1001_layers_is_one_fatal_naming_the_count_and_the_limit(
        singpy: Singpy, workdir: Path, registry_plain: RegistryServer, source: str) -> None:
    layer = Layer([file("a", "1")])
    image = Image([layer] * 1001)
    where = _owned_dir(singpy, workdir, f"many-{source}")
    if source == "registry":
        name = f"caps/many-{singpy.profile}-{uuid.uuid4().hex[:8]}"
        registry_plain.upload(image, name)
        reference, flags = registry_plain.ref(name), ["--no-https"]
    elif source == "oci":
        reference, flags = f"oci:{write_layout(where / 'layout', {'latest': image})}:latest", []
    else:
        reference, flags = f"oci-archive:{write_oci_archive(where / 'image.tar', {'latest': image})}", []
    env = _cache_env(singpy, workdir, source)
    out = _owned_dir(singpy, workdir, f"out-{source}")
    result = singpy.run("pull", *flags, str(out / "many.sif"), reference, env=env, timeout=60)
    assert_one_fatal(result, "lists 1001 layers (singpy reads at most 1000)")
    assert os.listdir(out) == []
    hex_digest = layer.digest.partition(":")[2]
    assert list(Path(env["SINGPY_CACHEDIR"]).rglob(f"*{hex_digest}*")) == []  # nothing fetched before it


def test_a_layer_listed_twice_is_downloaded_once_and_applied_in_each_place(
        singpy: Singpy, workdir: Path, registry_plain: RegistryServer) -> None:
    """[busybox, A: /marker, B: removes /marker, A again]: the last A puts /marker back."""
    again = Layer([file("marker", "from A\n", mode=0o644)])
    removes = Layer([whiteout("marker")])
    image = Image([busybox_layer(), again, removes, again])
    name = f"caps/twice-{singpy.profile}-{uuid.uuid4().hex[:8]}"
    registry_plain.upload(image, name)
    env = _cache_env(singpy, workdir, "twice")
    out = _owned_dir(singpy, workdir, "twice")
    singpy.ok("pull", "--no-https", str(out / "twice.sif"), registry_plain.ref(name), env=env)
    assert singpy.ok("exec", str(out / "twice.sif"), "cat", "/marker", env=env) == "from A\n"
    fetched = [line for line in registry_plain.log.read_text(errors="replace").splitlines()
               if f"GET /v2/{name}/blobs/{again.digest}" in line]
    assert len(fetched) == 1, fetched

"""A pull that falls back from the merged stream to the tree path says each progress line once (issue 31).

The stream (singpy.oci.streamsquash) reads every layer's headers first, printing "Extracting layer N/M"
as it goes; an image it can't hold then goes to the tree path, which reads the layers again. The user must
see what a pull through the tree path alone (`SINGPY_PULL_TREE=1`) shows: "Getting ..." once, each layer's
line once, in order, and from a registry each blob downloaded (and said) once. As root and as the test user,
from an OCI layout and from a registry; `-d` shows that the stream was tried and fell back.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import busybox_image, directory, file, hardlink, symlink, write_layout
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache

FELL_BACK = "is converted through a tree"  # the `-d` line of a fallback (singpy.oci.streamsquash)


def hard_link_in_the_middle() -> oci.Image:
    """A hard link to a symbolic link in the second of three layers of ours: the headers' pass stops there."""
    return busybox_image(layers=[
        oci.Layer([file("first", "first layer\n")]),
        oci.Layer([symlink("a-link", "first"), hardlink("linked-link", "a-link")]),
        oci.Layer([file("third", "third layer\n")]),
    ])


def own_singularity_d() -> oci.Image:
    """Its own /.singularity.d: every header is read, then the stream leaves the image to the tree path."""
    return busybox_image(layers=[oci.Layer([directory(".singularity.d"), file(".singularity.d/mine", "x\n")]),
                                 oci.Layer([file("last", "last layer\n")])])


IMAGES = {"middle": hard_link_in_the_middle, "install": own_singularity_d}


@pytest.fixture(scope="module")
def layout(workdir: Path) -> Path:
    path = write_layout(workdir / "fallback-messages-layout", {tag: make() for tag, make in IMAGES.items()})
    for where, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chmod(os.path.join(where, name), 0o755 if name in dirs else 0o644)
    return path


@pytest.fixture(scope="module")
def registry(registry_plain: RegistryServer) -> RegistryServer:
    for tag, make in IMAGES.items():
        registry_plain.upload(make(), f"fallback-messages/{tag}")
    return registry_plain


def pulled_lines(singpy: Singpy, workdir: Path, source: str, name: str, *, tree: bool) -> tuple[list[str], str]:
    """The INFO lines of a `-d` pull of `source` in a new cache (through the tree path alone if `tree`), its
    output directory named OUT there, and all of stderr."""
    how = "tree" if tree else "stream"
    out = workdir / "fallback-messages-out" / f"{singpy.profile}-{name}-{how}"
    out.mkdir(parents=True)
    (workdir / "fallback-messages-out").chmod(0o755)
    os.chown(out, singpy.uid, singpy.gid)
    cache = new_cache(singpy, workdir, f"fallback-messages-{name}-{how}")
    env = singpy.env(SINGPY_CACHEDIR=str(cache), **({"SINGPY_PULL_TREE": "1"} if tree else {}))
    plain = ["--no-https"] if source.startswith("docker:") else []
    result = singpy.run("-d", "pull", *plain, str(out / "image.sif"), source, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "image.sif").is_file()
    info = [line.replace(str(out), "OUT") for line in result.stderr.splitlines() if line.startswith("INFO:")]
    return info, result.stderr


@pytest.mark.parametrize("tag", sorted(IMAGES))
def test_a_fallback_from_a_layout_says_what_the_tree_path_says(singpy: Singpy, workdir: Path, layout: Path,
                                                               tag: str) -> None:
    source = f"oci:{layout}:{tag}"
    fallback, everything = pulled_lines(singpy, workdir, source, f"layout-{tag}", tree=False)
    assert FELL_BACK in everything  # the stream was tried, and gave up
    tree, _ = pulled_lines(singpy, workdir, source, f"layout-{tag}", tree=True)
    assert fallback == tree
    layers = [line for line in fallback if "Extracting layer" in line]
    assert len(layers) == len(IMAGES[tag]().layers) >= 3
    assert sum(line.startswith("INFO:    Getting ") for line in fallback) == 1


@pytest.mark.parametrize("tag", sorted(IMAGES))
def test_a_fallback_from_a_registry_downloads_and_says_each_layer_once(singpy: Singpy, workdir: Path,
                                                                       registry: RegistryServer, tag: str) -> None:
    source = registry.ref(f"fallback-messages/{tag}")
    fallback, everything = pulled_lines(singpy, workdir, source, f"registry-{tag}", tree=False)
    assert FELL_BACK in everything
    assert len(fallback) == len(set(fallback)), "\n".join(fallback)
    downloads = [line for line in fallback if line.startswith("INFO:    Downloading ")]
    assert len(downloads) == len(IMAGES[tag]().layers)
    assert not [line for line in fallback if "Using cached layer" in line]  # what this pull downloaded itself
    tree, _ = pulled_lines(singpy, workdir, source, f"registry-{tag}", tree=True)
    assert sorted(fallback) == sorted(tree)  # the downloads' lines come from threads, in any order

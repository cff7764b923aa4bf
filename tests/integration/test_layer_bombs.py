"""Small layers that claim a lot: what a pull costs is bounded by what the layer holds, not by what it claims.

Real layers in an OCI layout, pulled as root and as the test user through the merged stream (tar2sqfs,
the default where it is installed):

* a GNU sparse member claiming 1 GiB: its map is forwarded to tar2sqfs, which makes the holes; the stream
  into tar2sqfs (counted by a wrapper around the real tool) carries its data, not a gigabyte of zeros;
* a zstd layer followed, after the tar's end marker, by 256 GiB of compressed zeros (a few MiB of blob):
  read a little past the end, as the tree path does, the digest checked on the compressed blob.

The tree path's side (holes left holes, the host's attributes skipped) is in tests/unit/test_oci_layers_hostile.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import zstandard

from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import busybox_image, readable_layout
from tests.support.sifs import new_cache, owned_dir

CLAIM = 1 << 30  # what the sparse member says its file holds
TAIL_GIB = 256  # GiB of zeros after the tar's end marker: minutes to inflate, twice


def sparse_layer(scratch: Path) -> oci.Layer:
    """GNU tar's PAX sparse member (1.0) of a 1 GiB file with 8 bytes of data, then a plain file."""
    source = Path(tempfile.mkdtemp(prefix="bomb-sparse-", dir=scratch))
    with open(source / "big", "wb") as out:
        out.truncate(CLAIM - 8)
        out.seek(0, os.SEEK_END)
        out.write(b"the end\n")
    (source / "after").write_text("after\n")
    tar = subprocess.run(["tar", "--sparse", "--format=pax", "--numeric-owner", "--owner=0", "--group=0",
                          "--mtime=@0", "-C", str(source), "-cf", "-", "big", "after"],
                         capture_output=True, check=True).stdout
    shutil.rmtree(source)
    assert b"GNU.sparse" in tar and len(tar) < 64 << 10
    layer = oci.Layer.raw(oci.compress(tar, "gzip"), "application/vnd.oci.image.layer.v1.tar+gzip")
    layer.diff_id = f"sha256:{hashlib.sha256(tar).hexdigest()}"
    return layer


def tailed_layer() -> oci.Layer:
    """A zstd tar holding one file, then TAIL_GIB frames of 1 GiB of zeros each (a few MiB of blob)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("hello")
        info.size = 6
        archive.addfile(info, io.BytesIO(b"hello\n"))
    compressor = zstandard.ZstdCompressor(level=3)
    stream = compressor.compressobj()
    zeros = bytes(1 << 20)
    frame = b"".join(stream.compress(zeros) for _ in range(1024)) + stream.flush()
    blob = compressor.compress(buffer.getvalue()) + frame * TAIL_GIB
    layer = oci.Layer.raw(blob, "application/vnd.oci.image.layer.v1.tar+zstd")
    layer.diff_id = f"sha256:{hashlib.sha256(buffer.getvalue()).hexdigest()}"  # the tar's (no tool reads past it)
    return layer


@pytest.fixture(scope="module")
def layout(workdir: Path) -> Path:
    images = {"sparse": busybox_image(layers=[sparse_layer(workdir)]), "tailed": busybox_image(layers=[tailed_layer()])}
    return readable_layout(workdir / "bombs-layout", images)


def own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    return owned_dir(singpy, workdir / "bombs-out", name)


def listed(sif: Path) -> str:
    """The root filesystem of `sif` as `unsquashfs -lln` lists it."""
    info = subprocess.run(["siftool", "info", "4", str(sif)], capture_output=True, text=True, check=True).stdout
    offset = next(line.split()[-1] for line in info.splitlines() if line.strip().startswith("Offset:"))
    return subprocess.run(["unsquashfs", "-lln", "-o", offset, str(sif)], capture_output=True, text=True,
                          check=True).stdout


def test_a_sparse_files_holes_never_cross_the_pipe(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """The stream into tar2sqfs holds the sparse member's map and data, not the gigabyte it claims: a wrapper
    around the real tar2sqfs counts it. The SIF lists the file at its full size."""
    real = shutil.which("tar2sqfs")
    if real is None:
        pytest.skip("tar2sqfs (squashfs-tools-ng) is not installed: no merged stream")
    tools = own_dir(singpy, workdir, "counting-tools")
    counted = tools / "stream-bytes"
    wrapper = tools / "tar2sqfs"
    wrapper.write_text(f'#!/bin/bash\n{real} "$@" < <(tee >(wc -c > {counted}.part && mv {counted}.part {counted}))\n')
    wrapper.chmod(0o755)
    out = own_dir(singpy, workdir, "sparse")
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "bombs-sparse")),
                     PATH=f"{tools}:{os.environ['PATH']}")
    result = singpy.run("-d", "pull", str(out / "image.sif"), f"oci:{layout}:sparse", env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert str(wrapper) in result.stderr and "is converted through a tree" not in result.stderr
    deadline = time.monotonic() + 30
    while not counted.exists() and time.monotonic() < deadline:  # wc ends with the stream, after tar2sqfs
        time.sleep(0.1)
    sent = int(counted.read_text())
    assert sent < 8 << 20, f"{sent} bytes sent to tar2sqfs"
    shown = listed(out / "image.sif")
    assert re.search(rf"^-rw-r--r-- 0/0 +{CLAIM} .* squashfs-root/big$", shown, re.M), shown
    assert "squashfs-root/after" in shown


def test_what_follows_the_tars_end_is_not_inflated(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """256 GiB of zstd zeros after the end marker (minutes to inflate, twice): the pull reads a little past
    the end, as the tree path does, and checks the digest on the compressed blob."""
    out = own_dir(singpy, workdir, "tailed")
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "bombs-tailed")))
    started = time.monotonic()
    result = singpy.run("-d", "pull", str(out / "image.sif"), f"oci:{layout}:tailed", env=env, timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tar2sqfs" in result.stderr and "is converted through a tree" not in result.stderr
    assert took < 30, f"the pull took {took:.0f} s"
    assert "squashfs-root/hello" in listed(out / "image.sif")

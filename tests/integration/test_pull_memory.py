"""A pull's memory stays bounded whatever the image's size (issue 31, "Big pulls").

Unbounded, mksquashfs caches about as much of the tree as it can read ahead (25% of the host's memory
by default): 1.1 GiB of RSS for a 1.2 GB tree, 1.9 GiB for a 2 GiB one, enough for a login node's
memory limit to kill the pull. singpy bounds it (`-mem`, singpy.constants.SQUASH_MEMORY).

The image here holds 640 MiB of file data that compresses well (the layer is small and quick to make and
push) but that no two squashfs blocks share, so mksquashfs can neither skip nor deduplicate it: unbounded,
its cache grows past the bound checked (over 500 MB measured). The measure is the whole pull's process
tree, singpy and every helper it starts, in a memory cgroup of its own (tests.support.treepeak: the sum of
each process's peak resident set). Memory, not time: nothing here is timed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.oci import Image, Layer, busybox_layer, directory, file, write_layout
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache
from tests.support.treepeak import TreePeak, unavailable

MIB = 1 << 20
FILES, FILE_MIB = 80, 8  # 640 MiB of data
BLOCK = 128 * 1024  # mksquashfs's block size: every block of every file differs
# singpy's Python (~30 MiB) and mksquashfs bounded (~70 MiB on this image, ~170 MB on large ones) with room
# for a loaded machine; mksquashfs alone, unbounded, takes more than this on this image.
BOUND = 256 * MIB


def data_file(number: int) -> bytes:
    """FILE_MIB MiB whose every 128 KiB block is a different, highly compressible text."""
    blocks = []
    for block in range(FILE_MIB * MIB // BLOCK):
        line = f"file {number} block {block} of the memory test image\n".encode()
        blocks.append((line * (BLOCK // len(line) + 1))[:BLOCK])
    return b"".join(blocks)


@pytest.fixture(scope="module")
def big_image(registry_plain: RegistryServer, workdir: Path) -> str:
    """The reference of the 640 MiB image in registry_plain (built and pushed once)."""
    data = Layer([directory("data"), *(file(f"data/part-{n:03}", data_file(n)) for n in range(FILES))])
    image = Image([busybox_layer(), data], cmd=["/bin/sh"])
    layout = write_layout(workdir / "memory-layout", {"latest": image})
    registry_plain.push(layout, "pull/memory")
    return registry_plain.ref("pull/memory")


@pytest.mark.parametrize("squasher", ["tar2sqfs", "mksquashfs"])
def test_a_large_pull_stays_under_the_memory_bound(singpy: Singpy, big_image: str, workdir: Path,
                                                   squasher: str) -> None:
    """Both ways a pull squashes: one merged tar stream into tar2sqfs, or a tree (SINGPY_PULL_TREE=1) into
    mksquashfs (the way of an image the stream can't hold)."""
    if why := unavailable():
        pytest.skip(why)
    tree = {"SINGPY_PULL_TREE": "1"} if squasher == "mksquashfs" else {}
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"memory-{squasher}")), **tree)
    target = new_cache(singpy, workdir, f"memory-out-{squasher}") / "memory.sif"  # a directory the user owns
    argv, ids = singpy.command(["-q", "pull", "--no-https", str(target), big_image])
    with TreePeak(singpy.uid) as peak:
        result = subprocess.run(peak.wrap(argv), env=env, cwd=str(workdir), capture_output=True, text=True,
                                timeout=600, **ids)  # type: ignore[call-overload]
    assert result.returncode == 0, result.stderr
    shown = ", ".join(f"{name} {size // MIB} MiB" for name, size in sorted(peak.by_name().items()))
    assert squasher in peak.by_name(), f"{squasher} was not seen in the pull's process tree: {shown}"
    assert peak.bytes <= BOUND, f"the pull peaked at {peak.bytes // MIB} MiB (bound {BOUND // MIB}): {shown}"
    # The SIF holds the data, whole: the last file's last block read back through the container.
    last = singpy.run("exec", str(target), "tail", "-c", "60", f"/data/part-{FILES - 1:03}", env=env)
    assert last.returncode == 0, last.stderr
    assert last.stdout == data_file(FILES - 1)[-60:].decode()

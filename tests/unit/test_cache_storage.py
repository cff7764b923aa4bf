"""Which filesystem the extraction cache is on, and the warning for network storage (issue 15)."""

from __future__ import annotations

import pytest

from singpy.host.cachefiles import filesystem_type
from singpy.image.cache import LARGE_EXTRACTION, shared_storage_warning

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /home rw,relatime shared:2 - nfs4 server:/export/home rw,vers=4.2
31 30 0:41 / /home/alice/scratch rw shared:3 - lustre 10.0.0.1@o2ib:/scratch rw
32 22 0:42 / /tmp rw shared:4 - tmpfs tmpfs rw
33 22 0:43 / /mnt/with\\040space rw shared:5 - gpfs gpfs0 rw
"""


@pytest.mark.parametrize(("path", "kind"), [
    ("/home/alice/.cache/singpy", "nfs4"),
    ("/home/alice/scratch/cache", "lustre"),  # the deepest mount point wins
    ("/home/alice/scratchy", "nfs4"),  # a prefix of a name is not a parent directory
    ("/tmp/x", "tmpfs"),
    ("/var/cache", "ext4"),
    ("/mnt/with space/c", "gpfs"),  # mountinfo's octal escapes
])
def test_the_filesystem_of_a_path(path: str, kind: str) -> None:
    assert filesystem_type(path, MOUNTINFO) == kind


def test_a_large_extraction_onto_network_storage_is_warned_of() -> None:
    warning = shared_storage_warning("/home/alice/.cache/singpy", "nfs4", LARGE_EXTRACTION)
    assert "/home/alice/.cache/singpy is on nfs4" in warning and "SINGPY_CACHEDIR" in warning


@pytest.mark.parametrize(("kind", "length"), [("nfs4", LARGE_EXTRACTION - 1), ("ext4", LARGE_EXTRACTION * 4),
                                              ("tmpfs", LARGE_EXTRACTION)])
def test_small_or_local_extractions_are_not(kind: str, length: int) -> None:
    assert shared_storage_warning("/c", kind, length) == ""

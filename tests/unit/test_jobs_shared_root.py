"""A shared container's ranks and `unsquash in background` (singpy.image.warm): one root for all the ranks.

Ranks meet at a socket named by their plan (singpy.launch.jobs.share_spec); a SIF mounted with FUSE and the
tree its background unpacking left are the same root, whichever a rank found as it started, and a rank that
shares never waits for the unpacking (tests/integration/test_warm_shared.py runs the real burst).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from singpy.image import warm
from singpy.launch import jobs
from singpy.launch.planner import LaunchRequest
from singpy.plan import ImageSpec
from tests.support.job_steps import PMIX, SLURM, planned


@pytest.fixture
def fuse(tmp_path: Path) -> ImageSpec:
    sif = tmp_path / "image.sif"
    sif.write_bytes(b"\0" * 4096)
    return ImageSpec(kind="sif", path=str(sif), offset=1024, size=2048, strategy="fuse", tool="/usr/bin/squashfuse")


def socket(image: ImageSpec, env: dict[str, str], **fields: Any) -> str:
    share = planned(image, env, **fields).plan.share
    assert share is not None
    return share.socket


@pytest.mark.parametrize("env", [PMIX, SLURM], ids=["pmix", "slurm"])
def test_fuse_and_the_unpacked_tree_are_one_container(fuse: ImageSpec, env: dict[str, str]) -> None:
    cache = "/nonexistent/cache"
    forms = [
        fuse,  # no unpacking planned (the disk guard, say)
        fuse.replace(cache=cache, warm=warm.BACKGROUND, unpacker="/usr/bin/unsquashfs"),
        fuse.replace(cache=cache, warm=warm.OR_WAIT, unpacker="/usr/bin/unsquashfs"),
        fuse.replace(strategy="extract", tool="/usr/bin/unsquashfs", cache=cache, rootfs=f"{cache}/rootfs/ab",
                     warm=warm.CACHED),
    ]
    assert len({socket(form, env) for form in forms}) == 1
    assert len({socket(form, env, sharens=True) for form in forms}) == 1


def test_another_image_is_another_container(fuse: ImageSpec, tmp_path: Path) -> None:
    other = tmp_path / "other.sif"
    other.write_bytes(b"\0" * 4096)
    assert socket(fuse, PMIX) != socket(fuse.replace(path=str(other)), PMIX)
    assert socket(fuse, PMIX) != socket(fuse.replace(offset=2048), PMIX)


@pytest.mark.parametrize(("env", "fields", "expected"), [
    ({}, {}, False), ({}, {"sharens": True}, True), (PMIX, {}, True), (SLURM, {"no_sharens": True}, False),
])
def test_shares_as_the_planner_decides(fuse: ImageSpec, env: dict[str, str], fields: dict[str, Any],
                                       expected: bool) -> None:
    request = LaunchRequest(action="exec", image=fuse.path, args=("true",), **fields)
    assert jobs.shares(request, env) is expected
    assert (planned(fuse, env, **fields).plan.share is not None) is expected


def test_a_shared_rank_never_waits_for_the_unpacking(fuse: ImageSpec) -> None:
    waiting = fuse.replace(warm=warm.OR_WAIT)
    assert warm.shared(waiting) == waiting.replace(warm=warm.BACKGROUND)
    for other in (fuse, fuse.replace(warm=warm.BACKGROUND), fuse.replace(warm=warm.CACHED)):
        assert warm.shared(other) == other

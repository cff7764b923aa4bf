"""Fixtures the GPU test modules share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.simhost_runs import build_cuda_check_image


@pytest.fixture(scope="session")
def cuda_check_image(workdir: Path) -> Path:
    """A busybox image with `cuda-check` (it dlopen()s libcuda.so.1), built once a session: no test writes to it."""
    return build_cuda_check_image(workdir / "cuda-check-image")

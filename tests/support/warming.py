"""What the `unsquash in background` tests share (tests/integration/test_sif_warm.py, test_cache_identity.py,
test_warm_shared.py): the notes singpy prints, the `conf` fixture (singpy's defaults, in which the directive is on),
a PATH directory whose `unsquashfs` counts its calls (and may stall: STALLING), readings of a cache's trees and
locks, waits for an unpacking and for a file a wrapper writes, and a verbose `exec` run with a cache of the test's."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy

WARM_WAIT_LEAST = 5.0  # the shortest wait for an unpacking under way (docs/images.md)
UNPACKED_NOTE = "using the tree a background unpacking left in the cache"
STARTED_NOTE = "into the cache in the background, for later runs"
STALLING = 'echo "$PPID" > "$(dirname "$0")/unpacker"; /usr/bin/unsquashfs "$@"; exec sleep 300'


@pytest.fixture(name="conf")
def fixture_conf(workdir: Path) -> Path:
    """singpy's defaults (an empty file: each directive's default): `unsquash in background` is on by default."""
    path = workdir / "warm.conf"
    path.write_text("")
    path.chmod(0o644)
    return path


def unpacker_dir(workdir: Path, name: str, body: str) -> Path:
    """A directory (first in PATH) whose `unsquashfs` records each call in `calls`, then runs `body`."""
    directory = workdir / name
    directory.mkdir(exist_ok=True)
    directory.chmod(0o777)
    wrapper = directory / "unsquashfs"
    wrapper.write_text(f'#!/bin/sh\necho "$$" >> "$(dirname "$0")/calls"\n{body}\n')
    wrapper.chmod(0o755)
    return directory


def calls(directory: Path) -> int:
    path = directory / "calls"
    return len(path.read_text().split()) if path.exists() else 0


def trees(cache: Path) -> list[str]:
    root = cache / "rootfs"
    return [name for name in os.listdir(root) if len(name) == 64] if root.exists() else []


def busy(cache: Path) -> bool:
    """A background unpacking's lock is there (held, or left by a killed one)."""
    index = cache / "index"
    return any(name.endswith(".warm") for name in os.listdir(index)) if index.exists() else False


def wait_unpacked(cache: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (busy(cache) or not trees(cache)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert trees(cache) and not busy(cache), f"no tree unpacked in {cache}: {sorted(os.listdir(cache))}"


def run(singpy: Singpy, conf: Path, cache: Path, *args: str, path: str = "/usr/bin:/bin") -> \
        subprocess.CompletedProcess[str]:
    return singpy.run("--config", str(conf), "-v", "exec", *args, env=singpy.env(SINGPY_CACHEDIR=str(cache),
                                                                                  PATH=path))


def wait_file(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text().split()[0])

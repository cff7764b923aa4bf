"""`unsquash in background` with a shared container (`--sharens`, a job step's ranks): one container, one root.

A user's burst of ranks on a small SIF: the first to take the unpacking lock mounts the image with FUSE and
unpacks it behind itself; the others must not wait for that tree (and make a second container from it): every
rank runs in the container its holder made, and the image is still unpacked for the next runs, which share
one container on the tree. As root (a loop device, nothing unpacked) the ranks share one container too.
Payloads meet at a barrier (as in test_sharens.py) so that their namespaces are compared while all run.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Singpy
from tests.support import sifs
from tests.support.configs import readable_config
from tests.support.leftovers import traces
from tests.support.warming import UNPACKED_NOTE, wait_unpacked

WAITED_NOTE = "waiting for another singpy to finish unpacking"
BUILDS_NOTE = "this rank builds the shared container"
# Each payload: a file in the barrier directory, wait for N of them, print its mount namespace, wait for the
# release.
PAYLOAD = """mktemp {dir}/XXXXXX >/dev/null; i=0
while [ "$(ls {dir} | wc -l)" -lt {count} ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done
readlink /proc/self/ns/mnt
i=0; while [ ! -e {dir}.release ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"""


@pytest.fixture(scope="module")
def sif(workdir: Path) -> Path:
    """A small SIF of this module's own (its unpacking lock and cache entry are keyed by the file)."""
    return sifs.patched(sifs.siftool_sif(workdir), workdir / "warm-shared.sif", [])


@pytest.fixture(scope="module")
def conf(workdir: Path) -> Path:
    return readable_config(workdir, "warm-shared", "unsquash in background = yes\n")


def barrier(workdir: Path) -> Path:
    path = workdir / f"warm-shared-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


class Burst(NamedTuple):
    namespaces: set[str]  # the mount namespaces the payloads ran in
    errors: list[str]  # each launch's stderr (-v)
    fuse_helpers: int  # squashfuse processes serving the SIF while the payloads ran


def ranks(singpy: Singpy, conf: Path, cache: Path, sif: Path, how: str, count: int, workdir: Path) -> Burst:
    """`count` launches at once sharing a container (`how`: --sharens, or the ranks of a Slurm job step), all
    exited and successful."""
    meet = barrier(workdir)
    step = str(uuid.uuid4().int % 10**9)
    payload = PAYLOAD.format(dir=meet, count=count)
    launches = []
    for rank in range(count):
        variables = {"SLURM_JOB_ID": step, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                     "SLURM_STEP_NUM_TASKS": str(count)} if how == "slurm" else {}
        flags = ["--sharens"] if how == "sharens" else []
        launches.append(singpy.popen(
            ["--config", str(conf), "-v", "exec", *flags, "-B", str(meet), str(sif), "sh", "-c", payload],
            env=singpy.env(SINGPY_CACHEDIR=str(cache), PATH="/usr/bin:/bin", **variables),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    namespaces = set()
    for launch in launches:
        assert launch.stdout is not None
        namespaces.add(launch.stdout.readline().strip())
    helpers = fuse_helpers(sif)  # every payload is waiting at the barrier: its container is up
    Path(f"{meet}.release").touch()
    errors = []
    for launch in launches:
        _, err = launch.communicate(timeout=120)
        assert launch.returncode == 0, err
        errors.append(err)
    return Burst(namespaces, errors, helpers)


def fuse_helpers(sif: Path) -> int:
    """The squashfuse processes that serve `sif` now (given /dev/fd/N of it, they hold it open)."""
    return sum(os.path.basename(line.split()[1]).startswith("squashfuse") for line in traces(sif).processes)


@pytest.mark.parametrize("how", ["sharens", "slurm"])
def test_ranks_on_a_sif_being_unpacked_share_one_container(singpy: Singpy, sif: Path, conf: Path, workdir: Path,
                                                           fuse_open: str, how: str) -> None:
    cache = sifs.new_cache(singpy, workdir, f"warm-shared-{how}")
    first = ranks(singpy, conf, cache, sif, how, 3, workdir)
    assert len(first.namespaces) == 1, first  # one container, not one on FUSE and another on the tree
    assert not [err for err in first.errors if WAITED_NOTE in err], first  # no rank waited for the unpacking
    (builder,) = [err for err in first.errors if BUILDS_NOTE in err]
    if singpy.uid == 0:  # the loop device: nothing to unpack
        assert "loop device" in builder and first.fuse_helpers == 0
        assert not (cache / "rootfs").exists() or os.listdir(cache / "rootfs") == []
        return
    assert "squashfuse" in builder and first.fuse_helpers == 1  # the image being unpacked: the holder's FUSE
    wait_unpacked(cache)  # and it was unpacked all the same, for later runs
    later = ranks(singpy, conf, cache, sif, how, 2, workdir)
    assert len(later.namespaces) == 1, later
    assert later.fuse_helpers == 0 and all(UNPACKED_NOTE in err for err in later.errors), later

"""SIF and squashfs test images, built from the busybox rootfs of tests.support.images.

Three makers of one image, so that every mount strategy is tried on each:
`siftool` (the reference tool), `singpy build`, and `mksquashfs` alone (a
bare squashfs). Each builder reuses a file it made before in the same place.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import hostsim
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import Traces, settled, traces

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tests.conftest import Singpy

SINGPY = str(Path(sys.executable).parent / "singpy")
MARKER = "made-for-singpy-sif-tests"  # /etc/marker in every image
MAKERS = ("siftool", "singpy", "squashfs", "simg")
STRATEGIES = ("loop", "fuse", "extract")


def busybox_tree(workdir: Path) -> Path:
    root = workdir / "sif-source"
    if not (root / "etc" / "marker").exists():
        build_busybox_rootfs(root)
        (root / "etc" / "marker").write_text(MARKER + "\n")
        (root / ".singularity.d" / "labels.json").write_text('{"maker": "tests.support.sifs"}')
    return root


def bare_squashfs(workdir: Path) -> Path:
    out = workdir / "busybox.squashfs"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        subprocess.run(["mksquashfs", str(busybox_tree(workdir)), str(tmp), "-noappend", "-comp", "gzip",
                        "-all-root", "-quiet", "-no-progress"], check=True, stdout=subprocess.DEVNULL)
        tmp.rename(out)
    return out


def singularity2_simg(workdir: Path) -> Path:
    """A Singularity 2.x image as `singularity build` 2.4+ wrote it (and cwltool still ships one): a launch line,
    then the squashfs."""
    out = workdir / "busybox.simg"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(b"#!/usr/bin/env run-singularity\n" + bare_squashfs(workdir).read_bytes())
        tmp.chmod(0o755)
        tmp.rename(out)
    return out


def siftool_sif(workdir: Path) -> Path:
    """What a third-party tool makes: a deffile object and the primary partition, group 1."""
    out = workdir / "busybox-siftool.sif"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        deffile = workdir / "busybox.def"
        deffile.write_text("Bootstrap: localimage\nFrom: busybox\n")
        subprocess.run(["siftool", "new", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["siftool", "add", "--datatype", "1", "--groupid", "1", str(tmp), str(deffile)], check=True)
        subprocess.run(["siftool", "add", "--datatype", "4", "--parttype", "2", "--partfs", "1", "--partarch", "2",
                        "--groupid", "1", str(tmp), str(bare_squashfs(workdir))], check=True)
        tmp.chmod(0o644)
        tmp.rename(out)
    return out


def singpy_sif(workdir: Path) -> Path:
    out = workdir / "busybox-singpy.sif"
    if not out.exists():
        subprocess.run([SINGPY, "-q", "build", str(out), str(busybox_tree(workdir))], check=True)
    return out


def patched(source: Path, target: Path, patches: list[tuple[int, bytes]], *, cut: int | None = None) -> Path:
    """A copy of `source` with bytes replaced at absolute offsets, optionally truncated."""
    shutil.copyfile(source, target)
    with open(target, "r+b") as handle:
        for offset, data in patches:
            handle.seek(offset)
            handle.write(data)
        if cut is not None:
            handle.truncate(cut)
    target.chmod(0o644)
    return target


def descriptor_offset(sif: Path, object_id: int) -> int:
    """File offset of descriptor `object_id` (descriptors are 585 bytes, from DescriptorsOffset)."""
    with open(sif, "rb") as handle:
        header = handle.read(128)
    table: int = struct.unpack_from("<q", header, 96)[0]
    return table + (object_id - 1) * 585


def primary_offset(sif: Path) -> int:
    """Where the primary partition's data starts, as read by singpy's reader."""
    from singpy.image.sif import read_sif

    return read_sif(sif).primary_partition().offset


# --- fixture bodies (each test module declares its fixtures with these) ------------------------------------------


def all_images(workdir: Path) -> dict[str, Path]:
    """The same busybox image from each maker, by maker name (see MAKERS)."""
    makers = {"siftool": siftool_sif, "singpy": singpy_sif, "squashfs": bare_squashfs, "simg": singularity2_simg}
    return {name: make(workdir) for name, make in makers.items()}


def fuse_mode(state: str) -> Iterator[str]:
    """/dev/fuse usable by everyone ("open", an admin's choice) or by root only ("closed", Debian's default).

    The host's /dev/fuse is never touched: where it differs from `state`, the singpy runs of the
    test see a node of the wanted mode bound over it in a private mount namespace
    (tests.support.hostsim). Without root that can't be done: the test is skipped, with the reason.
    """
    from tests.support.users import ensure_test_user

    user = ensure_test_user()
    problem = hostsim.fuse_problem(state, user.pw_uid, user.pw_gid)
    if problem:
        pytest.skip(problem)
    with hostsim.fuse_state(state):
        yield state


def owned_dir(singpy: Singpy, parent: Path, name: str) -> Path:
    """A new directory `parent/PROFILE-name` the profile's user owns (`parent` made 0755 if missing)."""
    path = parent / f"{singpy.profile}-{name}"
    path.mkdir(parents=True)
    parent.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def new_cache(singpy: Singpy, workdir: Path, name: str) -> Path:
    """An empty extraction cache owned by the profile's user."""
    path = workdir / "caches" / f"{singpy.profile}-{name}"
    path.parent.mkdir(exist_ok=True)
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def conf_without_kernel_squashfs(workdir: Path) -> Path:
    conf = workdir / "no-kernel-squashfs.conf"
    conf.write_text("allow kernel squashfs = no\n")
    return conf


def conf_fuse_only(workdir: Path) -> Path:
    """A user's runs through FUSE and nothing else: no unpacking behind them (tests/integration/test_sif_warm.py
    tests the default, which unpacks)."""
    conf = workdir / "fuse-only.conf"
    conf.write_text("unsquash in background = no\n")
    return conf


def strategy_args(singpy: Singpy, strategy: str, workdir: Path) -> list[str]:
    """Global and action flags that make `singpy` use `strategy` for this profile."""
    if strategy == "extract":
        return ["--unsquash"]
    if strategy == "fuse":
        return ["--config", str(conf_without_kernel_squashfs(workdir) if singpy.uid == 0 else conf_fuse_only(workdir))]
    return []


def split_flags(flags: list[str]) -> tuple[list[str], list[str]]:
    """--config is a global flag (before the command), the others are action flags."""
    if flags and flags[0] == "--config":
        return flags[:2], flags[2:]
    return [], flags


# --- what must stay unchanged ----------------------------------------------------------------------------------------


Snapshot = Traces


def snapshot(workdir: Path) -> Snapshot:
    """What names our paths: mounts, loop devices, processes (squashfuse), singpy's TMPDIR (the host is shared)."""
    return traces(workdir)


def assert_restored(before: Snapshot, workdir: Path) -> None:
    """Loop devices and mounts are released asynchronously after the last process exits: allow a moment."""
    assert settled(before, workdir) == before


def entries(cache: Path) -> list[str]:
    """Everything in the cache's rootfs directory (trees, their .json, hidden locks and temporaries)."""
    root = cache / "rootfs"
    return sorted(os.listdir(root)) if root.exists() else []

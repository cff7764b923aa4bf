"""Bad SIF and squashfs input: one FATAL line, exit 255, nothing mounted, no cache entry.

Each broken image is a copy of the singpy-built busybox SIF with a few bytes
changed (header fields, the partition's descriptor, its superblock), tried
through every strategy that could get that far, as root and unprivileged.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import sifs
from tests.support.sifs import assert_restored, entries, snapshot, split_flags, strategy_args

ARM64 = Path(__file__).resolve().parents[1] / "data" / "sif-golden" / "real" / "busybox_arm64.sif"

# Descriptor fields, relative to the descriptor (sif.md section 4).
D_OFFSET, D_FSTYPE, D_PARTTYPE = 17, 201, 205


@pytest.fixture(scope="session")
def source(workdir: Path) -> Path:
    return sifs.singpy_sif(workdir)


@pytest.fixture
def fuse_open() -> Iterator[str]:
    yield from sifs.fuse_mode("open")


@pytest.fixture
def cachedir(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    return sifs.new_cache(singpy, workdir, request.node.name)


def broken(source: Path, workdir: Path, case: str) -> tuple[Path, str]:
    """A broken copy of `source` and the message its error must contain."""
    part = sifs.descriptor_offset(source, 3)  # deffile, inspect-metadata.json, then the partition
    data = sifs.primary_offset(source)
    size = source.stat().st_size
    target = workdir / f"broken-{case.replace(' ', '-')}.sif"
    table: dict[str, tuple[list[tuple[int, bytes]], int | None, str]] = {
        "truncated": ([], data + 4096, "descriptor 3 points outside the file"),
        "truncated header": ([], 100, "header truncated at 100 bytes"),
        "wrong magic": ([(32, b"SIF_MAGIK\0")], None, "is not a container image"),
        "bad magic end": ([(41, b"!")], None, "(bad magic)"),
        "bad version": ([(42, b"02\0")], None, 'unsupported SIF version "02"'),
        "offset outside": ([(part + D_OFFSET, struct.pack("<q", size + 8192))], None, "points outside the file"),
        "no primary": ([(part + D_PARTTYPE, struct.pack("<i", 1))], None, "no primary system partition"),
        "ext3": ([(part + D_FSTYPE, struct.pack("<i", 2))], None, "the primary partition is ext3"),
        "encrypted": ([(part + D_FSTYPE, struct.pack("<i", 5))], None, "the primary partition is encrypted squashfs"),
        "not squashfs": ([(data, b"XXXX")], None, "not a squashfs filesystem (bad superblock)"),
        "bad compressor": ([(data + 20, struct.pack("<H", 99))], None, "can't "),
    }
    patches, cut, message = table[case]
    if not target.exists():
        sifs.patched(source, target, patches, cut=cut)
    return target, message


def assert_one_fatal_line(result: object, message: str) -> None:
    returncode, stdout, stderr = result.returncode, result.stdout, result.stderr  # type: ignore[attr-defined]
    assert returncode == 255, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith(("HINT:", "VERBOSE:", "INFO:"))]
    assert len(lines) == 1 and lines[0].startswith("FATAL:"), stderr
    assert message in lines[0], stderr
    assert "Traceback" not in stderr and stdout == ""


DETECTED = ["truncated", "truncated header", "wrong magic", "bad magic end", "bad version", "offset outside",
            "no primary", "ext3", "encrypted", "not squashfs"]


@pytest.mark.parametrize("case", DETECTED)
def test_broken_sif_is_refused_before_anything_starts(singpy: Singpy, source: Path, workdir: Path, cachedir: Path,
                                                      case: str) -> None:
    image, message = broken(source, workdir, case)
    before = snapshot(workdir)
    for flags in ([], ["--unsquash"]):
        result = singpy.run("exec", *flags, str(image), "true", env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
        assert_one_fatal_line(result, message)
    assert_restored(before, workdir)
    assert entries(cachedir) == []


@pytest.mark.parametrize("strategy", sifs.STRATEGIES)
def test_squashfs_that_fails_to_mount(singpy: Singpy, source: Path, workdir: Path, cachedir: Path, fuse_open: str,
                                      strategy: str) -> None:
    if strategy == "loop" and singpy.uid != 0:
        pytest.skip("loop devices are for root only")
    image, message = broken(source, workdir, "bad compressor")
    before = snapshot(workdir)
    global_flags, flags = split_flags(strategy_args(singpy, strategy, workdir))
    result = singpy.run(*global_flags, "exec", *flags, str(image), "true",
                        env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
    assert_one_fatal_line(result, message)
    assert str(image) in result.stderr
    assert_restored(before, workdir)
    assert entries(cachedir) == []


def test_arch_mismatch_names_both(singpy: Singpy, workdir: Path, cachedir: Path) -> None:
    before = snapshot(workdir)
    for flags in ([], ["--unsquash"]):
        result = singpy.run("run", *flags, str(ARM64), env=singpy.env(SINGPY_CACHEDIR=str(cachedir)))
        assert_one_fatal_line(result, "image is arm64, this host is amd64")
    assert_restored(before, workdir)
    assert entries(cachedir) == []


def test_no_squashfs_tool_at_all(as_user: Singpy, source: Path, workdir: Path) -> None:
    """A user without FUSE and without unsquashfs: nothing can open the image."""
    empty = workdir / "empty-path"
    empty.mkdir(exist_ok=True)
    cache = sifs.new_cache(as_user, workdir, "no-tools")
    for flags in ([], ["--unsquash"]):
        result = as_user.run("exec", *flags, str(source), "true",
                             env=as_user.env(PATH=str(empty), SINGPY_CACHEDIR=str(cache)))
        assert_one_fatal_line(result, "no way to open a squashfs image here")
    assert entries(cache) == []


def test_unsquash_without_unsquashfs_as_root(as_root: Singpy, source: Path, workdir: Path) -> None:
    empty = workdir / "empty-path"
    empty.mkdir(exist_ok=True)
    cache = sifs.new_cache(as_root, workdir, "no-unsquashfs")
    result = as_root.run("exec", "--unsquash", str(source), "true",
                         env=as_root.env(PATH=str(empty), SINGPY_CACHEDIR=str(cache)))
    assert_one_fatal_line(result, "unsquashfs are not installed")


def test_unwritable_cache(as_user: Singpy, source: Path, workdir: Path) -> None:
    result = as_user.run("exec", "--unsquash", str(source), "true",
                         env=as_user.env(SINGPY_CACHEDIR="/proc/no-cache-here"))
    assert_one_fatal_line(result, "can't create the cache directory /proc/no-cache-here")
    assert not os.path.exists("/proc/no-cache-here")

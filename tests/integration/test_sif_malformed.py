"""Hostile and odd SIF files, and what `singpy sif add|new` and `build` write: review "sif" (session 40).

A descriptor count that only the file's (sparse) size bounds, two primary
partitions, an overlay partition outside the rootfs's group or without an
ext3 header, an object source that never ends, a signal in the middle of an
edit, a huge --alignment, and the mode of the files written under a umask.
Each as root and as the unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sif-golden"
TRUST = Path(__file__).resolve().parents[1] / "data" / "sif-trust"
SLOT = 585  # bytes of a descriptor
H_FREE, H_TOTAL, H_TABLE_AT = 80, 88, 96  # header fields (int64): free, total, table offset, table size


@pytest.fixture(scope="session")
def source(workdir: Path) -> Path:
    return sifs.singpy_sif(workdir)  # a busybox rootfs, objects 1-3 in group 1, the primary partition last


@pytest.fixture
def place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of the profile's user for one test."""
    name: str = request.node.name.replace("[", "-").replace("]", "")[:80]
    path = workdir / "sif-malformed" / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    path.parent.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _copy(singpy: Singpy, source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    target.chmod(0o644)
    os.chown(target, singpy.uid, singpy.gid)
    return target


def _table_at(path: Path) -> int:
    with open(path, "rb") as handle:
        handle.seek(H_TABLE_AT)
        offset: int = struct.unpack("<q", handle.read(8))[0]
    return offset


def _with_descriptors(singpy: Singpy, source: Path, target: Path, total: int) -> Path:
    """`source` with its table moved past its data and grown to `total` slots, the file (sparse) just long enough."""
    _copy(singpy, source, target)
    with open(target, "r+b") as handle:
        head = handle.read(128)
        old_total, old_at = struct.unpack_from("<qq", head, H_TOTAL)
        handle.seek(old_at)
        slots = handle.read(old_total * SLOT)
        table_at = handle.seek(0, os.SEEK_END)
        handle.write(slots)
        handle.truncate(table_at + total * SLOT)
        handle.seek(H_TOTAL)
        handle.write(struct.pack("<qqq", total, table_at, total * SLOT))
    return target


def _copy_slot(path: Path, slot: int, into: int) -> None:
    """Descriptor `slot` (0-based) copied into the free slot `into`, with ID into + 1."""
    table_at = _table_at(path)
    data = bytearray(path.read_bytes())
    raw = bytearray(data[table_at + slot * SLOT:table_at + (slot + 1) * SLOT])
    assert not data[table_at + into * SLOT + 4], "the target slot is used"
    struct.pack_into("<I", raw, 5, into + 1)
    data[table_at + into * SLOT:table_at + (into + 1) * SLOT] = raw
    struct.pack_into("<q", data, H_FREE, struct.unpack_from("<q", data, H_FREE)[0] - 1)
    path.write_bytes(bytes(data))


# --- 1: the descriptor count ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("total", [0xFFFFFFFF, 70000])
def test_a_huge_descriptor_count_is_refused_at_once(singpy: Singpy, source: Path, place: Path, total: int) -> None:
    """A 4 KiB sparse file claiming 2.5 TB of descriptors: one line, no MemoryError, no GBs of memory."""
    image = _with_descriptors(singpy, source, place / "huge.sif", total)
    for command in (["sif", "list"], ["sif", "header"], ["inspect"], ["exec"]):
        started = time.monotonic()
        result = singpy.run(*command, str(image), *(["true"] if command == ["exec"] else []), timeout=30)
        assert_one_fatal(result, f"{total} descriptors (at most 65536)")
        assert time.monotonic() - started < 10


def test_the_largest_table_is_read_in_chunks(singpy: Singpy, source: Path, place: Path) -> None:
    """65536 slots (38 MB, sparse) with the primary partition in the very last one: found, and the image runs."""
    image = _with_descriptors(singpy, source, place / "max.sif", 1 << 16)
    table_at = _table_at(image)
    with open(image, "r+b") as handle:  # the rootfs's descriptor (slot 2) moved to slot 65535
        handle.seek(table_at + 2 * SLOT)
        raw = bytearray(handle.read(SLOT))
        struct.pack_into("<I", raw, 5, 1 << 16)
        handle.seek(table_at + 2 * SLOT)
        handle.write(bytes(SLOT))
        handle.seek(table_at + ((1 << 16) - 1) * SLOT)
        handle.write(raw)
    assert "65536 |1" in singpy.ok("sif", "list", str(image))
    assert singpy.ok("exec", str(image), "echo", "ran") == "ran\n"


# --- 2: two primary partitions -------------------------------------------------------------------------------------


def test_two_primary_partitions_are_refused(singpy: Singpy, source: Path, place: Path) -> None:
    """Apptainer finds "multiple objects" and runs neither; singpy ran the first in slot order."""
    image = _copy(singpy, source, place / "two.sif")
    _copy_slot(image, 2, 3)
    for flags in ([], ["--unsquash"]):
        assert_one_fatal(singpy.run("exec", *flags, str(image), "true"), "multiple primary system partitions")


def test_legacy_verify_refuses_two_primary_partitions(singpy: Singpy, place: Path) -> None:
    """Which partition a legacy signature is checked for must not hang on slot order."""
    import pysequoia

    keys = place / "keys"
    keys.mkdir(mode=0o700)
    (keys / "pgp-public").write_bytes(bytes(pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())))
    for path in (keys, keys / "pgp-public"):
        os.chown(path, singpy.uid, singpy.gid)
    image = _copy(singpy, TRUST / "two-groups-signed-legacy.sif", place / "legacy.sif")
    env = singpy.env(APPTAINER_KEYSDIR=str(keys))
    singpy.ok("verify", "--legacy-insecure", str(image), env=env)  # as it comes: object 2 is verified
    data, table_at = image.read_bytes(), _table_at(image)
    free = next(i for i in range(48) if not data[table_at + i * SLOT + 4])
    _copy_slot(image, 1, free)  # object 2, the primary partition, again
    result = singpy.run("verify", "--legacy-insecure", str(image), env=env)
    kept = "".join(line for line in result.stderr.splitlines(keepends=True) if not line.startswith("INFO:"))
    assert_one_fatal(subprocess.CompletedProcess(result.args, result.returncode, result.stdout, kept),
                     "multiple primary system partitions")


# --- 3: the overlay partition --------------------------------------------------------------------------------------


def _overlay_image(singpy: Singpy, place: Path) -> Path:
    """An ext3 overlay whose upper layer holds /ovfile."""
    tree = place / "overlay-tree"
    (tree / "upper").mkdir(parents=True)
    (tree / "work").mkdir()
    (tree / "upper" / "ovfile").write_text("from the overlay\n")
    out = place / "overlay.img"
    subprocess.run(["mkfs.ext3", "-q", "-F", "-d", str(tree), str(out), "8M"], check=True,
                   env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"})
    os.chown(out, singpy.uid, singpy.gid)
    return out


def _add_overlay(singpy: Singpy, image: Path, overlay: Path, group: int) -> None:
    singpy.ok("sif", "add", "--datatype", "4", "--parttype", "4", "--partfs", "2", "--partarch", "2",
              "--groupid", str(group), str(image), str(overlay))


def test_an_overlay_outside_the_rootfs_group_is_ignored(singpy: Singpy, source: Path, place: Path) -> None:
    """As Apptainer: the rootfs in group 1, an overlay in group 2 (or in none) is not the image's overlay."""
    overlay = _overlay_image(singpy, place)
    for group in (2, 0):
        image = _copy(singpy, source, place / f"group{group}.sif")
        _add_overlay(singpy, image, overlay, group)
        listing = singpy.ok("exec", str(image), "ls", "/")
        assert "ovfile" not in listing.split() and "bin" in listing.split()


def test_an_overlay_in_the_rootfs_group_is_used(as_root: Singpy, source: Path, workdir: Path) -> None:
    place = workdir / "sif-malformed" / "same-group"
    shutil.rmtree(place, ignore_errors=True)
    place.mkdir(parents=True)
    image = _copy(as_root, source, place / "group1.sif")
    _add_overlay(as_root, image, _overlay_image(as_root, place), 1)
    assert as_root.ok("exec", str(image), "cat", "/ovfile") == "from the overlay\n"


def test_an_overlay_without_an_ext3_header_is_ignored(singpy: Singpy, source: Path, place: Path) -> None:
    """Apptainer's checkPartitionType leaves such a partition out; singpy tried to mount it."""
    junk = place / "junk.img"
    junk.write_bytes(b"\x01" * (1 << 16))
    os.chown(junk, singpy.uid, singpy.gid)
    image = _copy(singpy, source, place / "junk.sif")
    _add_overlay(singpy, image, junk, 1)
    assert singpy.ok("exec", str(image), "echo", "ran") == "ran\n"


# --- 4: the mode of what is written --------------------------------------------------------------------------------


def _run_under_umask(singpy: Singpy, *args: str) -> None:
    process = singpy.popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, umask=0o077)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err


def test_written_sifs_follow_the_umask(singpy: Singpy, workdir: Path, place: Path) -> None:
    """0755 less the umask, as the reference's os.OpenFile(..., 0755): umask 077 makes images nobody else reads."""
    _run_under_umask(singpy, "sif", "new", str(place / "new.sif"))
    _run_under_umask(singpy, "build", str(place / "built.sif"), str(sifs.busybox_tree(workdir)))
    for name in ("new.sif", "built.sif"):
        assert stat.S_IMODE((place / name).stat().st_mode) == 0o700, name
    singpy.ok("sif", "new", str(place / "plain.sif"))  # the suite's umask (022): 0755 as before
    assert stat.S_IMODE((place / "plain.sif").stat().st_mode) == 0o755 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- 5: the source of `sif add` ------------------------------------------------------------------------------------


def test_sif_add_takes_only_a_regular_file_other_than_the_image(singpy: Singpy, place: Path) -> None:
    image = _copy(singpy, GOLDEN / "one-group.sif", place / "t.sif")
    before = image.read_bytes()
    fifo = place / "fifo"
    os.mkfifo(fifo)
    os.chown(fifo, singpy.uid, singpy.gid)
    for source, message in ((image, "to itself"), (fifo, "not a regular file"), ("/dev/zero", "not a regular file")):
        result = singpy.run("sif", "add", "--datatype", "7", str(image), str(source), timeout=20)
        assert_one_fatal(result, message)
        assert image.read_bytes() == before


# --- 6: a signal in the middle of an edit --------------------------------------------------------------------------


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_sif_add_leaves_the_image_as_it_was(singpy: Singpy, place: Path, number: int) -> None:
    image = _copy(singpy, GOLDEN / "one-group.sif", place / "t.sif")
    before = image.read_bytes()
    big = place / "big.bin"
    with open(big, "wb") as handle:
        handle.truncate(4 << 30)  # sparse: reading it costs nothing, writing it takes seconds
    process = singpy.popen(["sif", "add", "--datatype", "7", str(image), str(big)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while image.stat().st_size <= len(before) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    assert process.poll() is None, "the copy ended before it could be interrupted"
    process.send_signal(number)
    out, err = process.communicate(timeout=60)
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert_one_fatal(result, f"interrupted by {signal.Signals(number).name}: the image is as it was")
    assert image.read_bytes() == before


# --- 7: --alignment ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alignment", [str(1 << 63), "99999999999999999999", str((1 << 30) + 1)])
def test_a_huge_alignment_is_one_line(singpy: Singpy, place: Path, alignment: str) -> None:
    image = _copy(singpy, GOLDEN / "one-group.sif", place / "t.sif")
    before = image.read_bytes()
    small = place / "small.txt"
    small.write_text("hi\n")
    result = singpy.run("sif", "add", "--datatype", "7", "--alignment", alignment, str(image), str(small))
    assert_one_fatal(result, f"--alignment {alignment} is out of range (0 to 1073741824)", code=1)
    assert image.read_bytes() == before

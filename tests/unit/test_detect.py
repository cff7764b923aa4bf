"""singpy.image.detect: the start-up SIF scan agrees with the full reader (singpy.image.sif) on everything."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from singpy.errors import ImageError, SifError
from singpy.image import detect, sif
from singpy.kernel import loop

DATA = Path(__file__).resolve().parents[1] / "data" / "sif-golden"
SIFS = sorted(str(p.relative_to(DATA)) for p in DATA.glob("**/*.sif"))


def full_reader(path: Path) -> tuple[int, int, int, str] | None:
    """What singpy.image.sif says: the primary partition, or None when it refuses the file or has none."""
    try:
        primary = sif.read_sif(path).primary_partition()
    except SifError:
        return None
    return primary.offset, primary.size, primary.fstype, primary.arch


@pytest.mark.parametrize("name", SIFS)
def test_scan_agrees_with_the_reader(name: str) -> None:
    assert detect._scan(detect._partitions(str(DATA / name))) == full_reader(DATA / name)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 40959), st.integers(0, 255)), max_size=6),
       cut=st.one_of(st.none(), st.integers(0, 40960)))
def test_scan_agrees_on_mutated_images(tmp_path: Path, flips: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray((DATA / "one-group.sif").read_bytes())
    for offset, value in flips:
        data[offset] = value
    path = tmp_path / "mutated.sif"
    path.write_bytes(bytes(data[:cut]))
    assert detect._scan(detect._partitions(str(path))) == full_reader(path)


def test_errors_come_from_the_reader(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sif"
    good = (DATA / "one-group.sif").read_bytes()
    bad.write_bytes(good[:42] + b"02\0" + good[45:])
    with pytest.raises(SifError, match=f'unsupported SIF version "02": {bad}'):
        detect.detect(str(bad))
    with pytest.raises(SifError, match="no primary system partition"):
        detect.detect(str(DATA / "one-object-generic-json.sif"))


def test_partition_checks() -> None:
    # one-group.sif: a 4 KiB squashfs primary partition built for 386.
    with pytest.raises(ImageError, match=f"image is 386, this host is {detect.host_arch()}$"):
        detect.detect(str(DATA / "one-group.sif"))
    spec = detect.sif_partition(str(DATA / "one-group.sif"), check_arch=False)
    assert (spec.kind, spec.offset, spec.size, spec.arch) == ("sif", 36864, 4096, "386")


def test_kind_comes_from_content(tmp_path: Path) -> None:
    named_sif = tmp_path / "image.sif"
    named_sif.write_bytes(b"hsqs" + bytes(100))
    assert detect.classify(str(named_sif)).kind == "squashfs"
    disguised = tmp_path / "image.squashfs"
    disguised.write_bytes((DATA / "one-group.sif").read_bytes())
    assert detect.classify(str(disguised)).kind == "sif"
    text = tmp_path / "notes.sif"
    text.write_text("hello")
    with pytest.raises(ImageError, match="is not a container image"):
        detect.classify(str(text))


def test_singularity2_image_is_the_squashfs_after_its_launch_line(tmp_path: Path) -> None:
    simg = tmp_path / "hello.simg"
    simg.write_bytes(b"#!/usr/bin/env run-singularity\n" + b"hsqs" + bytes(100))
    spec = detect.classify(str(simg))
    assert (spec.kind, spec.offset, spec.size) == ("squashfs", 31, 104)
    assert not detect.is_definition_file(str(simg))
    script = tmp_path / "script.simg"  # the launch line with anything but a squashfs after it is no image
    script.write_bytes(b"#!/usr/bin/env run-singularity\necho hello\n" + bytes(100))
    with pytest.raises(ImageError, match="is not a container image"):
        detect.classify(str(script))


def _ext_superblock(compat: int = 0x4, incompat: int = 0x2, rocompat: int = 0x1) -> bytes:
    """The first 2048 bytes of an ext filesystem: its superblock's magic at 1080, the feature flags at 1116."""
    head = bytearray(2048)
    head[1080:1082] = b"\x53\xef"
    struct.pack_into("<III", head, 1116, compat, incompat, rocompat)
    return bytes(head)


LAUNCH_LINE = b"#!/usr/bin/env run-singularity\n"


@pytest.mark.parametrize("prefix", [b"", LAUNCH_LINE, b"#!/bin/sh -e\n# run-singularity\n"])
def test_singularity2_ext3_image(tmp_path: Path, prefix: bytes) -> None:
    """Apptainer's CheckExt3Header: the filesystem after the line holding " run-singularity", or at the top."""
    image = tmp_path / "old.img"
    image.write_bytes(prefix + _ext_superblock(incompat=0x2 | 0x4 | 0x10, rocompat=0x7) + bytes(4096))
    spec = detect.detect(str(image))
    assert (spec.kind, spec.offset, spec.size) == ("ext3", len(prefix), image.stat().st_size - len(prefix))
    assert not detect.is_definition_file(str(image))


@pytest.mark.parametrize(("features", "kind"), [({"compat": 0}, "ext2"), ({"incompat": 0x2 | 0x40}, "ext4"),
                                                ({"rocompat": 0x8}, "ext4")])
def test_ext2_and_ext4_are_refused_by_name(tmp_path: Path, features: dict[str, int], kind: str) -> None:
    image = tmp_path / f"{kind}.img"
    image.write_bytes(LAUNCH_LINE + _ext_superblock(**features) + bytes(4096))
    with pytest.raises(ImageError, match="is not a valid ext3 image"):
        detect.classify(str(image))


def test_ext3_superblock_beyond_the_first_2048_bytes_is_no_image(tmp_path: Path) -> None:
    """Apptainer reads 2048 bytes: a launch line so long that the superblock lies past them is no ext3 image."""
    image = tmp_path / "long.img"
    image.write_bytes(b"#" * 1000 + LAUNCH_LINE + _ext_superblock() + bytes(4096))
    with pytest.raises(ImageError, match="is not a container image"):
        detect.classify(str(image))
    assert detect.is_definition_file(str(image))


def test_mkfs_ext3_image_is_detected(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if shutil.which("mkfs.ext3") is None:
        pytest.skip("mkfs.ext3 (e2fsprogs) is not installed")
    image = tmp_path / "real.img"
    subprocess.run(["mkfs.ext3", "-q", str(image), "4M"], check=True, capture_output=True)
    assert detect.classify(str(image)).kind == "ext3"
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image), "4M"], check=True, capture_output=True)
    with pytest.raises(ImageError, match="an ext2 or ext4 filesystem"):
        detect.classify(str(image))


@pytest.mark.parametrize(("code", "name"), [(b"02\0", "amd64"), (b"04\0", "arm64"), (b"06\0", "ppc64le"),
                                          (b"13\0", "loong64"), (b"00\0", "unknown"), (b"99\0", "unknown"),
                                          (b"ab\0", "unknown"), (b"02", "unknown"), (b"021", "unknown")])
def test_arch_names_of_sif_codes(code: bytes, name: str) -> None:
    assert detect.arch_name(code) == name
    assert sif.ARCH_CODES.get(name) in (code, None)


def test_loop_structures_have_the_kernel_sizes() -> None:
    assert loop._STATUS.size == 232  # sizeof(struct loop_info64)
    assert loop._CONFIG.size == 304  # sizeof(struct loop_config)
    packed = loop._CONFIG.pack(7, 0, *loop._info("/x.sif", 4096, 8192), *([0] * 8))
    assert struct.unpack_from("=I", packed)[0] == 7
    assert struct.unpack_from("=QQ", packed, 8 + 24) == (4096, 8192)  # lo_offset, lo_sizelimit
    assert struct.unpack_from("=I", packed, 8 + 40 + 12)[0] == loop.LO_FLAGS_READ_ONLY | loop.LO_FLAGS_AUTOCLEAR


@pytest.mark.skipif(os.getuid() != 0, reason="needs root")
def test_loop_device_detaches_by_itself() -> None:
    fd, device = loop.attach(str(DATA / "real" / "busybox_arm64.sif"), 45056, 794624)
    name = os.path.basename(device)
    try:
        with open(f"/sys/block/{name}/loop/offset") as handle:
            assert int(handle.read()) == 45056
        with open(f"/sys/block/{name}/loop/sizelimit") as handle:
            assert int(handle.read()) == 794624
        with open(f"/sys/block/{name}/loop/autoclear") as handle:
            assert handle.read().strip() == "1"
    finally:
        os.close(fd)
    import time

    deadline = time.monotonic() + 5
    while os.path.exists(f"/sys/block/{name}/loop") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/sys/block/{name}/loop/backing_file")


@pytest.mark.parametrize(("kind", "shown"), [("fifo", "a FIFO"), ("device", "a character device"),
                                             ("socket", "a socket")])
def test_only_directories_and_regular_files_are_images(tmp_path: Path, kind: str, shown: str) -> None:
    """Refused from stat() alone: a FIFO is never opened (it would wait for a writer), a device never read."""
    import socket

    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    holder = socket.socket(socket.AF_UNIX) if kind == "socket" else None
    try:
        if holder is not None:
            holder.bind(str(path))
        with pytest.raises(ImageError) as caught:
            detect.detect(str(path))
        assert caught.value.message == f"{path} is not a container image ({shown})"
    finally:
        if holder is not None:
            holder.close()


@pytest.mark.parametrize("path", ["/" + "n" * 256, "/x" * 2048], ids=["name-max", "path-max"])
def test_unusable_paths_are_one_line(path: str) -> None:
    with pytest.raises(ImageError) as caught:
        detect.detect(path)
    assert caught.value.message.startswith("can't read image /")
    assert caught.value.message.endswith("File name too long")
    assert len(caught.value.message) < 200


def test_scan_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert detect._scan(detect._partitions(str(fifo))) is None  # O_NONBLOCK open, then fstat: not a regular file

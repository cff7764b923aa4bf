"""SIF writer: byte-exact against the reference library's goldens, and against siftool."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from singpy.errors import ImageError, SifError
from singpy.image import sif
from singpy.image.sif import ZERO_TIME, read_sif
from singpy.image.sifwrite import (
    LAUNCH_SCRIPT,
    SifObject,
    add_object,
    build_sif_from_squashfs,
    create_sif,
    delete_object,
    set_primary_partition,
)

DATA = Path(__file__).parent.parent / "data" / "sif-golden"
WRITER = DATA / "writer"
SIFTOOL = shutil.which("siftool")
MKSQUASHFS = shutil.which("mksquashfs")

# The inputs of sylabs/sif's TestCreateContainer/TestAddObject/TestSetPrimPart/TestDeleteObject.
GO_ID = uuid.UUID("de170c43-36ab-44a8-bca9-1ea1a070a274")
GO_TIME = 946702800
FACE, FEED = b"\xfa\xce", b"\xfe\xed"


def create_det(path: Path, objects: list[SifObject], **kw: Any) -> None:
    """create_sif as the Go tests call it: deterministic, no launch script."""
    create_sif(path, objects, **{"deterministic": True, "launch_script": "", **kw})


def generic(data: bytes, alignment: int | None = None) -> SifObject:
    return SifObject(sif.DATA_GENERIC, data, alignment=alignment)


def part(data: bytes, fs: int, pt: int, arch: str, alignment: int | None = None) -> SifObject:
    return SifObject(sif.DATA_PARTITION, data, fstype=fs, parttype=pt, arch=arch, alignment=alignment)


def squash_prim(data: bytes, arch: str = "386", alignment: int | None = None) -> SifObject:
    return part(data, sif.FS_SQUASHFS, sif.PART_PRIMSYS, arch, alignment)


def raw_part(data: bytes, pt: int, arch: str) -> SifObject:
    return part(data, sif.FS_RAW, pt, arch)


def create(objects: list[SifObject], **kw: Any) -> Callable[[Path], None]:
    return lambda p: create_det(p, objects, **kw)


def then(first: Callable[[Path], None], *steps: Callable[[Path], None], fails: bool = False) -> Callable[[Path], None]:
    """Create, then edit; with `fails` every edit must be refused and change nothing."""

    def make(p: Path) -> None:
        first(p)
        for step in steps:
            before = p.read_bytes()
            if fails:
                with pytest.raises(SifError):
                    step(p)
                assert p.read_bytes() == before
            else:
                step(p)

    return make


def add(obj: SifObject, **kw: int) -> Callable[[Path], None]:
    return lambda p: add_object(p, obj, **kw)


def delete(object_id: int, **kw: Any) -> Callable[[Path], None]:
    return lambda p: delete_object(p, object_id, **kw)


def setprim(object_id: int, **kw: int) -> Callable[[Path], None]:
    return lambda p: set_primary_partition(p, object_id, **kw)


TWO_GENERIC = create([generic(FACE), generic(FEED)])
PRIM_THEN_SYSTEM = [raw_part(FACE, sif.PART_PRIMSYS, "386"), raw_part(FEED, sif.PART_SYSTEM, "amd64")]

CASES: dict[str, Callable[[Path], None]] = {
    "TestCreateContainer/Empty": create([]),
    "TestCreateContainer/EmptyCloseOnUnload": create([]),
    "TestCreateContainer/EmptyLaunchScript": create([], launch_script="#!/usr/bin/env launch-script\n"),
    "TestCreateContainer/EmptyWithID": create([], id=GO_ID),
    "TestCreateContainer/EmptyWithTime": create([], created=GO_TIME),
    "TestCreateContainer/EmptyDescriptorLimitedCapacity": create([], capacity=1),
    "TestCreateContainer/OneDescriptor": create([generic(FACE)]),
    "TestCreateContainer/TwoDescriptors": create([generic(FACE), squash_prim(FEED)]),
    "TestCreateContainer/TwoDescriptorsNotAligned": create(
        [generic(FACE, alignment=0), squash_prim(FEED, alignment=0)]
    ),
    "TestCreateContainer/TwoDescriptorsAligned": create(
        [generic(FACE, alignment=4), squash_prim(FEED, alignment=4)]
    ),
    "TestAddObject/ErrInsufficientCapacity": then(create([], capacity=0), add(generic(FEED)), fails=True),
    "TestAddObject/ErrPrimaryPartition": then(
        create([squash_prim(FACE)]), add(squash_prim(FEED, "amd64")), fails=True
    ),
    "TestAddObject/Deterministic": then(
        create([], id=GO_ID, created=GO_TIME, deterministic=False), add(generic(FACE), when=ZERO_TIME)
    ),
    "TestAddObject/WithTime": then(create([]), add(generic(FACE), when=GO_TIME)),
    "TestAddObject/Empty": then(create([]), add(generic(FACE))),
    "TestAddObject/EmptyNotAligned": then(create([]), add(generic(FACE, alignment=0))),
    "TestAddObject/EmptyAligned": then(create([]), add(generic(FACE, alignment=128))),
    "TestAddObject/NotEmpty": then(create([generic(FACE)]), add(squash_prim(FEED))),
    "TestAddObject/NotEmptyNotAligned": then(create([generic(FACE)]), add(squash_prim(FEED, alignment=0))),
    "TestAddObject/NotEmptyAligned": then(create([generic(FACE)]), add(squash_prim(FEED, alignment=128))),
    "TestSetPrimPart/ErrObjectNotFound": then(create([]), setprim(1), fails=True),
    "TestSetPrimPart/Deterministic": then(
        create([raw_part(FACE, sif.PART_SYSTEM, "386")], id=GO_ID, created=GO_TIME, deterministic=False),
        setprim(1, when=ZERO_TIME),
    ),
    "TestSetPrimPart/WithTime": then(create(PRIM_THEN_SYSTEM), setprim(2, when=GO_TIME)),
    "TestSetPrimPart/One": then(create([raw_part(FACE, sif.PART_SYSTEM, "386")]), setprim(1)),
    "TestSetPrimPart/Two": then(create(PRIM_THEN_SYSTEM), setprim(2)),
    "TestDeleteObject/ErrObjectNotFound": then(create([]), delete(1), fails=True),
    "TestDeleteObject/Compact": then(TWO_GENERIC, delete(1, compact=True), delete(2, compact=True)),
    "TestDeleteObject/OneZero": then(TWO_GENERIC, delete(1, zero=True)),
    "TestDeleteObject/OneCompact": then(TWO_GENERIC, delete(1, compact=True)),
    "TestDeleteObject/OneZeroCompact": then(TWO_GENERIC, delete(1, zero=True, compact=True)),
    "TestDeleteObject/TwoZero": then(TWO_GENERIC, delete(2, zero=True)),
    "TestDeleteObject/TwoCompact": then(TWO_GENERIC, delete(2, compact=True)),
    "TestDeleteObject/TwoZeroCompact": then(TWO_GENERIC, delete(2, zero=True, compact=True)),
    "TestDeleteObject/Deterministic": then(
        create([generic(FACE)], id=GO_ID, created=GO_TIME, deterministic=False), delete(1, when=ZERO_TIME)
    ),
    "TestDeleteObject/WithTime": then(create([generic(FACE)]), delete(1, when=GO_TIME)),
    "TestDeleteObject/PrimaryPartition": then(create([squash_prim(FACE)]), delete(1)),
}


def test_every_writer_golden_has_a_case() -> None:
    goldens = {str(p.relative_to(WRITER))[: -len(".golden")] for p in WRITER.glob("*/*.golden")}
    assert goldens == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_writer_golden_byte_exact(name: str, tmp_path: Path) -> None:
    out = tmp_path / "out.sif"
    CASES[name](out)
    assert out.read_bytes() == (WRITER / f"{name}.golden").read_bytes()


@pytest.mark.parametrize(
    ("golden", "objects", "kw"),
    [
        ("empty.sif", [], {}),
        ("empty-id.sif", [], {"id": uuid.UUID("3fa802cc-358b-45e3-bcc0-69dc7a45f9f8")}),
        ("empty-launch-script.sif", [], {"launch_script": "#!/usr/bin/env run-script\n"}),
        ("one-object-generic-json.sif", [SifObject(sif.DATA_GENERIC_JSON, b"{}", name="data.json")], {}),
        (
            "one-object-time.sif",
            [SifObject(sif.DATA_GENERIC_JSON, b"{}", name="data.json")],
            {"created": 1593475316},
        ),
        (
            "one-object-crypt-message.sif",
            [SifObject(sif.DATA_CRYPTO_MESSAGE, b"\xfe\xfe\xf0\xf0", extra=b"\1\0\0\0\0\1\0\0")],
            {},
        ),
    ],
)
def test_library_images_reproduced(
    golden: str, objects: list[SifObject], kw: dict[str, Any], tmp_path: Path
) -> None:
    """The gen_sifs.go images whose inputs are simple enough to restate here (sif.md §11)."""
    out = tmp_path / "out.sif"
    create_det(out, objects, **kw)
    assert out.read_bytes() == (DATA / golden).read_bytes()


V2_GOLDENS = sorted(
    str(p.relative_to(DATA)) for p in DATA.glob("**/*.sif") if read_sif(p).data_offset == 32176
)


@pytest.mark.parametrize("golden", V2_GOLDENS)
def test_v2_images_rebuilt_from_their_own_objects(golden: str, tmp_path: Path) -> None:
    """Every v2-layout image, signed ones included, is what create_sif makes of its objects."""
    image = read_sif(DATA / golden)
    objects = [
        SifObject(
            d.datatype, image.read_object(d), name=d.name, group=d.group_id, link=d.link,
            link_is_group=d.link_is_group, fstype=d.fstype, parttype=d.parttype, arch=d.arch,
            extra=b"" if d.is_partition else d.extra.rstrip(b"\0"), time=d.created,
        )
        for d in image.descriptors
    ]
    out = tmp_path / "out.sif"
    create_sif(
        out, objects, launch_script=image.launch_script, id=uuid.UUID(image.uuid),
        created=image.created, modified=image.modified,
    )
    assert out.read_bytes() == (DATA / golden).read_bytes()


def test_oci_blob_digest_is_the_data_digest() -> None:
    for name in ("one-object-oci-blob.sif", "one-object-oci-root-index.sif"):
        image = read_sif(DATA / name)
        blob = image.descriptors[0]
        digest = "sha256:" + hashlib.sha256(image.read_object(blob)).hexdigest()
        assert blob.extra.rstrip(b"\0") == digest.encode()


def test_streamed_object_equals_in_memory_object(tmp_path: Path) -> None:
    payload = os.urandom(10_000)
    (tmp_path / "payload").write_bytes(payload)
    create_det(tmp_path / "a.sif", [squash_prim(payload)])
    streamed = SifObject(
        sif.DATA_PARTITION, path=tmp_path / "payload", fstype=sif.FS_SQUASHFS, parttype=sif.PART_PRIMSYS, arch="386"
    )
    create_det(tmp_path / "b.sif", [streamed])
    assert (tmp_path / "a.sif").read_bytes() == (tmp_path / "b.sif").read_bytes()


def test_defaults_random_id_current_time_launch_script_mode(tmp_path: Path) -> None:
    out = tmp_path / "x.sif"
    create_sif(out, [generic(FACE)])
    image = read_sif(out)
    assert image.launch_script == LAUNCH_SCRIPT
    assert image.uuid != str(uuid.UUID(int=0))
    assert image.created > 1_600_000_000 and image.created == image.modified == image.descriptors[0].created
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert os.listdir(tmp_path) == ["x.sif"]


@pytest.mark.parametrize(
    ("objects", "kw", "message"),
    [
        ([part(FACE, sif.FS_SQUASHFS, sif.PART_PRIMSYS, "vax")], {}, "unknown architecture: 'vax'"),
        ([squash_prim(FACE), squash_prim(FEED)], {}, "already has a primary system partition"),
        ([generic(FACE), generic(FEED)], {"capacity": 1}, "no free descriptor"),
        ([], {"launch_script": "#" * 32}, "launch script is too long"),
        ([SifObject(name="n" * 129)], {}, "name is longer than 128 bytes"),
        ([SifObject(extra=bytes(385))], {}, "metadata is longer than 384 bytes"),
    ],
)
def test_create_errors_leave_nothing_behind(
    objects: list[SifObject], kw: dict[str, Any], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "x.sif"
    out.write_bytes(b"previous")
    with pytest.raises(SifError, match=message):
        create_sif(out, objects, **kw)
    assert out.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["x.sif"]


def test_unreadable_source_and_unwritable_destination(tmp_path: Path) -> None:
    missing = SifObject(path=tmp_path / "missing")
    with pytest.raises(ImageError, match="can't read .*missing: No such file"):
        create_sif(tmp_path / "x.sif", [missing])
    with pytest.raises(ImageError, match="can't create SIF file .*nodir/x.sif"):
        create_sif(tmp_path / "nodir" / "x.sif", [])
    assert os.listdir(tmp_path) == []


def test_failed_edits_leave_the_image_alone(tmp_path: Path) -> None:
    out = tmp_path / "x.sif"
    create_det(out, [generic(FACE)])
    before = out.read_bytes()
    with pytest.raises(ImageError, match="can't read .*missing"):
        add_object(out, SifObject(path=tmp_path / "missing"))
    with pytest.raises(SifError, match="unknown architecture"):
        add_object(out, part(FEED, sif.FS_SQUASHFS, sif.PART_SYSTEM, "pdp11"))
    assert out.read_bytes() == before
    (tmp_path / "bad.sif").write_bytes(before[:1000])
    with pytest.raises(SifError, match="corrupt SIF"):
        add_object(tmp_path / "bad.sif", generic(FEED))


def test_set_primary_refuses_non_system_partitions(tmp_path: Path) -> None:
    out = tmp_path / "x.sif"
    create_sif(out, [generic(FACE), part(FEED, sif.FS_EXT3, sif.PART_DATA, "amd64")])
    with pytest.raises(SifError, match="object 1 is not a partition"):
        set_primary_partition(out, 1)
    with pytest.raises(SifError, match="object 2 is not a system partition"):
        set_primary_partition(out, 2)


def test_edits_reuse_freed_slots_and_keep_times(tmp_path: Path) -> None:
    out = tmp_path / "x.sif"
    create_sif(out, [generic(b"abc"), generic(b"def")], created=1000)
    delete_object(out, 1)
    add_object(out, generic(b"ghi"), when=2000)
    image = read_sif(out)
    assert [(d.id, d.offset, d.created) for d in image.descriptors] == [(1, 32182, 2000), (2, 32179, 1000)]
    assert (image.created, image.modified, image.data_size) == (1000, 2000, 9)
    assert image.read_object(image.descriptors[0]) == b"ghi"


def _mksquashfs(tmp_path: Path) -> Path:
    if MKSQUASHFS is None:
        pytest.skip("mksquashfs is not installed")
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("hello\n")
    squash = tmp_path / "root.squashfs"
    subprocess.run([MKSQUASHFS, root, squash, "-noappend", "-quiet", "-comp", "gzip", "-all-root"], check=True)
    return squash


def _siftool(*args: object, text: bool = True) -> Any:
    if SIFTOOL is None:
        pytest.skip("siftool is not installed (Debian package siftool)")
    return subprocess.run([SIFTOOL, *map(str, args)], check=True, capture_output=True, text=text).stdout


def test_built_image_as_siftool_sees_it(tmp_path: Path) -> None:
    squash = _mksquashfs(tmp_path)
    out = tmp_path / "image.sif"
    build_sif_from_squashfs(
        out, squash, arch="arm64", deffile="Bootstrap: scratch\n", labels_json={"maintainer": "me"},
        oci_config={"Cmd": ["sh"]},
    )
    listing = _siftool("list", out)
    assert "FS (Squashfs/*System/arm64)" in listing
    assert "Def.FILE" in listing and listing.count("JSON.Generic") == 2
    info = _siftool("info", 4, out)
    assert "Partition Type:   *System" in info and "Architecture:     arm64" in info
    assert "Filesystem Type:  Squashfs" in info and "Group ID:         1" in info
    assert "Primary Architecture: arm64" in _siftool("header", out)
    assert _siftool("dump", 4, out, text=False) == squash.read_bytes()

    image = read_sif(out)
    assert [(d.id, d.type_name, d.name, d.group_id) for d in image.descriptors] == [
        (1, "Def.FILE", "", 1),
        (2, "JSON.Generic", "inspect-metadata.json", 1),
        (3, "JSON.Generic", "oci-config.json", 1),
        (4, "FS", "", 1),
    ]
    prim = image.primary_partition()
    assert (prim.offset % 4096, prim.size, image.arch) == (0, squash.stat().st_size, "arm64")
    meta = json.loads(image.read_object(image.descriptors[1]))
    assert meta == {"data": {"attributes": {"labels": {"maintainer": "me"}}}, "type": "container"}
    assert image.launch_script == LAUNCH_SCRIPT and stat.S_IMODE(out.stat().st_mode) == 0o755


def test_build_merges_labels_into_given_metadata(tmp_path: Path) -> None:
    squash = _mksquashfs(tmp_path)
    out = tmp_path / "image.sif"
    inspect = b'{"data":{"attributes":{"runscript":"#!/bin/sh"}},"type":"container"}'
    build_sif_from_squashfs(out, squash, arch="amd64", labels_json='{"a":"b"}', inspect_metadata=inspect)
    image = read_sif(out)
    assert [d.type_name for d in image.descriptors] == ["JSON.Generic", "FS"]
    meta = json.loads(image.read_object(image.descriptors[0]))
    assert meta["data"]["attributes"] == {"runscript": "#!/bin/sh", "labels": {"a": "b"}}


def test_build_refuses_what_is_not_squashfs(tmp_path: Path) -> None:
    (tmp_path / "not.sq").write_bytes(b"nope" * 10)
    with pytest.raises(SifError, match="not a squashfs image"):
        build_sif_from_squashfs(tmp_path / "x.sif", tmp_path / "not.sq", arch="amd64")
    assert not (tmp_path / "x.sif").exists()


def test_siftool_made_image_reproduced(tmp_path: Path) -> None:
    """siftool new + add, read back with our reader, then rebuilt byte for byte."""
    squash = _mksquashfs(tmp_path)
    deffile = tmp_path / "def"
    deffile.write_text("Bootstrap: scratch\n")
    theirs = tmp_path / "theirs.sif"
    _siftool("new", theirs)
    _siftool("add", theirs, deffile, "--datatype", 1, "--groupid", 1)
    _siftool("add", theirs, squash, "--datatype", 4, "--parttype", 2, "--partfs", 1, "--partarch", 4, "--groupid", 1)
    _siftool("add", theirs, deffile, "--datatype", 6, "--filename", "labels.json", "--groupid", 1, "--link", 2)

    image = read_sif(theirs)
    assert image.arch == "arm64" and image.data_offset == 32176
    assert [(d.id, d.datatype, d.group_id, d.link, d.offset) for d in image.descriptors] == [
        (1, sif.DATA_DEFFILE, 1, 0, 32176),
        (2, sif.DATA_PARTITION, 1, 0, 32768),
        (3, sif.DATA_GENERIC_JSON, 1, 2, 32768 + squash.stat().st_size),
    ]
    prim = image.primary_partition()
    assert (prim.id, prim.arch, prim.fstype_name, prim.parttype_name) == (2, "arm64", "Squashfs", "*System")
    assert image.read_object(image.descriptors[2]) == b"Bootstrap: scratch\n"

    d1, d2, d3 = image.descriptors
    ours = tmp_path / "ours.sif"
    objects = [
        SifObject(sif.DATA_DEFFILE, deffile.read_bytes(), time=d1.created),
        SifObject(sif.DATA_PARTITION, path=squash, fstype=1, parttype=2, arch="arm64", time=d2.created),
        SifObject(sif.DATA_GENERIC_JSON, deffile.read_bytes(), name="labels.json", link=2, time=d3.created),
    ]
    create_sif(
        ours, objects, launch_script="", id=uuid.UUID(image.uuid), created=image.created, modified=image.modified
    )
    assert ours.read_bytes() == theirs.read_bytes()


def test_an_offset_past_any_file_is_an_image_error(tmp_path: Path) -> None:
    """--alignment 2**64 (through the API: the CLI bounds it) made seek() raise ValueError, a traceback."""
    out = tmp_path / "t.sif"
    create_det(out, [generic(b"data")])
    before = out.read_bytes()
    for alignment in (1 << 63, 1 << 64):
        with pytest.raises(ImageError, match="can't write SIF file"):
            add_object(out, generic(b"x", alignment=alignment))
        assert out.read_bytes() == before


def test_a_descriptor_table_of_65536_slots_is_the_most(tmp_path: Path) -> None:
    """What singpy writes it must read back: the writer's capacity has the reader's bound."""
    out = tmp_path / "t.sif"
    create_det(out, [squash_prim(b"hsqs" + bytes(92))], capacity=1 << 16)
    assert read_sif(out).descriptors_total == 1 << 16
    with pytest.raises(SifError, match="unsupported descriptor capacity"):
        create_det(tmp_path / "u.sif", [], capacity=(1 << 16) + 1)

"""SIF reader: every golden image, corrupt inputs, fuzzing, and siftool as a second opinion."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from singpy.errors import SifError
from singpy.image import sif
from singpy.image.sif import DESCRIPTOR, HEADER, ZERO_TIME, host_arch, is_sif, read_sif

DATA = Path(__file__).parent.parent / "data" / "sif-golden"
SIFTOOL = shutil.which("siftool")
NIL_UUID = "00000000-0000-0000-0000-000000000000"


class Expect(NamedTuple):
    size: int
    data_offset: int
    arch: str
    primary: tuple[int, str, str] | None  # id, arch, fstype name
    objects: list[tuple[int, str, int, int, bool, int, int]]  # id type group link link_is_group offset size


P1 = (1, "FS", 1, 0, False, 32768, 4)  # raw system partition, 386
P2 = (2, "FS", 1, 0, False, 36864, 4096)  # squashfs primary partition, 386
P2_LEGACY = (2, "FS", 1, 0, False, 36864, 4)
P3 = (3, "FS", 2, 0, False, 40960, 262144)  # ext3, group 2, amd64
P3_LEGACY = (3, "FS", 2, 0, False, 40960, 4)
PRIM_386 = (2, "386", "Squashfs")

EXPECTED: dict[str, Expect] = {
    "empty.sif": Expect(32176, 32176, "unknown", None, []),
    "empty-id.sif": Expect(32176, 32176, "unknown", None, []),
    "empty-launch-script.sif": Expect(32176, 32176, "unknown", None, []),
    "one-object-crypt-message.sif": Expect(
        32180, 32176, "unknown", None, [(1, "Cryptographic Message", 1, 0, False, 32176, 4)]
    ),
    "one-object-generic-json.sif": Expect(32178, 32176, "unknown", None, [(1, "JSON.Generic", 1, 0, False, 32176, 2)]),
    "one-object-time.sif": Expect(32178, 32176, "unknown", None, [(1, "JSON.Generic", 1, 0, False, 32176, 2)]),
    "one-object-oci-blob.sif": Expect(33023, 32176, "unknown", None, [(1, "OCI.Blob", 1, 0, False, 32176, 847)]),
    "one-object-oci-root-index.sif": Expect(
        32882, 32176, "unknown", None, [(1, "OCI.RootIndex", 1, 0, False, 32176, 706)]
    ),
    "one-object-sbom.sif": Expect(32630, 32176, "unknown", None, [(1, "SBOM", 1, 0, False, 32176, 454)]),
    "one-group.sif": Expect(40960, 32176, "386", PRIM_386, [P1, P2]),
    "one-group-signed-dsse.sif": Expect(
        42654, 32176, "386", PRIM_386, [P1, P2, (3, "Signature", 0, 1, True, 40960, 1694)]
    ),
    "one-group-signed-pgp.sif": Expect(
        42008, 32176, "386", PRIM_386, [P1, P2, (3, "Signature", 0, 1, True, 40960, 1048)]
    ),
    "one-group-signed-legacy.sif": Expect(
        41569, 32768, "386", PRIM_386, [P1, P2_LEGACY, (3, "Signature", 1, 2, False, 40960, 609)]
    ),
    "one-group-signed-legacy-group.sif": Expect(
        41569, 32768, "386", PRIM_386, [P1, P2_LEGACY, (3, "Signature", 0, 1, True, 40960, 609)]
    ),
    "one-group-signed-legacy-all.sif": Expect(
        45665, 32768, "386", PRIM_386,
        [P1, P2_LEGACY, (3, "Signature", 1, 1, False, 40960, 609), (4, "Signature", 1, 2, False, 45056, 609)],
    ),
    "two-groups.sif": Expect(303104, 32176, "386", PRIM_386, [P1, P2, P3]),
    "two-groups-signed-dsse.sif": Expect(
        306224, 32176, "386", PRIM_386,
        [P1, P2, P3, (4, "Signature", 0, 1, True, 303104, 1694), (5, "Signature", 0, 2, True, 304798, 1426)],
    ),
    "two-groups-signed-pgp.sif": Expect(
        305001, 32176, "386", PRIM_386,
        [P1, P2, P3, (4, "Signature", 0, 1, True, 303104, 1048), (5, "Signature", 0, 2, True, 304152, 849)],
    ),
    "two-groups-signed-legacy.sif": Expect(
        45665, 32768, "386", PRIM_386, [P1, P2_LEGACY, P3_LEGACY, (4, "Signature", 1, 2, False, 45056, 609)]
    ),
    "two-groups-signed-legacy-group.sif": Expect(
        45665, 32768, "386", PRIM_386, [P1, P2_LEGACY, P3_LEGACY, (4, "Signature", 0, 1, True, 45056, 609)]
    ),
    "two-groups-signed-legacy-all.sif": Expect(
        49761, 32768, "386", PRIM_386,
        [P1, P2_LEGACY, P3_LEGACY, (4, "Signature", 1, 1, False, 45056, 609),
         (5, "Signature", 1, 2, False, 49152, 609)],
    ),
    "singularityce/empty.oci.sif": Expect(32179, 32176, "unknown", None, [(1, "OCI.RootIndex", 1, 0, False, 32176, 3)]),
    "singularityce/one-group-legacy-layout.sif": Expect(36868, 32768, "386", PRIM_386, [P1, P2_LEGACY]),
    "real/busybox_arm64.sif": Expect(
        841445, 32768, "arm64", (4, "arm64", "Squashfs"),
        [
            (1, "Def.FILE", 1, 0, False, 32768, 39),
            (2, "JSON.Generic", 1, 0, False, 36864, 1897),
            (3, "JSON.Generic", 1, 0, False, 40960, 90),
            (4, "FS", 1, 0, False, 45056, 794624),
            (5, "Signature", 0, 1, True, 839680, 1765),
        ],
    ),
    "real/busybox_ppc64le.sif": Expect(
        2885349, 32768, "ppc64le", (4, "ppc64le", "Squashfs"),
        [
            (1, "Def.FILE", 1, 0, False, 65536, 39),  # 64 KiB pages on ppc64le
            (2, "JSON.Generic", 1, 0, False, 131072, 1899),
            (3, "JSON.Generic", 1, 0, False, 196608, 90),
            (4, "FS", 1, 0, False, 262144, 2568192),
            (5, "Signature", 0, 1, True, 2883584, 1765),
        ],
    ),
}
ALL_SIFS = sorted(str(p.relative_to(DATA)) for p in DATA.glob("**/*.sif"))
GOLDENS = ALL_SIFS + sorted(str(p.relative_to(DATA)) for p in DATA.glob("writer/*/*.golden"))


def test_every_sif_has_expectations() -> None:
    assert set(ALL_SIFS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_parsed(name: str) -> None:
    want = EXPECTED[name]
    image = read_sif(DATA / name)
    assert (image.file_size, image.data_offset, image.arch) == (want.size, want.data_offset, want.arch)
    assert (image.magic, image.version) == ("SIF_MAGIC", "01")
    assert (image.descriptors_offset, image.descriptors_total, image.descriptors_size) == (4096, 48, 48 * 585)
    assert image.descriptors_free == 48 - len(want.objects)
    got = [(d.id, d.type_name, d.group_id, d.link, d.link_is_group, d.offset, d.size) for d in image.descriptors]
    assert got == want.objects
    assert all(d.used for d in image.descriptors)
    if want.primary is None:
        with pytest.raises(SifError, match="no primary system partition in .*" + re.escape(name)):
            image.primary_partition()
    else:
        prim = image.primary_partition()
        assert (prim.id, prim.arch, prim.fstype_name, prim.parttype_name) == (*want.primary, "*System")
        assert (prim.fstype, prim.parttype, prim.is_primary) == (sif.FS_SQUASHFS, sif.PART_PRIMSYS, True)


@pytest.mark.parametrize("name", GOLDENS)
def test_goldens_are_sif(name: str) -> None:
    assert is_sif(DATA / name)
    read_sif(DATA / name)


def test_header_fields_of_generated_images() -> None:
    empty = read_sif(DATA / "empty.sif")
    assert (empty.uuid, empty.launch_script, empty.created, empty.modified) == (NIL_UUID, "", ZERO_TIME, ZERO_TIME)
    assert empty.data_size == 0
    assert read_sif(DATA / "empty-id.sif").uuid == "3fa802cc-358b-45e3-bcc0-69dc7a45f9f8"
    assert read_sif(DATA / "empty-launch-script.sif").launch_script == "#!/usr/bin/env run-script\n"
    timed = read_sif(DATA / "one-object-time.sif")
    assert (timed.created, timed.modified, timed.descriptors[0].created) == (1593475316,) * 3
    assert timed.descriptors[0].name == "data.json"
    assert timed.read_object(timed.descriptors[0]) == b"{}"


def test_partition_metadata_and_names() -> None:
    image = read_sif(DATA / "two-groups.sif")
    raw, squash, ext3 = image.descriptors
    assert (raw.fstype_name, raw.parttype_name, raw.arch, raw.size_with_padding) == ("Raw", "System", "386", 596)
    assert (ext3.fstype_name, ext3.parttype_name, ext3.arch, ext3.fstype) == ("Ext3", "System", "amd64", sif.FS_EXT3)
    assert not raw.is_primary and squash.is_primary
    assert image.read_object(raw) == b"\xfa\xce\xfe\xed"
    assert image.read_object(squash)[:4] == b"hsqs"
    assert image.find(sif.DATA_PARTITION) == (raw, squash, ext3)


def test_non_partitions_have_no_partition_metadata() -> None:
    blob = read_sif(DATA / "one-object-oci-blob.sif").descriptors[0]
    assert (blob.fstype, blob.parttype, blob.arch, blob.is_partition) == (0, 0, "unknown", False)
    assert (blob.fstype_name, blob.parttype_name, blob.type_name) == ("Unknown", "Unknown", "OCI.Blob")
    assert blob.extra.startswith(b"sha256:a88b15e9") and len(blob.extra) == 384


def test_legacy_image_fields() -> None:
    image = read_sif(DATA / "one-group-signed-legacy-all.sif")
    assert image.launch_script == "#!/usr/bin/env run-singularity\n"
    assert image.uuid == "6ecc76b7-a497-4f7f-9ebd-8da2a04c6be1"
    raw = image.descriptors[0]
    assert (raw.uid, raw.gid, raw.name, raw.size_with_padding) == (1000, 1000, ".", 4)
    signature = image.descriptors[2]
    assert (signature.name, signature.extra[:4]) == ("part-signature", b"\2\0\0\0")  # SHA384


def test_real_busybox_arm64() -> None:
    image = read_sif(DATA / "real" / "busybox_arm64.sif")
    assert (image.arch, image.data_offset, image.uuid) == ("arm64", 32768, "a46b411d-d08c-4f71-8f4e-f77318d7edf2")
    assert image.launch_script == "#!/usr/bin/env run-singularity\n"
    deffile, inspect, oci, rootfs, _signature = image.descriptors
    assert image.read_object(deffile) == b"BootStrap: docker\nFrom: busybox:1.33.1\n"
    assert (inspect.name, oci.name) == ("inspect-metadata.json", "oci-config.json")
    labels = json.loads(image.read_object(inspect))["data"]["attributes"]["labels"]
    assert labels["org.label-schema.build-arch"] == "arm64"
    assert json.loads(image.read_object(oci)) == {
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sh"]
    }
    head = image.read_object(rootfs)[:22]
    assert head[:4] == b"hsqs" and struct.unpack_from("<H", head, 20)[0] == 1  # gzip
    assert image.find(sif.DATA_GENERIC_JSON, "oci-config.json") == (oci,)
    with pytest.raises(SifError, match="object 4 .* is too large"):
        image.read_object(rootfs, max_size=1 << 16)


def test_host_arch_matches_uname() -> None:
    machine = os.uname().machine
    expected = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}.get(machine, machine)
    assert host_arch() == expected
    assert host_arch() in sif.ARCH_CODES


@pytest.mark.skipif(SIFTOOL is None, reason="siftool is not installed (Debian package siftool)")
@pytest.mark.parametrize("name", ALL_SIFS)
def test_siftool_agrees(name: str) -> None:
    out = subprocess.run([SIFTOOL or "siftool", "list", DATA / name], check=True, capture_output=True, text=True)
    rows = [line.split("|") for line in out.stdout.splitlines() if re.match(r"\d+ +\|", line)]
    image = read_sif(DATA / name)
    assert len(rows) == len(image.descriptors)
    for row, d in zip(rows, image.descriptors, strict=True):
        link = "NONE" if not d.link else f"{d.link}   (G)" if d.link_is_group else str(d.link)
        assert [c.strip() for c in row[:4]] == [
            str(d.id), str(d.group_id or "NONE"), link, f"{d.offset}-{d.offset + d.size}"
        ]
        if d.is_partition:
            assert row[4].strip() == f"FS ({d.fstype_name}/{d.parttype_name}/{d.arch})"
        elif d.datatype < sif.DATA_OCI_ROOT_INDEX:  # this siftool predates the OCI types
            assert row[4].startswith(d.type_name)


# --- corrupt input -------------------------------------------------------------------------------

GOOD = (DATA / "one-group.sif").read_bytes()


def patched(data: bytes, offset: int, fmt: str, value: object) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


HDR = {name: HEADER.size - 8 * (13 - i) for i, name in enumerate(  # offsets of the int64 fields
    ["created", "modified", "free", "total", "desc_offset", "desc_size", "data_offset", "data_size"], start=5
)}
SLOT0 = 4096  # one-group.sif's descriptor table
CORRUPT = {
    "empty": (b"", "not a SIF file: {} (empty file)"),
    "tiny": (b"#!", "not a SIF file: {} (bad magic)"),
    "magic": (GOOD[:32] + b"SIF_MAGIK\0" + GOOD[42:], "not a SIF file: {} (bad magic)"),
    "squashfs": (b"hsqs" + bytes(200), "not a SIF file: {} (bad magic)"),
    "header": (GOOD[:100], "corrupt SIF {}: header truncated at 100 bytes"),
    "version": (GOOD[:42] + b"02\0" + GOOD[45:], 'unsupported SIF version "02": {} (only "01" is known)'),
    "table cut": (GOOD[:20000], "corrupt SIF {}: descriptor table lies outside the file"),
    "data cut": (GOOD[:40000], "corrupt SIF {}: descriptor 2 points outside the file"),
    "total": (patched(GOOD, HDR["total"], "<q", 49), "corrupt SIF {}: bad descriptor table size"),
    "negative total": (patched(GOOD, HDR["total"], "<q", -1), "corrupt SIF {}: bad descriptor table size"),
    "table size": (patched(GOOD, HDR["desc_size"], "<q", 28081), "corrupt SIF {}: bad descriptor table size"),
    "table offset": (patched(GOOD, HDR["desc_offset"], "<q", 64), "descriptor table lies outside the file"),
    "table far": (patched(GOOD, HDR["desc_offset"], "<q", 1 << 62), "descriptor table lies outside the file"),
    "data offset": (patched(GOOD, HDR["data_offset"], "<q", -1), "corrupt SIF {}: negative data offset"),
    "object offset": (patched(GOOD, SLOT0 + 17, "<q", 40960), "corrupt SIF {}: descriptor 1 points outside the file"),
    "negative offset": (patched(GOOD, SLOT0 + 17, "<q", -4), "descriptor 1 points outside the file"),
    "negative size": (patched(GOOD, SLOT0 + 585 + 25, "<q", -1), "descriptor 2 points outside the file"),
    "huge size": (patched(GOOD, SLOT0 + 25, "<q", 2**63 - 1), "descriptor 1 points outside the file"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_input(case: str, tmp_path: Path) -> None:
    data, message = CORRUPT[case]
    path = tmp_path / "bad.sif"
    path.write_bytes(data)
    with pytest.raises(SifError) as info:
        read_sif(path)
    assert message.format(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_unused_slots_are_ignored_even_if_they_point_anywhere(tmp_path: Path) -> None:
    slot = SLOT0 + 2 * DESCRIPTOR.size  # first free slot of one-group.sif
    path = tmp_path / "x.sif"
    path.write_bytes(patched(GOOD, slot + 17, "<q", 1 << 40))
    assert len(read_sif(path).descriptors) == 2


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(SifError, match=f"can't open SIF file {tmp_path}/missing.sif: No such file or directory"):
        read_sif(tmp_path / "missing.sif")
    with pytest.raises(SifError, match=f"not a SIF file: {tmp_path} \\(not a regular file\\)"):
        read_sif(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # must not block waiting for a writer
    with pytest.raises(SifError, match="not a regular file"):
        read_sif(fifo)
    assert not is_sif(fifo) and not is_sif(tmp_path) and not is_sif(tmp_path / "missing.sif")


def test_object_truncated_after_parsing(tmp_path: Path) -> None:
    path = tmp_path / "x.sif"
    path.write_bytes(GOOD)
    image = read_sif(path)
    path.write_bytes(GOOD[:36864 + 10])
    with pytest.raises(SifError, match="corrupt SIF .*: object 2 is truncated"):
        image.read_object(image.descriptors[1])
    path.unlink()
    with pytest.raises(SifError, match="can't read SIF object 2 from .*: .*No such file"):
        image.read_object(image.descriptors[1])


# --- fuzzing: whatever the bytes, read_sif returns or raises SifError --------------------------------

SMALL_GOLDENS = [(DATA / n).read_bytes() for n in ALL_SIFS if (DATA / n).stat().st_size < 64_000]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def parse_only_sif_errors(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        image = read_sif(path)
    except SifError as e:
        assert str(e) and "\n" not in str(e)
        return
    for desc in image.descriptors:  # every object the parser accepts must be readable
        assert len(image.read_object(desc)) == desc.size
        _ = (desc.type_name, desc.arch, desc.fstype_name, desc.parttype_name)
    assert is_sif(path)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_fuzz_random_bytes(tmp_path: Path, data: bytes) -> None:
    parse_only_sif_errors(tmp_path / "fuzz.sif", data)


@FUZZ
@given(data=st.binary(max_size=128))
def test_fuzz_random_header_after_magic(tmp_path: Path, data: bytes) -> None:
    parse_only_sif_errors(tmp_path / "fuzz.sif", bytes(32) + sif.MAGIC + data + GOOD[42 + len(data):])


@FUZZ
@given(
    source=st.sampled_from(SMALL_GOLDENS),
    flips=st.lists(st.tuples(st.integers(0, 64_000), st.integers(0, 255)), max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 64_000)),
)
def test_fuzz_mutated_goldens(tmp_path: Path, source: bytes, flips: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray(source)
    for where, value in flips:
        data[where % len(data)] = value
    parse_only_sif_errors(tmp_path / "fuzz.sif", bytes(data[:cut]))


NUMERIC_FIELDS = [(offset, "<q") for offset in HDR.values()] + [
    (SLOT0 + slot * DESCRIPTOR.size + offset, fmt)
    for slot in range(3)
    for offset, fmt in ((5, "<I"), (9, "<I"), (13, "<I"), (17, "<q"), (25, "<q"), (33, "<q"))
]


@FUZZ
@given(
    source=st.sampled_from(SMALL_GOLDENS),
    field=st.sampled_from(NUMERIC_FIELDS),
    value=st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-70_000, 70_000)),
)
def test_fuzz_numeric_fields(tmp_path: Path, source: bytes, field: tuple[int, str], value: int) -> None:
    """Header and descriptor integers set to anything, including values near the real ones."""
    data = bytearray(source)
    offset, fmt = field
    struct.pack_into(fmt, data, offset, value % 2**32 if fmt == "<I" else value)
    data[SLOT0 + 4] = 1  # make slot 0 "used" so that its fields matter
    parse_only_sif_errors(tmp_path / "fuzz.sif", bytes(data))


def _two_primaries(tmp_path: Path) -> Path:
    """one-group.sif with its primary partition's descriptor (slot 2) copied into slot 3, as object 3."""
    data = bytearray((DATA / "one-group.sif").read_bytes())
    table = struct.unpack_from("<q", data, 96)[0]
    slot = bytearray(data[table + DESCRIPTOR.size:table + 2 * DESCRIPTOR.size])
    struct.pack_into("<I", slot, 5, 3)
    data[table + 2 * DESCRIPTOR.size:table + 3 * DESCRIPTOR.size] = slot
    out = tmp_path / "two.sif"
    out.write_bytes(bytes(data))
    return out


def test_two_primary_partitions_have_no_primary(tmp_path: Path) -> None:
    """Apptainer's GetDescriptor(PartPrimSys) finds multiple objects: neither is the rootfs, whatever the slots."""
    from singpy.image import detect

    path = _two_primaries(tmp_path)
    with pytest.raises(SifError, match=r"multiple primary system partitions \(objects 2, 3\)"):
        read_sif(path).primary_partition()
    assert detect._scan(detect._partitions(str(path))) is None


@pytest.mark.parametrize("total", [(1 << 16) + 1, 0xFFFFFFFF, 1 << 62])
def test_a_descriptor_count_past_65536_is_refused(tmp_path: Path, total: int) -> None:
    from singpy.image import detect

    data = bytearray((DATA / "one-group.sif").read_bytes())
    struct.pack_into("<q", data, 88, total)
    struct.pack_into("<q", data, 104, total * DESCRIPTOR.size if total < 1 << 32 else 0)
    out = tmp_path / "huge.sif"
    out.write_bytes(bytes(data))
    with pytest.raises(SifError, match=f"corrupt SIF {out}: {total} descriptors \\(at most 65536\\)"):
        read_sif(out)
    assert detect._partitions(str(out)) is None

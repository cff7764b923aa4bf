"""singpy.gpu.intelhpu's choices on a host tree of plain files (its integration tests have real device nodes):
which accelerators HABANA_VISIBLE_DEVICES names, as Apptainer's IntelHpuFilterDevsByIDs, and each one's verbs node."""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.errors import GpuError
from singpy.gpu import GpuHost
from singpy.gpu.intelhpu import device_index, discover, select


@pytest.mark.parametrize(("name", "index"), [("accel0", "0"), ("accel12", "12"), ("hbl_3", "3"), ("accel", None),
                                             ("accel1x", None)])
def test_device_index_is_the_trailing_digits(name: str, index: str | None) -> None:
    assert device_index(name) == index


@pytest.mark.parametrize(("selection", "chosen"), [
    ("all", ["accel0", "accel1", "accel10"]), ("ALL", ["accel0", "accel1", "accel10"]), ("1", ["accel1"]),
    (" 10 , 0", ["accel0", "accel10"]), ("", []), ("''", []), ("2", []), ("1,1", ["accel1"]),
])
def test_selection(selection: str, chosen: list[str]) -> None:
    warnings: list[str] = []
    assert select(["accel0", "accel1", "accel10"], selection, warnings) == chosen and warnings == []


def test_a_name_without_index_is_left_out_with_a_warning() -> None:
    warnings: list[str] = []
    assert select(["accel", "accel2"], "2", warnings) == ["accel2"]
    assert warnings == ["unable to parse HPU device path: couldn't find device ID in 'accel'"]


def _host(root: Path, ports: dict[str, list[str]], nodes: list[str]) -> GpuHost:
    """`root`'s dev and sys: accelN per port N (hbl_N), each port's infiniband_verbs entries, the verbs nodes."""
    for port, entries in ports.items():
        (root / "dev/accel").mkdir(parents=True, exist_ok=True)
        (root / f"dev/accel/accel{device_index(port)}").touch()
        verbs = root / "sys/class/infiniband" / port / "device/infiniband_verbs"
        verbs.mkdir(parents=True)
        for entry in entries:
            (verbs / entry).mkdir()
    (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (root / "dev/infiniband" / node).touch()
    return GpuHost(env={}, path_env="", nvliblist="", rocmliblist="", dev_dir=str(root / "dev"),
                   sys_dir=str(root / "sys"))


def test_each_port_gives_the_first_verbs_entry_it_names(tmp_path: Path) -> None:
    host = _host(tmp_path, {"hbl_0": ["uverbs5", "uverbs2"], "hbl_1": [], "hbl_2": ["uverbs9"]},
                 ["uverbs2", "uverbs5"])
    found = discover(host, contain=True, selection="all")
    assert [(spec.source, spec.dest, spec.dev) for spec in found.mounts] == [
        (f"{tmp_path}/dev/accel/accel{n}", f"/dev/accel/accel{n}", True) for n in range(3)
    ] + [(f"{tmp_path}/dev/infiniband/uverbs2", "/dev/infiniband/uverbs2", True)]
    port = f"{tmp_path}/sys/class/infiniband"
    assert found.warnings == (f"no uverbs devices found for device: {port}/hbl_1",
                              f"encountered invalid hlib to uverb mapping: {port}/hbl_2 -> "
                              f"{tmp_path}/dev/infiniband/uverbs9")


def test_hbl_ports_hide_legacy_hlib_ones(tmp_path: Path) -> None:
    host = _host(tmp_path, {"hbl_0": ["uverbs0"], "hlib_1": ["uverbs1"]}, ["uverbs0", "uverbs1"])
    assert [spec.dest for spec in discover(host, contain=True, selection="1").mounts] == ["/dev/accel/accel1"]


def test_without_contain_the_binds_are_noted_as_no_ops(tmp_path: Path) -> None:
    host = _host(tmp_path, {"hbl_0": ["uverbs0"]}, ["uverbs0"])
    found = discover(host, contain=False)
    assert len(found.mounts) == 2 and found.notes[-1].endswith("the HPU device binds are no-ops")
    assert not discover(host, contain=True).notes[-1].endswith("no-ops")


def test_an_unreadable_port_raises(tmp_path: Path) -> None:
    host = _host(tmp_path, {"hbl_0": ["uverbs0"]}, ["uverbs0"])
    (tmp_path / "sys/class/infiniband/hbl_0/device/infiniband_verbs/uverbs0").rmdir()
    (tmp_path / "sys/class/infiniband/hbl_0/device/infiniband_verbs").rmdir()
    with pytest.raises(GpuError, match="unable to read .*/hbl_0/device/infiniband_verbs: No such file or directory"):
        discover(host, contain=True)
    assert discover(host, contain=True, selection="1").mounts == ()  # a port not selected is not read

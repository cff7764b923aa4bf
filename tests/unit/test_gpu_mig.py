"""MIG device names from what nvidia-smi prints (singpy.gpu.mig): pure parsing, no GPU."""

from __future__ import annotations

import pytest

from singpy.gpu.mig import MigDevice, find, mig_devices, parse_listing, parse_table

# As the MIG user guide shows them for an A100 with two 3g.20gb instances, plus a GPU without MIG.
LISTING = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0b8d4d5e-8e1f-4c67-a7d8-3c4e5f6a7b8c)
"""
SUMMARY = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.14    Driver Version: 550.54.14    CUDA Version: 12.4     |
|-------------------------------+----------------------+----------------------+
|   0  NVIDIA A100-SXM...  On   | 00000000:07:00.0 Off |                   On |
+-----------------------------------------------------------------------------+
| MIG devices:                                                                |
+------------------+----------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |         Memory-Usage |        Vol|         Shared        |
|      ID  ID  Dev |           BAR1-Usage | SM     Unc| CE  ENC  DEC  OFA  JPG|
|                  |                      |        ECC|                       |
|==================+======================+===========+=======================|
|  0    1   0   0  |     11MiB / 20224MiB | 42      0 |  3   0    2    0    0 |
|                  |      0MiB / 32767MiB |           |                       |
+------------------+----------------------+-----------+-----------------------+
|  0    2   0   1  |     11MiB / 20096MiB | 42      0 |  3   0    2    0    0 |
|                  |      0MiB / 32767MiB |           |                       |
+------------------+----------------------+-----------+-----------------------+

+-----------------------------------------------------------------------------+
| Processes:                                                                  |
|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |
|        ID   ID                                                   Usage      |
|=============================================================================|
|    0    1    0      4242      C   python                            100MiB |
+-----------------------------------------------------------------------------+
"""
FIRST = MigDevice(0, 0, 1, 0, "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f")
SECOND = MigDevice(0, 1, 2, 0, "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb")


def test_listing_and_table_are_joined_on_gpu_and_index() -> None:
    assert parse_listing(LISTING) == {(0, 0): FIRST.uuid, (0, 1): SECOND.uuid}
    assert parse_table(SUMMARY) == [(0, 1, 0, 0), (0, 2, 0, 1)]  # the Processes table is not read
    assert mig_devices(LISTING, SUMMARY) == [FIRST, SECOND]
    assert SECOND.name == "0:2:0"


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param(SECOND.uuid, SECOND, id="uuid"),
        pytest.param(SECOND.uuid.upper().replace("MIG-", "mig-"), SECOND, id="uuid-any-case"),
        pytest.param("0:0", FIRST, id="gpu-mig-index"),
        pytest.param("0:1", SECOND, id="gpu-mig-index-1"),
        pytest.param("0:2", None, id="no-such-index"),
        pytest.param("MIG-00000000-0000-0000-0000-000000000000", None, id="unknown-uuid"),
        pytest.param("x:1", None, id="not-numbers"),
    ],
)
def test_find(item: str, expected: MigDevice | None) -> None:
    assert find(item, mig_devices(LISTING, SUMMARY)) == expected


def test_no_mig_anywhere() -> None:
    assert mig_devices("GPU 0: Tesla T4 (UUID: GPU-1)\n", "| No MIG devices |\n") == []
    assert mig_devices("", "") == []


def test_a_device_missing_from_the_listing_has_no_uuid() -> None:
    (device, _) = mig_devices(LISTING.splitlines()[0] + "\n", SUMMARY)
    assert device == MigDevice(0, 0, 1, 0, "")
    assert find("0:0", [device]) == device and find(FIRST.uuid, [device]) is None

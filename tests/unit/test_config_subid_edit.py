"""The pure rules behind `singpy config` and `singpy sif`: Apptainer's subid ranges, the directive edits,
siftool's sizes and times."""

from __future__ import annotations

import pwd

import pytest

from singpy.config import edit, subid
from singpy.errors import ConfigError, UsageError
from singpy.image.siftool import go_time, readable_size

ROOT = pwd.getpwuid(0).pw_name
TOP = 4294967296 - 131072


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (710, "710 B"), (1023, "1023 B"), (1024, "1 KiB"),
                                            (1535, "1 KiB"), (1536, "2 KiB"), (28080, "27 KiB"),
                                            (9 * 1024 + 300, "9 KiB"), (809984, "791 KiB"), (5 << 30, "5 GiB")])
def test_readable_size_is_siftools(size: int, text: str) -> None:
    assert readable_size(size) == text


def test_go_time() -> None:
    assert go_time(1593475316) == "2020-06-30 00:01:56 +0000 UTC"
    assert go_time(1 << 62) == str(1 << 62)  # beyond any calendar: the number, never a traceback


def test_add_takes_the_highest_free_start() -> None:
    file = subid.SubidFile("/etc/subuid", f"other:{TOP}:65536\nbad line\n")
    file.add(ROOT)
    assert file.text() == f"other:{TOP}:65536\nbad line\n0:{TOP - 65536}:65536\n"
    file.add(ROOT)  # already there: unchanged
    assert file.text().count("\n0:") == 1


def test_a_start_inside_a_large_range_is_taken() -> None:
    file = subid.SubidFile("/etc/subuid", f"other:{TOP - 65536 * 3}:{65536 * 4}\n")
    file.add(ROOT)
    assert file.text().endswith(f"\n0:{TOP - 65536 * 4}:65536\n")


def test_the_entry_of_a_user() -> None:
    file = subid.SubidFile("/etc/subuid", f"{ROOT}:100000:1000\n{ROOT}:300000:131072\n0:500000:200000\n")
    assert file.find(ROOT).start == 500000  # no 65536 line: the largest above it
    small = subid.SubidFile("/etc/subuid", f"{ROOT}:100000:1000\n")
    with pytest.raises(ConfigError, match="lower than 65536"):
        small.find(ROOT)
    with pytest.raises(ConfigError, match="no mapping entry found in /etc/subuid"):
        subid.SubidFile("/etc/subuid", "").find(ROOT)


def test_disable_enable_remove() -> None:
    file = subid.SubidFile("/etc/subgid", f"# kept\n{ROOT}:100000:65536\n")
    file.disable(ROOT)
    file.disable(ROOT)
    assert file.text() == f"# kept\n!{ROOT}:100000:65536\n"
    file.enable(ROOT)
    assert file.text() == f"# kept\n{ROOT}:100000:65536\n"
    file.remove(ROOT)
    assert file.text() == "# kept\n"


def test_split_values() -> None:
    assert edit.split_values(" a, b,,a , c ") == ["a", "b", "c"]


def test_unknown_directive() -> None:
    with pytest.raises(UsageError, match="not a valid configuration directive"):
        edit.known_directive("mount homes")
    assert edit.known_directive("allow setuid") is None  # Apptainer's, ignored by singpy: still editable

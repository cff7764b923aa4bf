"""singpy.image.builddate: SOURCE_DATE_EPOCH as reproducible-builds.org defines it (a whole number of seconds,
within what squashfs keeps), and an OCI config's `created` (RFC 3339) as seconds."""

from __future__ import annotations

import pytest

from singpy.errors import ImageError
from singpy.image import builddate
from singpy.oci.streamsquash import clamp_times
from singpy.oci.tarmerge import Dir, File


@pytest.mark.parametrize(("raw", "seconds"), [("0", 0), ("1700000000", 1700000000), ("4294967295", 4294967295)])
def test_a_date_is_taken(raw: str, seconds: int) -> None:
    assert builddate.from_env({"SOURCE_DATE_EPOCH": raw}) == seconds


@pytest.mark.parametrize("raw", ["", " 5", "5 ", "+5", "-1", "1.5", "4294967296", "\u0663", "0x10", "soon"])
def test_anything_else_is_an_error(raw: str) -> None:
    with pytest.raises(ImageError, match="is not a date"):
        builddate.from_env({"SOURCE_DATE_EPOCH": raw})


def test_unset_is_none() -> None:
    assert builddate.from_env({}) is None


@pytest.mark.parametrize(("created", "seconds"), [
    ("2023-11-14T22:13:20Z", 1700000000),
    ("2023-11-14T22:13:20.999999999Z", 1700000000),
    ("2023-11-15T00:13:20+02:00", 1700000000),
    ("1970-01-01T00:00:00Z", 0),
    ("0001-01-01T00:00:00Z", None),  # Go's zero time, what a config without a date marshals to
    ("2023-11-14T22:13:20", None),  # no zone: not RFC 3339, and local time would make it the host's
    ("2023-11-14", None),
    ("2200-01-01T00:00:00Z", None),  # past squashfs's 32-bit times
    ("yesterday", None),
    (1700000000, None),
    (None, None),
])
def test_created_in_seconds(created: object, seconds: int | None) -> None:
    assert builddate.created_seconds({"created": created}) == seconds


def test_a_deep_tree_is_clamped_whole() -> None:
    """Deeper than Python's recursion limit: the clamp is a loop."""
    root = top = Dir(mtime=2_000_000_000)
    for _ in range(5000):
        child = Dir(mtime=2_000_000_000)
        top.children["d"] = child
        top = child
    top.children["f"] = File(0o644, 0, 0, 5, source=None, size=0)
    clamp_times(root, 1_700_000_000)
    times, node = [], root
    while node.children.get("d") is not None:
        times.append(node.mtime)
        node = node.children["d"]  # type: ignore[assignment]
    assert set(times) == {1_700_000_000} and node.children["f"].mtime == 5

"""singpy.kernel.mountinfo: mount points as proc(5) escapes them, read back as the paths they are."""

from __future__ import annotations

from singpy.kernel.mountinfo import mount_points, unescape


def test_escapes_are_read_back() -> None:
    assert unescape("/plain/path") == "/plain/path"
    assert unescape("/with\\040space\\011tab\\012newline") == "/with space\ttab\nnewline"
    assert unescape("/back\\134slash\\134040") == "/back\\slash\\040"  # an escaped backslash ends its escape


def test_this_processs_procfs_is_listed() -> None:
    points = mount_points()
    assert "/proc" in points and all(point.startswith("/") for point in points)

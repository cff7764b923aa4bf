"""What a library announces for a multipart upload is believed only when its parts cover the file exactly."""

from __future__ import annotations

from typing import Any

import pytest

from singpy.library.endpoint import Library
from singpy.library.multipart import MAX_PARTS, _announced
from singpy.library.remotes import RemoteError

MIB = 1 << 20


def lib() -> Library:
    return Library(url="http://127.0.0.1:1")


@pytest.mark.parametrize(("answer", "size", "expected"), [
    ({"uploadID": "u1", "totalParts": 5, "partSize": 16 * MIB}, 65 * MIB, ("u1", 5, 16 * MIB, True)),
    ({"uploadID": "u", "totalParts": 2, "partSize": 64 * MIB, "options": {"s3compliant": "false"}}, 65 * MIB,
     ("u", 2, 64 * MIB, False)),
    ({"uploadID": "u", "totalParts": 1, "partSize": 65 * MIB, "options": {"s3compliant": "true"}}, 65 * MIB,
     ("u", 1, 65 * MIB, True)),
])
def test_parts_that_cover_the_file(answer: dict[str, Any], size: int, expected: tuple[Any, ...]) -> None:
    assert _announced(lib(), answer, size) == expected


@pytest.mark.parametrize("answer", [
    {"uploadID": "u", "totalParts": 4, "partSize": 16 * MIB},  # 64 MiB: one short
    {"uploadID": "u", "totalParts": 6, "partSize": 16 * MIB},  # a part with nothing in it
    {"uploadID": "u", "totalParts": 0, "partSize": 16 * MIB},
    {"uploadID": "u", "totalParts": 5, "partSize": 0},
    {"uploadID": "u", "totalParts": MAX_PARTS + 1, "partSize": 1},
    {"uploadID": "", "totalParts": 5, "partSize": 16 * MIB},
    {"uploadID": 7, "totalParts": 5, "partSize": 16 * MIB},
    {"uploadID": "u", "totalParts": "5", "partSize": 16 * MIB},
    [], "nonsense",
])
def test_anything_else_is_refused(answer: Any) -> None:
    with pytest.raises(RemoteError, match="does not fit the file"):
        _announced(lib(), answer, 65 * MIB)

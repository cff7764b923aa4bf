"""What a local image is read from, one interface for every transport: named regular files, and their JSON."""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from singpy.errors import ImageError

CHUNK = 1 << 20


class Files:
    """Named regular files of a layout directory or an archive. Names are relative ("blobs/sha256/HEX")."""

    def __init__(self, where: str) -> None:
        self.where = where

    def size(self, name: str) -> int | None:
        """The size of regular file `name`, None when there is none (anything else there: ImageError)."""
        raise NotImplementedError

    def open(self, name: str, *, what: str) -> BinaryIO | None:
        raise NotImplementedError

    def read(self, name: str, limit: int, *, what: str) -> bytes | None:
        """The whole of `name`, None when missing; ImageError when it holds more than `limit` bytes."""
        stream = self.open(name, what=what)
        if stream is None:
            return None
        with stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise ImageError(f"{self.where}: {what} is too large (over {limit} bytes)")
        return data


def read_json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise ImageError(f"{what} is nested too deeply") from None
    except ValueError:
        raise ImageError(f"{what} is not valid JSON") from None

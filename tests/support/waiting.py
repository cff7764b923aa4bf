"""Waiting for what a background process writes (an instance's log, a startscript's output)."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_text(path: Path, text: str, timeout: float = 10.0) -> str:
    """The file's content once it holds `text`; fails with what it held when `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text() if path.exists() else ""
        if text in content or time.monotonic() > deadline:
            assert text in content, content
            return content
        time.sleep(0.02)

"""singpy.conf files that tests write: world-readable, in the session's directory, one name each."""

from __future__ import annotations

from pathlib import Path


def readable_config(workdir: Path, name: str, text: str) -> Path:
    """`workdir/conf/NAME.conf` holding `text`, readable by every profile's user (the directory too)."""
    directory = workdir / "conf"
    directory.mkdir(mode=0o755, exist_ok=True)
    path = directory / f"{name}.conf"
    path.write_text(text)
    path.chmod(0o644)
    return path

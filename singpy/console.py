"""Launcher messages on stderr, in Apptainer's style (`WARNING: ...`).

Plain writes, no rich: this module is on the start-up path of every
`singpy exec`. The payload's own stdout and stderr are never touched.
"""

from __future__ import annotations

import sys

# Apptainer's levels: --silent shows errors only, --quiet warnings too (its "suppress normal output").
SILENT, QUIET, NORMAL, VERBOSE, DEBUG = -2, -1, 0, 1, 2

_level = NORMAL


def set_level(level: int) -> None:
    """Called once by the command line, before anything is printed."""
    global _level
    _level = level


def level() -> int:
    return _level


def _write(tag: str, message: str) -> None:
    sys.stderr.write(f"{tag} {message}\n")
    sys.stderr.flush()


def human_size(count: float) -> str:
    """A byte count as people read it: 512 B, 1.9 MiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def fatal(message: str) -> None:
    _write("FATAL:  ", message)


def hint(message: str) -> None:
    _write("HINT:   ", message)


def warning(message: str) -> None:
    if _level >= QUIET:
        _write("WARNING:", message)


def info(message: str) -> None:
    if _level >= NORMAL:
        _write("INFO:   ", message)


def verbose(message: str) -> None:
    if _level >= VERBOSE:
        _write("VERBOSE:", message)


def debug(message: str) -> None:
    if _level >= DEBUG:
        _write("DEBUG:  ", message)

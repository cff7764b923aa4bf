"""Launcher messages on stderr, in Apptainer's style (`WARNING: ...`).

Plain writes, no rich: this module is on the start-up path of every
`singpy exec`. The payload's own stdout and stderr are never touched.

Every line goes through `escape`: a message may quote what an image, a
registry, a definition file or a user's argument holds, and a newline, an
escape sequence or a bidi override there must not forge a second line or
repaint the terminal.
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


def escape(text: str, keep: str = "") -> str:
    """`text` with every character that is not printable written as Python's repr writes it.

    Not printable (str.isprintable): C0 and C1 controls (newline, ESC, CR, DEL,
    CSI...), Unicode format characters (the bidi overrides U+202A-U+202E and
    isolates U+2066-U+2069, zero-width ones), the line and paragraph separators
    U+2028/U+2029, spaces other than " ", surrogates (undecodable bytes of a
    file name) and unassigned code points: \\n, \\x1b, \\u202e, \\udcff.
    Characters in `keep` (newline and tab, for a multi-line text such as a
    runscript) pass as they are. A backslash is not doubled: the result is for
    eyes, not for parsing back, and paths keep their look.

    A plain text costs one isprintable() call.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() or char in keep else repr(char)[1:-1] for char in text)


def _write(tag: str, message: str) -> None:
    sys.stderr.write(f"{tag} {escape(message)}\n")
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

"""Version numbers in driver files, image variables and ELF symbols, read without `re`.

Every `--nv` run parses a few of these; `re` and its pattern compilation
were a few milliseconds of the 10 ms --nv may add (benchmarks/README.md).
"""

from __future__ import annotations

MAX_DIGITS = 18  # a number longer than this is no GPU index or version (and int() refuses 4300 digits)


def is_number(text: str) -> bool:
    """ASCII digits only, at most MAX_DIGITS: what int() takes, where str.isdigit() also takes '²' (an image's text)."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def major_minor(text: str) -> tuple[int, int] | None:
    """(12, 4) from "12.4", "12.4.1", " 12.4 ...", "2.36"; None unless it starts with N.N."""
    head, dot, rest = text.lstrip().partition(".")
    minor = _leading_digits(rest)
    if not dot or not is_number(head) or not is_number(minor):
        return None
    return int(head), int(minor)


def after(text: str, marker: str) -> tuple[int, int] | None:
    """major_minor of what follows the first `marker` ("cuda>=" in NVIDIA_REQUIRE_CUDA)."""
    start = text.find(marker)
    return major_minor(text[start + len(marker):]) if start >= 0 else None


def dotted(token: str) -> tuple[int, ...] | None:
    """(550, 54, 14) from "550.54.14": two or three dot-separated numbers, nothing else."""
    parts = token.split(".")
    if not 2 <= len(parts) <= 3 or not all(is_number(part) for part in parts):
        return None
    return tuple(int(part) for part in parts)


def _leading_digits(text: str) -> str:
    end = 0
    while end < len(text) and text[end] in "0123456789":
        end += 1
    return text[:end]


def driver_version_text(proc_driver_version: str) -> str | None:
    """The version in "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ...".

    The open kernel module says "... Open Kernel Module for x86_64  570.86.15  Release Build ...".
    """
    try:
        with open(proc_driver_version, encoding="utf-8", errors="replace") as handle:
            text = handle.read(4096)
    except OSError:
        return None
    start = text.find("NVRM version:")
    line = text[start:].partition("\n")[0] if start >= 0 else ""
    return next((token for token in line.split()[2:] if dotted(token)), None)

"""Typed errors and exit codes.

Library code raises a `SingpyError` subclass and never prints or exits;
`singpy.cli.main` is the one place where an error becomes a line on stderr
and an exit status. A message may quote anything (an image's label, a
registry's answer, a file name): it is escaped there (singpy.console.escape),
so raising code need not.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself is not loaded at start-up; mypy treats this name as True
if TYPE_CHECKING:
    from typing import Final


class ExitCode:
    """Exit statuses of the launcher itself (a payload's status passes through).

    Plain ints, not an IntEnum: `enum` and what it imports cost ~4 ms of every `singpy exec` (issue 31).
    """

    SUCCESS: Final = 0
    USAGE: Final = 1  # bad command line: unknown flag, missing argument
    LAUNCHER: Final = 255  # anything else the launcher could not do (Apptainer uses 255 too)


class SingpyError(Exception):
    """An error a user can cause and understand: one line, plus an optional hint."""

    exit_code: int = ExitCode.LAUNCHER

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(SingpyError):
    """The command line itself is wrong."""

    exit_code: int = ExitCode.USAGE


class ConfigError(SingpyError):
    """singpy.conf (or a liblist file) is malformed; the message carries file:line."""


class ImageError(SingpyError):
    """The image is missing, unreadable, of an unknown kind or unusable here."""


class SifError(ImageError):
    """A SIF file is malformed. The SIF parser raises nothing else, on any input."""


class BindSpecError(SingpyError):
    """A --bind / bind path specification is malformed or cannot be honoured."""


class PathError(SingpyError):
    """A path inside an image cannot be used as asked: a link loop, a file where a directory must be, a
    special file where a regular one must be, a file too large to read."""


class KernelError(SingpyError):
    """A system call failed: "can't VERB OBJECT: strerror"."""

    @property
    def reason(self) -> str:
        """The strerror part, for messages of a caller's own wording."""
        return self.message.rsplit(": ", 1)[-1]


class ExecError(SingpyError):
    """The payload could not be started inside the container."""


class GpuError(SingpyError):
    """GPU set-up failed in a way that must stop the launch."""

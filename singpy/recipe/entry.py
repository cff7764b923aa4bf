"""The end of the `python -m singpy.recipe.*` helper programs: set up, then become the program.

Those helpers (osns, mapped) run between a build step and the program it starts. Their
parent reads the program's stderr, so a failure is reported there as one line (the
SingpyError's message, or the exec error) and exit status 127, as a shell reports a
command it could not run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exec_or_report(prepare: Callable[[], None], program: list[str], *, search_path: bool) -> NoReturn:
    """Run `prepare`, then exec `program` (looked up on PATH when `search_path`); never returns."""
    from singpy.errors import SingpyError

    try:
        prepare()
        if search_path:
            os.execvp(program[0], program)
        os.execv(program[0], program)
    except SingpyError as error:
        sys.stderr.write(f"{error.message}\n")
    except OSError as error:
        sys.stderr.write(f"can't run {program[0]}: {error.strerror}\n")
    os._exit(127)

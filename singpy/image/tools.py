"""The squashfs-tools programs singpy runs: finding them, running them, showing progress.

`unsquashfs` and `mksquashfs` write a progress bar to stdout as
`\\r[====   ] 123/456  27%`; on a terminal that count drives a rich progress
bar (rich is imported only then), elsewhere they run with `-no-progress`.
The tool dies with the launcher (PR_SET_PDEATHSIG): a killed `singpy`
leaves no extraction running behind it. A failure is one line: the tool's
last message on stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.kernel import syscalls as k

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import subprocess


def find_tool(name: str, env: Mapping[str, str]) -> str | None:
    """Absolute path of program `name` on the host's PATH, as the user's shell would find it."""
    for directory in env.get("PATH", os.defpath).split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return None


def require_tool(name: str, env: Mapping[str, str], purpose: str) -> str:
    path = find_tool(name, env)
    if path is None:
        raise ImageError(f"{name} is not installed (not found in PATH): it is needed to {purpose}",
                         hint="install squashfs-tools")
    return path


def _die_with_parent() -> None:
    k.prctl(k.PR_SET_PDEATHSIG, 9)  # SIGKILL


def show_progress() -> bool:
    """A progress bar only for a person watching: stderr is a terminal that can redraw, -q not given."""
    return console.level() >= console.NORMAL and sys.stderr.isatty() and os.environ.get("TERM", "dumb") != "dumb"


def run_tool(argv: list[str], *, label: str, failure: str) -> None:
    """Run a squashfs-tools program to completion; `failure` starts the error line.

    `-no-progress` is added here when there is no progress bar to feed
    (unsquashfs takes options first, mksquashfs after its sources and target).
    """
    import subprocess  # not on the path of a run that finds its image in the cache

    progress = show_progress()
    if not progress:
        last = os.path.basename(argv[0]) == "mksquashfs"
        argv = [*argv, "-no-progress"] if last else [argv[0], "-no-progress", *argv[1:]]
    console.debug(f"running {argv}")
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if progress else
                                 subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    except OSError as error:
        raise ImageError(f"{failure}: can't run {argv[0]}: {error.strerror}") from None
    assert child.stderr is not None
    if progress:
        _follow(child, label)
    errors = child.stderr.read().decode(errors="replace")
    if child.wait() != 0:
        reason = _reason(errors) or f"{os.path.basename(argv[0])} exited with status {child.returncode}"
        raise ImageError(f"{failure}: {reason}")


def _reason(errors: str) -> str:
    """The line that says why: the FATAL ERROR one, else the first (a list of details may follow it)."""
    lines = [line.strip() for line in errors.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("FATAL ERROR:"):
            return line.removeprefix("FATAL ERROR:").strip()
    return lines[0] if lines else ""


def _follow(child: subprocess.Popen[bytes], label: str) -> None:
    """Feed the tool's own `done/total` counts to a rich progress bar on stderr."""
    import re

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    assert child.stdout is not None
    count = re.compile(rb"(\d+)/(\d+)\s+\d+%")
    # No refresh thread (auto_refresh=False): the launcher must be single-threaded again
    # before unshare(CLONE_NEWUSER), which the kernel refuses to a threaded process.
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), auto_refresh=False, transient=True) as bar:
        task = bar.add_task(label, total=None)
        while chunk := os.read(child.stdout.fileno(), 4096):
            counts = count.findall(chunk)
            if counts:
                done, total = counts[-1]
                bar.update(task, completed=int(done), total=int(total))
                bar.refresh()

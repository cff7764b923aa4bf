"""Running the pull benchmark's commands (as the test user, in its directories) and the series of their timings."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from startup_records import Account
from startup_repo import REPO
from startup_runner import Runner

from singpy.record import Record

PULL_TIMEOUT = 1800  # seconds one command of a pull round may take on a loaded machine
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


class Series:
    """The timings of one command (or one step of the reference) over the rounds, in seconds."""

    def __init__(self, key: str, label: str, display: str) -> None:
        self.key, self.label, self.display = key, label, display
        self.times: list[float] = []
        self.na = ""  # why it was not measured

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times and not self.na else None

    def spread(self) -> str:
        return f"{min(self.times):.2f}-{max(self.times):.2f}" if self.times else ""

    def result(self) -> SeriesResult:
        return {"key": self.key, "label": self.label, "command": self.display, "na": self.na or None,
                "median_s": self.median, "times_s": [round(t, 4) for t in self.times]}


class SeriesResult(TypedDict):
    key: str
    label: str
    command: str
    na: str | None
    median_s: float | None
    times_s: list[float]



class Dirs(Record):
    """The test user's directories (under the benchmark's scratch directory)."""

    user: Path  # owned by the account
    pull_cache: Path  # SINGPY_CACHEDIR of the pulls: removed after every round
    exec_cache: Path  # SINGPY_CACHEDIR of the exec rows: kept
    tmp: Path  # TMPDIR of everything
    out: Path  # what the pulls write



def make_dirs(workdir: Path, account: Account) -> Dirs:
    user = workdir / "user"
    dirs = Dirs(user=user, pull_cache=user / "pull-cache", exec_cache=user / "exec-cache", tmp=user / "tmp",
                out=user / "out")
    for path in (user, dirs.exec_cache, dirs.tmp, dirs.out):
        path.mkdir(mode=0o700)
        os.chown(path, account.uid, account.gid)
    return dirs


def base_env(dirs: Dirs) -> dict[str, str]:
    """What every command gets on top of the runner's HOME, USER, PATH."""
    return {"TMPDIR": str(dirs.tmp), "XDG_RUNTIME_DIR": str(dirs.tmp),
            "SINGPY_CONFIG": str(REPO / "etc" / "singpy.conf")}


def run(runner: Runner, argv: list[str], env: dict[str, str], *, sync: bool = True,
        timeout: float = PULL_TIMEOUT) -> tuple[float, str]:
    """(seconds, "" or why it failed) of one command; `sync` first: the dirty pages of what ran before are not
    this command's to write."""
    if sync:
        os.sync()
    start = time.perf_counter()
    try:
        done = runner.capture(argv, env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout} s"
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return elapsed, f"`{' '.join(argv[:3])} ...` exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return elapsed, ""


def remove(path: Path) -> None:
    """Remove what a command left, whatever its modes (umoci's rootless bundles keep the image's 0555 dirs)."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_writable_and_retry)
    else:
        path.unlink()


def _writable_and_retry(_function: object, path: str, _error: object) -> None:
    parent = os.path.dirname(path)
    os.chmod(parent, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_writable_and_retry)
    else:
        os.unlink(path)


@contextlib.contextmanager
def scratch(kind: str = "pull") -> Iterator[Path]:
    """A world-searchable scratch directory (the test user reaches its own directory inside), removed after.

    Shared by build.py and hpc.py (`kind` names the benchmark in the directory's name).
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"singpy-bench-{kind}-", dir="/tmp"))
    workdir.chmod(0o755)
    try:
        yield workdir
    finally:
        remove(workdir)

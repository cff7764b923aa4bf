"""The peak memory of a command and every process it starts: a v1 memory cgroup of its own, sampled.

Used by tests/integration/test_pull_memory.py and benchmarks/pull_big.py. Root makes the cgroup
(/sys/fs/cgroup/memory/singpy-peak-PID-N, removed after) and gives its `cgroup.procs` to the user the command
runs as; the command starts through a shell that joins it and execs it (`wrap`), so every helper it forks
(mksquashfs, squashfuse...) is in it too.

The peak is the sum over the cgroup's processes of each one's VmHWM (its peak resident set, kept by the
kernel; after an exec, the new program's), read every 10 ms while it runs. VmHWM only grows, so a process
is missed only if it lives less than one sample, and the sum is an upper bound of what was resident at
once. The cgroup's own memory.max_usage_in_bytes is not used: it counts the page cache of every file the
pull writes, which the kernel reclaims under a limit and which no memory limit kills a job for.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
_SAMPLE_S = 0.01
_numbers = itertools.count()


def unavailable() -> str:
    """Why a TreePeak can't be made here ("" when it can): it needs root and a writable v1 memory hierarchy."""
    if os.geteuid() != 0:
        return "measuring a process tree's memory needs root (a memory cgroup of its own)"
    if not (MEMORY_ROOT / "cgroup.procs").exists() or not os.access(MEMORY_ROOT, os.W_OK):
        return f"no writable v1 memory cgroup hierarchy at {MEMORY_ROOT}"
    return ""


class TreePeak:
    """`with TreePeak(uid) as peak:` run `peak.wrap(argv)`; after it ends, `peak.bytes`."""

    def __init__(self, uid: int = 0) -> None:
        self.path = MEMORY_ROOT / f"singpy-peak-{os.getpid()}-{next(_numbers)}"
        self.uid = uid
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (its program, its VmHWM in bytes)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreePeak:
        self.path.mkdir()
        os.chown(self.path / "cgroup.procs", self.uid, -1)  # the command joins it after changing user
        self._procs = str(self.path / "cgroup.procs")
        self._sampler.start()
        return self

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run through a shell that first moves itself into the cgroup (its children follow), then execs.

        Not a preexec_fn: between fork and exec the child still has the caller's memory, and its VmHWM with it.
        """
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', self._procs, *argv]

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self._sample_once()
        for _ in range(100):  # the last processes may still be exiting
            try:
                self.path.rmdir()
                return
            except OSError:
                self._stop.wait(0.05)
        raise RuntimeError(f"{self.path} still has processes: {self._pids()}")

    @property
    def bytes(self) -> int:
        return sum(peak for _, peak in self.peaks.values())

    def by_name(self) -> dict[str, int]:
        """The largest peak of each program (comm), in bytes."""
        found: dict[str, int] = {}
        for name, peak in self.peaks.values():
            found[name] = max(found.get(name, 0), peak)
        return found

    def _pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self._sample_once()

    def _sample_once(self) -> None:
        for pid in self._pids():
            name, peak = _status(pid)
            if not peak:
                continue
            known, before = self.peaks.get(pid, (name, 0))
            # A new program (exec) starts a new VmHWM: what the pid had before was a fork's copy-on-write view of
            # its parent (the shell of `wrap`, a Popen child about to exec mksquashfs), counted there already.
            self.peaks[pid] = (name, peak if known != name else max(before, peak))


def _status(pid: int) -> tuple[str, int]:
    """(comm, VmHWM in bytes) of `pid`; 0 when it is gone or has no memory of its own (a zombie)."""
    name, peak = "", 0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Name:"):
                    name = line.split(None, 1)[1].strip() if len(line.split()) > 1 else ""
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return name, 0
    return name, peak

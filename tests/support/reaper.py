"""Signal a command at chosen moments of its start-up, and find what outlives it: a subreaper.

Run as its own process (never inside pytest, which must not adopt orphans):

    python -P tests/support/reaper.py < SPEC.json > RESULTS.json

It makes itself a child subreaper (prctl(PR_SET_CHILD_SUBREAPER), [1]
prctl(2)): any process that the command started and that loses its parent
is adopted by this process, not by the host's init. After each trial its own
children are therefore exactly what the trial left: read from
/proc/self/task/TID/children, nothing host-wide is looked at.

SPEC: {"argv": [...], "env": {...}, "cwd": str, "user": uid|null, "group": gid|null, "calibrate": N,
       "patience": s, "grace": s, "budget": s, "trials": [[signum, fraction], ...]}

`calibrate` runs the command N times first, to measure its start-up: the
time until it prints a line on stdout (the payload's "ready"). The first run
may fill a cache, so the median of the others counts. Each trial starts the
command with stdin a pipe held open (the payload waits on it), sleeps
`fraction` times the start-up from just before the start, sends `signum`,
and waits at most `patience` seconds for it to exit (else it is "hung" and
killed). Then, for up to `grace` seconds, it reaps what it adopted; whatever
still runs is a survivor: its command line is reported, and it is killed.
No trial starts once the trials have taken `budget` seconds: on a loaded
machine a case runs fewer of them rather than for ever.

RESULTS: {"startup": s, "calibration_survivors": [...],
          "trials": [{"signal", "delay", "status", "hung", "exit_after", "survivors": [...], "stderr"}, ...]}
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")


def children() -> list[int]:
    """This process's children, adopted ones included."""
    found: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as handle:
            found.extend(int(pid) for pid in handle.read().split())
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def survivors(grace: float) -> list[str]:
    """What is still running `grace` seconds after the command ended (reaping what ends meanwhile); then killed."""
    deadline = time.monotonic() + grace
    while True:
        reap_all()
        left = children()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    found = [f"{pid} {cmdline(pid)}" for pid in left]
    for _ in range(50):  # kill them, then whatever they leave to us in turn
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
        reap_all()
        left = children()
        if not left:
            break
    return found


class Command:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.ids: dict[str, Any] = {}
        if spec.get("user") is not None:
            self.ids = {"user": spec["user"], "group": spec["group"], "extra_groups": []}

    def start(self, stdout: int, stderr: IO[bytes]) -> tuple[subprocess.Popen[bytes], int]:
        """The command, and its stdin's write end (kept open: the payload waits on it)."""
        read_end, write_end = os.pipe()
        try:
            process = subprocess.Popen(self.spec["argv"], stdin=read_end, stdout=stdout, stderr=stderr,
                                       env=self.spec["env"], cwd=self.spec["cwd"], **self.ids)
        finally:
            os.close(read_end)
        return process, write_end

    def startup(self, left: list[str]) -> float:
        """Seconds until the command prints its first line; what outlived it is added to `left`."""
        with tempfile.TemporaryFile() as stderr:
            start = time.monotonic()
            process, write_end = self.start(subprocess.PIPE, stderr)
            assert process.stdout is not None
            line = process.stdout.readline()
            took = time.monotonic() - start
            os.close(write_end)  # the payload's `read` ends: it exits
            process.communicate(timeout=self.spec["patience"])
            if not line:
                stderr.seek(0)
                raise RuntimeError(f"the command printed nothing: {stderr.read().decode(errors='replace')[-2000:]}")
        left.extend(survivors(self.spec["grace"]))
        return took

    def trial(self, signum: int, delay: float) -> dict[str, Any]:
        with tempfile.TemporaryFile() as stderr:
            start = time.monotonic()
            process, write_end = self.start(subprocess.DEVNULL, stderr)
            time.sleep(max(0.0, start + delay - time.monotonic()))
            os.kill(process.pid, signum)
            sent = time.monotonic()
            hung = False
            try:
                status = process.wait(timeout=self.spec["patience"])
            except subprocess.TimeoutExpired:
                hung = True
                process.kill()
                status = process.wait()
            exit_after = time.monotonic() - sent
            left = survivors(self.spec["grace"])
            os.close(write_end)  # only now: a surviving payload would otherwise read end of file and leave by itself
            stderr.seek(0)
            said = stderr.read().decode(errors="replace")[-2000:]
        return {"signal": signum, "delay": delay, "status": status, "hung": hung, "exit_after": exit_after,
                "survivors": left, "stderr": said}


def default_signals(numbers: set[int]) -> None:
    """The signals the trials send, at their default action and unblocked, in us and so in the command.

    A suite started by a script in the background (or under nohup) has SIGINT,
    SIGQUIT or SIGHUP ignored; singpy rightly keeps a signal its caller ignores
    ignored, so a trial would count it as lost.
    """
    for number in numbers:
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, numbers)


def main() -> None:
    spec = json.load(sys.stdin)
    default_signals({signum for signum, _ in spec["trials"] if signum != signal.SIGKILL})
    become_subreaper()
    command = Command(spec)
    left: list[str] = []
    timings = [command.startup(left) for _ in range(spec["calibrate"])]
    counted = sorted(timings[1:] or timings)
    startup = (counted[(len(counted) - 1) // 2] + counted[len(counted) // 2]) / 2  # the median
    deadline = time.monotonic() + spec["budget"]
    results = []
    for signum, fraction in spec["trials"]:
        if time.monotonic() > deadline:
            break
        results.append(command.trial(signum, fraction * startup))
    json.dump({"startup": startup, "calibration_survivors": left, "trials": results}, sys.stdout)


if __name__ == "__main__":
    main()

"""Running the start-up benchmark's commands: as one user, timed from spawn to exit, probed, peak RSS."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from startup_records import Row

TIME = "/usr/bin/time"  # GNU time (Debian `time`), for peak RSS


class Runner:
    """Starts commands as one user, in one directory, and times them from spawn to exit."""

    def __init__(self, uid: int, gid: int, user: str, home: str, cwd: str, path: str) -> None:
        self.uid, self.gid, self.user, self.home, self.cwd = uid, gid, user, home, cwd
        self.base_env = {"HOME": home, "USER": user, "LOGNAME": user, "PATH": path, "LANG": "C.UTF-8",
                         "TERM": "dumb"}
        # Popen's defaults (None) when the commands run as ourselves: the child then switches nothing.
        switch = uid != os.geteuid()
        self.switch_uid: int | None = uid if switch else None
        self.switch_gid: int | None = gid if switch else None
        self.switch_groups: list[int] | None = [] if switch else None
        # The mount namespace the benchmark started in, kept open when it entered the simulated GPU host's: the
        # rows that must not see that host's /proc overmount (a new procfs is refused in a user namespace while
        # any mount hides part of /proc: --containall's --pid) run there (Row.host_namespace).
        self.host_mnt_fd: int | None = None

    def _spawn(self, host: bool) -> dict[str, Any]:
        """Popen's arguments that start a command as the user (in the first mount namespace with `host`)."""
        if not host or self.host_mnt_fd is None:
            return {"user": self.switch_uid, "group": self.switch_gid, "extra_groups": self.switch_groups}
        fd, uid, gid = self.host_mnt_fd, self.uid, self.gid

        def enter() -> None:  # in the child, before exec: setns needs the privileges the switch drops
            from singpy.kernel import syscalls as k

            k.setns(fd, k.CLONE_NEWNS, "the benchmark's first mount namespace")
            if uid != os.geteuid():
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)

        return {"preexec_fn": enter, "pass_fds": ()}

    def env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {**self.base_env, **(extra or {})}

    def timed(self, argv: list[str], extra: dict[str, str] | None = None, *, host: bool = False) -> tuple[float, int]:
        """(milliseconds, exit status) of one run, output discarded."""
        env = self.env(extra)
        spawn = self._spawn(host)
        start = time.perf_counter_ns()
        proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, **spawn)
        _, status = os.waitpid(proc.pid, 0)
        elapsed = (time.perf_counter_ns() - start) / 1e6
        proc.returncode = os.waitstatus_to_exitcode(status)
        return elapsed, proc.returncode

    def peak_rss(self, argv: list[str], extra: dict[str, str] | None, scratch: Path, *,
                 host: bool = False) -> int | None:
        """ru_maxrss (KiB) of the command, through GNU time.

        Not from our own wait4: a child forked (or vforked) from this Python process carries
        our RSS into its high-water mark until it execs, so a small C parent has to start it.
        """
        out = scratch / "rss"
        out.unlink(missing_ok=True)
        done = self.capture([TIME, "-f", "%M", "-o", str(out), *argv], extra, host=host)
        try:
            return int(out.read_text().split()[-1]) if done.returncode == 0 else None
        except (OSError, ValueError, IndexError):
            return None

    def capture(self, argv: list[str], extra: dict[str, str] | None = None,
                timeout: float = 120, *, host: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env(extra), cwd=self.cwd, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL, **self._spawn(host))


def probe(runner: Runner, row: Row) -> None:
    """Run the row's command once; on failure the row becomes n/a with the command's last error line."""
    if row.na:
        return
    try:
        done = runner.capture(row.argv, row.env, host=row.host_namespace)
    except (OSError, subprocess.SubprocessError) as error:
        row.na = str(error)
        return
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        row.na = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"


def image_mode(runner: Runner, row: Row, expected: str) -> None:
    """How singpy opened the image (squashfuse, loop, extraction), from its -v output; flagged when unexpected."""
    if row.na:
        return
    verbose = [row.argv[0], "-v", *row.argv[1:]]
    done = runner.capture(verbose, row.env)
    lines = [line.split(":", 1)[-1].strip() for line in done.stderr.splitlines()]
    mode = next((line for line in lines if line.startswith(("mounting it with", "extracting", "can't use FUSE"))), "")
    kind = "fuse" if mode.startswith("mounting it with") and "(FUSE)" in mode else "extract" if "extract" in mode \
        else "loop" if "loop" in mode else "?"
    row.extra["mode"], row.extra["kind"] = mode, kind
    if mode and kind != expected:
        row.display += f"  # but: {mode}"


def measure(runner: Runner, rows: list[Row], rounds: int, warmup: int, seed: int) -> None:
    live = [row for row in rows if not row.na]
    rng = random.Random(seed)
    for number in range(warmup + rounds):
        order = list(live)
        rng.shuffle(order)
        for row in order:
            elapsed, status = runner.timed(row.argv, row.env, host=row.host_namespace)
            if number < warmup:
                continue
            if status != 0:
                row.failures += 1
                continue
            row.times.append(elapsed)
    for row in live:
        if not row.times:
            row.na = f"every timed run failed ({row.failures})"


def measure_rss(runner: Runner, rows: list[Row], runs: int, scratch: Path) -> None:
    """Peak RSS, in a pass of its own (GNU time in between would add to the timings)."""
    if not os.path.exists(TIME):
        return
    for _ in range(runs):
        for row in rows:
            if not row.na:
                rss = runner.peak_rss(row.argv, row.env, scratch, host=row.host_namespace)
                if rss is not None:
                    row.rss.append(rss)

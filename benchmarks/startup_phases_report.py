"""The parent side of benchmarks/startup_phases.py: spawn the traced launches, interleaved, and print medians."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup_machine import choose_account, fresh_bytecode
from startup_repo import REPO
from startup_runner import Runner

from tests.support.images import build_busybox_rootfs

TRACER = str(Path(__file__).resolve().with_name("startup_phases.py"))
ORDER = ("interpreter start", "imports", "parse", "host facts", "config (singpy.conf)", "request", "image detect",
         "plan", "namespaces", "staging tmpfs + first pivot", "attach image", "survey + image on /newroot",
         "binds + second pivot", "glue (between the phases)", "execve, `true`, exit, wait")


def traced(runner: Runner, python: str, out: str, sandbox: str, *, site: bool) -> dict[str, float] | None:
    """One traced launch: milliseconds per phase, plus "total" (spawn to reaped)."""
    flags = [] if site else ["-S"]
    repo = [] if site else ["--path", str(REPO)]
    spawned = time.time_ns()
    argv = [python, *flags, TRACER, "--child", out, str(spawned), *repo, "exec", sandbox, "true"]
    proc = subprocess.Popen(argv, env=runner.env(None), cwd=runner.cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=runner.switch_uid,
                            group=runner.switch_gid, extra_groups=runner.switch_groups)
    proc.wait()
    reaped = time.time_ns()
    lines = Path(out).read_text().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    phases: dict[str, float] = {}
    covered, covered_until = 0, reaped
    for line in lines:  # no two wrapped phases nest: their sum plus the glue is the launch up to execve
        name, start, end = line.split("\t")
        if name == "execve":
            covered_until = int(start)
            phases["execve, `true`, exit, wait"] = (reaped - covered_until) / 1e6
            continue
        covered += int(end) - int(start)
        phases[name] = phases.get(name, 0.0) + (int(end) - int(start)) / 1e6
    total = (reaped - spawned) / 1e6
    phases["glue (between the phases)"] = (covered_until - spawned - covered) / 1e6
    phases["total"] = total
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--as-root", action="store_true")
    args = parser.parse_args()
    python = str(Path(sys.executable).parent / "python")
    fresh_bytecode(python)
    account = choose_account(args.as_root)
    with tempfile.TemporaryDirectory(prefix="singpy-phases-") as scratch:
        os.chmod(scratch, 0o755)
        sandbox = str(build_busybox_rootfs(Path(scratch) / "sandbox"))
        out = os.path.join(scratch, "marks")
        Path(out).touch()
        os.chown(out, account.uid, account.gid)
        runner = Runner(account.uid, account.gid, account.user, account.home, scratch, "/usr/bin:/bin")
        results: dict[str, list[dict[str, float]]] = {"with site": [], "-S": []}
        plain: dict[str, list[float]] = {"python3 -c pass": [], "python3 -S -c pass": []}
        rng = random.Random(31)
        for _ in range(args.rounds + 2):
            jobs = ["with site", "-S", "python3 -c pass", "python3 -S -c pass"]
            rng.shuffle(jobs)
            for job in jobs:
                if job in plain:
                    plain[job].append(runner.timed([python, *job.split()[1:-1], "pass"])[0])
                elif (phases := traced(runner, python, out, sandbox, site=job == "with site")) is not None:
                    results[job].append(phases)
        for name, runs in plain.items():
            print(f"{name:<34} {statistics.median(runs[2:]):6.2f} ms")
        print(f"{'phase (median ms, ' + account.user + ')':<34} {'with site':>10} {'-S':>10}")
        for name in (*ORDER, "total"):
            cells = [statistics.median(run.get(name, 0.0) for run in runs[2:]) if runs[2:] else float("nan")
                     for runs in results.values()]
            print(f"{name:<34} {cells[0]:10.2f} {cells[1]:10.2f}")

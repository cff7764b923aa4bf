"""A burst of jobs (issue 31): 64 simultaneous `singpy exec IMAGE.sif true` of one image as one user, right
after a cache clean, against the same 64 runs one after the other; the CPU time of each set.

    .venv/bin/python benchmarks/burst.py              # 5 interleaved repetitions of 64 runs
    .venv/bin/python benchmarks/burst.py --quick      # 1 repetition of 16: a smoke run
    .venv/bin/python benchmarks/burst.py --no-write

As root: the runs are the test user's (`singpy-test`, what cluster users are), with /dev/fuse open to users
(a node of mode 0666 bound over it in this benchmark's private mount namespace: the host's is not touched),
the case the issue is about. Without root: whoever runs it, with /dev/fuse as it is.

CPU time: this process is a child subreaper, so whatever a run leaves running (the background unpacking of
`unsquash in background`, detached from its launcher) is adopted and reaped here, and counted:
getrusage(RUSAGE_CHILDREN) holds every reaped descendant's user + system time. Each set starts after
`singpy cache clean --force` (as the user) and ends once every descendant is reaped. Two configurations,
interleaved with the two orders: `unsquash in background = no` (every run mounts the image with squashfuse)
and `= yes` (one unpacking, later runs from the tree). Target: parallel CPU <= 1.1x sequential CPU, with the
directive on. Writes the "A burst of jobs" section of docs/performance.md (between its own markers).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import startup_repo  # noqa: F401  (first: puts the repository on sys.path)
from pull_results import write_section
from startup_images import build_sandbox, build_sif, write_conf
from startup_machine import choose_account, machine, venv_commands

from tests.support.reaper import become_subreaper

TARGET = 1.1
MARKERS = ("<!-- benchmarks/burst.py: begin -->", "<!-- benchmarks/burst.py: end -->")
CONFIGS = {"off": "unsquash in background = no\n", "on": "unsquash in background = yes\n"}


def open_fuse(workdir: Path) -> str:
    """/dev/fuse open to users in this process's own mount namespace ("" when done, else why not)."""
    if os.geteuid() != 0:
        return "not root: /dev/fuse as the host has it"
    from singpy.kernel import syscalls as k

    rdev = os.stat("/dev/fuse").st_rdev
    k.unshare(k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)
    node = workdir / "fuse"
    os.mknod(node, 0o20666, rdev)
    node.chmod(0o666)
    k.mount(str(node), "/dev/fuse", None, k.MS_BIND)
    return ""


class Burst:
    """Runs `singpy exec SIF true` as one account, counting the CPU time of everything that started."""

    def __init__(self, singpy: str, sif: Path, cache: Path, confs: dict[str, Path], uid: int, gid: int,
                 home: str) -> None:
        self.singpy, self.sif, self.cache, self.confs = singpy, sif, cache, confs
        self.ids = {} if uid == os.geteuid() else {"user": uid, "group": gid, "extra_groups": []}
        self.base = {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SINGPY_CACHEDIR": str(cache)}

    def _run(self, args: list[str], config: str) -> subprocess.Popen[bytes]:
        env = {**self.base, "SINGPY_CONFIG": str(self.confs[config])}
        process: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [self.singpy, *args], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, **self.ids)
        return process

    def clean(self) -> None:
        process = self._run(["cache", "clean", "--force"], "off")
        _, err = process.communicate()
        assert process.returncode == 0, err.decode(errors="replace")

    def cpu(self, config: str, count: int, parallel: bool) -> tuple[float, float]:
        """(CPU seconds, wall seconds) of `count` runs after a cache clean, stragglers reaped."""
        self.clean()
        reap_all()
        before = _children_cpu()
        start = time.perf_counter()
        if parallel:
            runs = [self._run(["exec", str(self.sif), "true"], config) for _ in range(count)]
            for process in runs:
                _check(process)
        else:
            for _ in range(count):
                _check(self._run(["exec", str(self.sif), "true"], config))
        wall = time.perf_counter() - start
        reap_all()  # the detached unpacking, adopted by this subreaper: its CPU counts too
        return _children_cpu() - before, wall


def _check(process: subprocess.Popen[bytes]) -> None:
    _, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"a run failed ({process.returncode}): {err.decode(errors='replace')[-500:]}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reap_all() -> None:
    """Wait for every descendant left (adopted ones included)."""
    while True:
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            return


def measure(burst: Burst, reps: int, count: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {}
    for rep in range(reps):
        order = [(config, parallel) for config in CONFIGS for parallel in (True, False)]
        if rep % 2:
            order.reverse()
        for config, parallel in order:
            key = f"{config}-{'parallel' if parallel else 'sequential'}"
            results.setdefault(key, []).append(burst.cpu(config, count, parallel))
            print(f"  {key}: {results[key][-1][0]:.2f} s CPU, {results[key][-1][1]:.2f} s wall", file=sys.stderr)
    return results


def section(results: dict[str, list[tuple[float, float]]], count: int, reps: int, who: str, fuse_note: str,
            load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:
    info = machine()
    fuse = fuse_note or "open to users (a 0666 node bound over it in the benchmark's mount namespace)"
    lines = [MARKERS[0], "## A burst of jobs (issue 31)", "",
             f"`benchmarks/burst.py`: {count} `singpy exec IMAGE.sif true` of one busybox SIF as {who}, all at once "
             f"and one after the other, each set right after `singpy cache clean`; CPU time of every process "
             f"the set started (the benchmark is a child subreaper: the detached background unpacking is "
             f"reaped and counted too); medians of {reps} interleaved repetitions. /dev/fuse "
             f"{fuse}. "
             f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores; load average "
             f"{load[0][0]:.2f} at the start, {load[1][0]:.2f} at the end (the machine is shared).", "",
             "| `unsquash in background` | parallel CPU | sequential CPU | ratio | ratio per repetition | "
             "parallel wall | sequential wall |",
             "|---|---|---|---|---|---|---|"]
    ratios = {}
    for config in CONFIGS:
        par, seq = results[f"{config}-parallel"], results[f"{config}-sequential"]
        p_cpu, s_cpu = statistics.median(c for c, _ in par), statistics.median(c for c, _ in seq)
        ratios[config] = p_cpu / s_cpu
        paired = ", ".join(f"{p[0] / q[0]:.2f}" for p, q in zip(par, seq, strict=True))
        lines.append(f"| {config} | {p_cpu:.2f} s | {s_cpu:.2f} s | {ratios[config]:.2f}x | {paired} | "
                     f"{statistics.median(w for _, w in par):.2f} s | {statistics.median(w for _, w in seq):.2f} s |")
    met = ratios["on"] <= TARGET
    lines += ["", f"Target: parallel CPU <= {TARGET:g}x sequential, with `unsquash in background = yes`: "
              f"**{'met' if met else 'missed'}** ({ratios['on']:.2f}x, "
              f"{abs(TARGET - ratios['on']):.2f} {'to spare' if met else 'over'}).", "",
              "With the directive on, the first run of the burst takes the image's unpacking lock (non-blocking) "
              "and starts the one unpacking; the others find the lock taken and, the image being small "
              "(<= 64 MiB: singpy.image.warm), wait on it (a blocking flock: no CPU, no polling) and start from "
              "the tree, as the sequential runs after the first do. With it off, every run mounts the image with "
              "its own squashfuse, in both orders: its ratio is what running 64 start-ups at once on this "
              "machine costs by itself.", MARKERS[1], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition of 16 runs")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    reps, count = (1, 16) if args.quick else (args.reps, args.runs)
    if (commands := venv_commands()) is None:
        return 1
    account = choose_account(as_root=False)
    workdir = Path(tempfile.mkdtemp(prefix="singpy-burst-", dir="/tmp"))
    workdir.chmod(0o755)
    try:
        sif, reason = build_sif(workdir, build_sandbox(workdir))
        if sif is None:
            print(f"burst: n/a ({reason})", file=sys.stderr)
            return 0
        confs = {name: write_conf(workdir / f"conf-{name}", extra) for name, extra in CONFIGS.items()}
        cache = workdir / "cache"
        cache.mkdir(mode=0o700)
        os.chown(cache, account.uid, account.gid)
        fuse_note = open_fuse(workdir)
        become_subreaper()
        burst = Burst(commands[0], sif, cache, confs, account.uid, account.gid, account.home)
        start_load = os.getloadavg()
        print(f"burst: {reps} x {count} runs, 4 sets each ...", file=sys.stderr)
        results = measure(burst, reps, count)
        text = section(results, count, reps, account.user, fuse_note, (start_load, os.getloadavg()))
        print(text)
        if not args.no_write and not args.quick:
            print(f"wrote {write_section(text, MARKERS)}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

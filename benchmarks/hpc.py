"""Slurm and shared-container benchmark of `singpy exec` in HPC jobs (issue 13).

    .venv/bin/python benchmarks/hpc.py              # 20 rounds, 100 launches
    .venv/bin/python benchmarks/hpc.py --quick      # 5 rounds, 20 launches: a smoke run
    .venv/bin/python benchmarks/hpc.py --rounds 40 --no-write

Needs root: it starts the tests' one-node Slurm cluster (tests/support/slurm.py: munged, slurmctld, slurmd on
127.0.0.1, in the benchmark's scratch directory, stopped at the end) and builds the tests' bind-model image
(tests/support/mpi.py: a usr-merged skeleton run with `-B /usr:/usr:ro`). Commands run as the test user
(`--as-root`: as root).

(a) A job step's overhead. Interleaved rounds, shuffled order, wall time from spawn to exit of:
    `srun -n 2 true`, `srun -n 2 singpy exec IMG true` (the two ranks share one container: one builds it, the
    other joins), `true` and `singpy exec IMG true` (one process, no Slurm). The srun overhead is
    srun-singpy - srun-true, the single-process overhead singpy - true; the target: srun overhead <= 2x the
    single-process overhead (the step must not pay much more than one container start per node).
(b) Joining: LAUNCHES runs of `singpy exec --sharens IMG true` that join one container (a first member,
    `singpy exec --sharens IMG sleep`, started by this process keeps it up: --sharens shares among the
    launches of one parent process) against LAUNCHES runs of plain `singpy exec IMG true`, alternating;
    per-launch cost of each. Reported "not available" where this singpy has no --sharens.

A benchmark, not a test: a missed target fails nothing. Writes the "HPC jobs" section of docs/performance.md
(between its own markers) and benchmarks/results/DATE-COMMIT-hpc.json (-hpc-quick.json with --quick).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pull
import startup
from pull import RunInfo
from startup import Account, Runner, Target

from singpy.record import Record
from tests.support import mpi, slurm

REPO = startup.REPO
PATH = "/usr/bin:/bin"
TARGET_RATIO = 2.0  # srun overhead <= 2x the single-process overhead
MARK_BEGIN, MARK_END = "<!-- benchmarks/hpc.py: begin -->", "<!-- benchmarks/hpc.py: end -->"


class Options(Record):
    rounds: int
    launches: int
    as_root: bool
    write: bool
    seed: int
    quick: bool


class Series:
    """The timings (ms) of one command, or why it could not be measured."""

    def __init__(self, key: str, display: str) -> None:
        self.key, self.display = key, display
        self.times: list[float] = []
        self.na = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times and not self.na else None

    def result(self) -> dict[str, object]:
        return {"key": self.key, "command": self.display, "na": self.na, "median_ms": self.median,
                "times_ms": [round(t, 3) for t in self.times]}


class Bench:
    """The commands, their environment, and the cluster they run on."""

    def __init__(self, runner: Runner, cluster: slurm.SlurmCluster, image: Path, singpy: str, tmp: Path,
                 cache: Path) -> None:
        self.runner, self.cluster, self.image, self.singpy = runner, cluster, image, singpy
        self.env = {**cluster.env(), "TMPDIR": str(tmp), "SINGPY_CACHEDIR": str(cache)}
        exec_ = [singpy, "exec", *mpi.BIND_USR, str(image)]
        self.argv = {"srun-true": ["srun", "-n", "2", "true"], "srun-singpy": ["srun", "-n", "2", *exec_, "true"],
                     "true": ["/usr/bin/true"], "singpy": [*exec_, "true"],
                     "join": [singpy, "exec", "--sharens", *mpi.BIND_USR, str(image), "true"]}
        self.series = {key: Series(key, display) for key, display in (
            ("srun-true", "srun -n 2 true"), ("srun-singpy", "srun -n 2 singpy exec -B /usr:/usr:ro IMG true"),
            ("true", "true"), ("singpy", "singpy exec -B /usr:/usr:ro IMG true"),
            ("join", "singpy exec --sharens -B /usr:/usr:ro IMG true (joins a running container)"),
            ("plain", "singpy exec -B /usr:/usr:ro IMG true (a container of its own)"))}
        self.argv["plain"] = self.argv["singpy"]
        self.join_note = ""

    def timed(self, key: str) -> None:
        series = self.series[key]
        elapsed, status = self.runner.timed(self.argv[key], self.env)
        if status != 0:
            series.na = self.why(key, status)
        else:
            series.times.append(elapsed)

    def why(self, key: str, status: int) -> str:
        done = self.runner.capture(self.argv[key], self.env, timeout=120)
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return f"exit {status}: {lines[-1] if lines else 'no output'}"

    def steps(self, rounds: int, seed: int) -> None:
        """(a): one warm-up round (which finds a command that fails), then `rounds` shuffled rounds."""
        rng = random.Random(seed)
        keys = ["srun-true", "srun-singpy", "true", "singpy"]
        for number in range(rounds + 1):
            order = [key for key in keys if not self.series[key].na]
            rng.shuffle(order)
            print(f"hpc (a): {'warm-up' if number == 0 else f'round {number}/{rounds}'} ...", file=sys.stderr)
            for key in order:
                self.timed(key)
                if number == 0:
                    self.series[key].times.clear()

    def joins(self, launches: int) -> None:
        """(b): a first member keeps a --sharens container up; `launches` joins and plain starts, alternating."""
        first = self.start_first_member()
        if first is None:
            return
        try:
            for number in range(launches + 1):
                for key in ("join", "plain"):
                    if not self.series[key].na:
                        self.timed(key)
                        if number == 0:
                            self.series[key].times.clear()
        finally:
            first.send_signal(signal.SIGTERM)
            try:
                first.wait(timeout=30)
            except subprocess.TimeoutExpired:
                first.kill()
                first.wait()

    def start_first_member(self) -> subprocess.Popen[str] | None:
        """The long-running first member; None (and the join series n/a) where --sharens does not work."""
        probe = self.runner.capture([*self.argv["join"][:-1], "readlink", "/proc/self/ns/mnt"], self.env)
        if probe.returncode != 0:
            lines = [line for line in probe.stderr.splitlines() if line.strip()]
            self.series["join"].na = f"not available ({lines[-1] if lines else f'exit {probe.returncode}'})"
            return None
        argv = [*self.argv["join"][:-1], "sh", "-c", "readlink /proc/self/ns/mnt; exec sleep 3600"]
        first = subprocess.Popen(argv, env=self.runner.env(self.env), cwd=self.runner.cwd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 user=self.runner.switch_uid, group=self.runner.switch_gid,
                                 extra_groups=self.runner.switch_groups)
        assert first.stdout is not None
        namespace = first.stdout.readline().strip()
        joined = self.runner.capture([*self.argv["join"][:-1], "readlink", "/proc/self/ns/mnt"], self.env)
        if not namespace or joined.stdout.strip() != namespace:
            self.join_note = (f"the launches did not join the first member's container (first {namespace or '?'}, "
                              f"a launch {joined.stdout.strip() or '?'}): the join row times a container of its own")
        return first


# --- the report -------------------------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def overheads(bench: Bench) -> tuple[float | None, float | None]:
    series = bench.series
    srun_singpy, srun_true = series["srun-singpy"].median, series["srun-true"].median
    singpy, true = series["singpy"].median, series["true"].median
    if srun_singpy is None or srun_true is None or singpy is None or true is None:
        return None, None
    return srun_singpy - srun_true, singpy - true


def targets(bench: Bench) -> list[Target]:
    step, single = overheads(bench)
    name = (f"`srun -n 2 singpy exec IMG true` - `srun -n 2 true` <= {TARGET_RATIO:g} x "
            "(`singpy exec IMG true` - `true`)")
    if step is None or single is None:
        why = next((s.na for s in bench.series.values() if s.na), "not measured")
        return [{"target": name, "value": "n/a", "met": None, "margin": why}]
    ratio = step / single if single > 0 else float("inf")
    met = ratio <= TARGET_RATIO
    return [{"target": name, "value": f"{step:.1f} ms = {ratio:.2f} x {single:.1f} ms", "met": met,
             "margin": f"{abs(TARGET_RATIO - ratio):.2f} x {'to spare' if met else 'over'}"}, join_target(bench)]


def join_target(bench: Bench) -> Target:
    """The issue's second target: a launch that joins a shared container costs no more than a plain one."""
    name = "`singpy exec --sharens IMG true` joining a running container <= `singpy exec IMG true`"
    join, plain = bench.series["join"].median, bench.series["plain"].median
    if join is None or plain is None:
        return {"target": name, "value": "n/a", "met": None, "margin": bench.series["join"].na or "not measured"}
    met = join <= plain
    return {"target": name, "value": f"{join:.1f} ms vs {plain:.1f} ms", "met": met,
            "margin": f"{abs(plain - join):.1f} ms {'to spare' if met else 'over'}"}


def render(run_info: RunInfo, bench: Bench, launches: int, found: list[Target]) -> str:
    lines = [MARK_BEGIN, "## HPC jobs: Slurm steps and shared containers (issue 13)", "",
             "Generated by `benchmarks/hpc.py` (method in its docstring). Do not edit by hand.", "",
             *pull.conditions(run_info)[:3],
             f"- commands run as {run_info.who}; a one-node Slurm cluster (tests/support/slurm.py) on 127.0.0.1, "
             "the bind-model image (host /usr bound read-only)", "",
             "### (a) Per-step overhead", "",
             f"One warm-up round, then {run_info.rounds} rounds in shuffled order; wall time from spawn to exit.", "",
             "| command | median ms | min to max ms |", "|---|---:|---:|"]
    for key in ("srun-true", "srun-singpy", "true", "singpy"):
        lines.append(_row(bench.series[key]))
    step, single = overheads(bench)
    lines += ["", f"srun overhead (per step, 2 ranks sharing one container): **{fmt(step)} ms**; single-process "
              f"start-up overhead: **{fmt(single)} ms**.", "",
              "### (b) Joining a running container", "",
              f"{launches} launches each, alternating, after one untimed launch of each.", "",
              "| command | median ms | min to max ms |", "|---|---:|---:|",
              _row(bench.series["join"]), _row(bench.series["plain"])]
    if bench.join_note:
        lines += ["", f"Note: {bench.join_note}."]
    return "\n".join([*lines, "", *pull.targets_table(found), MARK_END]) + "\n"


def _row(series: Series) -> str:
    if series.median is None:
        return f"| `{series.display}` | n/a ({series.na or 'not measured'}) | |"
    return f"| `{series.display}` | **{series.median:.1f}** | {min(series.times):.1f} to {max(series.times):.1f} |"


class ResultsDocument(pull.ResultsHeader):
    """benchmarks/results/DATE-COMMIT-hpc.json."""

    series: list[dict[str, object]]
    srun_overhead_ms: float | None
    single_overhead_ms: float | None
    join_note: str
    targets: list[Target]


def write_results(run_info: RunInfo, section: str, bench: Bench, found: list[Target], *, quick: bool) -> None:
    doc = pull.write_section(section, (MARK_BEGIN, MARK_END))
    step, single = overheads(bench)
    document: ResultsDocument = {
        "date": run_info.now.isoformat(timespec="seconds"), "commit": run_info.commit, "dirty": run_info.dirty,
        "machine": run_info.machine, "tools": run_info.tools, "user": run_info.who,
        "series": [series.result() for series in bench.series.values()], "srun_overhead_ms": step,
        "single_overhead_ms": single, "join_note": bench.join_note, "targets": found}
    pull.save_results(run_info, "hpc", doc, document, quick=quick)


# --- the run ----------------------------------------------------------------------------------------------------


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description="singpy HPC benchmark: Slurm steps and shared containers")
    parser.add_argument("--rounds", type=int, help="timed rounds of (a) (default 20, 5 with --quick)")
    parser.add_argument("--launches", type=int, help="launches of each kind in (b) (default 100, 20 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else 5 if args.quick else 20
    launches = args.launches if args.launches is not None else 20 if args.quick else 100
    return Options(rounds=rounds, launches=launches, as_root=args.as_root, write=not args.no_write, seed=args.seed,
                   quick=args.quick)


def tool_versions() -> dict[str, str]:
    return {"slurm": startup.tool_version("slurmd", "-V"), "mpirun": startup.tool_version("mpirun", "--version")}


def account_dirs(workdir: Path, account: Account) -> tuple[Path, Path, Path]:
    """The account's working directory, TMPDIR and SINGPY_CACHEDIR."""
    user = workdir / "user"
    paths = (user, user / "tmp", user / "cache")
    for path in paths:
        path.mkdir(mode=0o700)
        os.chown(path, account.uid, account.gid)
    return paths


def benchmark(options: Options, workdir: Path, singpy: str) -> None:
    account = startup.choose_account(options.as_root)
    info = startup.machine()
    user, tmp, cache = account_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(user), PATH)
    images = mpi.build_mpi_images(workdir / "mpi")
    started = time.monotonic()
    with slurm.SlurmCluster(workdir / "slurm") as cluster:
        print(f"cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        bench = Bench(runner, cluster, images.sandbox, singpy, tmp, cache)
        bench.steps(options.rounds, options.seed)
        bench.joins(options.launches)
    info["loadavg_end"] = os.getloadavg()
    commit, dirty = startup.git_commit()
    run_info = RunInfo(machine=info, tools=tool_versions(), now=datetime.datetime.now(datetime.UTC), commit=commit,
                       dirty=dirty, who=account.describe(), rounds=options.rounds)
    found = targets(bench)
    section = render(run_info, bench, options.launches, found)
    print(section)
    if options.write:
        write_results(run_info, section, bench, found, quick=options.quick)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if (commands := startup.venv_commands()) is None:
        return 1
    singpy, python = commands
    why = slurm.missing() or mpi.missing()
    if why:
        print(f"can't run: {why}", file=sys.stderr)
        return 1
    startup.fresh_bytecode(python)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the cluster stopped, the scratch removed
    with pull.scratch("hpc") as workdir:
        benchmark(options, workdir, singpy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Start-up benchmark of `singpy exec` against ch-run, bubblewrap and the Python interpreter (issue 3).

    make bench                                   # = .venv/bin/python benchmarks/startup.py
    .venv/bin/python benchmarks/startup.py --quick
    .venv/bin/python benchmarks/startup.py --rounds 50 --compare benchmarks/results/OLD.json

Every command runs once per round, the order shuffled each round, so machine
noise hits all of them alike; the table gives medians and ratios measured side
by side in that one run. A row whose command does not work here (a tool or a
feature missing) is probed once and reported as "n/a (reason)".

As root, the commands run as the unprivileged test user (`singpy-test`, what
HPC users are: every container in a user namespace) unless `--as-root`; and the
whole benchmark runs on a simulated NVIDIA host (tests/gpu/simhost.py plus one
stand-in library per nvliblist.conf entry) put in place in a private mount
namespace of its own by tests/gpu/simrun.py, so `--nv` finds ~70 driver
libraries and every row, with or without `--nv`, sees the same /dev and the
same ld.so.cache. Writes docs/performance.md and benchmarks/results/DATE-COMMIT.json.

This script runs the phases; the rest lives beside it in benchmarks/ (each imported as a top-level module, as
pull.py, build.py and hpc.py import this one): startup_repo (REPO on sys.path), startup_records (the rows and
records of a run), startup_runner (running and timing commands), startup_imports (import-time profiles),
startup_images (the images and the simulated GPU host), startup_machine (the machine, the account, the venv),
startup_rows (the table's commands), startup_targets (the targets) and startup_report (the report and JSON).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
from pathlib import Path

from startup_images import gpu_host_note, prepare_gpu_host, prepare_images
from startup_imports import parse_importtime, profile_imports
from startup_machine import choose_account, fresh_bytecode, git_commit, machine, tool_version, venv_commands
from startup_records import Account, Machine, Options, Row, RunInfo, Target
from startup_repo import REPO
from startup_report import KEPT_SECTION, compare, import_section, render, results_document, write_results
from startup_rows import make_rows
from startup_runner import Runner, image_mode, measure, measure_rss, probe
from startup_targets import EXPECTED_IMAGE_MODE, all_targets

# What pull.py, build.py and hpc.py use of this module (`startup.NAME`, `from startup import NAME`).
__all__ = ["KEPT_SECTION", "REPO", "Account", "Machine", "Runner", "Target", "choose_account", "fresh_bytecode",
           "git_commit", "machine", "main", "parse_importtime", "tool_version", "venv_commands"]


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description="singpy start-up benchmark (issue 3)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="8 rounds, 3 import profiles: a smoke run")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--no-gpu-host", action="store_true", help="measure on this host as it is: --nv is n/a")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--compare", metavar="JSON", help="an earlier results file to compare ratios with")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    return Options(rounds=8 if args.quick and args.rounds == 30 else args.rounds,
                   profile_runs=3 if args.quick else 7, as_root=args.as_root, gpu_host=not args.no_gpu_host,
                   write=not args.no_write, compare=args.compare, seed=args.seed)


def user_cache(workdir: Path, account: Account) -> Path:
    """The extraction cache, the user's own."""
    cache = workdir / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, account.uid, account.gid)
    return cache


def probe_rows(runner: Runner, rows: list[Row]) -> dict[str, Row]:
    """Run every command once (a failing one becomes n/a) and see how singpy opens the SIF; the rows by key."""
    by_key = {row.key: row for row in rows}
    for row in rows:
        probe(runner, row)
    image_mode(runner, by_key["sif-fuse"], EXPECTED_IMAGE_MODE["sif-fuse"])
    image_mode(runner, by_key["sif-cache"], EXPECTED_IMAGE_MODE["sif-cache"])
    return by_key


def time_rows(runner: Runner, rows: list[Row], options: Options, workdir: Path) -> None:
    """The timed rounds, then the peak-RSS pass."""
    print(f"measuring {sum(not r.na for r in rows)} commands x {options.rounds} rounds ...", file=sys.stderr)
    measure(runner, rows, options.rounds, warmup=2, seed=options.seed)
    scratch = workdir / "scratch"
    scratch.mkdir(mode=0o1777)
    scratch.chmod(0o1777)
    measure_rss(runner, rows, 3, scratch)


def benchmark(options: Options, info: Machine, workdir: Path, singpy: str, python: str) -> None:
    """Everything after the checks: set up, measure, report, in `workdir` (which the caller removes)."""
    account = choose_account(options.as_root)
    images = prepare_images(workdir)
    first_namespace = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)  # before the GPU host's
    gpu = prepare_gpu_host(workdir, options.gpu_host)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(workdir), gpu.path)
    if not gpu.reason:  # its namespace was entered: --containall runs in the first one (startup_runner)
        runner.host_mnt_fd = first_namespace
    rows = make_rows(singpy, python, images, user_cache(workdir, account), gpu)
    by_key = probe_rows(runner, rows)
    gpu_note = gpu_host_note(runner, singpy, images.sandbox, by_key, gpu)
    time_rows(runner, rows, options, workdir)
    imports = profile_imports(runner, python, singpy, images, by_key, options.profile_runs)
    info["loadavg_end"] = os.getloadavg()
    targets = all_targets(by_key, imports)
    commit, dirty = git_commit()
    run = RunInfo(machine=info, now=datetime.datetime.now(datetime.UTC), commit=commit, dirty=dirty,
                  rounds=options.rounds, who=account.describe(), gpu_note=gpu_note)
    report = render(run, rows, targets, import_section(imports))
    print(report)
    if options.compare:
        compare(options.compare, rows)
    if options.write:
        write_results(run, report, results_document(run, rows, targets, imports))


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if (commands := venv_commands()) is None:
        return 1
    singpy, python = commands
    fresh_bytecode(python)
    info = machine()
    workdir = Path(tempfile.mkdtemp(prefix="singpy-bench-", dir="/tmp"))
    workdir.chmod(0o755)
    try:
        benchmark(options, info, workdir, singpy, python)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

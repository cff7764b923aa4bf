"""Big pulls (issue 31): a framework-sized image, singpy against skopeo + umoci + mksquashfs, time and memory.

    make bench                                         # ... then this: the 2 GiB image, 1 round
    .venv/bin/python benchmarks/pull_big.py --quick    # a 300 MiB stand-in of 747 files, 1 round
    .venv/bin/python benchmarks/pull_big.py --rounds 3 --no-write

The image (pull_big_image.py) is 2 GiB of this host's files, 100,000 of them, in 8 gzip layers, built once into
build/bench-pull/framework/ and pushed to a local docker-registry (plain HTTP). Each round runs, in shuffled
order, `singpy -q pull --no-https OUT.sif docker://HOST/framework:latest` with an empty cache and the
reference pipeline (pull_convert.PullBench, as pull.py: `skopeo copy` + `umoci unpack` + `mksquashfs` at singpy's
compression), one untimed warm-up round first unless --no-warm-up. Targets: the pull in at most 0.5x the
reference's time, and the whole pull's process tree (singpy and every helper it starts) at most 1 GiB of memory.
Memory is measured as root (tests.support.treepeak: a v1 memory cgroup per command, the sum of its processes'
peak resident sets); the reference's mksquashfs is measured the same way, for comparison. Writes the "Big
pulls" section of docs/performance.md and results/DATE-COMMIT-pull-big.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import startup
from pull import run_benchmark, tool_versions
from pull_big_image import GIB, FrameworkInfo, framework_layout
from pull_commands import PATH, make_dirs
from pull_convert import PullBench
from pull_results import RunInfo, conditions, save_results, targets_table, write_section
from startup_runner import Runner

from tests.support.registry import start_registry
from tests.support.treepeak import TreePeak, unavailable

MIB = 1 << 20
MARKERS = ("<!-- benchmarks/pull_big.py: begin -->", "<!-- benchmarks/pull_big.py: end -->")
TIME_TARGET, MEMORY_TARGET = 0.5, GIB


class MeasuredPull(PullBench):
    """PullBench with each singpy pull and each reference mksquashfs run in a memory cgroup of its own."""

    def __init__(self, *args: object, measure_memory: bool) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.measure_memory = measure_memory
        self.peaks: dict[str, list[int]] = {"singpy": [], "mksquashfs": []}
        self.by_name: dict[str, int] = {}

    def run_singpy(self, timed: bool) -> None:
        plain = self.singpy_argv
        with self._peak("singpy") as wrap:
            self.singpy_argv = wrap(plain)
            try:
                super().run_singpy(timed)
            finally:
                self.singpy_argv = plain

    def run_reference(self, timed: bool) -> None:
        plain = self.steps["mksquashfs"]
        with self._peak("mksquashfs") as wrap:
            self.steps["mksquashfs"] = wrap(plain)
            try:
                super().run_reference(timed)
            finally:
                self.steps["mksquashfs"] = plain

    def measure(self, rounds: int, seed: int, *, warm_up: bool = True) -> None:
        """As PullBench.measure, the warm-up round optional (on the 2 GiB image a round takes minutes)."""
        rng = random.Random(seed)
        sides = {"singpy": self.run_singpy, "reference": self.run_reference}
        for number in range(0 if warm_up else 1, rounds + 1):
            order = list(sides)
            rng.shuffle(order)
            label = "warm-up round" if number == 0 else f"round {number}/{rounds}"
            print(f"pull: {label} ({' then '.join(order)}) ...", file=sys.stderr)
            for side in order:
                if not (self.singpy_series if side == "singpy" else self.reference).na:
                    self.clean()
                    sides[side](number > 0)
        self.clean()

    def _peak(self, key: str) -> _Peak:
        return _Peak(self, key)


class _Peak:
    """`with bench._peak(key) as wrap:` a TreePeak (or nothing, unmeasured) whose result goes to bench.peaks[key]."""

    def __init__(self, bench: MeasuredPull, key: str) -> None:
        self.bench, self.key = bench, key
        self.tree = TreePeak(bench.runner.uid) if bench.measure_memory else None

    def __enter__(self) -> Callable[[list[str]], list[str]]:
        if self.tree is None:
            return lambda argv: argv
        self.tree.__enter__()
        return self.tree.wrap

    def __exit__(self, *exc: object) -> None:
        if self.tree is None:
            return
        self.tree.__exit__(*exc)
        if self.tree.bytes:
            self.bench.peaks[self.key].append(self.tree.bytes)
            if self.key == "singpy":
                for name, size in self.tree.by_name().items():
                    self.bench.by_name[name] = max(self.bench.by_name.get(name, 0), size)


def parse_options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="singpy big-pull benchmark (issue 31)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds (default 1, after one warm-up)")
    parser.add_argument("--no-warm-up", action="store_true", help="no untimed first round")
    parser.add_argument("--quick", action="store_true", help="a 300 MiB stand-in image (747 files)")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--gib", type=float, default=2.0, help="bytes of files, in GiB")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--rebuild", action="store_true", help="build the image layout again")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args(argv)
    if options.quick:
        options.files, options.gib = 20_000, 300 / 1024
    return options


def render(run_info: RunInfo, image: FrameworkInfo, bench: MeasuredPull,
           memory_note: str) -> tuple[str, dict[str, Any]]:
    singpy, reference = bench.singpy_series.median, bench.reference.median
    ratio = singpy / reference if singpy and reference else None
    peak = max(bench.peaks["singpy"], default=0)
    reference_peak = max(bench.peaks["mksquashfs"], default=0)
    found = [
        {"target": f"pull ≤ {TIME_TARGET}× skopeo + umoci + mksquashfs", "value": f"{ratio:.2f}×" if ratio else "n/a",
         "met": None if ratio is None else ratio <= TIME_TARGET,
         "margin": f"{TIME_TARGET - ratio:+.2f}×" if ratio else ""},
        {"target": "the pull's processes ≤ 1 GiB", "value": f"{peak / MIB:.0f} MiB" if peak else "n/a",
         "met": None if not peak else peak <= MEMORY_TARGET,
         "margin": f"{(MEMORY_TARGET - peak) / MIB:+.0f} MiB" if peak else ""},
    ]
    steps = " + ".join(f"{name} {series.median:.1f}" for name, series in bench.step_series.items()
                       if series.median is not None)
    lines = [MARKERS[0], "## Big pulls (issue 31)", "",
             "Generated by `benchmarks/pull_big.py` (run by `make bench` after `pull.py`). One round on this shared "
             "2-core machine moves by ±30% with its load: the runs so far are in "
             "[docs/pull.md](pull.md#big-images-memory-and-time).", "", *conditions(run_info),
             f"Image: {image['files']:,} files ({image['entries']:,} entries), {image['content_bytes'] / GIB:.2f} GiB "
             f"of file data, {image['layers']} gzip layers of {image['compressed_bytes'] / GIB:.2f} GiB; "
             f"{len(bench.singpy_series.times)} timed round(s), medians.", "",
             "| measure | singpy | reference | ratio |", "|---|---:|---:|---:|",
             f"| pull + convert | {singpy or 0:.1f} s | {reference or 0:.1f} s ({steps}) | "
             f"**{ratio:.2f}×** |" if ratio else "| pull + convert | n/a | n/a | n/a |",
             f"| peak memory of the process tree | {peak / MIB:.0f} MiB "
             f"({', '.join(f'{n} {s / MIB:.0f}' for n, s in sorted(bench.by_name.items()))}) | "
             f"mksquashfs alone: {reference_peak / MIB:.0f} MiB | |" if peak else
             f"| peak memory of the process tree | n/a ({memory_note}) | | |", "",
             *targets_table(found), "", MARKERS[1]]  # type: ignore[arg-type]
    document = {"image": image, "series": [s.result() for s in bench.all_series()], "peaks_bytes": bench.peaks,
                "singpy_peaks_by_program": bench.by_name, "targets": found, "sizes": bench.sizes}
    return "\n".join(lines) + "\n", document


def benchmark(options: argparse.Namespace, workdir: Path, singpy: str) -> None:
    account = startup.choose_account(options.as_root)
    name = "framework-quick" if options.quick else "framework"
    layout, image = framework_layout(name, options.files, int(options.gib * GIB), options.layers, options.rebuild)
    info = startup.machine()
    dirs = make_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(dirs.user), PATH)
    memory_note = unavailable()
    with start_registry(workdir / "registry") as registry:
        print(f"pushing the image to {registry.host} ...", file=sys.stderr)
        registry.push(layout, "framework")
        bench = MeasuredPull(runner, dirs, singpy, registry.ref("framework"), options.as_root,
                             measure_memory=not memory_note)
        bench.measure(options.rounds, options.seed, warm_up=not options.no_warm_up)
    info["loadavg_end"] = os.getloadavg()
    commit, dirty = startup.git_commit()
    run_info = RunInfo(machine=info, tools=tool_versions(), now=datetime.datetime.now(datetime.UTC), commit=commit,
                       dirty=dirty, who=account.describe(), rounds=options.rounds)
    section, document = render(run_info, image, bench, memory_note)
    print(section)
    if not options.no_write:
        doc = write_section(section, MARKERS)
        save_results(run_info, "pull-big", doc, {"date": run_info.now.isoformat(), "commit": commit, "dirty": dirty,
                                                 "machine": info, "tools": run_info.tools, **document},
                     quick=options.quick)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    return run_benchmark(lambda workdir, singpy, _python: benchmark(options, workdir, singpy))

if __name__ == "__main__":
    raise SystemExit(main())

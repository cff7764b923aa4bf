"""Build-from-definition-file benchmark of `singpy build OUT.sif RECIPE.def` (issue 12).

    make bench                                      # startup.py, pull.py, then this
    .venv/bin/python benchmarks/build.py            # a ~50 MB base image, 5 rounds
    .venv/bin/python benchmarks/build.py --quick    # the ~20 MB image of pull.py --quick, 2 rounds: a smoke run
    .venv/bin/python benchmarks/build.py --rounds 9 --no-write

The issue's target: building a recipe with a trivial `%post` on a cached base image costs at most 2 s more than
`pull` of the same base, plus the squash. Three commands, as the test user, with one warm singpy cache
(SINGPY_CACHEDIR) that already holds the base image, pulled and converted once before the timing:

(a) `singpy -q pull --no-https OUT.sif docker://HOST/base:latest`: the cached-conversion path (one HEAD request
    to the registry, then the cached SIF copied to OUT.sif);
(b) `singpy -q build --no-https OUT.sif recipe.def`, the recipe `Bootstrap: docker`, `From: HOST/base:latest`,
    `%post` = `true`;
(c) `mksquashfs TREE OUT.squashfs` at singpy's compression, TREE the base unpacked by `singpy build --sandbox`
    (untimed, once): the squash that (b) cannot avoid and (a) does not do;
(d) (b) with the work directory in /dev/shm.

(b) does not unpack the base in its work directory: the stage is an overlay on it (singpy/recipe/layered.py),
for the test user on the base unpacked once into the cache, by the untimed warm-up round's build.

The report gives (b) - (a) and (b) - (a) - (c) per round (medians of the paired differences) and the target
(b) - (a) - (c) <= 2 s, met or missed. One untimed warm-up round, then rounds with the three commands in
shuffled order; what a command leaves is removed outside the timing, and `sync` runs before each. One more
build, without -q and untimed, shows where the time goes: the seconds at which each of singpy's INFO lines came.

The base image is made by pull.py's image builder (busybox, then this host's Python standard library, shared
libraries and /usr/share files), at about 50 MB (20 MB with --quick) so that a full run stays under 3 minutes
on 2 cores; it is kept in build/bench-pull/ like pull.py's images. The registry (docker-registry, plain HTTP on
127.0.0.1) runs as root in this process. It is a benchmark, not a test: a missed target fails nothing. Writes
the "Build from a definition file" section of docs/performance.md (between its own markers, the rest of the
file untouched) and benchmarks/results/DATE-COMMIT-build.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

# Run as a script, sys.path[0] is benchmarks/: startup.py and pull.py are importable, and startup puts the
# repository on sys.path.
import pull
import startup
from pull import ImageInfo, RunInfo, Series, SeriesResult
from startup import Account, Runner, Target

from singpy.oci.pull import SQUASH_COMPRESSION
from singpy.record import Record
from tests.support.registry import start_registry

REPO = startup.REPO
MB = pull.MB
BUILD_BYTES = 46 * MB  # host files in the base image: with busybox and the tar headers, about 50 MB of layers
TARGET_OVERHEAD = 2.0  # seconds: build - pull - squash <= 2 s
TIMEOUT = 600  # seconds one command may take on a loaded machine
PATH = pull.PATH
MARK_BEGIN, MARK_END = "<!-- benchmarks/build.py: begin -->", "<!-- benchmarks/build.py: end -->"
RECIPE = """\
Bootstrap: docker
From: {base}

%post
    true
"""


class Options(Record):
    """The command line, resolved."""

    rounds: int  # timed rounds
    quick: bool  # pull.py's ~20 MB quick image
    as_root: bool  # the commands run as root, not as the test user
    rebuild: bool  # build the image layout again even if cached
    write: bool  # write docs/performance.md and the JSON
    seed: int  # of the shuffled order


class Dirs(Record):
    """The account's directories, under the benchmark's scratch directory."""

    user: Path  # owned by the account; the commands run here
    cache: Path  # SINGPY_CACHEDIR of every command: the base image is in it before the timing
    tmp: Path  # TMPDIR of everything
    out: Path  # what the commands write (the build's work directory is made here, next to OUT)
    memory: Path  # SINGPY_TMPDIR of (d): the build's work directory in memory (/dev/shm), OUT still in `out`


class Phase(TypedDict):
    """One stderr line of the untimed `singpy build` (without -q) and when it came."""

    seconds: float  # since the command was started
    line: str


class Paths(Record):
    """What the commands read and write."""

    recipe: Path
    tree: Path  # the base unpacked (the squash row's input)
    pulled: Path  # (a)'s OUT.sif
    built: Path  # (b)'s OUT.sif
    squashed: Path  # (c)'s output


# --- running -----------------------------------------------------------------------------------------------------


def make_dirs(workdir: Path, account: Account) -> Dirs:
    user = workdir / "user"
    memory = Path(tempfile.mkdtemp(prefix="singpy-bench-build-", dir="/dev/shm"))
    dirs = Dirs(user=user, cache=user / "cache", tmp=user / "tmp", out=user / "out", memory=memory)
    for path in (user, dirs.cache, dirs.tmp, dirs.out):
        path.mkdir(mode=0o700)
    for path in (user, dirs.cache, dirs.tmp, dirs.out, memory):
        os.chown(path, account.uid, account.gid)
    return dirs


def command_env(dirs: Dirs) -> dict[str, str]:
    """What every command gets on top of the runner's HOME, USER, PATH: no SINGPY_TMPDIR, so that the build
    works next to OUT, its default."""
    return {"TMPDIR": str(dirs.tmp), "XDG_RUNTIME_DIR": str(dirs.tmp), "SINGPY_CACHEDIR": str(dirs.cache),
            "SINGPY_CONFIG": str(REPO / "etc" / "singpy.conf")}


def leftovers(dirs: Dirs) -> list[str]:
    """Work directories a build left next to its output (there should be none)."""
    return sorted(name for name in os.listdir(dirs.out) if name.startswith(".singpy-build-"))


class BuildBench:
    """The three commands, round by round."""

    def __init__(self, runner: Runner, dirs: Dirs, singpy: str, base: str) -> None:
        self.runner, self.dirs, self.singpy, self.base = runner, dirs, singpy, base
        self.env = command_env(dirs)
        self.paths = Paths(recipe=dirs.user / "recipe.def", tree=dirs.out / "base-tree", pulled=dirs.out / "pulled.sif",
                           built=dirs.out / "built.sif", squashed=dirs.out / "base.squashfs")
        shown = base.replace(base.split("/")[2], "HOST")
        self.argv = {
            "pull": [singpy, "-q", "pull", "--no-https", str(self.paths.pulled), base],
            "build": [singpy, "-q", "build", "--no-https", str(self.paths.built), str(self.paths.recipe)],
            "squash": ["mksquashfs", str(self.paths.tree), str(self.paths.squashed), "-noappend", *SQUASH_COMPRESSION,
                       "-no-progress"],
            "memory": [singpy, "-q", "build", "--no-https", str(self.paths.built), str(self.paths.recipe)],
        }
        self.extra_env = {"memory": {"SINGPY_TMPDIR": str(dirs.memory)}}
        self.series = {
            "pull": Series("pull", "(a) singpy pull, base cached", f"singpy -q pull --no-https OUT.sif {shown}"),
            "build": Series("build", "(b) singpy build, trivial %post",
                            "singpy -q build --no-https OUT.sif recipe.def"),
            "squash": Series("squash", "(c) mksquashfs of the base's tree",
                             f"mksquashfs TREE OUT.squashfs -noappend {' '.join(SQUASH_COMPRESSION)} -no-progress"),
            "memory": Series("memory", "(d) as (b), the work directory in memory",
                             "SINGPY_TMPDIR=/dev/shm/DIR singpy -q build --no-https OUT.sif recipe.def"),
        }
        self.outputs = {"pull": self.paths.pulled, "build": self.paths.built, "squash": self.paths.squashed,
                        "memory": self.paths.built}
        self.sizes: dict[str, int] = {}
        self.setup_error = ""
        self.left: list[str] = []  # work directories builds left behind

    def prepare(self) -> None:
        """The recipe; the base pulled into the cache (converted once) and unpacked for the squash row."""
        self.paths.recipe.write_text(RECIPE.format(base=self.base.removeprefix("docker://")))
        os.chown(self.paths.recipe, self.runner.uid, self.runner.gid)
        print("caching the base image (one pull and conversion) ...", file=sys.stderr)
        _, error = pull.run(self.runner, self.argv["pull"], self.env, timeout=TIMEOUT)
        pull.remove(self.paths.pulled)
        if error:
            self.setup_error = f"the first pull failed: {error}"
            return
        sandbox = [self.singpy, "-q", "build", "--sandbox", "--no-https", str(self.paths.tree), self.base]
        _, error = pull.run(self.runner, sandbox, self.env, timeout=TIMEOUT)
        if error:
            self.series["squash"].na = f"no unpacked tree: {error}"

    def run_one(self, key: str, timed: bool) -> None:
        series = self.series[key]
        pull.remove(self.outputs[key])
        env = {**self.env, **self.extra_env.get(key, {})}
        elapsed, error = pull.run(self.runner, self.argv[key], env, timeout=TIMEOUT)
        if error:
            series.na = error
        else:
            if timed:
                series.times.append(elapsed)
            self.sizes[key] = self.outputs[key].stat().st_size
        if key in ("build", "memory"):
            self.left += leftovers(self.dirs)
        pull.remove(self.outputs[key])

    def measure(self, rounds: int, seed: int) -> None:
        """One warm-up round (which also finds a command that does not work here), then `rounds` rounds."""
        if self.setup_error:
            for series in self.series.values():
                series.na = self.setup_error
            return
        rng = random.Random(seed)
        for number in range(rounds + 1):
            order = [key for key, series in self.series.items() if not series.na]
            rng.shuffle(order)
            label = "warm-up round" if number == 0 else f"round {number}/{rounds}"
            print(f"build: {label} ({' then '.join(order)}) ...", file=sys.stderr)
            for key in order:
                if not self.series[key].na:
                    self.run_one(key, number > 0)

    def paired(self, combine: Callable[[float, float, float], float], build_key: str = "build") -> list[float]:
        """combine(build, pull, squash) of each round, for the rounds in which all three ran (`build_key`:
        which build, (b) or (d))."""
        build, pulled, squash = (self.series[key] for key in (build_key, "pull", "squash"))
        if build.na or pulled.na or squash.na:
            return []
        return [combine(b, a, c) for b, a, c in zip(build.times, pulled.times, squash.times, strict=True)]

    def phases(self) -> list[Phase]:
        """One more build, not quiet and untimed in the table: when each stderr line came."""
        if self.series["build"].na:
            return []
        pull.remove(self.paths.built)
        os.sync()
        argv = [arg for arg in self.argv["build"] if arg != "-q"]
        found: list[Phase] = []
        start = time.perf_counter()
        with subprocess.Popen(argv, env=self.runner.env(self.env), cwd=self.runner.cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, user=self.runner.switch_uid, group=self.runner.switch_gid,
                              extra_groups=self.runner.switch_groups) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.strip():
                    found.append({"seconds": round(time.perf_counter() - start, 3), "line": line.rstrip()})
        found.append({"seconds": round(time.perf_counter() - start, 3), "line": f"(exit {proc.returncode})"})
        pull.remove(self.paths.built)
        return found

    def clean(self) -> None:
        for path in (*self.outputs.values(), self.paths.tree, self.dirs.memory):
            pull.remove(path)


# --- the report --------------------------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} to {max(values):.2f}" if values else ""


def targets(bench: BuildBench) -> list[Target]:
    net = median(bench.paired(lambda b, a, c: b - a - c))
    name = f"`singpy build` (trivial %post, base cached) - `singpy pull` (same base, cached) - squash <= " \
           f"{TARGET_OVERHEAD:g} s"
    if net is None:
        why = next((series.na for series in bench.series.values() if series.na), "not measured")
        return [{"target": name, "value": "n/a", "met": None, "margin": why}]
    met = net <= TARGET_OVERHEAD
    return [{"target": name, "value": f"{net:.2f} s", "met": met,
             "margin": f"{abs(TARGET_OVERHEAD - net):.2f} s {'to spare' if met else 'over'}"}]


def render(run_info: RunInfo, image: ImageInfo, bench: BuildBench, phases: list[Phase], found: list[Target]) -> str:
    """The "Build from a definition file" section of docs/performance.md, markers included."""
    lines = [MARK_BEGIN, "## Build from a definition file (issue 12)", "",
             "Generated by `benchmarks/build.py` (run by `make bench` after `pull.py`; method: "
             "[benchmarks/README.md](../benchmarks/README.md#build-from-a-definition-file-issue-12)). "
             "Do not edit by hand.", "", *pull.conditions(run_info), *_rounds_section(image, bench, run_info.rounds),
             *_phases_section(phases), *pull.targets_table(found)]
    return "\n".join([*lines, MARK_END]) + "\n"


def _rounds_section(image: ImageInfo, bench: BuildBench, rounds: int) -> list[str]:
    entries = sum(layer["entries"] for layer in image["layers"])
    lines = ["### Build against pull", "",
             f"The base image: {len(image['layers'])} gzip layers, {pull.mb(image['uncompressed_bytes'])} MB "
             f"uncompressed, {pull.mb(image['compressed_bytes'])} MB compressed, {entries} entries (pull.py's "
             "image builder). It is pulled and converted once into the cache all three commands use; the recipe "
             "is `Bootstrap: docker`, `From: HOST/base:latest`, `%post` `true`. One warm-up round, then "
             f"{rounds} rounds, the commands in shuffled order; wall time of each command. The build's stage is "
             "an overlay on the base (singpy/recipe/layered.py): as root on the image itself, for a user on the "
             "base unpacked once into the cache (by the warm-up round's build). (d) is (b) with the build's work "
             "directory in /dev/shm (SINGPY_TMPDIR), the output still on disk.", "",
             "| measure | command | median s | min to max s |", "|---|---|---:|---:|"]
    for series in bench.series.values():
        value = series.median
        if value is None:
            lines.append(f"| {series.label} | `{series.display}` | n/a ({series.na or 'not measured'}) | |")
        else:
            lines.append(f"| {series.label} | `{series.display}` | **{value:.2f}** | {spread(series.times)} |")
    for label, combine in (("(b) - (a): what the build costs over the pull",
                            lambda b, a, c: b - a),
                           ("(b) - (a) - (c): the same without the squash", lambda b, a, c: b - a - c)):
        values = bench.paired(combine)
        shown = f"**{median(values):.2f}**" if values else "n/a"
        lines.append(f"| {label} | per round, median of the differences | {shown} | {spread(values)} |")
    values = bench.paired(lambda b, a, c: b - a - c, "memory")
    shown = f"**{median(values):.2f}**" if values else "n/a"
    lines.append(f"| (d) - (a) - (c): the same, work directory in memory | per round, median of the differences | "
                 f"{shown} | {spread(values)} |")
    sizes = ", ".join(f"{key} {pull.mb(size)} MB" for key, size in bench.sizes.items())
    lines += ["", f"Output sizes: {sizes or 'n/a'}."]
    if bench.left:
        lines.append(f"**Work directories left next to OUT by a build**: {', '.join(sorted(set(bench.left)))}.")
    return [*lines, ""]


def _phases_section(phases: list[Phase]) -> list[str]:
    if not phases:
        return []
    lines = ["### Where the build's time goes", "",
             "One more `singpy build --no-https OUT.sif recipe.def` (not quiet, untimed above): the second at which "
             "each line of its output came (a step's time is the gap to the next line).", "",
             "| s | line |", "|---:|---|"]
    lines += [f"| {phase['seconds']:.2f} | `{phase['line'].replace('|', '/')[:160]}` |" for phase in phases]
    return [*lines, ""]


class ResultsDocument(pull.ResultsHeader):
    """benchmarks/results/DATE-COMMIT-build.json."""

    image: ImageInfo
    recipe: str
    series: list[SeriesResult]
    overhead_s: list[float]  # build - pull, per round
    overhead_without_squash_s: list[float]  # build - pull - squash, per round
    sizes: dict[str, int]
    phases: list[Phase]
    leftover_work_dirs: list[str]
    targets: list[Target]


def results_document(run_info: RunInfo, image: ImageInfo, bench: BuildBench, phases: list[Phase],
                     found: list[Target]) -> ResultsDocument:
    return {
        "date": run_info.now.isoformat(timespec="seconds"), "commit": run_info.commit, "dirty": run_info.dirty,
        "machine": run_info.machine, "tools": run_info.tools, "user": run_info.who, "image": image,
        "recipe": RECIPE, "series": [series.result() for series in bench.series.values()],
        "overhead_s": [round(t, 4) for t in bench.paired(lambda b, a, c: b - a)],
        "overhead_without_squash_s": [round(t, 4) for t in bench.paired(lambda b, a, c: b - a - c)],
        "sizes": bench.sizes, "phases": phases, "leftover_work_dirs": sorted(set(bench.left)), "targets": found,
    }


def write_results(run_info: RunInfo, section: str, document: ResultsDocument, *, quick: bool) -> None:
    doc = pull.write_section(section, (MARK_BEGIN, MARK_END))
    pull.save_results(run_info, "build", doc, document, quick=quick)


# --- the run -----------------------------------------------------------------------------------------------------


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description="singpy build-from-definition-file benchmark (issue 12)")
    parser.add_argument("--rounds", type=int, help="timed rounds (default 5, 2 with --quick; after one warm-up)")
    parser.add_argument("--quick", action="store_true", help="pull.py's ~20 MB image and 2 rounds: a smoke run")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--rebuild", action="store_true", help="build the image layout again")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else 2 if args.quick else 5
    return Options(rounds=rounds, quick=args.quick, as_root=args.as_root, rebuild=args.rebuild,
                   write=not args.no_write, seed=args.seed)


def tool_versions() -> dict[str, str]:
    return {"registry": startup.tool_version("docker-registry", "--version"),
            "mksquashfs": startup.tool_version("mksquashfs", "-version")}


def benchmark(options: Options, workdir: Path, singpy: str) -> None:
    account = startup.choose_account(options.as_root)
    if options.quick:
        layout, image = pull.cached_layout("quick", pull.QUICK_BYTES, options.rebuild)
    else:
        layout, image = pull.cached_layout("build", BUILD_BYTES, options.rebuild)
    info = startup.machine()
    dirs = make_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(dirs.user), PATH)
    with start_registry(workdir / "registry") as registry:
        print(f"pushing the base image to {registry.host} ...", file=sys.stderr)
        registry.push(layout, "base")
        bench = BuildBench(runner, dirs, singpy, registry.ref("base"))
        try:
            bench.prepare()
            bench.measure(options.rounds, options.seed)
            phases = bench.phases()
        finally:
            bench.clean()
    info["loadavg_end"] = os.getloadavg()
    commit, dirty = startup.git_commit()
    run_info = RunInfo(machine=info, tools=tool_versions(), now=datetime.datetime.now(datetime.UTC), commit=commit,
                       dirty=dirty, who=account.describe(), rounds=options.rounds)
    found = targets(bench)
    section = render(run_info, image, bench, phases, found)
    print(section)
    if options.write:
        write_results(run_info, section, results_document(run_info, image, bench, phases, found), quick=options.quick)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if (commands := startup.venv_commands()) is None:
        return 1
    singpy, python = commands
    # skopeo pushes the image to the registry.
    tools = ("docker-registry", "skopeo", "mksquashfs")
    if missing := [tool for tool in tools if shutil.which(tool, path=PATH) is None]:
        print(f"not installed: {', '.join(missing)} (`make setup` installs them)", file=sys.stderr)
        return 1
    startup.fresh_bytecode(python)
    # SIGTERM unwinds like Ctrl-C: the registry is stopped and the scratch directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with pull.scratch("build") as workdir:
        benchmark(options, workdir, singpy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

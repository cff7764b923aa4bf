"""The pull benchmark's measure 3: `singpy exec` of a cached docker:// image against the same image as a SIF."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
from typing import TYPE_CHECKING, TypedDict

from pull_commands import Dirs, base_env, run
from startup_imports import parse_importtime
from startup_runner import Runner

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.registry import RegistryServer


class ExecRow:
    """One `singpy exec` command of the cached-image comparison, times in ms."""

    def __init__(self, key: str, label: str, argv: list[str], display: str) -> None:
        self.key, self.label, self.argv, self.display = key, label, argv, display
        self.times: list[float] = []
        self.failures = 0
        self.na = ""
        # ms of CPU the registry spent on one of this row's runs (its HEAD request), where measured: on this
        # machine the registry shares the launcher's cores, a remote registry does not
        self.server_cpu_ms: float | None = None
        self.base = "sif"  # the key of the row its ratio is taken against

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times and not self.na else None

    def quartiles(self) -> str:
        if len(self.times) < 4:
            return ""
        low, _, high = statistics.quantiles(self.times, n=4)
        return f"{low:.1f}-{high:.1f}"


def exec_rows(runner: Runner, dirs: Dirs, singpy: str, registry: RegistryServer, digest: str) -> list[ExecRow]:
    """The small image pulled (caching it) and copied to SMALL.sif; the rows, n/a where setting up failed."""
    env = exec_env(dirs)
    sif = dirs.out / "small.sif"
    tag, pinned = registry.ref("small"), registry.ref("small", digest)
    rows = [
        ExecRow("sif", "singpy exec SMALL.sif true", [singpy, "exec", str(sif), "true"], "singpy exec SMALL.sif true"),
        ExecRow("docker", "singpy exec docker://…:latest true (cached)", [singpy, "exec", tag, "true"],
                "singpy exec docker://HOST/small:latest true"),
        ExecRow("digest", "singpy exec docker://…@sha256 true (cached, no request)", [singpy, "exec", pinned, "true"],
                "singpy exec docker://HOST/small@sha256:… true"),
    ]
    _, error = run(runner, [singpy, "-q", "pull", str(sif), tag], env, timeout=300)
    for row in rows:
        if error:
            row.na = f"pull failed: {error}"
            continue
        done = runner.capture(row.argv, env)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            row.na = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return rows


def exec_env(dirs: Dirs) -> dict[str, str]:
    # --no-https as APPTAINER_NOHTTPS, for every row alike: the command lines differ in the image only.
    return {**base_env(dirs), "SINGPY_CACHEDIR": str(dirs.exec_cache), "APPTAINER_NOHTTPS": "1"}


def measure_exec(runner: Runner, rows: list[ExecRow], env: dict[str, str], rounds: int, seed: int) -> None:
    live = [row for row in rows if not row.na]
    rng = random.Random(seed)
    print(f"exec: {len(live)} commands x {rounds} rounds ...", file=sys.stderr)
    for number in range(rounds + 2):  # two warm-up rounds, as startup.py
        rng.shuffle(live)
        for row in live:
            elapsed, status = runner.timed(row.argv, env)
            if number < 2:
                continue
            if status != 0:
                row.failures += 1
            else:
                row.times.append(elapsed)


APART = "-apart"  # the key suffix of a row timed with the registry off the launcher's core


def apart_rows(rows: list[ExecRow], keys: tuple[str, ...] = ("sif", "docker")) -> list[ExecRow]:
    """The rows of `keys` again, to be timed with the registry kept off the launcher's core (`registry_apart`),
    each against the twin of its own base."""
    twins = []
    for row in rows:
        if row.key in keys:
            twin = ExecRow(row.key + APART, f"{row.label}, the registry on the other core", row.argv, row.display)
            twin.base, twin.na = row.base + APART, row.na
            twins.append(twin)
    return twins


@contextlib.contextmanager
def registry_apart(*pids: int) -> Iterator[bool]:
    """The registries (every thread of each process in `pids`) on the last CPU and this process (and what it
    starts) on the others, as a registry on another machine never takes the launcher's core; False where there
    is one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        yield False
        return
    threads = [int(name) for pid in pids for name in os.listdir(f"/proc/{pid}/task")]
    mine, theirs = os.sched_getaffinity(0), {thread: os.sched_getaffinity(thread) for thread in threads}
    for thread in threads:  # threads the registry starts later inherit it
        os.sched_setaffinity(thread, {cpus[-1]})
    os.sched_setaffinity(0, set(cpus[:-1]))
    try:
        yield True
    finally:
        os.sched_setaffinity(0, mine)
        for thread, allowed in theirs.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(thread, allowed)


def measure_apart(runner: Runner, rows: list[ExecRow], env: dict[str, str], rounds: int, seed: int,
                  pids: tuple[int, ...]) -> None:
    """`rows` (from apart_rows) timed as measure_exec times, with the registries `pids` off the launcher's core."""
    with registry_apart(*pids) as pinned:
        if pinned:
            measure_exec(runner, rows, env, rounds, seed)
    for row in rows:
        row.na = row.na or ("" if pinned else "one CPU: no other core for the registry")


def server_cpu_per_head(pid: int, url: str, accept: str, count: int = 50) -> float | None:
    """Milliseconds of CPU the registry (process `pid`) spends answering one anonymous HEAD of `url` on a new
    connection, as a cached tag's check sends it; None where its /proc entry can't be read."""
    import urllib.request

    def cpu_ms() -> float:
        with open(f"/proc/{pid}/stat") as stat:  # utime and stime, after the command's closing parenthesis
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")

    try:
        before = cpu_ms()
        for _ in range(count):
            request = urllib.request.Request(url, method="HEAD", headers={"Accept": accept, "Connection": "close"})
            with urllib.request.urlopen(request, timeout=30):
                pass
        return (cpu_ms() - before) / count
    except (OSError, ValueError, IndexError):
        return None


class ImportExtra(TypedDict):
    modules: list[str]  # in import order
    self_ms: float  # their self time, summed
    heavy_ms: dict[str, float]  # cumulative time of those of HEAVY imported


# Standard-library modules whose import the docker:// path may add, each with what it imports in turn.
HEAVY = ("http.client", "email.parser", "ssl", "socket", "urllib.parse", "typing", "hashlib", "json", "re",
         "threading")


def import_extras(runner: Runner, python: str, rows: list[ExecRow], env: dict[str, str]) -> dict[str, ImportExtra]:
    """By row key: the modules a docker:// run imports beyond `singpy exec SMALL.sif` (one `-X importtime` run
    each), and their self time: where part of the docker:// path's extra milliseconds go."""
    profiles: dict[str, dict[str, tuple[int, int]]] = {}
    for row in rows:
        if row.na:
            continue
        done = runner.capture([python, "-X", "importtime", *row.argv], env)
        if done.returncode == 0:
            profiles[row.key] = parse_importtime(done.stderr)
    base = profiles.get("sif")
    if base is None:
        return {}
    extras: dict[str, ImportExtra] = {}
    for key, modules in profiles.items():
        if key != "sif":
            names = [name for name in modules if name not in base]
            extras[key] = {"modules": names, "self_ms": sum(modules[name][0] for name in names) / 1000,
                           "heavy_ms": {name: modules[name][1] / 1000 for name in HEAVY if name in names}}
    return extras

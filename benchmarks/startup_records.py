"""The records of one start-up benchmark run: the table's rows, the options, images, imports, results (JSON)."""

from __future__ import annotations

import datetime
import statistics
from pathlib import Path
from typing import NotRequired, TypedDict

import startup_repo  # noqa: F401  (the repository on sys.path, for singpy)

from singpy.record import Record


class Row:
    """One command of the table."""

    def __init__(self, key: str, label: str, argv: list[str], *, env: dict[str, str] | None = None,
                 display: str = "", na: str = "", host_namespace: bool = False) -> None:
        self.key, self.label, self.argv, self.env = key, label, argv, env
        self.host_namespace = host_namespace  # run outside the simulated GPU host's mount namespace (startup_runner)
        self.display = display or " ".join(argv)
        self.na = na  # reason the row is not measured, "" when it is
        self.times: list[float] = []  # ms
        self.rss: list[int] = []  # KiB, ru_maxrss of the command's process
        self.failures = 0
        self.extra: dict[str, str] = {}  # "mode" and "kind" of a SIF row: how singpy opened the image

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    def quartiles(self) -> tuple[float, float] | None:
        if len(self.times) < 4:
            return None
        q = statistics.quantiles(self.times, n=4)
        return q[0], q[2]


def measured(rows: dict[str, Row], key: str) -> float | None:
    """The row's median, None when the row is missing or n/a."""
    row = rows.get(key)
    return row.median if row and not row.na else None



class Options(Record):
    """The command line, resolved."""

    rounds: int  # timed rounds
    profile_runs: int  # runs of the plain exec's import profile
    as_root: bool  # --as-root: the commands run as root, not as the test user
    gpu_host: bool  # simulate the GPU host (no --no-gpu-host)
    write: bool  # write docs/performance.md and the JSON (no --no-write)
    compare: str | None  # --compare: an earlier results file
    seed: int  # of the shuffled order


class Account(Record):
    """Whom the commands run as."""

    uid: int
    gid: int
    user: str
    home: str

    def describe(self) -> str:
        return f"{self.user} (uid {self.uid}{', user namespaces' if self.uid else ', no user namespace'})"


class Images(Record):
    """The images and configurations every row uses, under the benchmark's scratch directory."""

    sandbox: Path
    sif: Path | None
    sif_reason: str  # why there is no SIF, "" when there is one
    confs: dict[str, Path]  # singpy.conf variants: "default", "unsquash", "liblist" (and "ecl" when signed)
    signed: Path | None = None  # the SIF signed, for the ECL row (startup_images.build_signed)
    signed_reason: str = "not built"  # why there is no signed SIF and ECL, "" when there are


class GpuSetup(Record):
    """The simulated GPU host, as far as it could be put in place."""

    path: str  # PATH of the commands: the simulated host's tools first
    reason: str  # why the --nv rows are n/a, "" when the host is in place
    note: str  # the report's "GPU host" line when the host is not in place
    cdi_dir: str = ""  # the CDI spec written for the simulated host (--device row)


class ImportProfile(Record):
    """`python -X importtime` of one command: medians over its runs."""

    modules: dict[str, tuple[float, float]]  # module -> (self us, cumulative us), in import order
    total_us: float  # sum of the self times
    count: int  # modules imported


class ImportExtra(TypedDict):
    """What a flag or a SIF imports on top of the plain exec (one run)."""

    modules: list[str]
    self_us: float
    forbidden: list[str]


class Imports(Record):
    """The import profiles of the exec path."""

    plain: ImportProfile | None  # None when `singpy exec` failed under -X importtime
    extras: dict[str, ImportExtra]  # by row label
    forbidden: list[str] | None  # FORBIDDEN_PLAIN modules the plain exec imports; None without a profile


class Target(TypedDict):
    """One line of the targets table (and of the JSON's "targets")."""

    target: str
    value: str
    met: bool | None  # None: n/a
    margin: str


# "ch-run" is no identifier, hence the functional form.
Machine = TypedDict("Machine", {
    "cpu": str, "cores": int | None, "usable_cores": int, "memory": str, "kernel": str, "distro": str,
    "python": str, "python_executable": str, "loadavg_start": tuple[float, float, float],
    "ch-run": str, "bwrap": str, "squashfuse": str,
    "loadavg_end": NotRequired[tuple[float, float, float]],  # added once the measuring is done
})


class RunInfo(Record):
    """Where, when and how this run was made: the report's Machine section and the JSON's header."""

    machine: Machine
    now: datetime.datetime
    commit: str
    dirty: bool
    rounds: int
    who: str  # Account.describe()
    gpu_note: str


class RowResult(TypedDict):
    key: str
    label: str
    command: str
    na: str | None
    median_ms: float | None
    quartiles_ms: tuple[float, float] | None
    failures: int
    rss_kib_median: float | None
    times_ms: list[float]


class ModuleTime(TypedDict):
    self_ms: float
    cumulative_ms: float


class ImportsResult(TypedDict):
    count: int
    total_ms: float
    modules: dict[str, ModuleTime]
    forbidden_found: list[str] | None
    extras: dict[str, ImportExtra]


class ResultsDocument(TypedDict):
    """benchmarks/results/DATE-COMMIT.json (read back by --compare)."""

    date: str
    commit: str
    dirty: bool
    rounds: int
    machine: Machine
    user: str
    gpu_host: str
    rows: list[RowResult]
    targets: list[Target]
    imports: ImportsResult | None

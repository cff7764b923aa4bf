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
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

# Run as a script, sys.path[0] is benchmarks/: the repository root makes `singpy` and `tests` importable from it.
if (_repo := str(Path(__file__).resolve().parent.parent)) not in sys.path:
    sys.path.insert(0, _repo)

from singpy.record import Record

if TYPE_CHECKING:
    from tests.gpu.simhost import SimHost

REPO = Path(_repo)

# Modules that must not be imported by a plain `singpy exec` (docs/performance.md, tests/unit/test_hot_path_imports.py).
FORBIDDEN_ALWAYS = ("typer", "click", "rich", "pyroute2", "prctl", "singpy.image.sifwrite")
FORBIDDEN_PLAIN = (*FORBIDDEN_ALWAYS, "dataclasses", "typing", "pathlib", "json")

# Standard-library modules the launcher keeps off its hot path (or imports only when a flag needs them);
# `python3 -c "import X"` runs beside the others so the doc can say what each would cost.
STDLIB = ("enum", "signal", "re", "shutil", "subprocess", "ctypes", "json", "pathlib", "typing", "dataclasses")
TIME = "/usr/bin/time"  # GNU time (Debian `time`), for peak RSS
TARGET_RATIO = 3.0  # singpy exec SANDBOX true <= 3x python3 -c pass
TARGET_DELTA_MS = 10.0  # SIF (squashfuse or cache) and --nv: <= 10 ms over the sandbox
# The rows held to TARGET_DELTA_MS, and how the targets table names them.
DELTA_TARGETS = (("sif-fuse", "SIF mounted with squashfuse"), ("sif-cache", "SIF from the extraction cache"),
                 ("nv", "`--nv` (~70 libraries, listed by nvidia-container-cli)"),
                 ("nv-liblist", "`--nv` (~70 libraries, nvliblist.conf + ld cache)"),
                 ("cdi", "`--device nvidia.com/gpu=all` (CDI spec, ~70 libraries)"))
# How singpy must open the SIF of each SIF row; any other way is flagged "but: ..." in the report.
EXPECTED_IMAGE_MODE = {"sif-fuse": "fuse", "sif-cache": "extract"}
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH of the commands; the simulated GPU host puts its tools first
# The sections the other benchmarks (pull.py, build.py) write into docs/performance.md start at the first of
# these markers and run to the end of the file: kept when this script rewrites the file.
KEPT_SECTION = ("<!-- benchmarks/pull.py: begin -->", "<!-- benchmarks/pull.py: end -->")  # pull.py's own markers
KEPT_MARKERS = (KEPT_SECTION[0], "<!-- benchmarks/build.py: begin -->")


class Row:
    """One command of the table."""

    def __init__(self, key: str, label: str, argv: list[str], *, env: dict[str, str] | None = None,
                 display: str = "", na: str = "") -> None:
        self.key, self.label, self.argv, self.env = key, label, argv, env
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


# --- the records of one run -------------------------------------------------------------------------


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
    confs: dict[str, Path]  # singpy.conf variants: "default", "unsquash", "liblist"


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


# --- running commands -------------------------------------------------------------------------------


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

    def env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {**self.base_env, **(extra or {})}

    def timed(self, argv: list[str], extra: dict[str, str] | None = None) -> tuple[float, int]:
        """(milliseconds, exit status) of one run, output discarded."""
        env = self.env(extra)
        start = time.perf_counter_ns()
        proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, user=self.switch_uid, group=self.switch_gid,
                                extra_groups=self.switch_groups)
        _, status = os.waitpid(proc.pid, 0)
        elapsed = (time.perf_counter_ns() - start) / 1e6
        proc.returncode = os.waitstatus_to_exitcode(status)
        return elapsed, proc.returncode

    def peak_rss(self, argv: list[str], extra: dict[str, str] | None, scratch: Path) -> int | None:
        """ru_maxrss (KiB) of the command, through GNU time.

        Not from our own wait4: a child forked (or vforked) from this Python process carries
        our RSS into its high-water mark until it execs, so a small C parent has to start it.
        """
        out = scratch / "rss"
        out.unlink(missing_ok=True)
        done = self.capture([TIME, "-f", "%M", "-o", str(out), *argv], extra)
        try:
            return int(out.read_text().split()[-1]) if done.returncode == 0 else None
        except (OSError, ValueError, IndexError):
            return None

    def capture(self, argv: list[str], extra: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=self.env(extra), cwd=self.cwd, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL, user=self.switch_uid,
                              group=self.switch_gid, extra_groups=self.switch_groups)


def probe(runner: Runner, row: Row) -> None:
    """Run the row's command once; on failure the row becomes n/a with the command's last error line."""
    if row.na:
        return
    try:
        done = runner.capture(row.argv, row.env)
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
            elapsed, status = runner.timed(row.argv, row.env)
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
                rss = runner.peak_rss(row.argv, row.env, scratch)
                if rss is not None:
                    row.rss.append(rss)


# --- import time ------------------------------------------------------------------------------------


def parse_importtime(stderr: str) -> dict[str, tuple[int, int]]:
    """`-X importtime` lines -> module: (self us, cumulative us)."""
    modules: dict[str, tuple[int, int]] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            modules[parts[2].strip()] = (int(parts[0]), int(parts[1]))
    return modules


def forbidden_in(modules: Iterable[str], forbidden: tuple[str, ...]) -> list[str]:
    names = list(modules)
    return sorted(name for name in names for bad in forbidden if name == bad or name.startswith(bad + "."))


def import_profile(runner: Runner, python: str, argv: list[str], env: dict[str, str] | None,
                   runs: int) -> ImportProfile | None:
    """Median self/cumulative import time per module over `runs` runs of `python -X importtime argv`."""
    samples: list[dict[str, tuple[int, int]]] = []
    for _ in range(runs):
        done = runner.capture([python, "-X", "importtime", *argv], env)
        if done.returncode != 0:
            return None
        samples.append(parse_importtime(done.stderr))
    names = list(samples[0])
    modules: dict[str, tuple[float, float]] = {}
    for name in names:
        selfs = [s[name][0] for s in samples if name in s]
        cums = [s[name][1] for s in samples if name in s]
        modules[name] = (statistics.median(selfs), statistics.median(cums))
    total = statistics.median(sum(v[0] for v in s.values()) for s in samples)
    return ImportProfile(modules=modules, total_us=total, count=len(names))


# --- images and the simulated GPU host --------------------------------------------------------------


def build_sandbox(workdir: Path) -> Path:
    from tests.support.images import build_busybox_rootfs

    return build_busybox_rootfs(workdir / "sandbox")


def build_sif(workdir: Path, sandbox: Path) -> tuple[Path | None, str]:
    """A SIF made as `apptainer build` makes one: a squashfs of the sandbox in a SIF container."""
    mksquashfs = shutil.which("mksquashfs", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if mksquashfs is None:
        return None, "mksquashfs not installed (Debian squashfs-tools)"
    squash = workdir / "rootfs.squashfs"
    done = subprocess.run([mksquashfs, str(sandbox), str(squash), "-noappend", "-all-root", "-no-progress"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None, f"mksquashfs failed: {done.stderr.strip()[-200:]}"
    from singpy.image.sif import host_arch
    from singpy.image.sifwrite import build_sif_from_squashfs

    sif = workdir / "busybox.sif"
    build_sif_from_squashfs(sif, squash, arch=host_arch())
    sif.chmod(0o755)
    return sif, ""


def nvliblist_libraries() -> list[str]:
    from singpy.config.liblist import load_liblist

    return [name for name in load_liblist(str(REPO / "etc" / "nvliblist.conf")).libraries if not name.startswith("/")]


def build_gpu_host(workdir: Path) -> tuple[SimHost | None, str]:
    """The simulated NVIDIA host plus one stand-in library for each nvliblist.conf library name."""
    if os.geteuid() != 0:
        return None, "the simulated GPU host needs root (mknod, a private mount namespace)"
    if shutil.which("gcc") is None:
        return None, "gcc not installed (the simulated driver libraries are compiled)"
    from tests.gpu import simhost

    root = workdir / "gpuhost"
    root.mkdir()
    host = simhost.build_nvidia_host(root, gpus=4)
    have = {path.name.split(".so")[0] for path in host.lib_dir.iterdir()}
    for entry in nvliblist_libraries():
        stem = entry[: entry.index(".so")]
        if stem in have:
            continue
        simhost._shared_lib(host.lib_dir, stem, simhost.DRIVER, f"{stem}.so.1", simhost.ROCM_C)
    dirs = [host.lib_dir, *([host.lib32_dir] if host.lib32_dir else [])]
    simhost.build_ld_cache(root, dirs)
    # The stand-in nvidia-container-cli lists every driver file too (a real one also asks the driver, through
    # NVML, which takes longer than this shell script's `cat`).
    listed = [str(host.bin_dir / "nvidia-smi")]
    listed += [str(path) for directory in dirs for path in sorted(directory.iterdir())
               if path.is_file() and not path.is_symlink()]
    host.container_cli.write_text(simhost.container_cli_script(listed))
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return host, ""


def write_cdi_spec(directory: Path, host: SimHost) -> Path:
    """The spec `nvidia-ctk cdi generate` would write for the simulated host (tests/gpu/test_cdi.py), with every
    driver library of the host mounted, as the real one lists them: `directory`, holding nvidia.json."""
    from tests.gpu.test_cdi import LIB_DIR, OPTIONS, nvidia_spec

    spec = nvidia_spec(host)
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    listed = {mount["hostPath"] for mount in edits["mounts"]}
    edits["mounts"] += [{"hostPath": str(path), "containerPath": f"{LIB_DIR}/{path.name}", "options": OPTIONS}
                        for path in sorted(host.lib_dir.iterdir())
                        if path.is_file() and not path.is_symlink() and str(path) not in listed]
    directory.mkdir(mode=0o755)
    (directory / "nvidia.json").write_text(json.dumps(spec, indent=1))
    (directory / "nvidia.json").chmod(0o644)
    return directory


def enter_gpu_host(host: SimHost) -> None:
    """Put the simulated host in place of this machine's /dev and ld.so.cache, for this process and its children.

    tests/gpu/simrun.py makes the private mount namespace; /dev/fuse is added so that squashfuse still works.
    """
    from tests.gpu.simrun import simulate

    fuse = os.stat("/dev/fuse").st_rdev if os.path.exists("/dev/fuse") else None
    simulate(str(host.root))
    # The driver's version file too (a tmpfs over /proc/driver): --nv reads it, and keeps nvidia-container-cli's
    # listing per driver version (singpy.gpu.listcache), as on a real host.
    from singpy.kernel import syscalls as k

    k.mount("simproc", "/proc/driver", "tmpfs", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, "mode=0755")
    shutil.copytree(host.root / "proc/driver/nvidia", "/proc/driver/nvidia")
    if fuse is not None:
        os.mknod("/dev/fuse", stat.S_IFCHR | 0o666, fuse)
        os.chmod("/dev/fuse", 0o666)


def write_conf(directory: Path, extra: str = "") -> Path:
    """The shipped singpy.conf (plus `extra` lines) with the shipped liblists beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("nvliblist.conf", "rocmliblist.conf"):
        shutil.copy(REPO / "etc" / name, directory / name)
    conf = directory / "singpy.conf"
    conf.write_text((REPO / "etc" / "singpy.conf").read_text() + extra)
    directory.chmod(0o755)
    return conf


# --- the machine ------------------------------------------------------------------------------------


def _version(tool: str, flag: str = "--version") -> str:
    """`tool` and the first line of its version output that has a digit in it."""
    try:
        done = subprocess.run([tool, flag], capture_output=True, text=True, timeout=10, check=False,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": "root"})
    except OSError:
        return f"{tool}: not installed"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    with_digit = [line for line in lines if any(c.isdigit() for c in line) and not line.startswith("-")]
    named = [line for line in with_digit if line.lower().startswith(tool.split("-")[0])]
    return (named or [f"{tool} {line}" for line in with_digit] or [f"{tool} ?"])[0]


def machine() -> Machine:
    model = "?"
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) // 1024} MiB"
    distro = "?"
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    distro = line.split("=", 1)[1].strip().strip('"')
    return {
        "cpu": model, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "memory": memory,
        "kernel": platform.release(), "distro": distro, "python": platform.python_version(),
        "python_executable": sys.executable, "loadavg_start": os.getloadavg(),
        "ch-run": _version("ch-run"), "bwrap": _version("bwrap"), "squashfuse": _version("squashfuse"),
    }


def git_commit() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit, dirty


# --- targets ----------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def evaluate(rows: dict[str, Row], forbidden_found: list[str] | None, typer_ms: float | None) -> list[Target]:
    """Each target: met / missed / n/a, with the measured value and the margin."""
    targets = [ratio_target(rows)]
    targets += [delta_target(rows, key, what) for key, what in DELTA_TARGETS]
    targets.append(imports_target(forbidden_found, typer_ms))
    return targets


def ratio_target(rows: dict[str, Row]) -> Target:
    """Target 1: the plain exec against the interpreter's floor."""
    name = f"`singpy exec SANDBOX true` <= {TARGET_RATIO:g}x `python3 -c pass`"
    sandbox, python = measured(rows, "singpy"), measured(rows, "python")
    if sandbox is None or python is None:
        return {"target": name, "value": "n/a", "met": None, "margin": rows["singpy"].na or rows["python"].na}
    ratio = sandbox / python
    return {"target": name, "value": f"{ratio:.2f}x ({sandbox:.1f} ms vs {python:.1f} ms)",
            "met": ratio <= TARGET_RATIO,
            "margin": f"{abs(TARGET_RATIO * python - sandbox):.1f} ms "
                      f"({'under' if ratio <= TARGET_RATIO else 'over'} {TARGET_RATIO * python:.1f} ms)"}


def delta_target(rows: dict[str, Row], key: str, what: str) -> Target:
    """Targets 2 and 3: the row `key` over the plain exec."""
    name = f"{what} adds <= {TARGET_DELTA_MS:g} ms over the sandbox"
    value, sandbox = measured(rows, key), measured(rows, "singpy")
    if value is None or sandbox is None:
        reason = rows[key].na if key in rows else "not measured"
        return {"target": name, "value": "n/a", "met": None, "margin": reason}
    delta = value - sandbox
    met = delta <= TARGET_DELTA_MS
    mode, kind = rows[key].extra.get("mode", ""), rows[key].extra.get("kind")
    expected = EXPECTED_IMAGE_MODE.get(key)
    shown = f"{delta:+.1f} ms" + (f" (but: {mode})" if expected and mode and kind != expected else "")
    return {"target": name, "value": shown, "met": met,
            "margin": f"{abs(TARGET_DELTA_MS - delta):.1f} ms {'to spare' if met else 'over'}"}


def imports_target(forbidden_found: list[str] | None, typer_ms: float | None) -> Target:
    """Target 4: nothing forbidden on the exec path."""
    if forbidden_found is None:
        return {"target": "no typer/click/rich/pyroute2/prctl/SIF writer on the exec path", "value": "n/a",
                "met": None, "margin": "import profile failed"}
    typer_note = f"; typer's import ({fmt(typer_ms)} ms here) is avoided" if typer_ms is not None else ""
    return {"target": "no typer/click/rich/pyroute2/prctl/SIF writer (nor dataclasses, typing, "
                      "pathlib, json) on the exec path",
            "value": ", ".join(forbidden_found) or "none imported", "met": not forbidden_found,
            "margin": f"{len(forbidden_found)} forbidden modules{typer_note}"}


def all_targets(rows: dict[str, Row], imports: Imports) -> list[Target]:
    """The four targets, plus one missed target per flag or SIF run that imports a forbidden module."""
    typer, python = measured(rows, "typer"), measured(rows, "python")
    typer_ms = typer - python if typer is not None and python is not None else None
    targets = evaluate(rows, imports.forbidden, typer_ms)
    for label, extra in imports.extras.items():
        if extra["forbidden"]:
            targets.append({"target": f"nothing forbidden imported by {label}",
                            "value": ", ".join(extra["forbidden"]), "met": False, "margin": ""})
    return targets


# --- report -----------------------------------------------------------------------------------------


def table(rows: list[Row], python: float | None, sandbox: float | None) -> list[str]:
    lines = ["| row | command | median ms | p25-p75 ms | x python | vs sandbox ms | peak RSS MiB |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.key.startswith("mod-"):
            continue
        if row.na:
            lines.append(f"| {row.label} | `{row.display}` | n/a ({row.na}) | | | | |")
            continue
        median = row.median
        assert median is not None
        quart = row.quartiles()
        spread = f"{quart[0]:.1f}-{quart[1]:.1f}" if quart else ""
        ratio = f"{median / python:.2f}" if python else ""
        delta = f"{median - sandbox:+.1f}" if sandbox is not None and row.key != "singpy" else ""
        rss = f"{statistics.median(row.rss) / 1024:.1f}" if row.rss else ""
        fails = f" ({row.failures} failed)" if row.failures else ""
        lines.append(f"| {row.label} | `{row.display}` | **{median:.1f}**{fails} | {spread} | {ratio} | {delta} "
                     f"| {rss} |")
    return lines


def import_section(imports: Imports) -> list[str]:
    profile = imports.plain
    if profile is None:
        return ["The import profile could not be taken (`singpy exec` failed under `-X importtime`)."]
    modules = profile.modules
    lines = [f"{profile.count} modules imported, {float(profile.total_us) / 1000:.1f} ms of import time in all "
             "(sum of self times, median of the runs; the interpreter's own start-up modules included).", "",
             "| module | self ms | cumulative ms |", "|---|---:|---:|"]
    for name, (self_us, cum_us) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:15]:
        lines.append(f"| `{name}` | {self_us / 1000:.2f} | {cum_us / 1000:.2f} |")
    singpy = sorted(((n, v) for n, v in modules.items() if n.startswith("singpy")), key=lambda kv: -kv[1][0])
    own = sum(v[0] for _, v in singpy) / 1000
    lines += ["", f"singpy's own modules: {len(singpy)}, {own:.1f} ms self time in all."]
    for label, extra in imports.extras.items():
        names = extra["modules"]
        cost = float(extra["self_us"]) / 1000
        shown = ", ".join(f"`{n}`" for n in names[:25]) + (" ..." if len(names) > 25 else "")
        lines.append(f"\nImported in addition by {label}: {len(names)} modules, {cost:.1f} ms self time"
                     + (f": {shown}" if names else ""))
    return lines


def machine_section(run: RunInfo) -> list[str]:
    """The title, and the machine and the conditions of the run."""
    info = run.machine
    return ["# Start-up performance", "",
            "Generated by `make bench` (`benchmarks/startup.py`; what each row means: "
            "[benchmarks/README.md](../benchmarks/README.md)). Do not edit by hand.", "",
            "## Machine", "",
            f"- date: {run.now.strftime('%Y-%m-%d %H:%M UTC')}; commit {run.commit}"
            f"{' (with uncommitted changes)' if run.dirty else ''}",
            f"- CPU: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable); memory {info['memory']}",
            f"- kernel {info['kernel']}; {info['distro']}; Python {info['python']}",
            f"- {info['ch-run']}; {info['bwrap']}; {info['squashfuse']}",
            f"- load average at start {tuple(round(x, 2) for x in info['loadavg_start'])}, "
            f"at end {tuple(round(x, 2) for x in info['loadavg_end'])}",
            f"- commands run as {run.who}; {run.rounds} rounds, every command once per round in shuffled order",
            f"- GPU host: {run.gpu_note}", ""]


def timing_section(rows: list[Row], python: float | None, sandbox: float | None) -> list[str]:
    return ["## Start-up time", "",
            "Wall time from spawn to exit as seen by the parent, median of the rounds; `x python` is the ratio to "
            "`python3 -c pass` (the same interpreter singpy runs on), `vs sandbox` the difference to "
            "`singpy exec SANDBOX true`; peak RSS is `ru_maxrss` as GNU time reports it, in a separate pass (for "
            "singpy: the launcher's Python process, which the payload replaces by exec, and with --pid the "
            "namespace's init too).", "", *table(rows, python, sandbox)]


def targets_section(targets: list[Target]) -> list[str]:
    lines = ["", "## Targets", "", "| target | measured | met | margin |", "|---|---|---|---|"]
    for target in targets:
        met = {True: "met", False: "**missed**", None: "n/a"}[target["met"]]
        lines.append(f"| {target['target']} | {target['value']} | {met} | {target['margin']} |")
    return [*lines, "", "What would close a missed target, and the costs measured on the way there: "
            "[benchmarks/README.md](../benchmarks/README.md#closing-the-gaps)."]


def stdlib_section(rows: list[Row], python: float | None) -> list[str]:
    """The `import X` rows as costs over `python3 -c pass`; nothing when they could not be measured."""
    modules = [row for row in rows if row.key.startswith("mod-") and not row.na]
    if not (modules and python):
        return []
    lines = ["", "## What standard-library modules would cost", "",
             "`python3 -c 'import X'` minus `python3 -c pass`, medians of the same rounds: why the exec path "
             "avoids `dataclasses`, `typing`, `pathlib` and `json`, and imports `subprocess`, `shutil` and `re` "
             "only when a flag needs them.", "", "| module | ms |", "|---|---:|"]
    for row in sorted(modules, key=lambda r: r.median or 0):
        lines.append(f"| `{row.label.removeprefix('import ')}` | {(row.median or 0) - python:+.1f} |")
    return lines


def memory_section(rows: dict[str, Row]) -> list[str]:
    lines = ["", "## Peak memory", "", "Peak RSS (`/usr/bin/time -f %M`, median of 3 runs) of the process tree "
             "started by the command:", ""]
    for key in ("true", "python", "singpy", "nv", "nv-liblist", "containall", "sif-fuse", "chrun", "bwrap",
                "typer-path"):
        row = rows.get(key)
        if row and not row.na and row.rss:
            lines.append(f"- {row.label}: {statistics.median(row.rss) / 1024:.1f} MiB")
    return lines


def render(run: RunInfo, rows: list[Row], targets: list[Target], imports: list[str]) -> str:
    """docs/performance.md."""
    by_key = {row.key: row for row in rows}
    python, sandbox = measured(by_key, "python"), measured(by_key, "singpy")
    lines = [*machine_section(run), *timing_section(rows, python, sandbox), *targets_section(targets),
             *stdlib_section(rows, python)]
    lines += ["", "## Import time of the exec path", "",
              "`python -X importtime .venv/bin/singpy exec SANDBOX true`, the 15 heaviest modules by self time:", ""]
    lines += imports
    lines += memory_section(by_key)
    lines.append("")
    return "\n".join(lines)


def results_document(run: RunInfo, rows: list[Row], targets: list[Target], imports: Imports) -> ResultsDocument:
    """benchmarks/results/DATE-COMMIT.json: every sample, for comparison between commits."""
    plain = imports.plain
    return {
        "date": run.now.isoformat(timespec="seconds"), "commit": run.commit, "dirty": run.dirty,
        "rounds": run.rounds, "machine": run.machine, "user": run.who, "gpu_host": run.gpu_note,
        "rows": [{"key": r.key, "label": r.label, "command": r.display, "na": r.na or None,
                  "median_ms": r.median, "quartiles_ms": r.quartiles(), "failures": r.failures,
                  "rss_kib_median": statistics.median(r.rss) if r.rss else None,
                  "times_ms": [round(t, 3) for t in r.times]} for r in rows],
        "targets": targets,
        "imports": None if plain is None else {
            "count": plain.count, "total_ms": float(plain.total_us) / 1000,
            "modules": {n: {"self_ms": v[0] / 1000, "cumulative_ms": v[1] / 1000} for n, v in plain.modules.items()},
            "forbidden_found": imports.forbidden, "extras": imports.extras},
    }


def write_results(run: RunInfo, report: str, document: ResultsDocument) -> None:
    (REPO / "docs").mkdir(exist_ok=True)
    doc = REPO / "docs" / "performance.md"
    old = doc.read_text() if doc.exists() else ""
    starts = [at for marker in KEPT_MARKERS if (at := old.find(marker)) >= 0]
    doc.write_text(report + ("\n" + old[min(starts):].rstrip("\n") + "\n" if starts else ""))
    results = REPO / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{run.now.strftime('%Y-%m-%d')}-{run.commit}{'-dirty' if run.dirty else ''}.json"
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"\nwrote docs/performance.md and {out.relative_to(REPO)}", file=sys.stderr)


def compare(old_path: str, rows: list[Row]) -> None:
    with open(old_path) as handle:
        old = json.load(handle)
    old_rows = {row["key"]: row for row in old["rows"]}
    old_python = old_rows.get("python", {}).get("median_ms")
    new = {row.key: row for row in rows}
    python = new["python"].median if not new["python"].na else None
    print(f"\nCompared with {old_path} (commit {old.get('commit')}), as ratios to python3 -c pass:")
    for row in rows:
        before = old_rows.get(row.key, {}).get("median_ms")
        if row.na or before is None or not old_python or not python:
            continue
        assert row.median is not None
        print(f"  {row.label:<44} {before / old_python:6.2f}x -> {row.median / python:6.2f}x")


# --- the rows ---------------------------------------------------------------------------------------


def make_rows(singpy: str, python: str, images: Images, cache: Path, gpu: GpuSetup) -> list[Row]:
    """Every row, in the table's order; a row whose tool is not installed is n/a."""
    env = {"SINGPY_CONFIG": str(images.confs["default"]), "SINGPY_CACHEDIR": str(cache)}
    rows = [*reference_rows(singpy, python, str(images.sandbox), env), *variant_rows(singpy, images, env, gpu)]
    rows += [Row(f"mod-{name}", f"import {name}", [python, "-c", f"import {name}"],
                 display=f"python3 -c 'import {name}'") for name in STDLIB]
    packages = {"ch-run": "charliecloud-runtime", "bwrap": "bubblewrap"}
    for row in rows:
        if row.argv[0] in packages and shutil.which(row.argv[0]) is None:
            row.na = f"{row.argv[0]} not installed (Debian {packages[row.argv[0]]})"
    return rows


def reference_rows(singpy: str, python: str, sb: str, env: dict[str, str]) -> list[Row]:
    """The floors, the plain exec and the other launchers."""
    bwrap = ["bwrap", "--unshare-user", "--bind", sb, "/", "--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc",
             "--ro-bind", "/sys", "/sys", "--bind", "/tmp", "/tmp", "--", "true"]
    return [
        Row("true", "spawn floor (/bin/true on the host)", ["/bin/true"]),
        Row("python", "python3 -c pass (interpreter floor)", [python, "-c", "pass"], display="python3 -c pass"),
        Row("typer", "python3 -c 'import typer' (CLI framework)", [python, "-c", "import typer"],
            display="python3 -c 'import typer'"),
        Row("version", "singpy --version (fast parser, no container)", [singpy, "--version"], env=env,
            display="singpy --version"),
        Row("singpy", "singpy exec SANDBOX true", [singpy, "exec", sb, "true"], env=env,
            display="singpy exec SANDBOX true"),
        Row("chrun", "ch-run SANDBOX -- true", ["ch-run", sb, "--", "true"], display="ch-run SANDBOX -- true"),
        Row("bwrap", "bwrap, user+mount namespaces", bwrap,
            display="bwrap --unshare-user --bind SANDBOX / --dev-bind /dev /dev --bind /proc /proc "
                    "--ro-bind /sys /sys --bind /tmp /tmp -- true"),
    ]


def variant_rows(singpy: str, images: Images, env: dict[str, str], gpu: GpuSetup) -> list[Row]:
    """singpy exec with a SIF, --nv, --device and the isolation flags, then the typer path."""
    gpu_reason = gpu.reason
    cache_env = {**env, "SINGPY_CONFIG": str(images.confs["unsquash"])}
    liblist_env = {**env, "SINGPY_CONFIG": str(images.confs["liblist"])}
    sb, sif, sif_reason = str(images.sandbox), str(images.sif), images.sif_reason
    return [
        Row("sif-fuse", "singpy exec SIF true (squashfuse)", [singpy, "exec", sif, "true"], env=env,
            display="singpy exec SIF true", na=sif_reason),
        Row("sif-cache", "singpy exec SIF true (extraction cache)", [singpy, "exec", sif, "true"],
            env=cache_env, display="singpy exec SIF true  # unsquash = yes", na=sif_reason),
        Row("nv", "singpy exec --nv (nvidia-container-cli)", [singpy, "exec", "--nv", sb, "true"], env=env,
            display="singpy exec --nv SANDBOX true", na=gpu_reason),
        Row("nv-liblist", "singpy exec --nv (nvliblist.conf + ld cache)", [singpy, "exec", "--nv", sb, "true"],
            env=liblist_env, display="singpy exec --nv SANDBOX true  # use nvidia-container-cli = no",
            na=gpu_reason),
        Row("cdi", "singpy exec --device nvidia.com/gpu=all (CDI)",
            [singpy, "exec", "--cdi-dirs", gpu.cdi_dir, "--device", "nvidia.com/gpu=all", sb, "true"], env=env,
            display="singpy exec --device nvidia.com/gpu=all SANDBOX true", na=gpu_reason),
        Row("contain", "singpy exec --contain", [singpy, "exec", "--contain", sb, "true"], env=env,
            display="singpy exec --contain SANDBOX true"),
        Row("containall", "singpy exec --containall", [singpy, "exec", "--containall", sb, "true"], env=env,
            display="singpy exec --containall SANDBOX true"),
        Row("writable-tmpfs", "singpy exec --writable-tmpfs", [singpy, "exec", "--writable-tmpfs", sb, "true"],
            env=env, display="singpy exec --writable-tmpfs SANDBOX true"),
        Row("typer-path", "singpy version (typer path, off the hot path)", [singpy, "version"], env=env,
            display="singpy version"),
    ]


def nv_summary(runner: Runner, singpy: str, sandbox: Path, env: dict[str, str] | None) -> str:
    """What --nv binds on the simulated host, from the dry-run report."""
    done = runner.capture([singpy, "exec", "--nv", "--dry-run", str(sandbox), "true"], env)
    try:
        report = json.loads(done.stdout)
        gpu = report["gpu"]
        return (f"{len(gpu['libraries'])} library files, {len(gpu['devices'])} device nodes and "
                f"{len(gpu['binaries'])} tool(s)")
    except (ValueError, KeyError, TypeError):
        return "dry-run report unreadable"


# --- the phases of a run ----------------------------------------------------------------------------


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


def choose_account(as_root: bool) -> Account:
    """As root the test user (what HPC users are) unless `as_root`; without root, whoever runs the benchmark."""
    if os.geteuid() == 0 and not as_root:
        from tests.support.users import ensure_test_user

        entry = ensure_test_user()
    else:
        import pwd

        entry = pwd.getpwuid(os.geteuid())
    return Account(uid=entry.pw_uid, gid=entry.pw_gid, user=entry.pw_name, home=entry.pw_dir)


def prepare_images(workdir: Path) -> Images:
    print(f"building images in {workdir} ...", file=sys.stderr)
    sandbox = build_sandbox(workdir)
    sif, sif_reason = build_sif(workdir, sandbox)
    confs = {"default": write_conf(workdir / "conf"),
             "unsquash": write_conf(workdir / "conf-unsquash", "unsquash = yes\n"),
             "liblist": write_conf(workdir / "conf-liblist", "use nvidia-container-cli = no\n")}
    return Images(sandbox=sandbox, sif=sif, sif_reason=sif_reason, confs=confs)


def prepare_gpu_host(workdir: Path, wanted: bool) -> GpuSetup:
    """Build the simulated GPU host and enter it (this process's own mount namespace), if wanted and possible."""
    if not wanted:
        return GpuSetup(path=DEFAULT_PATH, reason="--no-gpu-host", note="not simulated (--no-gpu-host)")
    print("building the simulated GPU host ...", file=sys.stderr)
    host, reason = build_gpu_host(workdir)
    if host is None:
        return GpuSetup(path=DEFAULT_PATH, reason=reason, note=f"not simulated: {reason}")
    cdi_dir = write_cdi_spec(workdir / "cdi", host)
    enter_gpu_host(host)
    return GpuSetup(path=f"{host.bin_dir}:{DEFAULT_PATH}", reason="", note="", cdi_dir=str(cdi_dir))


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


def gpu_host_note(runner: Runner, singpy: str, sandbox: Path, rows: dict[str, Row], gpu: GpuSetup) -> str:
    """The report's "GPU host" line; with the host in place, what each --nv mode binds there."""
    if gpu.reason:
        return gpu.note
    if rows["nv"].na and rows["nv-liblist"].na:
        return "simulated, but `singpy exec --nv` fails there (see the table)"
    return ("simulated (tests/gpu/simhost.py, 4 GPUs, one gcc-built stand-in per nvliblist.conf "
            "library), in place of /dev and /etc/ld.so.cache for every row; --nv binds "
            f"{nv_summary(runner, singpy, sandbox, rows['nv'].env)} through nvidia-container-cli, "
            f"{nv_summary(runner, singpy, sandbox, rows['nv-liblist'].env)} through nvliblist.conf")


def time_rows(runner: Runner, rows: list[Row], options: Options, workdir: Path) -> None:
    """The timed rounds, then the peak-RSS pass."""
    print(f"measuring {sum(not r.na for r in rows)} commands x {options.rounds} rounds ...", file=sys.stderr)
    measure(runner, rows, options.rounds, warmup=2, seed=options.seed)
    scratch = workdir / "scratch"
    scratch.mkdir(mode=0o1777)
    scratch.chmod(0o1777)
    measure_rss(runner, rows, 3, scratch)


def profile_imports(runner: Runner, python: str, singpy: str, images: Images, rows: dict[str, Row],
                    runs: int) -> Imports:
    """The plain exec's import profile (`runs` runs) and what the flags and a SIF import on top of it."""
    print("import profiles ...", file=sys.stderr)
    plain = import_profile(runner, python, [singpy, "exec", str(images.sandbox), "true"], rows["singpy"].env, runs)
    if plain is None:
        return Imports(plain=None, extras={}, forbidden=None)
    extras = import_extras(runner, python, singpy, images, rows, set(plain.modules))
    return Imports(plain=plain, extras=extras, forbidden=forbidden_in(plain.modules, FORBIDDEN_PLAIN))


def import_extras(runner: Runner, python: str, singpy: str, images: Images, rows: dict[str, Row],
                  base: set[str]) -> dict[str, ImportExtra]:
    """The modules beyond `base` that each measured --nv, SIF and --containall row imports (one run each)."""
    sandbox, sif = str(images.sandbox), str(images.sif)
    extras: dict[str, ImportExtra] = {}
    for key, flagged in (("nv", ["--nv", sandbox]), ("nv-liblist", ["--nv", sandbox]), ("sif-fuse", [sif]),
                         ("sif-cache", [sif]), ("containall", ["--containall", sandbox])):
        if rows[key].na:
            continue
        other = import_profile(runner, python, [singpy, "exec", *flagged, "true"], rows[key].env, 1)
        if other is None:
            continue
        new = [name for name in other.modules if name not in base]
        extras[rows[key].label] = {"modules": new, "self_us": sum(other.modules[name][0] for name in new),
                                   "forbidden": forbidden_in(new, FORBIDDEN_ALWAYS)}
    return extras


def benchmark(options: Options, info: Machine, workdir: Path, singpy: str, python: str) -> None:
    """Everything after the checks: set up, measure, report, in `workdir` (which the caller removes)."""
    account = choose_account(options.as_root)
    images = prepare_images(workdir)
    gpu = prepare_gpu_host(workdir, options.gpu_host)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(workdir), gpu.path)
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


def venv_commands() -> tuple[str, str] | None:
    """The venv's `singpy` and `python` (every benchmark runs them); None, said on stderr, without them."""
    bindir = Path(sys.executable).parent
    singpy, python = str(bindir / "singpy"), str(bindir / "python")
    if not os.path.exists(singpy):
        print(f"{singpy} not found: run `make setup` (or use the venv's python)", file=sys.stderr)
        return None
    return singpy, python


def fresh_bytecode(python: str) -> None:
    """singpy's bytecode up to date and readable by the test user, as `make setup` leaves it.

    A stale .pyc would be recompiled on every run (the test user cannot write
    __pycache__), and so would one it cannot read: Python writes a .pyc with
    the umask of the process that first imported the module (a test that runs
    singpy as root under umask 077 leaves it 0600). That time is not singpy's.
    """
    subprocess.run([python, "-m", "compileall", "-q", str(REPO / "singpy")], check=False)
    for compiled in (REPO / "singpy").rglob("*.pyc"):
        mode = compiled.stat().st_mode
        if mode & 0o044 != 0o044:
            compiled.chmod(mode | 0o044)


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

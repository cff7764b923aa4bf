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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Modules that must not be imported by a plain `singpy exec` (docs/performance.md, tests/unit/test_hot_path_imports.py).
FORBIDDEN_ALWAYS = ("typer", "click", "rich", "pyroute2", "prctl", "singpy.image.sifwrite")
FORBIDDEN_PLAIN = (*FORBIDDEN_ALWAYS, "dataclasses", "typing", "pathlib", "json")

# Standard-library modules the launcher keeps off its hot path (or imports only when a flag needs them);
# `python3 -c "import X"` runs beside the others so the doc can say what each would cost.
STDLIB = ("enum", "signal", "re", "shutil", "subprocess", "ctypes", "json", "pathlib", "typing", "dataclasses")
TIME = "/usr/bin/time"  # GNU time (Debian `time`), for peak RSS
TARGET_RATIO = 3.0  # singpy exec SANDBOX true <= 3x python3 -c pass
TARGET_DELTA_MS = 10.0  # SIF (squashfuse or cache) and --nv: <= 10 ms over the sandbox


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
        self.extra: dict[str, object] = {}

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    def quartiles(self) -> tuple[float, float] | None:
        if len(self.times) < 4:
            return None
        q = statistics.quantiles(self.times, n=4)
        return q[0], q[2]


# --- running commands -------------------------------------------------------------------------------


class Runner:
    """Starts commands as one user, in one directory, and times them from spawn to exit."""

    def __init__(self, uid: int, gid: int, user: str, home: str, cwd: str, path: str) -> None:
        self.uid, self.gid, self.user, self.home, self.cwd = uid, gid, user, home, cwd
        self.base_env = {"HOME": home, "USER": user, "LOGNAME": user, "PATH": path, "LANG": "C.UTF-8",
                         "TERM": "dumb"}

    def _cred(self) -> dict[str, object]:
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {**self.base_env, **(extra or {})}

    def timed(self, argv: list[str], extra: dict[str, str] | None = None) -> tuple[float, int]:
        """(milliseconds, exit status) of one run, output discarded."""
        env = self.env(extra)
        start = time.perf_counter_ns()
        proc = subprocess.Popen(argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, **self._cred())  # type: ignore[call-overload]
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
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL,
                              **self._cred())  # type: ignore[call-overload]


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
    modules = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            modules[parts[2].strip()] = (int(parts[0]), int(parts[1]))
    return modules


def forbidden_in(modules: object, forbidden: tuple[str, ...]) -> list[str]:
    names = list(modules)  # type: ignore[call-overload]
    return sorted(name for name in names for bad in forbidden if name == bad or name.startswith(bad + "."))


def import_profile(runner: Runner, python: str, argv: list[str], env: dict[str, str] | None,
                   runs: int) -> dict[str, object] | None:
    """Median self/cumulative import time per module over `runs` runs of `python -X importtime argv`."""
    samples = []
    for _ in range(runs):
        done = runner.capture([python, "-X", "importtime", *argv], env)
        if done.returncode != 0:
            return None
        samples.append(parse_importtime(done.stderr))
    names = list(samples[0])
    modules = {}
    for name in names:
        selfs = [s[name][0] for s in samples if name in s]
        cums = [s[name][1] for s in samples if name in s]
        modules[name] = (statistics.median(selfs), statistics.median(cums))
    total = statistics.median(sum(v[0] for v in s.values()) for s in samples)
    return {"modules": modules, "total_us": total, "count": len(names)}


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


def build_gpu_host(workdir: Path) -> tuple[object | None, str]:
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


def enter_gpu_host(host: object) -> None:
    """Put the simulated host in place of this machine's /dev and ld.so.cache, for this process and its children.

    tests/gpu/simrun.py makes the private mount namespace; /dev/fuse is added so that squashfuse still works.
    """
    from tests.gpu.simrun import simulate

    fuse = os.stat("/dev/fuse").st_rdev if os.path.exists("/dev/fuse") else None
    simulate(str(host.root))  # type: ignore[attr-defined]
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


def machine() -> dict[str, object]:
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


# --- report -----------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def evaluate(rows: dict[str, Row], forbidden_found: list[str] | None, typer_ms: float | None) -> list[dict]:
    """Each target: met / missed / n/a, with the measured value and the margin."""
    def med(key: str) -> float | None:
        row = rows.get(key)
        return row.median if row and not row.na else None

    targets = []
    sandbox, python = med("singpy"), med("python")
    if sandbox is not None and python is not None:
        ratio = sandbox / python
        targets.append({"target": f"`singpy exec SANDBOX true` <= {TARGET_RATIO:g}x `python3 -c pass`",
                        "value": f"{ratio:.2f}x ({sandbox:.1f} ms vs {python:.1f} ms)", "met": ratio <= TARGET_RATIO,
                        "margin": f"{abs(TARGET_RATIO * python - sandbox):.1f} ms "
                                  f"({'under' if ratio <= TARGET_RATIO else 'over'} {TARGET_RATIO * python:.1f} ms)"})
    else:
        targets.append({"target": f"`singpy exec SANDBOX true` <= {TARGET_RATIO:g}x `python3 -c pass`",
                        "value": "n/a", "met": None, "margin": rows["singpy"].na or rows["python"].na})
    for key, what in (("sif-fuse", "SIF mounted with squashfuse"), ("sif-cache", "SIF from the extraction cache"),
                      ("nv", "`--nv` (~70 libraries, listed by nvidia-container-cli)"),
                      ("nv-liblist", "`--nv` (~70 libraries, nvliblist.conf + ld cache)")):
        value = med(key)
        name = f"{what} adds <= {TARGET_DELTA_MS:g} ms over the sandbox"
        if value is None or sandbox is None:
            reason = rows[key].na if key in rows else "not measured"
            targets.append({"target": name, "value": "n/a", "met": None, "margin": reason})
            continue
        delta = value - sandbox
        met = delta <= TARGET_DELTA_MS
        mode, kind = str(rows[key].extra.get("mode", "")), rows[key].extra.get("kind")
        expected = {"sif-fuse": "fuse", "sif-cache": "extract"}.get(key)
        shown = f"{delta:+.1f} ms" + (f" (but: {mode})" if expected and mode and kind != expected else "")
        targets.append({"target": name, "value": shown, "met": met,
                        "margin": f"{abs(TARGET_DELTA_MS - delta):.1f} ms {'to spare' if met else 'over'}"})
    if forbidden_found is None:
        targets.append({"target": "no typer/click/rich/pyroute2/prctl/SIF writer on the exec path", "value": "n/a",
                        "met": None, "margin": "import profile failed"})
    else:
        typer_note = f"; typer's import ({fmt(typer_ms)} ms here) is avoided" if typer_ms is not None else ""
        targets.append({"target": "no typer/click/rich/pyroute2/prctl/SIF writer (nor dataclasses, typing, "
                                  "pathlib, json) on the exec path",
                        "value": ", ".join(forbidden_found) or "none imported", "met": not forbidden_found,
                        "margin": f"{len(forbidden_found)} forbidden modules{typer_note}"})
    return targets


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


def import_section(profile: dict[str, object] | None, extras: dict[str, dict[str, object]]) -> list[str]:
    if profile is None:
        return ["The import profile could not be taken (`singpy exec` failed under `-X importtime`)."]
    modules: dict[str, tuple[float, float]] = profile["modules"]  # type: ignore[assignment]
    lines = [f"{profile['count']} modules imported, {float(profile['total_us']) / 1000:.1f} ms of import time in all "
             "(sum of self times, median of the runs; the interpreter's own start-up modules included).", "",
             "| module | self ms | cumulative ms |", "|---|---:|---:|"]
    for name, (self_us, cum_us) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:15]:
        lines.append(f"| `{name}` | {self_us / 1000:.2f} | {cum_us / 1000:.2f} |")
    singpy = sorted(((n, v) for n, v in modules.items() if n.startswith("singpy")), key=lambda kv: -kv[1][0])
    own = sum(v[0] for _, v in singpy) / 1000
    lines += ["", f"singpy's own modules: {len(singpy)}, {own:.1f} ms self time in all."]
    for label, extra in extras.items():
        names: list[str] = extra["modules"]  # type: ignore[assignment]
        cost = float(extra["self_us"]) / 1000  # type: ignore[arg-type]
        shown = ", ".join(f"`{n}`" for n in names[:25]) + (" ..." if len(names) > 25 else "")
        lines.append(f"\nImported in addition by {label}: {len(names)} modules, {cost:.1f} ms self time"
                     + (f": {shown}" if names else ""))
    return lines


def render(info: dict[str, object], rows: list[Row], targets: list[dict], imports: list[str],
           rounds: int, commit: str, dirty: bool, date: str, who: str, gpu_note: str) -> str:
    by_key = {row.key: row for row in rows}
    python = by_key["python"].median if not by_key["python"].na else None
    sandbox = by_key["singpy"].median if not by_key["singpy"].na else None
    lines = ["# Start-up performance", "",
             "Generated by `make bench` (`benchmarks/startup.py`; what each row means: "
             "[benchmarks/README.md](../benchmarks/README.md)). Do not edit by hand.", "",
             "## Machine", "",
             f"- date: {date}; commit {commit}{' (with uncommitted changes)' if dirty else ''}",
             f"- CPU: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable); memory {info['memory']}",
             f"- kernel {info['kernel']}; {info['distro']}; Python {info['python']}",
             f"- {info['ch-run']}; {info['bwrap']}; {info['squashfuse']}",
             f"- load average at start {tuple(round(x, 2) for x in info['loadavg_start'])}, "  # type: ignore[attr-defined]
             f"at end {tuple(round(x, 2) for x in info['loadavg_end'])}",  # type: ignore[attr-defined]
             f"- commands run as {who}; {rounds} rounds, every command once per round in shuffled order",
             f"- GPU host: {gpu_note}", "",
             "## Start-up time", "",
             "Wall time from spawn to exit as seen by the parent, median of the rounds; `x python` is the ratio to "
             "`python3 -c pass` (the same interpreter singpy runs on), `vs sandbox` the difference to "
             "`singpy exec SANDBOX true`; peak RSS is `ru_maxrss` as GNU time reports it, in a separate pass (for "
             "singpy: the launcher's Python process, which the payload replaces by exec, and with --pid the "
             "namespace's init too).", ""]
    lines += table(rows, python, sandbox)
    lines += ["", "## Targets", "", "| target | measured | met | margin |", "|---|---|---|---|"]
    for target in targets:
        met = {True: "met", False: "**missed**", None: "n/a"}[target["met"]]
        lines.append(f"| {target['target']} | {target['value']} | {met} | {target['margin']} |")
    lines += ["", "What would close a missed target, and the costs measured on the way there: "
              "[benchmarks/README.md](../benchmarks/README.md#closing-the-gaps)."]
    modules = [row for row in rows if row.key.startswith("mod-") and not row.na]
    if modules and python:
        lines += ["", "## What standard-library modules would cost", "",
                  "`python3 -c 'import X'` minus `python3 -c pass`, medians of the same rounds: why the exec path "
                  "avoids `dataclasses`, `typing`, `pathlib` and `json`, and imports `subprocess`, `shutil` and `re` "
                  "only when a flag needs them.", "", "| module | ms |", "|---|---:|"]
        for row in sorted(modules, key=lambda r: r.median or 0):
            lines.append(f"| `{row.label.removeprefix('import ')}` | {(row.median or 0) - python:+.1f} |")
    lines += ["", "## Import time of the exec path", "",
              "`python -X importtime .venv/bin/singpy exec SANDBOX true`, the 15 heaviest modules by self time:", ""]
    lines += imports
    lines += ["", "## Peak memory", "", "Peak RSS (`/usr/bin/time -f %M`, median of 3 runs) of the process tree "
              "started by the command:", ""]
    for key in ("true", "python", "singpy", "nv", "nv-liblist", "containall", "sif-fuse", "chrun", "bwrap",
                "typer-path"):
        row = by_key.get(key)
        if row and not row.na and row.rss:
            lines.append(f"- {row.label}: {statistics.median(row.rss) / 1024:.1f} MiB")
    lines.append("")
    return "\n".join(lines)


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


# --- main -------------------------------------------------------------------------------------------


def make_rows(singpy: str, python: str, sandbox: Path, sif: Path | None, sif_reason: str, confs: dict[str, Path],
              cache: Path, gpu_reason: str) -> list[Row]:
    env = {"SINGPY_CONFIG": str(confs["default"]), "SINGPY_CACHEDIR": str(cache)}
    cache_env = {**env, "SINGPY_CONFIG": str(confs["unsquash"])}
    liblist_env = {**env, "SINGPY_CONFIG": str(confs["liblist"])}
    sb = str(sandbox)
    bwrap = ["bwrap", "--unshare-user", "--bind", sb, "/", "--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc",
             "--ro-bind", "/sys", "/sys", "--bind", "/tmp", "/tmp", "--", "true"]
    rows = [
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
        Row("sif-fuse", "singpy exec SIF true (squashfuse)", [singpy, "exec", str(sif), "true"], env=env,
            display="singpy exec SIF true", na=sif_reason),
        Row("sif-cache", "singpy exec SIF true (extraction cache)", [singpy, "exec", str(sif), "true"],
            env=cache_env, display="singpy exec SIF true  # unsquash = yes", na=sif_reason),
        Row("nv", "singpy exec --nv (nvidia-container-cli)", [singpy, "exec", "--nv", sb, "true"], env=env,
            display="singpy exec --nv SANDBOX true", na=gpu_reason),
        Row("nv-liblist", "singpy exec --nv (nvliblist.conf + ld cache)", [singpy, "exec", "--nv", sb, "true"],
            env=liblist_env, display="singpy exec --nv SANDBOX true  # use nvidia-container-cli = no",
            na=gpu_reason),
        Row("contain", "singpy exec --contain", [singpy, "exec", "--contain", sb, "true"], env=env,
            display="singpy exec --contain SANDBOX true"),
        Row("containall", "singpy exec --containall", [singpy, "exec", "--containall", sb, "true"], env=env,
            display="singpy exec --containall SANDBOX true"),
        Row("writable-tmpfs", "singpy exec --writable-tmpfs", [singpy, "exec", "--writable-tmpfs", sb, "true"],
            env=env, display="singpy exec --writable-tmpfs SANDBOX true"),
        Row("typer-path", "singpy version (typer path, off the hot path)", [singpy, "version"], env=env,
            display="singpy version"),
    ]
    rows += [Row(f"mod-{name}", f"import {name}", [python, "-c", f"import {name}"],
                 display=f"python3 -c 'import {name}'") for name in STDLIB]
    packages = {"ch-run": "charliecloud-runtime", "bwrap": "bubblewrap"}
    for row in rows:
        if row.argv[0] in packages and shutil.which(row.argv[0]) is None:
            row.na = f"{row.argv[0]} not installed (Debian {packages[row.argv[0]]})"
    return rows


def nv_summary(runner: Runner, singpy: str, sandbox: Path, env: dict[str, str]) -> str:
    """What --nv binds on the simulated host, from the dry-run report."""
    done = runner.capture([singpy, "exec", "--nv", "--dry-run", str(sandbox), "true"], env)
    try:
        report = json.loads(done.stdout)
        gpu = report["gpu"]
        return (f"{len(gpu['libraries'])} library files, {len(gpu['devices'])} device nodes and "
                f"{len(gpu['binaries'])} tool(s)")
    except (ValueError, KeyError, TypeError):
        return "dry-run report unreadable"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="singpy start-up benchmark (issue 3)")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="8 rounds, 3 import profiles: a smoke run")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--no-gpu-host", action="store_true", help="measure on this host as it is: --nv is n/a")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--compare", metavar="JSON", help="an earlier results file to compare ratios with")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rounds = 8 if args.quick and args.rounds == 30 else args.rounds
    profile_runs = 3 if args.quick else 7
    bindir = Path(sys.executable).parent
    singpy, python = str(bindir / "singpy"), str(bindir / "python")
    if not os.path.exists(singpy):
        print(f"{singpy} not found: run `make setup` (or use the venv's python)", file=sys.stderr)
        return 1

    # Fresh bytecode, as `make setup` leaves it: a stale .pyc would be recompiled on every run (the test user
    # cannot write __pycache__), and that compile time is not singpy's.
    subprocess.run([python, "-m", "compileall", "-q", str(REPO / "singpy")], check=False)
    info = machine()
    workdir = Path(tempfile.mkdtemp(prefix="singpy-bench-", dir="/tmp"))
    workdir.chmod(0o755)
    try:
        if os.geteuid() == 0 and not args.as_root:
            from tests.support.users import ensure_test_user

            entry = ensure_test_user()
            uid, gid, user, home = entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir
        else:
            import pwd

            entry = pwd.getpwuid(os.geteuid())
            uid, gid, user, home = entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir
        who = f"{user} (uid {uid}{', user namespaces' if uid else ', no user namespace'})"
        print(f"building images in {workdir} ...", file=sys.stderr)
        sandbox = build_sandbox(workdir)
        sif, sif_reason = build_sif(workdir, sandbox)
        confs = {"default": write_conf(workdir / "conf"),
                 "unsquash": write_conf(workdir / "conf-unsquash", "unsquash = yes\n"),
                 "liblist": write_conf(workdir / "conf-liblist", "use nvidia-container-cli = no\n")}
        path = "/usr/local/bin:/usr/bin:/bin"
        gpu_reason, gpu_note = "--no-gpu-host" if args.no_gpu_host else "", "not simulated (--no-gpu-host)"
        if not args.no_gpu_host:
            print("building the simulated GPU host ...", file=sys.stderr)
            host, gpu_reason = build_gpu_host(workdir)
            if host is not None:
                enter_gpu_host(host)
                path = f"{host.bin_dir}:{path}"  # type: ignore[attr-defined]
            else:
                gpu_note = f"not simulated: {gpu_reason}"
        runner = Runner(uid, gid, user, home, str(workdir), path)
        cache = workdir / "cache"  # the extraction cache, the user's own
        cache.mkdir(mode=0o700)
        os.chown(cache, uid, gid)
        rows = make_rows(singpy, python, sandbox, sif, sif_reason, confs, cache, gpu_reason)
        by_key = {row.key: row for row in rows}
        for row in rows:
            probe(runner, row)
        image_mode(runner, by_key["sif-fuse"], "fuse")
        image_mode(runner, by_key["sif-cache"], "extract")
        if not gpu_reason and not (by_key["nv"].na and by_key["nv-liblist"].na):
            gpu_note = ("simulated (tests/gpu/simhost.py, 4 GPUs, one gcc-built stand-in per nvliblist.conf "
                        "library), in place of /dev and /etc/ld.so.cache for every row; --nv binds "
                        f"{nv_summary(runner, singpy, sandbox, by_key['nv'].env)} through nvidia-container-cli, "
                        f"{nv_summary(runner, singpy, sandbox, by_key['nv-liblist'].env)} through nvliblist.conf")
        elif not gpu_reason:
            gpu_note = "simulated, but `singpy exec --nv` fails there (see the table)"
        print(f"measuring {sum(not r.na for r in rows)} commands x {rounds} rounds ...", file=sys.stderr)
        measure(runner, rows, rounds, warmup=2, seed=args.seed)
        scratch = workdir / "scratch"
        scratch.mkdir(mode=0o1777)
        scratch.chmod(0o1777)
        measure_rss(runner, rows, 3, scratch)

        print("import profiles ...", file=sys.stderr)
        plain = import_profile(runner, python, [singpy, "exec", str(sandbox), "true"], by_key["singpy"].env,
                               profile_runs)
        extras: dict[str, dict[str, object]] = {}
        if plain is not None:
            base = set(plain["modules"])  # type: ignore[arg-type]
            for key, flagged in (("nv", ["--nv", str(sandbox)]), ("nv-liblist", ["--nv", str(sandbox)]),
                                 ("sif-fuse", [str(sif)]), ("sif-cache", [str(sif)]),
                                 ("containall", ["--containall", str(sandbox)])):
                if by_key[key].na:
                    continue
                other = import_profile(runner, python, [singpy, "exec", *flagged, "true"], by_key[key].env, 1)
                if other is None:
                    continue
                mods: dict[str, tuple[float, float]] = other["modules"]  # type: ignore[assignment]
                new = [name for name in mods if name not in base]
                extras[by_key[key].label] = {
                    "modules": new, "self_us": sum(mods[name][0] for name in new),
                    "forbidden": forbidden_in(new, FORBIDDEN_ALWAYS)}
        found = forbidden_in(plain["modules"], FORBIDDEN_PLAIN) if plain is not None else None  # type: ignore[arg-type]
        info["loadavg_end"] = os.getloadavg()
        typer_ms = None
        if not by_key["typer"].na and not by_key["python"].na:
            typer_ms = by_key["typer"].median - by_key["python"].median  # type: ignore[operator]
        targets = evaluate(by_key, found, typer_ms)
        for label, extra in extras.items():
            if extra["forbidden"]:
                targets.append({"target": f"nothing forbidden imported by {label}",
                                "value": ", ".join(extra["forbidden"]), "met": False, "margin": ""})  # type: ignore
        commit, dirty = git_commit()
        now = datetime.datetime.now(datetime.UTC)
        report = render(info, rows, targets, import_section(plain, extras), rounds, commit, dirty,
                        now.strftime("%Y-%m-%d %H:%M UTC"), who, gpu_note)
        print(report)
        if args.compare:
            compare(args.compare, rows)
        if not args.no_write:
            (REPO / "docs").mkdir(exist_ok=True)
            (REPO / "docs" / "performance.md").write_text(report)
            results = REPO / "benchmarks" / "results"
            results.mkdir(parents=True, exist_ok=True)
            out = results / f"{now.strftime('%Y-%m-%d')}-{commit}{'-dirty' if dirty else ''}.json"
            document = {
                "date": now.isoformat(timespec="seconds"), "commit": commit, "dirty": dirty, "rounds": rounds,
                "machine": info, "user": who, "gpu_host": gpu_note,
                "rows": [{"key": r.key, "label": r.label, "command": r.display, "na": r.na or None,
                          "median_ms": r.median, "quartiles_ms": r.quartiles(), "failures": r.failures,
                          "rss_kib_median": statistics.median(r.rss) if r.rss else None,
                          "times_ms": [round(t, 3) for t in r.times]} for r in rows],
                "targets": targets,
                "imports": None if plain is None else {
                    "count": plain["count"], "total_ms": float(plain["total_us"]) / 1000,  # type: ignore[arg-type]
                    "modules": {n: {"self_ms": v[0] / 1000, "cumulative_ms": v[1] / 1000}
                                for n, v in plain["modules"].items()},  # type: ignore[attr-defined]
                    "forbidden_found": found, "extras": extras},
            }
            out.write_text(json.dumps(document, indent=1) + "\n")
            print(f"\nwrote docs/performance.md and {out.relative_to(REPO)}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Pull-and-convert benchmark of `singpy pull` against skopeo + umoci + mksquashfs (issue 10).

    make bench                                     # startup.py, then this
    .venv/bin/python benchmarks/pull.py            # a ~200 MB image, 3 rounds; 30 rounds of cached exec
    .venv/bin/python benchmarks/pull.py --quick    # a ~20 MB image: a smoke run of the script
    .venv/bin/python benchmarks/pull.py --rounds 5 --exec-rounds 60 --no-write

Three measures, each run side by side in one process:

1. Pull + convert of a ~200 MB image (uncompressed: four gzip layers of busybox, Python's standard library,
   shared libraries and /usr/share files of this host) from a local docker-registry on 127.0.0.1 (plain
   HTTP): `singpy -q pull --no-https OUT.sif docker://HOST/big:latest` with an empty cache, against the same
   work done by the reference tools, `skopeo copy` to an OCI layout + `umoci unpack` + `mksquashfs` at
   singpy's compression. One untimed warm-up round, then rounds in shuffled order; what each round leaves is
   removed outside the timing, and `sync` runs before each pipeline so neither pays for the other's dirty
   pages.
2. The compression choice: mksquashfs of the same unpacked tree with gzip level 6 (singpy's), 9 (mksquashfs's
   default), 1, and zstd levels 3 and 15: time and size, one run each.
3. `singpy exec docker://HOST/small:latest true` with the image cached (one HEAD request to the registry: has
   the tag moved?) against `singpy exec SMALL.sif true` (the same SIF as a file), and the same by digest
   (no request at all): interleaved rounds, medians.

As root the commands run as the unprivileged test user `singpy-test` (as startup.py does), in directories
that user owns; the registry runs as root in this process. The big image's layout is built once and kept in
build/bench-pull/ (`make clean` removes it; --rebuild makes it again). Writes the "Pull and convert" section
of docs/performance.md (between its markers, the rest of the file untouched) and
benchmarks/results/DATE-COMMIT-pull.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypedDict

# Run as a script, sys.path[0] is benchmarks/ (startup.py importable) and startup puts the repository on sys.path.
import startup
from startup import Account, Machine, Runner, Target

from singpy.oci.pull import SQUASH_COMPRESSION
from singpy.record import Record
from tests.support.oci import (
    Entry,
    Image,
    Layer,
    busybox_entries,
    busybox_image,
    directory,
    file,
    hardlink,
    symlink,
    write_layout,
)
from tests.support.registry import RegistryServer, start_registry

REPO = startup.REPO
CACHE = REPO / "build" / "bench-pull"  # the built image layouts, kept between runs (build/ is git-ignored)
IMAGE_VERSION = 1  # bump when the image recipe changes: a cached layout of another version is rebuilt
MB = 1_000_000
# Bytes of host files in each image: with busybox and the tar headers, about 200 MB (20 MB) of layer tars.
BIG_BYTES = 186 * MB
QUICK_BYTES = 17 * MB
TARGET_PULL = 1.0  # singpy pull <= 1.0x skopeo + umoci + mksquashfs
TARGET_EXEC = 2.0  # singpy exec docker://X (cached) <= 2x singpy exec X.sif
PULL_TIMEOUT = 1800  # seconds one command of a pull round may take on a loaded machine
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
MARK_BEGIN, MARK_END = startup.KEPT_SECTION  # startup.py, which rewrites the file, keeps what lies between
# (host directory, its share of the image's bytes) per layer, after a busybox base layer; a directory this host
# lacks is left out. Binaries, Python source and bytecode, text and already-gzipped man pages: what real images
# hold, in their proportions.
LIB_DIR = next((str(p) for p in sorted(Path("/usr/lib").glob("*-linux-gnu")) if p.is_dir()), "/usr/lib")
PYTHON_DIR = f"/usr/lib/python3.{sys.version_info.minor}"
LAYERS: tuple[tuple[tuple[str, float], ...], ...] = (
    ((PYTHON_DIR, 0.25),),
    ((LIB_DIR, 0.45),),
    (("/usr/share/perl", 0.08), ("/usr/share/man", 0.08), ("/usr/share/doc", 0.06), ("/usr/share/i18n", 0.04),
     ("/usr/share/zoneinfo", 0.02), ("/usr/share/vim", 0.02)),
)
# mksquashfs variants of the compression table: (label, options).
COMPRESSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gzip level 6 (singpy)", SQUASH_COMPRESSION),
    ("gzip level 9 (mksquashfs's default)", ("-comp", "gzip")),
    ("gzip level 1", ("-comp", "gzip", "-Xcompression-level", "1")),
    ("zstd level 3", ("-comp", "zstd", "-Xcompression-level", "3")),
    ("zstd level 15 (mksquashfs's default)", ("-comp", "zstd")),
)


class Options(Record):
    """The command line, resolved."""

    rounds: int  # timed pull rounds
    exec_rounds: int  # timed exec rounds
    quick: bool  # the ~20 MB image
    as_root: bool  # the commands run as root, not as the test user
    rebuild: bool  # build the image layout again even if cached
    write: bool  # write docs/performance.md and the JSON
    seed: int  # of the shuffled order


class LayerInfo(TypedDict):
    source: str  # the host directories, or "busybox"
    entries: int
    content_bytes: int  # regular files' bytes
    tar_bytes: int  # the uncompressed layer
    blob_bytes: int  # gzip


class ImageInfo(TypedDict):
    """What the image holds: build/bench-pull/KIND/image.json, and the JSON's "image"."""

    version: int
    budget: int  # bytes of host files asked for
    layers: list[LayerInfo]
    uncompressed_bytes: int
    compressed_bytes: int
    digest: str


class Series:
    """The timings of one command (or one step of the reference) over the rounds, in seconds."""

    def __init__(self, key: str, label: str, display: str) -> None:
        self.key, self.label, self.display = key, label, display
        self.times: list[float] = []
        self.na = ""  # why it was not measured

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times and not self.na else None

    def spread(self) -> str:
        return f"{min(self.times):.2f}-{max(self.times):.2f}" if self.times else ""

    def result(self) -> SeriesResult:
        return {"key": self.key, "label": self.label, "command": self.display, "na": self.na or None,
                "median_s": self.median, "times_s": [round(t, 4) for t in self.times]}


class SeriesResult(TypedDict):
    key: str
    label: str
    command: str
    na: str | None
    median_s: float | None
    times_s: list[float]


class Squash(TypedDict):
    """One line of the compression table."""

    label: str
    options: list[str]
    seconds: float | None
    bytes: int | None
    error: str | None


class Dirs(Record):
    """The test user's directories (under the benchmark's scratch directory)."""

    user: Path  # owned by the account
    pull_cache: Path  # SINGPY_CACHEDIR of the pulls: removed after every round
    exec_cache: Path  # SINGPY_CACHEDIR of the exec rows: kept
    tmp: Path  # TMPDIR of everything
    out: Path  # what the pulls write


# --- the image ---------------------------------------------------------------------------------------------------


def host_entries(source: str, budget: int) -> tuple[list[Entry], int]:
    """Entries for `source` (its parents first) in sorted walk order until `budget` bytes of files; the bytes.

    Only what anyone may read (the test user runs umoci and mksquashfs on it): a file without o+r, a directory
    without o+rx, sockets and devices are left out. Owners root, times fixed, hard links kept.
    """
    member = source.strip("/")
    parts = member.split("/")
    entries = [directory("/".join(parts[:n])) for n in range(1, len(parts) + 1)]
    used = 0
    seen: dict[tuple[int, int], str] = {}
    for current, dirs, files in os.walk(source):
        relative = os.path.relpath(current, source)
        kept_dirs = []
        for name in sorted([*dirs, *files]):
            path = os.path.join(current, name)
            name_in_image = os.path.normpath(os.path.join(member, relative, name))
            entry, size = _host_entry(path, name_in_image, seen)
            if entry is None or used + size > budget:
                continue
            entries.append(entry)
            used += size
            if entry.kind == "dir":
                kept_dirs.append(name)
        dirs[:] = sorted(kept_dirs)
        if used >= budget * 0.999:
            break
    return entries, used


def _host_entry(path: str, name: str, seen: dict[tuple[int, int], str]) -> tuple[Entry | None, int]:
    """The entry for one host path and the bytes it adds; None for what is left out."""
    try:
        info = os.lstat(path)
    except OSError:
        return None, 0
    mode = stat.S_IMODE(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return symlink(name, os.readlink(path)), 0
    if stat.S_ISDIR(info.st_mode):
        return (directory(name, mode=mode), 0) if mode & 0o005 == 0o005 else (None, 0)
    if not stat.S_ISREG(info.st_mode) or not mode & 0o004:
        return None, 0
    key = (info.st_dev, info.st_ino)
    if info.st_nlink > 1 and key in seen:
        return hardlink(name, seen[key], mode=mode), 0
    try:
        with open(path, "rb") as handle:
            content = handle.read()
    except OSError:
        return None, 0
    seen[key] = name
    return file(name, content, mode=mode & ~0o6000), len(content)


def build_image(total: int) -> tuple[Image, list[LayerInfo]]:
    """busybox, then one layer per LAYERS entry, each its share of `total` bytes of this host's files."""
    base = Layer(busybox_entries())
    layers, infos = [base], [_layer_info("busybox", base, sum(len(e.content) for e in base.entries))]
    for sources in LAYERS:
        entries: list[Entry] = []
        content = 0
        present = [(path, share) for path, share in sources if os.path.isdir(path)]
        for path, share in present:
            found, used = host_entries(path, int(total * share))
            entries += found
            content += used
        if entries:
            layer = Layer(entries)
            layers.append(layer)
            infos.append(_layer_info(", ".join(path for path, _ in present), layer, content))
    return Image(layers, cmd=["/bin/sh"]), infos


def _layer_info(source: str, layer: Layer, content: int) -> LayerInfo:
    return {"source": source, "entries": len(layer.entries), "content_bytes": content, "tar_bytes": len(layer.tar),
            "blob_bytes": layer.size}


def cached_layout(kind: str, total: int, rebuild: bool) -> tuple[Path, ImageInfo]:
    """The OCI layout of the benchmark image `kind` ("big", "quick") under build/bench-pull/, built if needed."""
    where = CACHE / kind
    info_file = where / "image.json"
    if not rebuild and info_file.exists():
        try:
            info: ImageInfo = json.loads(info_file.read_text())
            if (info.get("version"), info.get("budget")) == (IMAGE_VERSION, total) \
                    and (where / "layout" / "index.json").exists():
                return where / "layout", info
        except ValueError:
            pass
    print(f"building the {kind} image ({total // MB} MB of this host's files) in {where} ...", file=sys.stderr)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    image, layers = build_image(total)
    write_layout(where / "layout", {"latest": image})
    info = {"version": IMAGE_VERSION, "budget": total, "layers": layers,
            "uncompressed_bytes": sum(li["tar_bytes"] for li in layers),
            "compressed_bytes": sum(li["blob_bytes"] for li in layers), "digest": image.digest}
    info_file.write_text(json.dumps(info, indent=1) + "\n")  # last: a layout without it is built again
    return where / "layout", info


# --- running commands --------------------------------------------------------------------------------------------


def make_dirs(workdir: Path, account: Account) -> Dirs:
    user = workdir / "user"
    dirs = Dirs(user=user, pull_cache=user / "pull-cache", exec_cache=user / "exec-cache", tmp=user / "tmp",
                out=user / "out")
    for path in (user, dirs.exec_cache, dirs.tmp, dirs.out):
        path.mkdir(mode=0o700)
        os.chown(path, account.uid, account.gid)
    return dirs


def base_env(dirs: Dirs) -> dict[str, str]:
    """What every command gets on top of the runner's HOME, USER, PATH."""
    return {"TMPDIR": str(dirs.tmp), "XDG_RUNTIME_DIR": str(dirs.tmp),
            "SINGPY_CONFIG": str(REPO / "etc" / "singpy.conf")}


def run(runner: Runner, argv: list[str], env: dict[str, str], *, sync: bool = True,
        timeout: float = PULL_TIMEOUT) -> tuple[float, str]:
    """(seconds, "" or why it failed) of one command; `sync` first: the dirty pages of what ran before are not
    this command's to write."""
    if sync:
        os.sync()
    start = time.perf_counter()
    try:
        done = runner.capture(argv, env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout} s"
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return elapsed, f"`{' '.join(argv[:3])} ...` exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return elapsed, ""


def remove(path: Path) -> None:
    """Remove what a command left, whatever its modes (umoci's rootless bundles keep the image's 0555 dirs)."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=_writable_and_retry)
    else:
        path.unlink()


def _writable_and_retry(_function: object, path: str, _error: object) -> None:
    parent = os.path.dirname(path)
    os.chmod(parent, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_writable_and_retry)
    else:
        os.unlink(path)


# --- 1. pull and convert -----------------------------------------------------------------------------------------


class PullBench:
    """singpy's pull against the reference tools, round by round."""

    def __init__(self, runner: Runner, dirs: Dirs, singpy: str, ref: str, as_root: bool) -> None:
        self.runner, self.dirs, self.singpy, self.ref = runner, dirs, singpy, ref
        self.env = base_env(dirs)
        self.oci, self.bundle = dirs.out / "oci", dirs.out / "bundle"
        self.sif, self.squashfs = dirs.out / "singpy.sif", dirs.out / "reference.squashfs"
        rootless = [] if as_root else ["--rootless"]
        self.steps = {
            "skopeo": ["skopeo", "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false", ref,
                       f"oci:{self.oci}:latest"],
            "umoci": ["umoci", "unpack", *rootless, "--image", f"{self.oci}:latest", str(self.bundle)],
            "mksquashfs": ["mksquashfs", str(self.bundle / "rootfs"), str(self.squashfs), "-noappend",
                           *SQUASH_COMPRESSION, "-no-progress"],
        }
        self.singpy_argv = [singpy, "-q", "pull", "--no-https", str(self.sif), ref]
        shown_ref = ref.replace(ref.split("/")[2], "HOST")
        self.singpy_series = Series("singpy", "singpy pull", f"singpy -q pull --no-https OUT.sif {shown_ref}")
        self.reference = Series("reference", "skopeo + umoci + mksquashfs", "the three steps below, one after another")
        self.step_series = {
            "skopeo": Series("skopeo", "skopeo copy",
                             f"skopeo copy --src-tls-verify=false {shown_ref} oci:DIR:latest"),
            "umoci": Series("umoci", "umoci unpack", f"umoci unpack {' '.join(rootless)} --image DIR:latest BUNDLE"
                            .replace("  ", " ")),
            "mksquashfs": Series("mksquashfs", "mksquashfs",
                                 f"mksquashfs BUNDLE/rootfs OUT -noappend {' '.join(SQUASH_COMPRESSION)} -no-progress"),
        }
        self.sizes: dict[str, int] = {}

    def all_series(self) -> list[Series]:
        return [self.singpy_series, self.reference, *self.step_series.values()]

    def clean(self) -> None:
        for path in (self.dirs.pull_cache, self.oci, self.bundle, self.sif, self.squashfs):
            remove(path)

    def run_singpy(self, timed: bool) -> None:
        self.dirs.pull_cache.mkdir(mode=0o700)
        os.chown(self.dirs.pull_cache, self.runner.uid, self.runner.gid)
        env = {**self.env, "SINGPY_CACHEDIR": str(self.dirs.pull_cache)}
        elapsed, error = run(self.runner, self.singpy_argv, env)
        if error:
            self.singpy_series.na = error
        elif timed:
            self.singpy_series.times.append(elapsed)
        if not error:
            self.sizes["singpy_sif"] = self.sif.stat().st_size

    def run_reference(self, timed: bool) -> None:
        total = 0.0
        for name, argv in self.steps.items():
            # No sync between the steps: singpy writes its blobs and tree with no pause to flush them either.
            elapsed, error = run(self.runner, argv, self.env, sync=name == "skopeo")
            if error:
                self.reference.na = self.step_series[name].na = error
                return
            total += elapsed
            if timed:
                self.step_series[name].times.append(elapsed)
        if timed:
            self.reference.times.append(total)
        self.sizes["reference_squashfs"] = self.squashfs.stat().st_size

    def measure(self, rounds: int, seed: int) -> None:
        """One warm-up round (which also finds a pipeline that does not work here), then `rounds` rounds."""
        rng = random.Random(seed)
        sides = {"singpy": self.run_singpy, "reference": self.run_reference}
        for number in range(rounds + 1):
            order = list(sides)
            rng.shuffle(order)
            label = "warm-up round" if number == 0 else f"round {number}/{rounds}"
            print(f"pull: {label} ({' then '.join(order)}) ...", file=sys.stderr)
            for side in order:
                if (self.singpy_series if side == "singpy" else self.reference).na:
                    continue
                self.clean()
                sides[side](number > 0)
        self.clean()

    def unpacked_tree(self) -> Path | None:
        """The reference's unpacked tree of the image (untimed), for the compression table; None if it failed."""
        self.clean()
        for name in ("skopeo", "umoci"):
            _, error = run(self.runner, self.steps[name], self.env)
            if error:
                return None
        return self.bundle / "rootfs"


# --- 2. the compression table ------------------------------------------------------------------------------------


def compression_table(runner: Runner, dirs: Dirs, tree: Path | None) -> list[Squash]:
    """mksquashfs of the unpacked `tree` with each of COMPRESSIONS, one run each."""
    table: list[Squash] = []
    target = dirs.out / "compression.squashfs"
    env = base_env(dirs)
    for label, options in COMPRESSIONS:
        if tree is None:
            table.append({"label": label, "options": list(options), "seconds": None, "bytes": None,
                          "error": "no unpacked tree (skopeo copy or umoci unpack failed)"})
            continue
        print(f"compression: {label} ...", file=sys.stderr)
        remove(target)
        argv = ["mksquashfs", str(tree), str(target), "-noappend", *options, "-no-progress"]
        elapsed, error = run(runner, argv, env)
        table.append({"label": label, "options": list(options), "seconds": None if error else elapsed,
                      "bytes": None if error else target.stat().st_size, "error": error or None})
    remove(target)
    return table


# --- 3. exec of a cached docker:// image -------------------------------------------------------------------------


class ExecRow:
    """One `singpy exec` command of the cached-image comparison, times in ms."""

    def __init__(self, key: str, label: str, argv: list[str], display: str) -> None:
        self.key, self.label, self.argv, self.display = key, label, argv, display
        self.times: list[float] = []
        self.failures = 0
        self.na = ""

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
            profiles[row.key] = startup.parse_importtime(done.stderr)
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


# --- targets and the report --------------------------------------------------------------------------------------


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def targets(pull: PullBench, rows: dict[str, ExecRow], image_mb: float) -> list[Target]:
    singpy, reference = pull.singpy_series.median, pull.reference.median
    pull_ratio = ratio(singpy, reference)
    docker, sif = rows["docker"].median, rows["sif"].median
    exec_ratio = ratio(docker, sif)
    found: list[Target] = []
    name = f"`singpy pull` of a {image_mb:.0f} MB image <= {TARGET_PULL:g}x skopeo copy + umoci unpack + mksquashfs"
    if pull_ratio is None or singpy is None or reference is None:
        found.append({"target": name, "value": "n/a", "met": None,
                      "margin": pull.singpy_series.na or pull.reference.na or "not measured"})
    else:
        met = pull_ratio <= TARGET_PULL
        found.append({"target": name, "value": f"{pull_ratio:.2f}x ({singpy:.1f} s vs {reference:.1f} s)",
                      "met": met, "margin": f"{abs(TARGET_PULL * reference - singpy):.1f} s "
                                            f"{'to spare' if met else 'over'}"})
    name = f"`singpy exec docker://X true` (X cached) <= {TARGET_EXEC:g}x `singpy exec X.sif true`"
    if exec_ratio is None or docker is None or sif is None:
        found.append({"target": name, "value": "n/a", "met": None,
                      "margin": rows["docker"].na or rows["sif"].na or "not measured"})
    else:
        met = exec_ratio <= TARGET_EXEC
        found.append({"target": name, "value": f"{exec_ratio:.2f}x ({docker:.1f} ms vs {sif:.1f} ms)", "met": met,
                      "margin": f"{abs(TARGET_EXEC * sif - docker):.1f} ms {'to spare' if met else 'over'}"})
    return found


class RunInfo(Record):
    machine: Machine
    tools: dict[str, str]
    now: datetime.datetime
    commit: str
    dirty: bool
    who: str
    rounds: int
    exec_rounds: int = 0  # build.py, which shares this record, times no exec


def mb(count: int | None) -> str:
    return "n/a" if count is None else f"{count / MB:.1f}"


def render(run_info: RunInfo, image: ImageInfo, pull: PullBench, table: list[Squash], rows: list[ExecRow],
           found: list[Target], extras: dict[str, ImportExtra]) -> str:
    """The "Pull and convert" section of docs/performance.md, markers included."""
    lines = [MARK_BEGIN, "## Pull and convert (issue 10)", "",
             "Generated by `benchmarks/pull.py` (run by `make bench` after `startup.py`; method: "
             "[benchmarks/README.md](../benchmarks/README.md#pull-and-convert-issue-10)). Do not edit by hand.", "",
             *conditions(run_info), *_pull_section(image, pull, run_info.rounds), *_compression_section(table),
             *_exec_section(rows, extras), "", *targets_table(found)]
    return "\n".join([*lines, MARK_END]) + "\n"


def targets_table(found: list[Target]) -> list[str]:
    """The "Targets" part of a section: one row per target, met or missed."""
    lines = ["### Targets", "", "| target | measured | met | margin |", "|---|---|---|---|"]
    for target in found:
        met = {True: "met", False: "**missed**", None: "n/a"}[target["met"]]
        lines.append(f"| {target['target']} | {target['value']} | {met} | {target['margin']} |")
    return lines


def conditions(run_info: RunInfo) -> list[str]:
    """The machine, the commit and the tools a run had: the first lines of a section."""
    info = run_info.machine
    load_end = info.get("loadavg_end", info["loadavg_start"])
    return [f"- date: {run_info.now.strftime('%Y-%m-%d %H:%M UTC')}; commit {run_info.commit}"
            f"{' (with uncommitted changes)' if run_info.dirty else ''}",
            f"- CPU: {info['cpu']}, {info['usable_cores']} usable cores; memory {info['memory']}; kernel "
            f"{info['kernel']}; load average at start {tuple(round(x, 2) for x in info['loadavg_start'])}, "
            f"at end {tuple(round(x, 2) for x in load_end)}",
            f"- {'; '.join(run_info.tools.values())}",
            f"- commands run as {run_info.who}; the registry (docker-registry, plain HTTP on 127.0.0.1) as root", ""]


def _pull_section(image: ImageInfo, pull: PullBench, rounds: int) -> list[str]:
    layers = ", ".join(f"{mb(layer['tar_bytes'])} MB ({layer['source']})" for layer in image["layers"])
    reference = pull.reference.median
    lines = ["### Pull + convert", "",
             f"The image: {len(image['layers'])} gzip layers, {mb(image['uncompressed_bytes'])} MB uncompressed, "
             f"{mb(image['compressed_bytes'])} MB compressed, "
             f"{sum(layer['entries'] for layer in image['layers'])} entries: {layers}. Each round starts with an "
             "empty singpy cache and no layout, bundle or output; one warm-up round first, then "
             f"{rounds} rounds, the two pipelines in shuffled order; wall time of the "
             "command (the sum of the three for the reference).", "",
             "| pipeline | command | median s | min-max s | x reference |", "|---|---|---:|---:|---:|"]
    for series in pull.all_series():
        median = series.median
        if median is None:
            lines.append(f"| {series.label} | `{series.display}` | n/a ({series.na or 'not measured'}) | | |")
            continue
        share = f"{median / reference:.2f}" if reference else ""
        bold = "**" if series.key in ("singpy", "reference") else ""
        lines.append(f"| {series.label} | `{series.display}` | {bold}{median:.2f}{bold} | {series.spread()} "
                     f"| {share} |")
    lines += ["", f"Output: the SIF {mb(pull.sizes.get('singpy_sif'))} MB, the reference's squashfs "
                  f"{mb(pull.sizes.get('reference_squashfs'))} MB.", ""]
    return lines


def _compression_section(table: list[Squash]) -> list[str]:
    base = next((row for row in table if row["options"] == list(SQUASH_COMPRESSION)), None)
    lines = ["### Compression of the SIF", "",
             "mksquashfs of the reference's unpacked tree (the same files), one run each: why singpy squashes with "
             "gzip level 6. zstd would need a kernel and a squashfuse built with it, so singpy keeps gzip, which "
             "every kernel and squashfuse reads.", "",
             "| compression | options | time s | size MB | x gzip-6 time | x gzip-6 size |",
             "|---|---|---:|---:|---:|---:|"]
    for row in table:
        if row["seconds"] is None or row["bytes"] is None:
            lines.append(f"| {row['label']} | `{' '.join(row['options'])}` | n/a ({row['error']}) | | | |")
            continue
        time_ratio = f"{row['seconds'] / base['seconds']:.2f}" if base and base["seconds"] else ""
        size_ratio = f"{row['bytes'] / base['bytes']:.3f}" if base and base["bytes"] else ""
        lines.append(f"| {row['label']} | `{' '.join(row['options'])}` | {row['seconds']:.2f} | {mb(row['bytes'])} "
                     f"| {time_ratio} | {size_ratio} |")
    return [*lines, ""]


def _exec_section(rows: list[ExecRow], extras: dict[str, ImportExtra]) -> list[str]:
    sif = next((row.median for row in rows if row.key == "sif"), None)
    lines = ["### `singpy exec` of a cached docker:// image", "",
             "busybox (tests.support.oci.busybox_image) pushed to the same registry, pulled once into the cache "
             "and once to SMALL.sif; every command with `APPTAINER_NOHTTPS=1`; spawn to exit, median of the "
             "rounds (two warm-up rounds first). A tag costs one HEAD request to the registry per run (has it "
             "moved?); a digest none.", "",
             "| row | command | median ms | p25-p75 ms | x SIF |", "|---|---|---:|---:|---:|"]
    for row in rows:
        median = row.median
        if median is None:
            lines.append(f"| {row.label} | `{row.display}` | n/a ({row.na or 'every run failed'}) | | |")
            continue
        fails = f" ({row.failures} failed)" if row.failures else ""
        lines.append(f"| {row.label} | `{row.display}` | **{median:.1f}**{fails} | {row.quartiles()} "
                     f"| {median / sif:.2f} |" if sif else f"| {row.label} | `{row.display}` | {median:.1f} | | |")
    for key, label in (("docker", "a tag"), ("digest", "a digest")):
        extra = extras.get(key)
        if extra is None:
            continue
        heavy = ", ".join(f"`{name}` {ms:.1f}" for name, ms in extra["heavy_ms"].items())
        lines.append(f"\nImported by a docker:// run with {label} beyond the SIF's: {len(extra['modules'])} modules, "
                     f"{extra['self_ms']:.1f} ms self time (`-X importtime`, one run, which inflates it)"
                     + (f"; cumulative ms of some (each includes what it imports): {heavy}" if heavy else ""))
    return lines


def write_section(section: str, markers: tuple[str, str] = (MARK_BEGIN, MARK_END)) -> Path:
    """Put `section` into docs/performance.md in place of the one between `markers` (appended if none)."""
    doc = REPO / "docs" / "performance.md"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    begin, end = text.find(markers[0]), text.find(markers[1])
    if begin >= 0 and end > begin:
        text = text[:begin] + section + text[end + len(markers[1]):].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)
    return doc


class ResultsHeader(TypedDict):
    """What every results file of pull.py, build.py and hpc.py starts with (RunInfo's facts)."""

    date: str
    commit: str
    dirty: bool
    machine: Machine
    tools: dict[str, str]
    user: str


class ResultsDocument(ResultsHeader):
    """benchmarks/results/DATE-COMMIT-pull.json."""

    image: ImageInfo
    pull: list[SeriesResult]
    sizes: dict[str, int]
    compression: list[Squash]
    exec: list[dict[str, object]]
    exec_imports: dict[str, ImportExtra]
    targets: list[Target]


def results_document(run_info: RunInfo, image: ImageInfo, pull: PullBench, table: list[Squash],
                     rows: list[ExecRow], extras: dict[str, ImportExtra], found: list[Target]) -> ResultsDocument:
    return {
        "date": run_info.now.isoformat(timespec="seconds"), "commit": run_info.commit, "dirty": run_info.dirty,
        "machine": run_info.machine, "tools": run_info.tools, "user": run_info.who, "image": image,
        "pull": [series.result() for series in pull.all_series()], "sizes": pull.sizes, "compression": table,
        "exec": [{"key": row.key, "label": row.label, "command": row.display, "na": row.na or None,
                  "median_ms": row.median, "failures": row.failures, "times_ms": [round(t, 3) for t in row.times]}
                 for row in rows],
        "exec_imports": extras, "targets": found,
    }


# --- the run -----------------------------------------------------------------------------------------------------


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description="singpy pull-and-convert benchmark (issue 10)")
    parser.add_argument("--rounds", type=int, default=3, help="timed pull rounds (default 3, after one warm-up)")
    parser.add_argument("--exec-rounds", type=int, default=30, help="timed exec rounds (default 30)")
    parser.add_argument("--quick", action="store_true", help="a ~20 MB image and 8 exec rounds: a smoke run")
    parser.add_argument("--as-root", action="store_true", help="run the commands as root (default: the test user)")
    parser.add_argument("--rebuild", action="store_true", help="build the image layout again")
    parser.add_argument("--no-write", action="store_true", help="print only; write neither docs nor JSON")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    return Options(rounds=args.rounds, exec_rounds=8 if args.quick and args.exec_rounds == 30 else args.exec_rounds,
                   quick=args.quick, as_root=args.as_root, rebuild=args.rebuild, write=not args.no_write,
                   seed=args.seed)


def tool_versions() -> dict[str, str]:
    return {"registry": startup._version("docker-registry", "--version"), "skopeo": startup._version("skopeo"),
            "umoci": startup._version("umoci"), "mksquashfs": startup._version("mksquashfs", "-version")}


def missing_tools() -> list[str]:
    return [tool for tool in ("docker-registry", "skopeo", "umoci", "mksquashfs") if shutil.which(tool, path=PATH)
            is None]


def benchmark(options: Options, workdir: Path, singpy: str, python: str) -> None:
    account = startup.choose_account(options.as_root)
    kind = "quick" if options.quick else "big"
    layout, image = cached_layout(kind, QUICK_BYTES if options.quick else BIG_BYTES, options.rebuild)
    info = startup.machine()
    dirs = make_dirs(workdir, account)
    runner = Runner(account.uid, account.gid, account.user, account.home, str(dirs.user), PATH)
    with start_registry(workdir / "registry") as registry:
        print(f"pushing the images to {registry.host} ...", file=sys.stderr)
        registry.push(layout, "big")
        small_digest = registry.push(write_layout(workdir / "small-layout", {"latest": busybox_image()}), "small")
        pull = PullBench(runner, dirs, singpy, registry.ref("big"), options.as_root)
        pull.measure(options.rounds, options.seed)
        table = compression_table(runner, dirs, pull.unpacked_tree())
        pull.clean()
        rows = exec_rows(runner, dirs, singpy, registry, small_digest)
        env = exec_env(dirs)
        measure_exec(runner, rows, env, options.exec_rounds, options.seed)
        extras = import_extras(runner, python, rows, env)
    info["loadavg_end"] = os.getloadavg()
    commit, dirty = startup.git_commit()
    run_info = RunInfo(machine=info, tools=tool_versions(), now=datetime.datetime.now(datetime.UTC), commit=commit,
                       dirty=dirty, who=account.describe(), rounds=options.rounds, exec_rounds=options.exec_rounds)
    found = targets(pull, {row.key: row for row in rows}, image["uncompressed_bytes"] / MB)
    section = render(run_info, image, pull, table, rows, found, extras)
    print(section)
    if options.write:
        write_results(run_info, section, results_document(run_info, image, pull, table, rows, extras, found),
                      quick=options.quick)


def write_results(run_info: RunInfo, section: str, document: ResultsDocument, *, quick: bool) -> None:
    save_results(run_info, "pull", write_section(section), document, quick=quick)


def save_results(run_info: RunInfo, kind: str, doc: Path, document: Mapping[str, object], *, quick: bool) -> None:
    """benchmarks/results/DATE-COMMIT[-dirty]-KIND[-quick].json (pull.py, build.py, hpc.py), and say so."""
    results = REPO / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / (f"{run_info.now.strftime('%Y-%m-%d')}-{run_info.commit}{'-dirty' if run_info.dirty else ''}"
                     f"-{kind}{'-quick' if quick else ''}.json")
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"\nwrote {doc.relative_to(REPO)} (its {kind} section) and {out.relative_to(REPO)}", file=sys.stderr)


@contextlib.contextmanager
def scratch(kind: str = "pull") -> Iterator[Path]:
    """A world-searchable scratch directory (the test user reaches its own directory inside), removed after.

    Shared by build.py and hpc.py (`kind` names the benchmark in the directory's name).
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"singpy-bench-{kind}-", dir="/tmp"))
    workdir.chmod(0o755)
    try:
        yield workdir
    finally:
        remove(workdir)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if (commands := startup.venv_commands()) is None:
        return 1
    singpy, python = commands
    if missing := missing_tools():
        print(f"not installed: {', '.join(missing)} (`make setup` installs them)", file=sys.stderr)
        return 1
    startup.fresh_bytecode(python)
    # SIGTERM unwinds like Ctrl-C: the registry is stopped and the scratch directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with scratch() as workdir:
        benchmark(options, workdir, singpy, python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

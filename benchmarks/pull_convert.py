"""The pull benchmark's measures 1 and 2: singpy's pull against skopeo + umoci + mksquashfs, and the compressions."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import TypedDict

from pull_commands import Dirs, Series, base_env, remove, run
from startup_runner import Runner

from singpy.oci.pull import SQUASH_COMPRESSION

# mksquashfs variants of the compression table: (label, options).
COMPRESSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gzip level 6 (singpy)", SQUASH_COMPRESSION),
    ("gzip level 9 (mksquashfs's default)", ("-comp", "gzip")),
    ("gzip level 1", ("-comp", "gzip", "-Xcompression-level", "1")),
    ("zstd level 3", ("-comp", "zstd", "-Xcompression-level", "3")),
    ("zstd level 15 (mksquashfs's default)", ("-comp", "zstd")),
)


class Squash(TypedDict):
    """One line of the compression table."""

    label: str
    options: list[str]
    seconds: float | None
    bytes: int | None
    error: str | None


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

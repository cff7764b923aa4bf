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

This script runs the three measures; the rest lives beside it in benchmarks/ (top-level modules, as build.py and
hpc.py import this one): pull_image (the image), pull_commands (running commands, series of timings),
pull_convert (measures 1 and 2), pull_exec (measure 3), pull_report (this benchmark's section and JSON) and
pull_results (what the reports of pull.py, build.py and hpc.py share).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

# Run as a script, sys.path[0] is benchmarks/ (startup.py and its modules importable); startup_repo puts the
# repository on sys.path.
import startup
from pull_commands import PATH, Series, SeriesResult, make_dirs, remove, run, scratch
from pull_convert import PullBench, compression_table
from pull_exec import apart_rows, exec_env, exec_rows, import_extras, measure_apart, measure_exec, server_cpu_per_head
from pull_image import BIG_BYTES, MB, QUICK_BYTES, ImageInfo, cached_layout
from pull_report import render, results_document, targets, write_results
from pull_results import ResultsHeader, RunInfo, conditions, mb, save_results, targets_table, write_section
from startup_runner import Runner

from singpy.oci.manifest import ACCEPT
from singpy.record import Record
from tests.support.oci import busybox_image, write_layout
from tests.support.registry import start_registry

# What build.py and hpc.py use of this module (`pull.NAME`, `from pull import NAME`).
__all__ = ["MB", "PATH", "QUICK_BYTES", "ImageInfo", "ResultsHeader", "RunInfo", "Series", "SeriesResult",
           "cached_layout", "conditions", "main", "mb", "remove", "run", "run_benchmark", "save_results", "scratch",
           "targets_table", "write_section"]


class Options(Record):
    """The command line, resolved."""

    rounds: int  # timed pull rounds
    exec_rounds: int  # timed exec rounds
    quick: bool  # the ~20 MB image
    as_root: bool  # the commands run as root, not as the test user
    rebuild: bool  # build the image layout again even if cached
    write: bool  # write docs/performance.md and the JSON
    seed: int  # of the shuffled order


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
    return {"registry": startup.tool_version("docker-registry", "--version"), "skopeo": startup.tool_version("skopeo"),
            "umoci": startup.tool_version("umoci"), "mksquashfs": startup.tool_version("mksquashfs", "-version")}


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
        tag_row = next(row for row in rows if row.key == "docker")
        if not tag_row.na:
            tag_row.server_cpu_ms = server_cpu_per_head(registry.pid, f"{registry.url}/v2/small/manifests/latest",
                                                        ACCEPT)
        apart = apart_rows(rows)
        measure_apart(runner, apart, env, options.exec_rounds, options.seed, (registry.pid,))
        extras = import_extras(runner, python, rows, env)
        rows += apart
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



def run_benchmark(body: Callable[[Path, str, str], None]) -> int:
    """What pull.py and pull_big.py share around their measures: the venv's commands, the tools, fresh
    bytecode, then `body(workdir, singpy, python)` in a scratch directory; 1 when something is missing."""
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
        body(workdir, singpy, python)
    return 0


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    return run_benchmark(lambda workdir, singpy, python: benchmark(options, workdir, singpy, python))


if __name__ == "__main__":
    raise SystemExit(main())

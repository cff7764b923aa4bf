"""Import-time profiling of the exec path (`python -X importtime`), and the modules it must not import."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable

from startup_records import Images, ImportExtra, ImportProfile, Imports, Row
from startup_runner import Runner

# Modules that must not be imported by a plain `singpy exec` (docs/performance.md, tests/unit/test_hot_path_imports.py).
FORBIDDEN_ALWAYS = ("typer", "click", "rich", "pyroute2", "prctl", "singpy.image.sifwrite")
FORBIDDEN_PLAIN = (*FORBIDDEN_ALWAYS, "dataclasses", "typing", "pathlib", "json")


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


def shebang_flags(script: str) -> list[str]:
    """The interpreter flag of a script's `#!` line (`-S`: the tuned console script, singpy.cli.launcher)."""
    try:
        with open(script, encoding="utf-8") as text:
            words = text.readline(300).split()
    except (OSError, UnicodeDecodeError):
        return []
    return words[1:2] if words[:1] and words[0].startswith("#!") and words[1:] == ["-S"] else []


def import_profile(runner: Runner, python: str, argv: list[str], env: dict[str, str] | None,
                   runs: int) -> ImportProfile | None:
    """Median self/cumulative import time per module over `runs` runs of `python -X importtime argv`."""
    samples: list[dict[str, tuple[int, int]]] = []
    flags = shebang_flags(argv[0])
    for _ in range(runs):
        done = runner.capture([python, *flags, "-X", "importtime", *argv], env)
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

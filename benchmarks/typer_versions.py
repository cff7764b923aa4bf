"""Import cost of typer releases, side by side: the evidence behind singpy's typer pin.

    python benchmarks/typer_versions.py [--rounds N] [--versions typer==0.9.4 typer-slim==0.24.0 ...]

Each requirement is installed with pip into its own throwaway venv under
/tmp/singpy-typer-bench/ (made with this interpreter, so every venv runs the
same Python); then, round after round in shuffled order, every venv runs
`python -c pass` and `python -c "import typer"` and the difference of the
medians is the import's cost. `-X importtime` gives the module count and
which heavy packages (click, rich, pydantic, typing...) typer drags in.
Prints a Markdown table for benchmarks/README.md and writes the numbers as
JSON beside it (--json). Needs PyPI (or a mirror pip is configured for).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import TypedDict

DEFAULT = ("typer==0.9.4", "typer==0.12.5", "typer-slim==0.12.5", "typer==0.15.4", "typer-slim==0.15.4",
           "typer==0.20.1", "typer-slim==0.20.1", "typer==0.24.2", "typer==0.29.2")
HEAVY = ("click", "rich", "pydantic", "pydantic_core", "typing", "typing_extensions", "annotated_types",
         "shellingham", "inspect", "dataclasses", "pathlib", "json")
ROOT = "/tmp/singpy-typer-bench"
# A two-command app run as `APP version --verbose`: what `singpy version` does through typer.
APP = """import typer
app = typer.Typer(add_completion=False)
@app.command()
def version(verbose: bool = typer.Option(False, "--verbose", "-v", help="say more")) -> None:
    print("0.1.0")
@app.command()
def inspect(image: str = typer.Argument(..., help="an image")) -> None:
    print(image)
app(args=["version", "--verbose"], prog_name="app", standalone_mode=False)
"""
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SINGPY = f"import sys; sys.path.insert(0, {REPO!r}); from singpy.cli.main import main; sys.exit(main(['version']))"
JOBS = {"pass": ["-c", "pass"], "typer": ["-c", "import typer"], "app": [os.path.join(ROOT, "app.py")],
        "singpy": ["-c", SINGPY]}


class Result(TypedDict):
    """One requirement's row of the table (and of the --json output)."""

    requirement: str
    versions: dict[str, str]  # package -> installed version, for typer, typer-slim, click, rich, pydantic
    python_pass_ms: float
    import_typer_ms: float
    typer_cost_ms: float
    app_ms: float
    app_cost_ms: float
    singpy_version_ms: float | None  # None: that typer cannot run singpy's app
    importtime_ms: float
    modules: int
    heavy: list[str]


def venv_for(requirement: str) -> str:
    path = os.path.join(ROOT, requirement.replace("==", "-"))
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(os.path.join(path, ".installed")):
        subprocess.run([sys.executable, "-m", "venv", "--clear", path], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
                       check=True)
        open(os.path.join(path, ".installed"), "w").close()
    return python


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)  # cwd: no stray package
    return (time.perf_counter() - start) * 1000 if done.returncode == 0 else float("nan")


def importtime(python: str) -> tuple[dict[str, int], set[str]]:
    """Module -> self time (us) for `import typer`, and the modules loaded after it (failed attempts excluded)."""
    done = subprocess.run([python, "-X", "importtime", "-c", "import sys, typer; print(*sys.modules)"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    modules: dict[str, int] = {}
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            modules[parts[2].strip()] = int(parts[0])
    return modules, set(done.stdout.split())


def installed(python: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for n in ('typer', 'typer-slim', 'click', 'rich', 'pydantic'):\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    versions: dict[str, str] = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                                         check=True).stdout)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--versions", nargs="+", default=list(DEFAULT))
    parser.add_argument("--json", default="", help="write the results here as JSON")
    args = parser.parse_args(argv)
    os.makedirs(ROOT, exist_ok=True)
    with open(os.path.join(ROOT, "app.py"), "w") as handle:
        handle.write(APP)
    pythons = {req: venv_for(req) for req in args.versions}
    runs: dict[tuple[str, str], list[float]] = {(req, what): [] for req in pythons for what in JOBS}
    jobs = list(runs)
    rng = random.Random(3)
    for _ in range(2):  # warm the page cache and the bytecode caches
        for req, what in jobs:
            timed([pythons[req], *JOBS[what]])
    for _ in range(args.rounds):
        rng.shuffle(jobs)
        for req, what in jobs:
            runs[req, what].append(timed([pythons[req], *JOBS[what]]))
    results: list[Result] = []
    for req, python in pythons.items():
        floor = statistics.median(runs[req, "pass"])
        with_typer = statistics.median(runs[req, "typer"])
        app = statistics.median(runs[req, "app"])
        ok = [t for t in runs[req, "singpy"] if t == t]  # NaN: that typer cannot run singpy's app
        singpy = statistics.median(ok) if len(ok) == len(runs[req, "singpy"]) else None
        samples = [importtime(python) for _ in range(5)]
        modules, loaded = samples[0]
        self_us = statistics.median(sum(s.values()) for s, _ in samples)
        heavy = sorted({m.split(".")[0] for m in modules if m in loaded} & set(HEAVY))
        results.append({
            "requirement": req, "versions": installed(python), "python_pass_ms": round(floor, 2),
            "import_typer_ms": round(with_typer, 2), "typer_cost_ms": round(with_typer - floor, 2),
            "app_ms": round(app, 2), "app_cost_ms": round(app - floor, 2),
            "singpy_version_ms": None if singpy is None else round(singpy, 2),
            "importtime_ms": round(self_us / 1000, 2), "modules": len(modules), "heavy": heavy,
        })
    print(f"{args.rounds} rounds, interleaved; Python {sys.version.split()[0]}; {os.uname().release}\n")
    print("| requirement | installs click / rich / pydantic | `python -c pass` ms | `import typer` ms "
          "| import cost ms | app command ms | app cost ms | `singpy version` ms | modules at import "
          "| heavy packages at import |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        v = r["versions"]
        installs = " / ".join(v.get(name, "-") for name in ("click", "rich", "pydantic"))
        print(f"| {r['requirement']} | {installs} | {r['python_pass_ms']:.1f} | {r['import_typer_ms']:.1f} "
              f"| **{r['typer_cost_ms']:.1f}** | {r['app_ms']:.1f} | **{r['app_cost_ms']:.1f}** "
              f"| {'fails' if r['singpy_version_ms'] is None else format(r['singpy_version_ms'], '.1f')} "
              f"| {r['modules']} "
              f"| {', '.join(r['heavy'])} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rounds": args.rounds, "python": sys.version.split()[0], "results": results}, handle,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

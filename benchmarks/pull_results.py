"""What the reports of pull.py, build.py and hpc.py share: RunInfo, their first lines, targets, section, JSON file."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from pull_image import MB
from startup_records import Machine, Target
from startup_repo import REPO
from startup_report import KEPT_SECTION

from singpy.record import Record

MARK_BEGIN, MARK_END = KEPT_SECTION  # startup.py, which rewrites the file, keeps what lies between


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


def save_results(run_info: RunInfo, kind: str, doc: Path, document: Mapping[str, object], *, quick: bool) -> None:
    """benchmarks/results/DATE-COMMIT[-dirty]-KIND[-quick].json (pull.py, build.py, hpc.py), and say so."""
    results = REPO / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / (f"{run_info.now.strftime('%Y-%m-%d')}-{run_info.commit}{'-dirty' if run_info.dirty else ''}"
                     f"-{kind}{'-quick' if quick else ''}.json")
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"\nwrote {doc.relative_to(REPO)} (its {kind} section) and {out.relative_to(REPO)}", file=sys.stderr)

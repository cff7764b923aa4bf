"""Running the CWL v1.2 conformance subset (tests/data/cwl-v1.2) with cwltest and cwltool, and reading results.

`run_subset` copies the subset into a directory of the profile's user (cwltest and cwltool write beside it),
runs `cwltest --test conformance_tests.yaml --tool cwltool -j JOBS --junit-xml ... -- --ENGINE` as that user
(tests.support.clients.run_client: a hung run is killed with everything it started) and returns a `Results`:
the test ids that passed, failed, or were reported unsupported, read from cwltest's JUnit XML.

`BASELINE` (tests/data/cwl-v1.2/podman-baseline.txt) is what rootless podman did on the subset when measured
on the development machine (its header says where and how); a host without podman is compared with it.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import yaml

from tests.conftest import Singpy
from tests.support.clients import VENV_BIN, own_dir, run_client

SUBSET = Path(__file__).resolve().parents[1] / "data" / "cwl-v1.2"
BASELINE = SUBSET / "podman-baseline.txt"
TEST_TIMEOUT = 120  # cwltest's limit for one conformance test


class Results:
    """What cwltest reported, by conformance test id (its short name)."""

    def __init__(self, passed: set[str], failed: dict[str, str], unsupported: set[str]) -> None:
        self.passed, self.failed, self.unsupported = passed, failed, unsupported

    def __repr__(self) -> str:
        return f"Results({len(self.passed)} passed, {len(self.failed)} failed, {len(self.unsupported)} unsupported)"


def subset_ids() -> list[str]:
    """The ids of the subset's tests, in file order (the numbers cwltest's -n counts from 1)."""
    entries = yaml.safe_load((SUBSET / "conformance_tests.yaml").read_text())
    return [str(entry["id"]) for entry in entries]


def read_junit(path: Path) -> Results:
    passed: set[str] = set()
    failed: dict[str, str] = {}
    unsupported: set[str] = set()
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("file") or case.get("name") or "?"
        failure = case.find("failure")
        if failure is not None:
            failed[name] = (failure.get("message") or "") + "\n" + (case.findtext("system-err") or "")[-1500:]
        elif case.find("skipped") is not None:
            unsupported.add(name)
        else:
            passed.add(name)
    return Results(passed, failed, unsupported)


def run_subset(singpy: Singpy, place: Path, engine: str, env: dict[str, str], *, only: set[str] | None = None,
               jobs: int = 2, timeout: float = 900) -> Results:
    """The subset (or the tests `only` names) run by cwltool with `--ENGINE` (podman, singularity)."""
    tests = place / f"cwl-{engine}"
    shutil.copytree(SUBSET, tests)
    for entry in [tests, *tests.rglob("*")]:
        shutil.chown(entry, singpy.uid, singpy.gid)
    tmp = own_dir(singpy, place / f"tmp-{engine}")  # cwltool's output and staging dirs
    junit = place / f"{engine}.xml"
    argv = [str(VENV_BIN / "cwltest"), "--test", "conformance_tests.yaml", "--tool", str(VENV_BIN / "cwltool"),
            "-j", str(jobs), "--timeout", str(TEST_TIMEOUT), "--junit-xml", str(junit)]
    # a file of those alone: with -n/-s, cwltest 2.7 puts other tests' names in its report
    if only is not None and only != set(subset_ids()):
        selected = [entry for entry in yaml.safe_load((SUBSET / "conformance_tests.yaml").read_text())
                    if entry["id"] in only]
        (tests / "conformance_tests.yaml").write_text(yaml.safe_dump(selected, sort_keys=False))
    done: subprocess.CompletedProcess[str] = run_client(singpy, [*argv, "--", f"--{engine}"],
                                                        env={**env, "TMPDIR": str(tmp)}, cwd=tests, timeout=timeout)
    if not junit.exists():
        raise AssertionError(f"cwltest --{engine} wrote no report\nstdout: {done.stdout[-3000:]}\n"
                             f"stderr: {done.stderr[-3000:]}")
    return read_junit(junit)


def read_baseline() -> tuple[set[str], set[str]]:
    """(passed, not passed) by rootless podman when the baseline was measured."""
    passed: set[str] = set()
    other: set[str] = set()
    for line in BASELINE.read_text().splitlines():
        if line and not line.startswith("#"):
            verdict, _, name = line.partition(" ")
            (passed if verdict == "pass" else other).add(name)
    return passed, other

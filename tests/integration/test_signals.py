"""Signals and launcher death at any moment of start-up, in every mode, as root and as a user.

Each case starts singpy many times and, at a random moment of its start-up
(spread over the start-up time measured for that mode just before), either
sends it a forwarded signal or kills it with SIGKILL:

* a forwarded signal N is never lost: the payload's trap for it runs (exit
  100+N), or, when it came before the payload could exist, it ends the
  container as it would have ended the payload (128+N from a supervisor, or
  singpy itself killed by N), and singpy exits within a few seconds;
* after a SIGKILL of singpy nothing it started keeps running: init, the
  payload, squashfuse, the --fakeroot helper.

The runs are started by tests/support/reaper.py, a child subreaper: whatever
loses its parent is adopted by it, so its own children after a run are
exactly what the run left, without looking at any host-wide list.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import sifs
from tests.support.leftovers import settled, traces

REAPER = str(Path(__file__).resolve().parents[1] / "support" / "reaper.py")
# Not SIGINT: in the interpreter's own first milliseconds, before singpy's code runs, Python turns it into a
# KeyboardInterrupt that its start-up code may report (status 1) or even swallow (docs/usage.md).
# test_process.py sends it once the payload runs. (Not SIGQUIT either: its default action dumps core.)
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
TRAPPED = 100  # the payload exits 100+N from its trap for signal N
PAYLOAD = " ".join(f"trap 'exit {TRAPPED + sig}' {sig.name[3:]};" for sig in FORWARDED) + " echo ready; read line"
TRIALS = 30  # per case, half SIGKILL, half a forwarded signal (SIGTERM for half of those)
SPREAD = 1.5  # signals are sent between 0 and SPREAD times the measured start-up
PATIENCE = 5.0  # seconds singpy may take to exit after a signal
GRACE = 2.0  # seconds what singpy started may take to die after it
BUDGET = 8.0  # seconds of trials per case at most (2 to 5 s on an idle machine): a loaded one runs fewer

# mode: (action flags, image kind, squashfs strategy or None)
MODES = {
    "sandbox": ([], "sandbox", None),
    "pid": (["--pid"], "sandbox", None),
    "containall": (["--containall"], "sandbox", None),
    "fakeroot": (["--fakeroot"], "sandbox", None),
    "extract": (["--unsquash"], "sif", "extract"),
    "loop": ([], "sif", "loop"),
    "fuse": ([], "sif", "fuse"),
    "fuse-pid": (["--pid"], "sif", "fuse"),
}


@pytest.fixture(scope="module")
def sif(workdir: Path) -> Path:
    """A SIF of this module's own: what names its path (loop devices, squashfuse) is this module's doing."""
    return sifs.patched(sifs.siftool_sif(workdir), workdir / "signals.sif", [])


def plan(rng: random.Random) -> list[tuple[int, float]]:
    """(signal, moment as a fraction of the start-up): each kind spread evenly over [0, SPREAD], in random order."""
    kills = [(int(signal.SIGKILL), (i + rng.random()) / (TRIALS // 2) * SPREAD) for i in range(TRIALS // 2)]
    others = TRIALS - len(kills)
    forwarded = [(int(signal.SIGTERM if i % 2 else rng.choice(FORWARDED)), (i + rng.random()) / others * SPREAD)
                 for i in range(others)]
    trials = kills + forwarded
    rng.shuffle(trials)
    return trials


def problems(trial: dict[str, object]) -> list[str]:
    """What is wrong with one trial's outcome ([] if nothing)."""
    sig, status = int(trial["signal"]), trial["status"]  # type: ignore[call-overload]
    found = []
    if trial["hung"]:
        found.append(f"still running {PATIENCE} s after the signal (the signal was lost)")
    elif sig == signal.SIGKILL:
        if status != -signal.SIGKILL:
            found.append(f"status {status} after SIGKILL")
    elif status not in (TRAPPED + sig, 128 + sig, -sig):
        found.append(f"status {status}: neither the payload's trap ({TRAPPED + sig}) nor the signal ({128 + sig})")
    if trial["survivors"]:
        found.append(f"left running: {trial['survivors']}")
    stderr = str(trial["stderr"])
    if "Traceback" in stderr or "internal error" in stderr:
        found.append(f"stderr: {stderr}")
    return found


@pytest.mark.parametrize("mode", list(MODES))
def test_signals_and_kills_at_random_moments(singpy: Singpy, image: Path, sif: Path, workdir: Path, mode: str,
                                             request: pytest.FixtureRequest) -> None:
    flags, kind, strategy = MODES[mode]
    global_flags: list[str] = []
    if strategy == "loop" and singpy.uid != 0:
        pytest.skip("loop devices are for root only")
    if strategy == "fuse":
        request.getfixturevalue("fuse_open")
    if strategy is not None:
        global_flags, strategy_flags = sifs.split_flags(sifs.strategy_args(singpy, strategy, workdir))
        flags = [*strategy_flags, *flags]
    target = sif if kind == "sif" else image
    seed = random.randrange(1 << 32)
    argv, ids = singpy.command([*global_flags, "exec", *flags, str(target), "sh", "-c", PAYLOAD])
    spec = {"argv": argv, "env": singpy.env(), "cwd": str(workdir), "user": ids.get("user"),
            "group": ids.get("group"), "calibrate": 5, "patience": PATIENCE, "grace": GRACE, "budget": BUDGET,
            "trials": plan(random.Random(seed))}
    before = traces(target)
    done = subprocess.run([sys.executable, "-P", REAPER], input=json.dumps(spec), capture_output=True, text=True,
                          timeout=BUDGET + 100)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert results["calibration_survivors"] == []
    failures = [f"signal {trial['signal']} at {trial['delay'] * 1000:.0f} ms: {problem}"
                for trial in results["trials"] for problem in problems(trial)]
    trapped = sum(1 for trial in results["trials"] if trial["status"] == TRAPPED + trial["signal"])
    print(f"{mode}/{singpy.profile}: start-up {results['startup'] * 1000:.0f} ms, {len(results['trials'])} trials, "
          f"{trapped} signals trapped by the payload, seed {seed}")
    assert failures == [], f"seed {seed}, start-up {results['startup'] * 1000:.0f} ms"
    assert settled(before, target) == before

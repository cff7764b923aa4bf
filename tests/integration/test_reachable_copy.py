"""`make test` from a clone in root's 0700 home: the suite runs from a copy the test user can reach."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import reachable
from tests.support.users import is_root


@pytest.mark.skipif(not is_root(), reason="only root runs the suite as a second user")
def test_suite_runs_from_a_clone_other_users_cannot_reach(workdir: Path) -> None:
    private = workdir / "private-home"
    private.mkdir(mode=0o700)
    clone = private / "singpy"
    clone.mkdir()
    venv = reachable.make_copy(reachable.REPO, clone)  # a clone with its own .venv, as `make setup` leaves it
    (private).chmod(0o700)
    script = (venv / "bin" / "singpy").read_text()
    assert f"'{reachable.REPO}" not in script and f"'{clone}" in script  # the tuned script imports the copy
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "tests.support.reachable", "-q", "-p",
                           "no:cacheprovider", "tests/integration/test_cli.py", "-k", "test_version"],
                          cwd=clone, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = re.search(rf"the test user can't reach {re.escape(str(clone))}: running the suite from a copy in (\S+)",
                     done.stdout)
    assert said is not None, done.stdout[-3000:]
    assert "3 passed" in done.stdout  # the version tests, as root and as the test user
    assert not Path(said.group(1)).exists()  # this run's copy is gone (another suite's may be there meanwhile)

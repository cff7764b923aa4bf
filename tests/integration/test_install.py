"""`make install` puts a working `singpy` on PATH (issue 11: "Installing like a Python tool")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "singpy").exists(), reason="needs the clone's .venv (make setup)")
def test_make_install_links_a_working_singpy(tmp_path: Path) -> None:
    if Path(sys.executable).parent != REPO / ".venv" / "bin":
        pytest.skip("the suite runs outside the clone's .venv: `make install` would link another one")
    done = subprocess.run(["make", "-s", "-C", str(REPO), "install", f"PREFIX={tmp_path}"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    command = tmp_path / "bin" / "singpy"
    assert command.is_symlink() and os.readlink(command) == str(REPO / ".venv" / "bin" / "singpy")
    assert f"add {tmp_path}/bin to your PATH" in done.stdout
    shown = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0 and shown.stdout.startswith("singpy version "), shown.stderr

"""`make test` from a clone the test user can't reach: the suite runs from a copy they can.

As root the suite runs singpy, Python and the tests' helpers as the unprivileged test user too
(tests/conftest.py). Root's home is mode 0700 on Debian, so from a clone there (`git clone ...
~/singpy && cd ~/singpy && make test`) none of them is reachable by that user. `make test` therefore
starts pytest through this module: where the test user reaches the clone's command and interpreter it
simply runs pytest; otherwise it copies the working tree and its `.venv` into a directory of
/tmp that everyone may read (`/tmp/singpy-tests-clone-XXXXXXXX`), points the copied environment at the
copied tree (the scripts' `#!` lines, the editable install's path entry), runs the same pytest
command there, and removes the copy afterwards. Nothing in the clone changes.

    python -m tests.support.reachable [PYTEST ARGS...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIPPED = {".venv", "build", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"}


def main(argv: list[str]) -> int:
    if not _needs_copy():
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv])
    copy = Path(tempfile.mkdtemp(prefix="singpy-tests-clone-", dir="/tmp"))
    try:
        copy.chmod(0o755)
        print(f"the test user can't reach {REPO}: running the suite from a copy in {copy}", flush=True)
        venv = make_copy(REPO, copy)
        return subprocess.call([str(venv / "bin" / "python"), "-m", "pytest", *argv], cwd=copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _needs_copy() -> bool:
    """Whether the suite runs as root and its unprivileged user can't reach this clone's command or Python."""
    if os.geteuid() != 0:
        return False  # the invoking user is the test user (tests/support/users.py)
    from tests.support.users import can_reach, ensure_test_user

    user = ensure_test_user()
    return not all(can_reach(user, str(path)) for path in (Path(sys.executable).parent / "singpy", REPO / "tests"))


def make_copy(repo: Path, copy: Path) -> Path:
    """The working tree of `repo` (tracked or not, less what SKIPPED names; its .git too: tests list the tracked
    files, as the pipx install's) and its .venv, copied into `copy` and made readable by all; returns the venv."""
    shutil.copytree(repo, copy, symlinks=True, dirs_exist_ok=True,
                    ignore=lambda directory, names: [name for name in names
                                                     if Path(directory) == repo and name in SKIPPED])
    venv = copy / ".venv"
    shutil.copytree(repo / ".venv", venv, symlinks=True)
    _repoint(repo / ".venv", venv, repo, copy)
    subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
    return venv


def _repoint(old_venv: Path, venv: Path, repo: Path, copy: Path) -> None:
    """The copied venv's scripts start the copied Python, and its editable install imports the copied tree (as
    does singpy's tuned script, singpy.cli.launcher: it names the clone and the bundle in it, quoted)."""
    old, new = f"#!{old_venv}/bin/", f"#!{venv}/bin/"
    for script in (venv / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(old.encode()):
                data = new.encode() + data[len(old):]
                script.write_bytes(data.replace(f"'{repo}".encode(), f"'{copy}".encode()))
    for entry in venv.glob("lib/python*/site-packages/__editable__*.pth"):
        lines = entry.read_text().splitlines()
        entry.write_text("".join(f"{str(copy) if line == str(repo) else line}\n" for line in lines))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

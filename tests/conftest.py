"""Fixtures: real busybox images, and singpy run as root and as an unprivileged user.

Integration tests take the `singpy` fixture, which is parametrized over the
two profiles; each case therefore runs once as root and once as the test
user created here (`singpy-test`), like Apptainer's e2e profiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.images import build_busybox_rootfs
from tests.support.users import can_reach, ensure_test_user

SINGPY = str(Path(sys.executable).parent / "singpy")


class Singpy:
    """Runs the real `singpy` command as one profile's user."""

    def __init__(self, profile: str, workdir: Path) -> None:
        self.profile = profile
        self.workdir = workdir
        if profile == "root":
            self.uid, self.gid, self.home, self.user = 0, 0, "/root", "root"
        else:
            entry = ensure_test_user()
            self.uid, self.gid, self.home, self.user = entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_name

    def env(self, **extra: str) -> dict[str, str]:
        base = {"HOME": self.home, "USER": self.user, "LOGNAME": self.user, "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8", "TERM": "dumb"}
        return {**base, **extra}

    def popen(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              **kwargs: object) -> subprocess.Popen[str]:
        ids: dict[str, object] = {}
        if self.uid != 0:
            ids = {"user": self.uid, "group": self.gid, "extra_groups": []}
        return subprocess.Popen([SINGPY, *args], env=self.env() if env is None else env,
                                cwd=str(cwd or self.workdir), text=True, **ids, **kwargs)  # type: ignore[call-overload]

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        process = self.popen(list(args), env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        out, err = process.communicate(input, timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def ok(self, *args: str, **kwargs: object) -> str:
        """Run and return stdout, failing the test with stderr on a non-zero exit."""
        result = self.run(*args, **kwargs)  # type: ignore[arg-type]
        assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        return result.stdout


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    """A world-readable scratch directory (pytest's own tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="singpy-tests-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def image(workdir: Path) -> Path:
    """A busybox sandbox image with a runscript and no env scripts."""
    return build_busybox_rootfs(workdir / "busybox")


@pytest.fixture(scope="session")
def env_image(workdir: Path) -> Path:
    """A busybox sandbox image whose /.singularity.d/env scripts set variables."""
    return build_busybox_rootfs(workdir / "busybox-env", env_scripts={
        "10-docker2singularity.sh": 'export FROM_DOCKER="${FROM_DOCKER:-docker}"\nexport SHARED=image\n',
        "90-environment.sh": "export FROM_IMAGE=image90\nexport PATH=/opt/bin:$PATH\n",
    })


@pytest.fixture(scope="session", params=["root", "user"])
def singpy(request: pytest.FixtureRequest, workdir: Path) -> Singpy:
    runner = Singpy(request.param, workdir)
    if runner.uid != 0:
        for needed in (SINGPY, sys.executable, str(workdir)):
            if not can_reach(ensure_test_user(), needed):
                pytest.fail(f"the test user cannot reach {needed}: clone the repository where other users can read it")
    return runner


@pytest.fixture(scope="session")
def as_root(workdir: Path) -> Singpy:
    return Singpy("root", workdir)


@pytest.fixture(scope="session")
def as_user(workdir: Path) -> Singpy:
    return Singpy("user", workdir)


def host_state() -> tuple[str, frozenset[str], frozenset[str]]:
    """What a failed run must leave unchanged: mounts, /tmp entries, singpy processes."""
    mounts = Path("/proc/self/mountinfo").read_text()
    tmp = frozenset(name for name in os.listdir("/tmp") if not name.startswith("cc"))  # not gcc's temp files
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return mounts, tmp, frozenset(line for line in procs if SINGPY in line)

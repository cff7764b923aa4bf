"""Fixtures: real busybox images, and singpy run as root and as an unprivileged user.

Integration tests take the `singpy` fixture, which is parametrized over the
two profiles; each case therefore runs once as root and once as the test
user, like Apptainer's e2e profiles. As root the test user is `singpy-test`,
created here on first use (tests/support/users.py); as anyone else it is the
invoking user, and what needs root (the "root" profile, `as_root`, changing
host settings) is skipped with the reason.

Another copy of this suite may run on the same machine at the same time:
everything a session makes lives in its own directory (`workdir`, which also
holds pytest's tmp_path), singpy gets a TMPDIR and a cache of the session's
own, and host settings a test needs changed (/dev/fuse's mode, /etc/subuid)
are changed in a private mount namespace for that test's singpy only
(tests/support/hostsim.py). What a run may leave behind is checked with
tests/support/leftovers.py, which only looks at what names our own paths.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import hostsim, reaper, sifs
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import descendants, watch_tmpdir
from tests.support.users import can_reach, ensure_other_user, ensure_test_user, is_root

# The registry_* fixtures (tests.support.registry), each registry started once per session for all modules.
pytest_plugins = ["tests.support.registry", "tests.support.slurm", "tests.support.mpi"]

SINGPY = str(Path(sys.executable).parent / "singpy")
_SESSION: dict[str, Path] = {}
_STARTED: list[subprocess.Popen[str]] = []  # singpy processes started by the current test (see _end_what_we_started)


def pytest_configure(config: pytest.Config) -> None:
    """One directory per session, made before anything else: pytest's tmp_path goes there too.

    (pytest's default base, /tmp/pytest-of-USER, is shared by every session of the same user.) `make test`
    runs the suite in two pytest-xdist workers: worker gwN works in gwN/ inside the controller's directory and
    its tmp_path goes under pN/ there (no longer than a lone session's: messages shorten paths over 80
    characters); the controller removes all of it at the end, even a worker's it stopped early.
    """
    worker = getattr(config, "workerinput", None)
    if worker is not None:
        controller, name = Path(worker[_WORKDIR_KEY]), worker["workerid"]
        path, tmp = controller / name, controller / f"p{name.removeprefix('gw')}"
        path.mkdir()
    else:
        path = Path(tempfile.mkdtemp(prefix="singpy-tests-", dir="/tmp"))
        tmp = path / "pytest"
    path.chmod(0o755)  # pytest's own tmp dirs are private to their owner; the test user must reach ours
    _SESSION["workdir"] = path
    if config.option.basetemp is None or worker is not None:
        config.option.basetemp = str(tmp)
    _signals_as_in_a_shell()


_WORKDIR_KEY = "singpy_workdir"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: where a worker makes its directory (pytest_configure)."""
    node.workerinput[_WORKDIR_KEY] = str(_SESSION["workdir"])


# The slowest test files (a module fixture or a test of minutes each): first in the collection, so that in
# `make test`'s workers (`--no-loadscope-reorder` keeps this order) none is left to run alone at the end.
_SLOWEST_FIRST = ("test_cwl_conformance.py", "test_build_agents.py", "test_install.py", "test_pull_memory.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest files first (_SLOWEST_FIRST); the sort is stable, so each file's tests keep their order."""
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return _SLOWEST_FIRST.index(name) if name in _SLOWEST_FIRST else len(_SLOWEST_FIRST)
    items.sort(key=rank)


def _signals_as_in_a_shell() -> None:
    """The programs the tests start get the signal dispositions of a command typed in a shell.

    Started by `nohup` (SIGHUP ignored) or as a background job of a script (SIGINT and SIGQUIT
    ignored), this process would pass those on, and an ignored signal stays ignored across
    execve: tests that signal singpy would see their signals lost. A handler of ours keeps this
    process as immune as it was, and is reset to the default in every program it starts.
    """
    for number in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, _still_ignored)


def _still_ignored(number: int, frame: object) -> None:
    """Stands for SIG_IGN in this process only (see _signals_as_in_a_shell)."""


def pytest_unconfigure(config: pytest.Config) -> None:
    path = _SESSION.pop("workdir", None)
    if path is not None:
        _remove_tree(path)


def _remove_tree(path: Path) -> None:
    """rmtree that gets through read-only directories (unpacked images have them)."""
    subprocess.run(["chmod", "-R", "u+rwX", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def default_signals() -> None:
    """In a child, before exec: the signals the tests send start at their default action, whatever we
    inherited (tests.support.reaper.default_signals says why)."""
    reaper.default_signals({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1,
                            signal.SIGUSR2})


class Singpy:
    """Runs the real `singpy` command as one profile's user."""

    def __init__(self, profile: str, workdir: Path) -> None:
        self.profile = profile
        self.workdir = workdir
        if profile == "root":
            if not is_root():
                pytest.skip("profile root: the suite is not running as root")
            self.uid, self.gid, self.home, self.user = 0, 0, "/root", "root"
        else:
            entry = ensure_test_user()
            self.uid, self.gid, self.home, self.user = entry.pw_uid, entry.pw_gid, entry.pw_dir, entry.pw_name
        self.tmpdir = workdir / "tmp"  # the TMPDIR of every run (sticky, like /tmp; see the workdir fixture)
        self.cachedir = workdir / f"cache-{profile}"  # SINGPY_CACHEDIR: never the user's shared ~/.cache
        if not self.cachedir.exists():
            self.cachedir.mkdir(mode=0o700)
            os.chown(self.cachedir, self.uid, self.gid)

    def env(self, **extra: str) -> dict[str, str]:
        base = {"HOME": self.home, "USER": self.user, "LOGNAME": self.user, "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": str(self.tmpdir),
                "SINGPY_CACHEDIR": str(self.cachedir)}
        return {**base, **extra}

    def command(self, args: list[str]) -> tuple[list[str], dict[str, object]]:
        """The argv for `singpy ARGS` and the Popen arguments that switch to this profile's user.

        While a test simulates a host setting (tests.support.hostsim), singpy starts through the
        wrapper, which changes user itself.
        """
        prefix = hostsim.wrapper(self.uid, self.gid, str(self.workdir / ".hostsim"))
        return [*prefix, SINGPY, *args], {} if prefix else self.switch()

    def switch(self) -> dict[str, object]:
        """subprocess arguments that run a command as this profile's user ({} when that is us already)."""
        if self.uid == os.geteuid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def popen(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              **kwargs: object) -> subprocess.Popen[str]:
        argv, ids = self.command(args)
        kwargs.setdefault("preexec_fn", default_signals)
        process: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
            argv, env=self.env() if env is None else env, cwd=str(cwd or self.workdir), text=True, **ids, **kwargs)
        _STARTED.append(process)
        return process

    def run(self, *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        process = self.popen(list(args), env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def ok(self, *args: str, **kwargs: object) -> str:
        """Run and return stdout, failing the test with stderr on a non-zero exit."""
        result = self.run(*args, **kwargs)  # type: ignore[arg-type]
        assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        return result.stdout


@pytest.fixture(autouse=True)
def _end_what_we_started() -> Iterator[None]:
    """A test that fails while its singpy runs (a timeout, a failed assertion) must not leave it running.

    A payload that waits forever for a signal it never got would outlive the session and hold its
    images; everything `Singpy.popen` started, and what it started, is killed when the test ends.

    It also watches the one host file every container gets bound in: the host's /dev/null was once found
    chmod-ed to 0644 with a new mtime after a run of the suite, by an unknown test; a test whose singpy
    changes its mode or times fails here, naming itself.
    """
    before = os.stat("/dev/null")
    yield
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns), \
        f"the host's /dev/null changed: mode {before.st_mode:o} -> {after.st_mode:o}, mtime " \
        f"{before.st_mtime_ns} -> {after.st_mtime_ns}"
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            for pid in [*descendants(process.pid), process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.wait()


def readable_by_all(root: Path) -> None:
    """Make a tree readable (and its directories searchable) by everyone, whatever the umask it was made under."""
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)


def assert_one_fatal(result: subprocess.CompletedProcess[str], message: str, code: int = 255) -> None:
    """Exit `code`, one FATAL line holding `message` (a HINT may follow), no traceback, nothing on stdout."""
    assert result.returncode == code, result.stderr
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("FATAL:") and message in lines[0], result.stderr
    assert [line for line in lines[1:] if not line.startswith("HINT:")] == [], result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.fixture(scope="session")
def workdir() -> Path:
    """This session's world-readable scratch directory, /tmp/singpy-tests-XXXXXXXX (removed at the end).

    It holds the images, singpy's TMPDIR (`tmp`, sticky and world-writable like /tmp, watched by
    tests.support.leftovers), the caches and the wrapper's mount point (`.hostsim`).
    """
    path = _SESSION["workdir"]
    tmp = path / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    watch_tmpdir(tmp)
    (path / ".hostsim").mkdir(mode=0o755, exist_ok=True)
    return path


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
    if runner.uid != os.geteuid():
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


# /dev/fuse usable by users ("open") or by root only ("closed"), for the singpy runs of one test.
# Test modules may declare their own with sifs.fuse_mode; these are for the others.


@pytest.fixture(params=["open", "closed"])
def fuse(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from sifs.fuse_mode(request.param)


@pytest.fixture
def fuse_open() -> Iterator[str]:
    yield from sifs.fuse_mode("open")


@pytest.fixture
def fuse_closed() -> Iterator[str]:
    yield from sifs.fuse_mode("closed")


@pytest.fixture(scope="session")
def other_user() -> pwd.struct_passwd:
    """A second unprivileged user (`singpy-test2`), acting against the profile's user in cross-user tests."""
    entry = ensure_other_user()
    if entry is None:
        pytest.skip("a second user needs root to create")
    return entry


def instance_logs(owner: Singpy) -> Path:
    """Where `owner`'s instances write their output: NAME.out and NAME.err."""
    return Path(owner.home, ".singpy", "instances", "logs", os.uname().nodename, owner.user)


_INSTANCE_PREFIX = f"i{os.getpid()}-{uuid.uuid4().hex[:6]}"  # the homes are shared by suites running at once


@pytest.fixture
def named() -> Iterator[Callable[[Singpy], str]]:
    """Unique instance names, each stopped (SIGKILL) by its owner and its logs removed at the end, whatever
    happened."""
    made: list[tuple[Singpy, str]] = []

    def make(owner: Singpy) -> str:
        made.append((owner, f"{_INSTANCE_PREFIX}-{uuid.uuid4().hex[:6]}"))
        return made[-1][1]

    yield make
    for owner, name in made:
        owner.run("instance", "stop", "--force", name)
        for suffix in ("out", "err"):
            (instance_logs(owner) / f"{name}.{suffix}").unlink(missing_ok=True)

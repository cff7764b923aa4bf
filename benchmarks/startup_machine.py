"""The machine, the checkout and the account of a benchmark run, and the venv's commands with fresh bytecode."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from startup_records import Account, Machine
from startup_repo import REPO


def tool_version(tool: str, flag: str = "--version") -> str:
    """`tool` and the first line of its version output that has a digit in it."""
    try:
        done = subprocess.run([tool, flag], capture_output=True, text=True, timeout=10, check=False,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": "root"})
    except OSError:
        return f"{tool}: not installed"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    with_digit = [line for line in lines if any(c.isdigit() for c in line) and not line.startswith("-")]
    named = [line for line in with_digit if line.lower().startswith(tool.split("-")[0])]
    return (named or [f"{tool} {line}" for line in with_digit] or [f"{tool} ?"])[0]


def machine() -> Machine:
    model = "?"
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) // 1024} MiB"
    distro = "?"
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    distro = line.split("=", 1)[1].strip().strip('"')
    return {
        "cpu": model, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "memory": memory,
        "kernel": platform.release(), "distro": distro, "python": platform.python_version(),
        "python_executable": sys.executable, "loadavg_start": os.getloadavg(),
        "ch-run": tool_version("ch-run"), "bwrap": tool_version("bwrap"), "squashfuse": tool_version("squashfuse"),
    }


def git_commit() -> tuple[str, bool]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit, dirty


def choose_account(as_root: bool) -> Account:
    """As root the test user (what HPC users are) unless `as_root`; without root, whoever runs the benchmark."""
    if os.geteuid() == 0 and not as_root:
        from tests.support.users import ensure_test_user

        entry = ensure_test_user()
    else:
        import pwd

        entry = pwd.getpwuid(os.geteuid())
    return Account(uid=entry.pw_uid, gid=entry.pw_gid, user=entry.pw_name, home=entry.pw_dir)


def venv_commands() -> tuple[str, str] | None:
    """The venv's `singpy` and `python` (every benchmark runs them); None, said on stderr, without them."""
    bindir = Path(sys.executable).parent
    singpy, python = str(bindir / "singpy"), str(bindir / "python")
    if not os.path.exists(singpy):
        print(f"{singpy} not found: run `make setup` (or use the venv's python)", file=sys.stderr)
        return None
    return singpy, python


def fresh_bytecode(python: str) -> None:
    """singpy's bytecode up to date and readable by the test user, as `make setup` leaves it.

    A stale .pyc would be recompiled on every run (the test user cannot write
    __pycache__), and so would one it cannot read: Python writes a .pyc with
    the umask of the process that first imported the module (a test that runs
    singpy as root under umask 077 leaves it 0600). That time is not singpy's.
    """
    subprocess.run([python, "-m", "compileall", "-q", str(REPO / "singpy")], check=False)
    for compiled in (REPO / "singpy").rglob("*.pyc"):
        mode = compiled.stat().st_mode
        if mode & 0o044 != 0o044:
            compiled.chmod(mode | 0o044)

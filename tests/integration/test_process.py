"""Exit status, signals, standard streams, file descriptors, leftovers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, host_state

WAIT_FOR_TERM = 'trap "echo got-$1; exit 3" {sig}; echo ready; while :; do sleep 0.05; done'


@pytest.mark.parametrize("code", [0, 1, 42, 254])
def test_exit_status_passes_through(singpy: Singpy, image: Path, code: int) -> None:
    assert singpy.run("exec", str(image), "sh", "-c", f"exit {code}").returncode == code


@pytest.mark.parametrize("flags", [[], ["--pid"]], ids=["no-pidns", "pidns"])
def test_killed_payload_gives_128_plus_signal(singpy: Singpy, image: Path, flags: list[str]) -> None:
    result = singpy.run("exec", *flags, str(image), "sh", "-c", "kill -9 $$")
    assert result.returncode in (137, -9)  # -9: the shell of `subprocess` sees the signal itself
    if flags:
        assert result.returncode == 137


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
@pytest.mark.parametrize("flags", [[], ["--pid"]], ids=["no-pidns", "pidns"])
def test_signals_reach_the_payload(singpy: Singpy, image: Path, sig: signal.Signals, flags: list[str]) -> None:
    name = sig.name[3:]
    script = WAIT_FOR_TERM.format(sig=name).replace("$1", name)
    process = singpy.popen(["exec", *flags, str(image), "sh", "-c", script], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    process.send_signal(sig)
    out, err = process.communicate(timeout=10)
    assert out == f"got-{name}\n", err
    assert process.returncode == 3


def test_stdin_stdout_stderr_pass_through(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", str(image), "sh", "-c", "cat; echo to-err >&2", input="line 1\nline 2\n")
    assert result.stdout == "line 1\nline 2\n"
    assert result.stderr == "to-err\n"


def test_verbose_messages_go_to_stderr_only(singpy: Singpy, image: Path) -> None:
    result = singpy.run("-v", "exec", str(image), "echo", "payload")
    assert result.stdout == "payload\n"
    assert "VERBOSE:" in result.stderr


def test_no_file_descriptors_leak(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", str(image), "ls", "/proc/self/fd")
    assert out.split() == ["0", "1", "2", "3"]  # 3 is ls's own handle on the directory


def test_no_process_survives(singpy: Singpy, image: Path) -> None:
    before = host_state()[2]
    singpy.ok("exec", "--pid", str(image), "sh", "-c", "sleep 30 & sleep 31 & echo started")
    time.sleep(0.2)
    leftover = subprocess.run(["pgrep", "-f", "sleep 3[01]"], capture_output=True, text=True).stdout
    assert leftover == ""
    assert host_state()[2] == before


def test_interactive_shell_gets_the_terminal(singpy: Singpy, image: Path) -> None:
    import os
    import pty

    pid, fd = pty.fork()
    if pid == 0:
        import sys

        env = singpy.env()
        if singpy.uid:
            os.setgroups([])
            os.setgid(singpy.gid)
            os.setuid(singpy.uid)
        os.chdir(singpy.workdir)
        os.execve(str(Path(sys.executable).parent / "singpy"), ["singpy", "shell", str(image)], env)
    os.write(fd, b"tty; exit 7\n")
    output = b""
    while True:
        try:
            chunk = os.read(fd, 1024)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7
    assert b"/dev/pts/" in output

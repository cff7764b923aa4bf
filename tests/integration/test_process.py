"""Exit status, signals, standard streams, file descriptors, leftovers."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.leftovers import boot_ticks, settled, traces, wait_for_empty_pid_namespace

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
    """The payload's background processes end with the container's PID namespace (found by its id, not by name)."""
    before = traces(image, singpy.workdir)
    out = singpy.ok("exec", "--pid", str(image), "sh", "-c", "readlink /proc/self/ns/pid; sleep 30 & sleep 31 & "
                    "echo started")
    returned = boot_ticks()  # the sleeps started before; a later namespace may get its number once it has gone
    namespace, started = out.split()
    assert namespace.startswith("pid:[") and started == "started"
    assert wait_for_empty_pid_namespace(namespace, started_by=returned, timeout=5) == []
    assert settled(before, image, singpy.workdir) == before


def test_interactive_shell_gets_the_terminal(singpy: Singpy, image: Path) -> None:
    import os
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # a copy of pytest: it must never return into the test session, whatever fails
        try:
            import sys

            env = singpy.env()
            if singpy.uid != os.geteuid():
                os.setgroups([])
                os.setgid(singpy.gid)
                os.setuid(singpy.uid)
            os.chdir(singpy.workdir)
            os.execve(str(Path(sys.executable).parent / "singpy"), ["singpy", "shell", str(image)], env)
        finally:
            os._exit(127)
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


# --- the payload's signal state, and commands that can't run ---------------------------------------------------------

SIGNAL_BITS = {name: 1 << (getattr(signal, name) - 1) for name in
               ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "SIGALRM", "SIGPIPE", "SIGXFSZ")}
SHOW_SIGNALS = ["grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"]  # exec'd directly: a shell changes its own


def signal_masks(out: str) -> dict[str, int]:
    """{"SigBlk": mask, "SigIgn": mask} from SHOW_SIGNALS's output."""
    return {name.rstrip(":"): int(value, 16) for name, value in (line.split() for line in out.splitlines())}


def names(mask: int) -> list[str]:
    return sorted(name for name, bit in SIGNAL_BITS.items() if mask & bit)


def payload_signals(singpy: Singpy, args: list[str], ignored: tuple[signal.Signals, ...]) -> dict[str, int]:
    """The payload's masks when singpy starts with exactly `ignored` ignored (the test's own caller may ignore more)."""
    def start_state() -> None:
        for name in SIGNAL_BITS:
            sig = getattr(signal, name)
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    process = singpy.popen([*args, *SHOW_SIGNALS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=start_state)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return signal_masks(out)


@pytest.mark.parametrize("flags", [[], ["--pid"]], ids=["no-pidns", "pidns"])
def test_payload_starts_with_default_signal_actions(singpy: Singpy, image: Path, flags: list[str]) -> None:
    """Nothing blocked, nothing of the launcher's ignored: Python ignores SIGPIPE, and execve keeps that."""
    masks = payload_signals(singpy, ["exec", *flags, str(image)], ignored=())
    assert names(masks["SigBlk"]) == []
    assert names(masks["SigIgn"]) == []
    result = singpy.run("exec", *flags, str(image), "sh", "-c", "yes | head -n 1")
    assert (result.returncode, result.stdout, result.stderr) == (0, "y\n", "")  # `yes` killed by SIGPIPE, quietly


@pytest.mark.parametrize("flags", [[], ["--pid"]], ids=["no-pidns", "pidns"])
def test_signals_ignored_by_the_caller_stay_ignored(singpy: Singpy, image: Path, flags: list[str]) -> None:
    """As under nohup (SIGHUP) or in a shell's background job (SIGINT, SIGQUIT)."""
    ignored = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    masks = payload_signals(singpy, ["exec", *flags, str(image)], ignored=ignored)
    assert names(masks["SigIgn"]) == ["SIGHUP", "SIGINT", "SIGQUIT"]
    assert names(masks["SigBlk"]) == []


@pytest.mark.parametrize("flags", [[], ["--pid"]], ids=["no-pidns", "pidns"])
@pytest.mark.parametrize(("command", "reason"), [("/etc", "is a directory"), ("/etc/passwd", "permission denied"),
                                                 ("/dev/null", "permission denied"),
                                                 ("/no/such/file", "no such file in the container")])
@pytest.mark.parametrize("through_shell", [False, True], ids=["direct", "env-scripts"])
def test_command_that_cannot_run_gives_one_fatal_line(singpy: Singpy, image: Path, env_image: Path, flags: list[str],
                                                      command: str, reason: str, through_shell: bool) -> None:
    """Whether the payload is exec'd directly or through the shell that sources the image's env scripts."""
    result = singpy.run("exec", *flags, str(env_image if through_shell else image), command)
    assert (result.returncode, result.stdout, result.stderr) == (255, "", f'FATAL:   "{command}": {reason}\n')


@pytest.mark.parametrize("args", [["-d", "exec"], ["exec", "--contain", "--cleanenv", "-d"]],
                         ids=["global-d", "action-d"])
def test_debug_traceback_of_an_error_inside_the_container(singpy: Singpy, image: Path, args: list[str]) -> None:
    """The error comes after pivot_root, where nothing can be imported: the traceback must not need to."""
    result = singpy.run(*args, str(image), "/etc")
    assert result.returncode == 255
    lines = result.stderr.splitlines()
    assert "Traceback (most recent call last):" in lines
    # One exception, shown once: no ModuleNotFoundError, no second traceback of the error handling itself.
    # (Source lines may show, where the container happens to see singpy's sources, as under /tmp.)
    assert lines.count("Traceback (most recent call last):") == 1
    raised = [line for line in lines if "Error: " in line or line.endswith("Error")]
    assert raised == ['singpy.errors.ExecError: "/etc": is a directory'], raised
    assert lines[-2:] == ['singpy.errors.ExecError: "/etc": is a directory', 'FATAL:   "/etc": is a directory']
    assert [line for line in lines if line.startswith("FATAL:")] == ['FATAL:   "/etc": is a directory']

"""`run --runscript-timeout DURATION` (APPTAINER_RUNSCRIPT_TIMEOUT), as Apptainer 1.5 means it.

Apptainer interprets its action script, and the image's env scripts it sources,
in an embedded shell whose commands run under a deadline; a command still
running when it passes is killed and the run ends with `FATAL:   command "sleep
2s" was killed after 1s timeout`, exit 255 (its process_linux.go and
util/shell/interpreter). The payload itself, the runscript exec'd at the end, is
never limited.

singpy sources the env scripts with the image's /bin/sh (singpy.env.environ's
ACTION_SCRIPT), so the deadline is kept from outside by a watchdog: a process
forked (twice: nobody has to reap it) just before that shell is exec'd. Until
the deadline it looks, every 20 ms, whether the process that runs the shell
still runs it (its command line is ACTION_SCRIPT's); once the payload replaced
the shell, it exits. At the deadline it sends the shell SIGUSR1, which
ACTION_SCRIPT traps to exit 255 (trapped only with a timeout, and untrapped just
before the payload's exec), kills the shell's children (the slow command) and
prints the FATAL line. Apptainer's default of one minute is not applied: without
the flag, nothing limits the env scripts (no process is forked).

Runs inside the container root: the modules it needs are imported before the
pivot (singpy.launch.phases), and it reads the container's /proc (without one,
`mount proc = no`, nothing can be watched: a warning, and the run goes on).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from singpy.console import escape
from singpy.env.environ import ACTION_SCRIPT
from singpy.errors import UsageError

_POLL = 0.02  # seconds between two looks at the shell
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
TIMER_VARIABLE = "__SINGPY_TIMER"  # set in the shell's environment: ACTION_SCRIPT traps SIGUSR1 then


_LONGEST = (2 ** 63 - 1) / 1e9  # seconds in Go's largest time.Duration


def parse_duration(text: str) -> float:
    """Seconds in Go's duration syntax (time.ParseDuration, which Apptainer uses): 1s, 500ms, 1m30s, 1.5h.

    Refused: no unit (Go refuses it but for 0), a sign, zero (a deadline already past).
    """
    bad = f"bad --runscript-timeout {text!r}"
    rest, total = text.strip(), 0.0
    if not rest:
        raise UsageError(f"{bad}: a duration such as 30s, 1m or 1m30s")
    while rest:
        number_end = 0
        while number_end < len(rest) and (rest[number_end] in "0123456789."):
            number_end += 1
        unit_end = number_end
        while unit_end < len(rest) and rest[unit_end] not in "0123456789.":
            unit_end += 1
        number, unit = rest[:number_end], rest[number_end:unit_end]
        if number in ("", ".") or number.count(".") > 1 or unit not in _UNITS:
            raise UsageError(f"{bad}: a duration such as 30s, 1m or 1m30s (units ns, us, ms, s, m, h)")
        total += float(number) * _UNITS[unit]
        rest = rest[unit_end:]
    if total <= 0:
        raise UsageError(f"{bad}: the duration must be more than zero")
    if total > _LONGEST:  # Go's time.Duration ends at ~292 years; infinity would never fire
        raise UsageError(f"{bad}: longer than Go's longest duration (about 292 years)")
    return total


def arm(seconds: float, shown: str) -> None:
    """Fork the watchdog of the env-script shell this process (or, under singpy's init, its next child) runs."""
    target = os.getpid()
    if not os.path.isdir(f"/proc/{target}"):
        from singpy import console

        console.warning("--runscript-timeout: no /proc in the container to watch the env scripts by: not applied")
        return
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:  # the watchdog, orphaned at once: adopted by the namespace's init, reaped there
                os.closerange(0, 2)  # stdin and stdout: a reader waiting for their end must not wait for it
                os.closerange(3, 65536)
                _watch(target, time.monotonic() + seconds, shown)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _watch(target: int, deadline: float, shown: str) -> None:
    seen = False
    while time.monotonic() < deadline:
        shell = _shell(target)
        if shell is None and (seen or not os.path.isdir(f"/proc/{target}")):
            return  # the payload replaced the shell (or it ended): nothing more to watch
        seen = seen or shell is not None
        time.sleep(_POLL)
    shell = _shell(target)
    if shell is None:
        return
    children = _children(shell)
    command = " ".join(_cmdline(children[0])) if children else "the env scripts"  # read while it is there
    # Said first: with --pid the shell's end ends the namespace, this process with it. The image's command line
    # is escaped: its control characters shown, never sent to the terminal.
    os.write(2, f'FATAL:   command "{escape(command)}" was killed after {shown} timeout\n'.encode(errors="replace"))
    try:
        os.kill(shell, signal.SIGUSR1)  # ACTION_SCRIPT's trap: exit 255, once its running command is gone
    except ProcessLookupError:
        return
    _stop(children)
    end = time.monotonic() + 0.5
    while _shell(target) == shell and time.monotonic() < end:  # the trap ran: exit 255
        time.sleep(_POLL)
    if _shell(target) == shell:  # SIGUSR1 ignored when the shell started: it can't trap it (POSIX)
        os.kill(shell, signal.SIGKILL)


def _stop(children: list[int]) -> None:
    """The shell's running commands ended: SIGINT first, the one signal of a command's death the shells do not
    report ("Killed" would follow the FATAL line), then SIGKILL for one that outlives it."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
    end = time.monotonic() + 0.2
    while time.monotonic() < end and any(_alive(pid) for pid in children):
        time.sleep(_POLL / 4)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Still running (a zombie is done: its parent, the shell, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read(4096)
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2:].split()
    return bool(fields) and fields[0] != b"Z"


def _shell(target: int) -> int | None:
    """The pid of the ACTION_SCRIPT shell: `target` itself, or a child of it (under singpy's init)."""
    if _is_action_shell(target):
        return target
    return next((pid for pid in _children(target) if _is_action_shell(pid)), None)


def _is_action_shell(pid: int) -> bool:
    argv = _cmdline(pid)
    return len(argv) >= 3 and argv[1] == "-c" and argv[2] == ACTION_SCRIPT


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            data = handle.read(1 << 20)
    except OSError:
        return []
    return [part.decode(errors="replace") for part in data.split(b"\0")[:-1]]


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` but this one (orphaned, it may be the shell's, PID 1's), oldest
    first (from /proc/PID/stat: the field after the name)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read(4096)
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(parent).encode() and int(name) != os.getpid():  # adopted: not us
            found.append(int(name))
    return sorted(found)

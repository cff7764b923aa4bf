"""Starting the payload inside the finished container, and supervising it.

Without --pid the launcher *becomes* the payload (execve in place): its exit
status, signals, terminal and file descriptors are the payload's with no
process in between, and nothing can be left running. With --pid a process
must stay outside (the new namespace's PID 1 is our child); see `supervise`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from singpy import console
from singpy.environ import ACTION_SCRIPT, final_env, needs_shell, shell_env
from singpy.errors import ExecError, SingpyError
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.plan import ProcessSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

RUNSCRIPT = "/.singularity.d/runscript"
ENV_DIR = "/.singularity.d/env"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                     signal.SIGQUIT, signal.SIGALRM, signal.SIGWINCH, signal.SIGCONT)


def payload_argv(process: ProcessSpec) -> list[str]:
    """What runs, decided inside the container root (runscript, shell)."""
    if process.action == "exec":
        return list(process.args)
    if process.action == "run":
        if os.access(RUNSCRIPT, os.X_OK):
            return [RUNSCRIPT, *process.args]
        console.verbose(f"no {RUNSCRIPT} in the container: running /bin/sh")
        return ["/bin/sh", *process.args]
    if process.shell:
        return [process.shell, *process.args]
    if os.access("/bin/bash", os.X_OK):
        return ["/bin/bash", "--norc", *process.args]
    return ["/bin/sh", *process.args]


def exec_process(process: ProcessSpec) -> NoReturn:
    """Called inside the container root, as the final step: chdir, no_new_privs, capabilities, execve.

    No PR_SET_PDEATHSIG here: when this runs in the launcher's own process
    (no --pid, no supervisor) there is no parent whose death matters, the
    launcher *is* the payload; under a supervisor, `_run_child` set it.
    """
    argv = payload_argv(process)
    _chdir(process.cwd, dict(process.env.base).get("HOME", "/"))
    k.prctl(k.PR_SET_NO_NEW_PRIVS, 1)
    caps.apply(process.privileges)  # last: the steps before may still need what is dropped
    if (_has_env_scripts() or needs_shell(process.env)) and os.access("/bin/sh", os.X_OK):
        console.debug("environment through /bin/sh: the image's env scripts, or values to evaluate")
        _execve("/bin/sh", ["/bin/sh", "-c", ACTION_SCRIPT, "singpy", *argv], shell_env(process.env))
    env = final_env(process.env)
    _execve(_find_executable(argv[0], env.get("PATH", "")), argv, env)


def _chdir(cwd: str, home: str) -> None:
    for candidate in (cwd, home, "/"):
        try:
            os.chdir(candidate)
            if candidate != cwd:
                console.warning(f"could not change to {cwd} in the container: starting in {candidate}")
            return
        except OSError:
            continue


def _has_env_scripts() -> bool:
    try:
        return any(name.endswith(".sh") for name in os.listdir(ENV_DIR))
    except OSError:
        return False


def _find_executable(name: str, path: str) -> str:
    if "/" in name:
        return name
    for directory in path.split(":"):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise ExecError(f'"{name}": executable file not found in $PATH')


def _execve(path: str, argv: list[str], env: dict[str, str]) -> NoReturn:
    console.debug(f"exec {argv}")
    try:
        os.execve(path, argv, env)
    except FileNotFoundError:
        raise ExecError(f'"{argv[0]}": no such file in the container') from None
    except PermissionError:
        raise ExecError(f'"{argv[0]}": permission denied') from None
    except OSError as error:
        raise ExecError(f'can\'t execute "{argv[0]}": {error.strerror}') from None


def supervise(child: Callable[[], NoReturn], helpers: tuple[int, ...] = ()) -> int:
    """Fork `child` and wait for it, forwarding signals; return its exit status.

    Used for --pid: the parent stays outside the new PID namespace; the child
    is its PID 1 and runs `init`. Used too when `helpers` (squashfuse, see
    `spawn_helper`) serve the container's root: they are killed once the
    child is gone, whatever way it ended. PR_SET_PDEATHSIG makes a killed
    launcher take the container and the helpers down with it rather than
    leave them unsupervised.
    """
    try:
        pid = os.fork()
        if pid == 0:
            _run_child(child)
        return _wait_forwarding(pid)
    finally:
        for helper in helpers:
            _stop(helper)


def spawn_helper(argv: list[str], *, root: str, keep_fd: int, quiet: bool) -> tuple[int, int]:
    """Start a long-running helper program; return its pid and the read end of its stderr.

    The child chroots to `root` (the host tree, where its dynamic loader and
    libraries are), so `argv` holds host paths. It gets a session of its
    own, so that a terminal's ^C or hangup, meant for the payload, does not
    reach it (it must outlive the payload's signal handling), and it dies with
    the launcher (PR_SET_PDEATHSIG). `keep_fd` stays open in it; stdin and
    stdout are /dev/null (a pipe held open by it would delay the reader's end
    of file); its stderr goes to a pipe we read only if it fails, or to ours
    at -d (`quiet` false).
    """
    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the launcher died before the prctl
                os._exit(1)
            os.setsid()
            os.chroot(root)
            os.chdir("/")
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)  # the payload's stdin and stdout are not the helper's business
            os.dup2(null, 1)
            os.dup2(errors_write if quiet else 2, 2)
            os.set_inheritable(keep_fd, True)
            os.execve(argv[0], argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except BaseException as error:  # never let a forked child unwind into the parent's code
            os.write(errors_write, f"can't start {argv[0]}: {error}\n".encode())
        os._exit(127)
    os.close(errors_write)
    return pid, errors_read


def helper_failure(pid: int, errors: int) -> str:
    """After a helper failed: its last line on stderr ("" if none); reaps it."""
    with os.fdopen(errors, "rb") as pipe:
        text = pipe.read().decode(errors="replace")
    _stop(pid)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _stop(pid: int) -> None:
    """Kill a helper and reap it. SIGKILL: it serves a read-only image, there is nothing to flush."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        return


def init(payload: Callable[[], NoReturn]) -> NoReturn:
    """PID 1 of a new PID namespace: start the payload, forward signals, reap orphans.

    The kernel delivers to a namespace's PID 1 only the signals it has
    handlers for (pid_namespaces(7)), so the payload cannot be PID 1 itself:
    SIGTERM would be ignored.
    """
    pid = os.fork()
    if pid == 0:
        _run_child(payload)
    os._exit(_wait_forwarding(pid, reap_all=True))


def _run_child(body: Callable[[], NoReturn]) -> NoReturn:
    try:
        k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
        body()
    except SingpyError as error:
        console.fatal(error.message)
        os._exit(error.exit_code)
    except BaseException as error:  # never let a forked child unwind into the parent's code
        console.fatal(f"internal error: {error!r}")
        os._exit(255)


def _wait_forwarding(pid: int, *, reap_all: bool = False) -> int:
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, lambda received, _frame: _forward(pid, received))
    while True:
        done, status = os.waitpid(-1 if reap_all else pid, 0)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # already gone: its status is on its way
        return

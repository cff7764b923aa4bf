"""Starting the payload inside the finished container, and supervising it.

Without --pid the launcher *becomes* the payload (execve in place): its exit status, signals, terminal and
file descriptors are the payload's with no process in between, and nothing can be left running (a tree of the
cache stays held in use: ProcessSpec.in_use). With --pid a process must stay outside (the new namespace's PID 1
is our child); see `supervise`.

Two promises hold at every moment of the start-up, not only once the payload runs:

* No forwarded signal is lost. Until the payload exists it ends the start-up
  as it would have ended the payload (default action); a supervisor and init
  keep the signals blocked and take them with sigwaitinfo, so that a new PID
  namespace's init never drops one for lack of a handler (`supervise`).
* No process outlives a killed launcher: every child is made by `fork_tied`
  (PR_SET_PDEATHSIG, then a check that the parent did not die before it).
"""

from __future__ import annotations

import os
import stat
import sys

from singpy import console
from singpy.constants import RUNSCRIPT, SYSTEM_PATH
from singpy.env.environ import ACTION_SCRIPT, final_env, needs_shell, shell_env
from singpy.errors import ExecError, SingpyError
from singpy.host.hostfiles import which
from singpy.image.scripts import ImageScripts
from singpy.kernel import caps
from singpy.kernel import syscalls as k
from singpy.launch.exitstatus import exit_code
from singpy.plan import Privileges, ProcessSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import NoReturn
if TYPE_CHECKING:  # the same calls and constants, typed
    import signal
else:  # the C module: `signal` only wraps them in enums, about 0.5 ms of a launch's imports
    import _signal as signal

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                     signal.SIGQUIT, signal.SIGALRM, signal.SIGWINCH, signal.SIGCONT)
_caller_mask: set[int | signal.Signals] | None = None  # the mask singpy started with, once `block_signals` changed it


def payload_argv(process: ProcessSpec, scripts: ImageScripts) -> list[str]:
    """What runs, decided inside the container root (the runscript found in the image, the shell)."""
    if process.action == "exec":
        return list(process.args)
    if process.action == "run":
        if scripts.runscript is not None and os.access(scripts.runscript, os.X_OK):
            return [scripts.runscript, *process.args]
        if process.app:  # Apptainer's words; its action script stops there too
            return _app_fallback(process) or _raise(f"no runscript for contained app: {process.app}")
        console.verbose(f"no executable {RUNSCRIPT} in the image: running /bin/sh")
        return ["/bin/sh", *process.args]
    if process.action == "test":  # Apptainer's action script: no test script is a success, an app's is an error
        if scripts.runscript is not None and os.access(scripts.runscript, os.X_OK):
            return [scripts.runscript, *process.args]
        if process.app:
            return _app_fallback(process) or _raise(f"No tests for contained app: {process.app}")
        return []
    if process.shell:
        return [process.shell, *process.args]
    if os.access("/bin/bash", os.X_OK):
        return ["/bin/bash", "--norc", *process.args]
    return ["/bin/sh", *process.args]


def _app_fallback(process: ProcessSpec) -> list[str]:
    """Apptainer's action script, for an app without the script asked for (run and test alike): the test
    script of an app named `singularity`, if that is executable (a quirk kept: images may rely on it)."""
    fallback = "/scif/apps/singularity/scif/test"
    return [fallback, *process.args] if os.access(fallback, os.X_OK) else []


def _raise(message: str) -> NoReturn:
    raise ExecError(message)


def exec_process(process: ProcessSpec, scripts: ImageScripts) -> NoReturn:
    """Called inside the container root, as the final step: chdir, no_new_privs, capabilities, execve.

    `scripts` are the image's own env scripts and runscript, found in the image
    before anything was mounted on it (singpy.launch.phases.build_container).

    No PR_SET_PDEATHSIG here: when this runs in the launcher's own process (no --pid, no supervisor)
    there is no parent whose death matters, the launcher *is* the payload; under a supervisor, `fork_tied` set it.
    """
    argv = payload_argv(process, scripts)
    if not argv:  # `test` of an image without a test script
        console.info("No test script found in container, exiting")
        sys.stderr.flush()
        os._exit(0)
    _chdir(process.cwd, dict(process.env.base).get("HOME", "/"), required=process.cwd_required)
    _check_command(argv[0])
    if process.umask is not None:  # --no-umask; otherwise the caller's, inherited, as Apptainer passes it on
        os.umask(process.umask)
    if process.no_new_privs:  # off for --allow-setuid alone (singpy.launch.setuid)
        k.prctl(k.PR_SET_NO_NEW_PRIVS, 1)
    # --security uid:/gid: first (they need CAP_SETUID/CAP_SETGID); a payload no longer root has no capability
    # left, and no CAP_SETPCAP to trim its bounding set, which no_new_privs makes moot anyway.
    left_root = process.security is not None and _security().apply_ids(process.security)
    if not left_root:
        caps.apply(process.privileges)  # last: the steps before may still need what is dropped
    env_plan = process.env.replace(shell=argv[0]) if process.action == "shell" else process.env  # SHELL: the one run
    if (scripts.env or needs_shell(env_plan)) and os.access("/bin/sh", os.X_OK):
        console.debug("environment through /bin/sh: the image's env scripts, or values to evaluate")
        _execve("/bin/sh", ["/bin/sh", "-c", ACTION_SCRIPT, "singpy", *argv], shell_env(env_plan, scripts.env), process)
    env = final_env(env_plan, run_ldconfig=process.security is None)  # no image program before the filter
    _execve(_find_executable(argv[0], env.get("PATH", "")), argv, env, process)


def _security() -> ModuleType:
    """singpy.launch.security, imported only with --security (imported before the pivot: launch.plan_launch)."""
    from singpy.launch import security

    return security


def _chdir(cwd: str, home: str, *, required: bool) -> None:
    """The host's working directory may be missing inside: the home, then /, as Apptainer; a --pwd may not."""
    for candidate in (cwd, home, "/"):
        try:
            os.chdir(candidate)
            if candidate != cwd:
                console.warning(f"could not change to {cwd} in the container: starting in {candidate}")
            return
        except OSError as error:
            if required:  # Apptainer: "failed to set working directory", never another directory
                reason = error.strerror
                raise ExecError(f"can't change to the --pwd directory {cwd} in the container: {reason}") from None
            continue


def _check_command(name: str) -> None:
    """A command given as a path must be an executable file: else one FATAL line, never a shell's words.

    execve would refuse the rest too, a directory with EACCES ("permission
    denied" would mislead); but through the env-script shell (ACTION_SCRIPT)
    `command -v` accepts any existing path, and the shell's `exec` would fail
    with its own message and status. Names without a slash are looked up in
    PATH (`_find_executable`, or the shell's `command -v`).
    """
    if "/" not in name:
        return
    try:
        mode = os.stat(name).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ExecError(f'"{name}": no such file in the container') from None
    except OSError as error:
        raise ExecError(f'can\'t execute "{name}": {error.strerror}') from None
    if stat.S_ISDIR(mode):
        raise ExecError(f'"{name}": is a directory')
    if not stat.S_ISREG(mode) or not os.access(name, os.X_OK):
        raise ExecError(f'"{name}": permission denied')


def _find_executable(name: str, path: str) -> str:
    """`name` as execvp would find it; a path is returned as it is (checked by `_check_command`)."""
    if "/" in name:
        return name
    found = which(name, path)
    if found is None:
        raise ExecError(f'"{name}": executable file not found in $PATH')
    return found


def _execve(path: str, argv: list[str], env: dict[str, str], process: ProcessSpec) -> NoReturn:
    console.debug(f"exec {argv}")
    if process.go_pipe[0] >= 0:  # every check passed: the background unpacking may start (before SIGPIPE's default)
        _send_go(*process.go_pipe)
    _keep_in_use(*process.in_use)
    _exec_signals()
    if process.security is not None:  # the AppArmor/SELinux exec label, the seccomp filter: nothing of ours after
        _security().apply_last(process.security)
    try:
        os.execve(path, argv, env)
    except FileNotFoundError:
        raise ExecError(f'"{argv[0]}": no such file in the container') from None
    except PermissionError:
        raise ExecError(f'"{argv[0]}": permission denied') from None
    except OSError as error:
        raise ExecError(f'can\'t execute "{argv[0]}": {error.strerror}') from None


def _send_go(fd: int, inode: int) -> None:
    """The go byte of ProcessSpec.go_pipe, if `fd` still is that pipe (closed and reused, it is someone else's); an
    unpacking that is gone already is no error of the launch."""
    try:
        if stat.S_ISFIFO((info := os.fstat(fd)).st_mode) and info.st_ino == inode:
            os.write(fd, b"g")
    except OSError as error:  # EPIPE: it stopped waiting (singpy.image.warm.GO_TIMEOUT)
        console.debug(f"the background unpacking did not take its go: {error.strerror}")


def _keep_in_use(fd: int, inode: int) -> None:
    """ProcessSpec.in_use across the execve, if `fd` (-1: none) is still that file (a holder closes what it does
    not know): the payload holds the cache's tree in use while it lives (a daemon closing it loses only that)."""
    try:
        if fd >= 0 and stat.S_ISREG((info := os.fstat(fd)).st_mode) and info.st_ino == inode:  # -1: no syscall
            os.set_inheritable(fd, True)
    except OSError:
        return


def _exec_signals() -> None:
    """Signals as a program expects them when we exec it: default actions, the caller's mask.

    Handlers go back to the default at execve, but an ignored signal stays
    ignored and the mask stays as it is: Python ignores SIGPIPE and SIGXFSZ
    (`yes | head` would then end with an error instead of quietly), and a
    supervisor blocked signals (`block_signals`). A forwarded signal pending
    now came during the set-up: it takes its default action here, as it would
    have on the payload. What the user's process ignored (SIGINT and SIGQUIT in
    a background job, SIGHUP under nohup) stays ignored; SIGPIPE's and
    SIGXFSZ's original actions are lost, so the default, as subprocess does.
    """
    _default_handlers()
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    if _caller_mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _caller_mask)


def _default_handlers() -> None:
    """The forwarded signals that have a Python handler (Python's own for SIGINT): default action."""
    for signum in FORWARDED_SIGNALS:
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)


def supervise(child: Callable[[], NoReturn], helpers: tuple[int, ...] = ()) -> int:
    """Fork `child` and wait for it, forwarding signals; return its status: an exit code, or -N where signal N
    killed it (the launcher then ends by that signal too: singpy.launch.exitstatus).

    Used for --pid: the parent stays outside the new PID namespace; the child
    is its PID 1 and runs `init`. Used too when `helpers` (squashfuse, see
    `spawn_helper`) serve the container's root, or a host network is wired
    (singpy.launch.launch.attach_network): the helpers are killed once the child is
    gone, whatever way it ended. The child dies with the launcher (`fork_tied`).

    No signal is lost at any moment: the forwarded signals are blocked before
    the fork (`block_signals`), and a blocked signal stays pending, even in a
    PID namespace's init, to which the kernel does not deliver a signal whose
    action is the default. The child inherits the mask and keeps it while it
    builds the container; the supervisor and init take the signals from their
    pending set (`_wait_forwarding`), and the payload unblocks them just
    before execve (`_exec_signals`): a signal that came before the payload
    existed then takes its default action on it, as it would have later.
    """
    try:
        block_signals()
        pid = fork_tied()
        if pid == 0:
            run_child(child)
        return _wait_forwarding(pid)
    finally:
        for helper in helpers:
            stop_helper(helper)


def block_signals() -> None:
    """Hold the forwarded signals and SIGCHLD pending from now on, here and in the children forked from now.

    SIGCHLD's action must be the default (an ignored SIGCHLD reaps children
    unasked: their status would be lost); the caller's mask is kept for the
    payload (`_exec_signals`).
    """
    global _caller_mask
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, (*FORWARDED_SIGNALS, signal.SIGCHLD))
    if _caller_mask is None:
        _caller_mask = previous


def fork_tied() -> int:
    """fork(2) for a child that must not outlive us: 0 in the child, its pid here.

    The child sets PR_SET_PDEATHSIG (SIGKILL), which a fork does not inherit
    and which covers only a parent that dies after it is set, so the child
    then checks that the parent is still there (`_parent_alive`) and leaves
    if not. Python's SIGINT handler goes back to the default action in the
    child (a KeyboardInterrupt must not unwind a forked child); the signal
    mask is inherited and stays as it is.
    """
    parent = os.getpid()
    lifeline, held = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(held)
            _default_handlers()
            k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
            if not _parent_alive(parent, lifeline):
                os._exit(1)  # nobody waits for this status
            os.close(lifeline)
        except BaseException:  # never let a forked child unwind into the parent's code
            os._exit(255)
        return 0
    # `held` stays open here for as long as we live (close-on-exec): see _parent_alive.
    os.close(lifeline)
    return pid


def _parent_alive(parent: int, lifeline: int) -> bool:
    """In a child of `fork_tied`, after PR_SET_PDEATHSIG: whether the parent has not died already.

    Once dead, the parent is no longer ours: getppid() then names the
    process that adopted us. That test is void for the first process of a new
    PID namespace, whose parent is outside it: getppid() is 0 whether the
    parent lives or not. There the lifeline tells: a pipe whose write end only
    the parent holds (ours was closed first, and the parent forks nothing after
    it), so reading finds end of file once the parent has died.
    """
    ppid = os.getppid()
    if ppid != 0:
        return ppid == parent
    os.set_blocking(lifeline, False)
    try:
        return os.read(lifeline, 1) != b""
    except BlockingIOError:  # no data, a writer still there: the parent
        return True


def spawn_helper(argv: list[str], *, root: str, keep_fd: int, quiet: bool,
                 death_signal: int = signal.SIGKILL, privileges: Privileges | None = None) -> tuple[int, int]:
    """Start a long-running helper program; return its pid and the read end of its stderr.

    The child chroots to `root` (the host tree, where its dynamic loader and
    libraries are), so `argv` holds host paths. It gets a session of its
    own, so that a terminal's ^C or hangup, meant for the payload, does not
    reach it (it must outlive the payload's signal handling), and it dies with
    the launcher (`fork_tied`). `keep_fd` stays open in it; stdin and
    stdout are /dev/null (a pipe held open by it would delay the reader's end
    of file); its stderr goes to a pipe we read only if it fails, or to ours
    at -d (`quiet` false). `death_signal` is what it gets if the launcher
    dies (SIGTERM for fuse2fs, which must flush a writable image). With
    `privileges` (a program of the image: --fusemount container:), it runs
    as the payload would: no_new_privs, only the capabilities left to it.
    """
    errors_read, errors_write = os.pipe2(os.O_CLOEXEC)
    pid = fork_tied()
    if pid == 0:
        try:
            if death_signal != signal.SIGKILL:
                k.prctl(k.PR_SET_PDEATHSIG, death_signal)
            os.setsid()
            os.chroot(root)
            os.chdir("/")
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)  # the payload's stdin and stdout are not the helper's business
            os.dup2(null, 1)
            os.dup2(errors_write if quiet else 2, 2)
            os.set_inheritable(keep_fd, True)
            if privileges is not None:
                k.prctl(k.PR_SET_NO_NEW_PRIVS, 1)
                caps.apply(privileges)
            _exec_signals()
            os.execve(argv[0], argv, {"PATH": SYSTEM_PATH})
        except BaseException as error:  # never let a forked child unwind into the parent's code
            os.write(errors_write, f"can't start {argv[0]}: {error}\n".encode())
        os._exit(127)
    os.close(errors_write)
    return pid, errors_read


_STOP_GRACE = 10.0  # seconds a helper gets to exit after SIGTERM (fuse2fs flushing a large image)
_held_mounts: dict[int, int] = {}  # helper pid -> a descriptor keeping the mount it serves alive (`hold_mount`)


def hold_mount(pid: int, path: str) -> None:
    """Keep the FUSE mount at `path`, served by helper `pid`, alive until `stop_helper(pid)` has signalled it.

    Once the staging root is detached, a layer's mount lives only as long as
    something refers to it: the layer above (fuse-overlayfs's descriptors).
    When that helper is stopped, the kernel would end the connection of the
    one below, and fuse2fs would begin to exit on its own: it gives SIGTERM
    back its default action, runs fusermount, then writes the image's
    bitmaps and superblock. Our SIGTERM, sent in that time, killed it half
    way and lost all the container wrote (CI saw it; 1 launch in 35 to 150
    here). Held, the mount ends only after the signal (`stop_helper`), which
    fuse2fs then handles.
    """
    _held_mounts[pid] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def helper_failure(pid: int, errors: int) -> str:
    """After a helper failed: its last line on stderr ("" if none); reaps it."""
    with os.fdopen(errors, "rb") as pipe:
        text = pipe.read().decode(errors="replace")
    stop_helper(pid)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def stop_helper(pid: int) -> None:
    """Stop a helper and reap it: SIGTERM, then SIGKILL if it is still there after _STOP_GRACE seconds.

    SIGTERM first: fuse2fs, serving a writable overlay image, writes its
    bitmaps and superblock only when it exits (libfuse ends its loop on
    SIGTERM and unmounts); killed, it would leave the image inconsistent.
    A mount held for it (`hold_mount`) is let go once the signal is pending:
    with nothing above it any more, its connection then ends too, which
    wakes a libfuse 2 loop that took the signal between its check of the
    exit flag and its next read.
    """
    import time

    try:
        try:
            os.kill(pid, signal.SIGTERM)
        finally:
            held = _held_mounts.pop(pid, None)
            if held is not None:
                os.close(held)
        deadline = time.monotonic() + _STOP_GRACE
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.002)
    except (ProcessLookupError, ChildProcessError):
        return


def init(payload: Callable[[], NoReturn]) -> NoReturn:
    """PID 1 of a new PID namespace: start the payload, forward signals, reap orphans.

    The kernel delivers to a namespace's PID 1 only the signals it has
    handlers for (pid_namespaces(7)), so the payload cannot be PID 1 itself:
    SIGTERM would be ignored. init keeps the signals blocked (`supervise`),
    and the kernel never ignores a blocked signal: what the launcher forwarded
    during the set-up is pending, and reaches the payload from `_wait_forwarding`.
    """
    pid = fork_tied()
    if pid == 0:
        run_child(payload)
    os._exit(exit_code(_wait_forwarding(pid, reap_all=True)))  # the kernel shields init from its own signals


def run_child(body: Callable[[], NoReturn]) -> NoReturn:
    try:
        body()
    except SingpyError as error:
        console.fatal(error.message)
        os._exit(error.exit_code)
    except BaseException as error:  # never let a forked child unwind into the parent's code
        console.fatal(f"internal error: {error!r}")
        os._exit(255)


def _wait_forwarding(pid: int, *, reap_all: bool = False) -> int:
    """Forward signals to `pid` until it exits (reaping any other child if `reap_all`); its status (-N: killed
    by signal N).

    Synchronous: the signals stay blocked (`block_signals`, before the fork)
    and are taken one at a time from the pending set with sigwaitinfo,
    SIGCHLD among them. A handler could not do that safely: Python runs it
    between bytecodes, so a signal that came just before the wait system call
    would only be noted while the wait went on, possibly for ever. A signal
    is forwarded only before `pid` is reaped (never to a recycled pid); a
    signal ignored when singpy started is not forwarded (the payload ignores
    it too).
    """
    forwarded = {signum for signum in FORWARDED_SIGNALS if signal.getsignal(signum) != signal.SIG_IGN}
    waited = forwarded | {signal.SIGCHLD}
    while True:
        received = signal.sigwaitinfo(waited).si_signo
        if received != signal.SIGCHLD:
            _forward(pid, received)
            continue
        status = _reap(pid, reap_all=reap_all)
        if status is not None:
            return status


def _reap(pid: int, *, reap_all: bool) -> int | None:
    """Reap the children that have exited (`pid` only, or all); `pid`'s exit status if it is one of them.

    One SIGCHLD may stand for several children: all are reaped at once.
    """
    while True:
        done, status = os.waitpid(-1 if reap_all else pid, os.WNOHANG)
        if done == 0:
            return None
        if done == pid:
            return os.waitstatus_to_exitcode(status)  # -N: killed by signal N (singpy.launch.exitstatus)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # already gone: its status is on its way
        return

"""How singpy ends when it outlived its payload: with the payload's exit status, or killed by its signal.

A launcher that stays as the container's supervisor (squashfuse serving the image, --pid, a host network,
resource limits, --disable-cache) gets its payload's status from waitpid: a code, or the signal that killed
it (`os.waitstatus_to_exitcode` gives -N). Without a supervisor the payload replaces the launcher, and its
caller sees the payload itself end: killed by SIGTERM, say, which a shell shows as 143 and Python's
subprocess as -15, and Slurm records as a signal. A supervisor ends the same way: it re-raises the signal on
itself (as Apptainer's starter does, internal/app/starter/master_linux.go), so that a SIF's first run
(through FUSE, supervised) and its later runs (from the unpacked tree, exec'd) end alike.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import NoReturn

_PR_SET_DUMPABLE = 4


def exit_code(status: int) -> int:
    """A status as an exit code: -N (killed by signal N) becomes 128+N, as a shell shows it."""
    return 128 - status if status < 0 else status


def exit_as(status: int) -> NoReturn:
    """End this process with `status`: exit with it, or, for -N, be killed by signal N (exit 128+N should the
    signal not kill: a PID namespace's init, which the kernel shields from its own signals).

    No core file is written for the launcher (the payload dumped its own, if it was to): the process is made
    non-dumpable first, which also covers a core_pattern pipe that ignores RLIMIT_CORE.
    """
    if status < 0:
        if TYPE_CHECKING:  # the same calls and constants, typed
            import signal
        else:  # the C module: see singpy.launch.process
            import _signal as signal

        from singpy.kernel import syscalls as k

        signum = -status
        k.prctl(_PR_SET_DUMPABLE, 0)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signum,))
        os.kill(os.getpid(), signum)
    os._exit(exit_code(status))

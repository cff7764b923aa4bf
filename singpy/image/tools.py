"""The squashfs-tools programs singpy runs: finding them, running them, showing progress.

`unsquashfs` and `mksquashfs` write a progress bar to stdout as
`\\r[====   ] 123/456  27%`; on a terminal that count drives a rich progress
bar (rich is imported only then), elsewhere they run with `-no-progress`.
The tool dies with the launcher (PR_SET_PDEATHSIG): a killed `singpy`
leaves no extraction running behind it. A failure is one line: the tool's
last message on stderr.
"""

from __future__ import annotations

import os
import sys

from singpy import console
from singpy.errors import ImageError
from singpy.host.hostfiles import which
from singpy.kernel import syscalls as k

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import signal
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import Any
else:  # the C module: `signal` wraps the same calls in enums (with `enum`, ~2 ms of every SIF launch: issue 31)
    import _signal as signal

_MAX_ERRORS = 1 << 16  # of a tool's stderr kept for the error line: a failing unsquashfs may repeat itself


def find_tool(name: str, env: Mapping[str, str]) -> str | None:
    """Absolute path of program `name` on the host's PATH, as the user's shell would find it."""
    found = which(name, env.get("PATH", os.defpath))
    return os.path.abspath(found) if found else None


def require_tool(name: str, env: Mapping[str, str], purpose: str) -> str:
    path = find_tool(name, env)
    if path is None:
        raise ImageError(f"{name} is not installed (not found in PATH): it is needed to {purpose}",
                         hint="install squashfs-tools")
    return path


def die_with(parent: int, mask: set[int | signal.Signals]) -> None:
    """In the child, before exec: die (SIGKILL) when `parent` does; the signal mask back to `mask`.

    The death signal is armed only now; if the parent died between the fork
    and this point, nothing would ever be sent, so a parent other than the
    one that forked us means it is gone already.
    """
    k.prctl(k.PR_SET_PDEATHSIG, 9)  # SIGKILL
    if os.getppid() != parent:
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Interrupted(ImageError):
    """SIGTERM, SIGHUP or SIGINT arrived inside `with Interruptible()`."""

    number = 0  # the signal, when the handler raised it (0: a caller's re-worded copy)


def _raise_interrupted(number: int, frame: object) -> None:
    if _holding:  # the main thread is starting a thread: taken at the end of SignalsHeld
        _held.append(number)
        return
    for other in _SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(other, signal.SIG_IGN)
    interrupted = Interrupted(f"interrupted by {_NAMES.get(number, number)}")
    interrupted.number = number
    raise interrupted


def _deliver_again(unraisable: Any) -> None:
    """sys.unraisablehook from a command's dispatch on (`keep_interrupts`) and inside Interruptible: a signal's
    exception that Python could not raise is delivered again.

    Python runs a signal's handler at whatever bytecode the main thread is at; when that is a callback whose
    exceptions it can only print ("Exception ignored in": a weakref's callback such as importlib's module
    lock's, a __del__), the exception (Interruptible's Interrupted, or the default handler's KeyboardInterrupt
    before any Interruptible) would go to the terminal as a traceback and the signal be lost (a pull went on
    to its end: seen in CI). The signal is raised again instead, and taken in the code the callback cut into.
    """
    error = unraisable.exc_value
    number = 0
    if isinstance(error, Interrupted):
        number = error.number
    elif isinstance(error, KeyboardInterrupt):
        number = signal.SIGINT
    if number:
        import _thread  # raised here, the signal would be taken in this hook, whose exception is printed too

        if isinstance(error, Interrupted):
            signal.signal(number, _raise_interrupted)
        _thread.start_new_thread(_send_later, (_thread.get_ident(), number))
        return
    _previous_hooks[-1](unraisable)


def keep_interrupts() -> None:
    """From the dispatch of every command but run/exec/shell/test on (singpy.cli.main), before any Interruptible:
    `_deliver_again` for the command's whole life, over Python's own hook (never over another's: a test
    runner's)."""
    if sys.unraisablehook is sys.__unraisablehook__:
        _previous_hooks.append(sys.unraisablehook)
        sys.unraisablehook = _deliver_again


def _send_later(main: int, number: int) -> None:
    """The signal again to the main thread, once it is out of the callback (taken there too, it comes back
    here: a few round trips at most, as a callback is short)."""
    import time

    time.sleep(_AGAIN_AFTER)
    signal.pthread_kill(main, number)


_AGAIN_AFTER = 0.01  # seconds before a signal taken in a callback is sent again


_holding: list[None] = []  # one per SignalsHeld block the main thread is in
_held: list[int] = []  # signals that came during those blocks, sent again at the end of the outermost
_previous_hooks: list[Any] = []  # the hooks keep_interrupts and Interruptible blocks replaced, innermost last


_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_NAMES: dict[int, str] = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP", signal.SIGINT: "SIGINT"}


class Interruptible:
    """`with Interruptible():` turns SIGTERM, SIGHUP and SIGINT into `Interrupted` inside the block.

    By default SIGTERM and SIGHUP end Python at once, skipping every
    `finally`: a build's scratch directory next to its target (hundreds of
    MB) and an extraction's temporary tree would stay. As an exception, the
    signal unwinds through them: `run_tool` kills and reaps its child, the
    scratch directories are removed, and the command ends with one line.
    (A class rather than contextlib: extraction is on the path of a first run.)
    """

    def __enter__(self) -> None:
        _previous_hooks.append(sys.unraisablehook)
        sys.unraisablehook = _deliver_again
        self.previous = {number: signal.signal(number, _raise_interrupted) for number in _SIGNALS}

    def __exit__(self, *exc: object) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        sys.unraisablehook = _previous_hooks.pop()


class SignalsHeld:
    """`with SignalsHeld(): thread.start()`: a signal Interruptible would raise waits for the block's end.

    CPython's Thread.start drops the new thread from its table when an exception comes between the
    thread's start and the moment it is seen started (`except Exception` there); the thread then dies
    on the missing entry with a traceback on stderr ("Exception ignored in thread started by", seen in
    CI when SIGINT cut a pull as it started a layer's read-ahead). Held, the signal is sent to the main
    thread again as the block ends, and taken there. Only the main thread holds: it alone runs handlers.
    """

    def __enter__(self) -> None:
        import threading  # loaded already: the caller starts a thread

        self.main = threading.current_thread() is threading.main_thread()
        if self.main:
            _holding.append(None)

    def __exit__(self, *exc: object) -> None:
        if not self.main:
            return
        _holding.pop()
        if _held and not _holding:
            number = _held[0]
            _held.clear()
            signal.raise_signal(number)  # the main thread's own: its handler runs at the next bytecode


def start_thread(thread: Any) -> None:
    """thread.start(), never cut by a signal that Interruptible turns into an exception (see SignalsHeld)."""
    with SignalsHeld():
        thread.start()


def compression_flags(extra: Sequence[str], default: Sequence[str]) -> list[str]:
    """mksquashfs's compression flags beside `extra` (build --mksquashfs-args, given after them): `default`, unless
    `extra` names its own -comp (Apptainer's rule; singpy's gzip level would not fit another compressor)."""
    if "-comp" not in extra:
        return list(default)
    if list(extra[extra.index("-comp") + 1:extra.index("-comp") + 2]) != ["gzip"]:
        console.info("Non-gzip squashfs compression might not work with some installations")  # Apptainer's words
    return []


def show_progress() -> bool:
    """A progress bar only for a person watching: stderr is a terminal that can redraw, -q not given."""
    return console.level() >= console.NORMAL and sys.stderr.isatty() and os.environ.get("TERM", "dumb") != "dumb"


def run_tool(argv: list[str], *, label: str, failure: str, prefix: Sequence[str] = (),
             squashfs_tool: bool = True, pass_fds: Sequence[int] = ()) -> None:
    """Run a squashfs-tools program (or, `squashfs_tool=False`, another) to completion; `failure` starts the error
    line.

    `-no-progress` is added here when there is no progress bar to feed
    (unsquashfs takes options first, mksquashfs after its sources and target).
    `prefix` runs the program through another (singpy.recipe.mapped). `pass_fds`: descriptors the program
    inherits (an image opened once, given as /proc/self/fd/N: singpy.image.cache).
    """
    import subprocess  # not on the path of a run that finds its image in the cache

    progress = show_progress() and squashfs_tool
    if not progress and squashfs_tool:
        last = os.path.basename(argv[0]) == "mksquashfs"
        argv = [*argv, "-no-progress"] if last else [argv[0], "-no-progress", *argv[1:]]
    argv = [*prefix, *argv]
    console.debug(f"running {argv}")
    parent = os.getpid()
    # Blocked while Popen runs: a signal that came once the tool runs but before Popen returns would
    # unwind with no child object to kill. Unblocked just after, it is taken with the child known.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    child: subprocess.Popen[bytes] | None = None
    # A terminal for the tool's progress: squashfs-tools draw their bar as they go only on a terminal (into a
    # pipe, mksquashfs prints it once, at the end, and the bar would sit at nothing until then).
    terminal = _terminal() if progress else None
    try:
        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal[1] if terminal else
                                     subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     pass_fds=tuple(pass_fds), preexec_fn=lambda: die_with(parent, mask))
        except OSError as error:
            raise ImageError(f"{failure}: can't run {argv[0]}: {error.strerror}") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if terminal:
                os.close(terminal[1])
        assert child.stderr is not None
        if terminal:
            _follow(terminal[0], label)
        errors = _drain(child.stderr.fileno())
        status = child.wait()
    except BaseException:  # Interrupted, KeyboardInterrupt: the tool must not outlive us, nor stay a zombie
        if child is not None:
            child.kill()
            child.wait()
        raise
    finally:
        for stream in (child.stdout, child.stderr) if child is not None else ():
            if stream is not None:
                stream.close()
        if terminal:
            os.close(terminal[0])
    if status != 0:
        reason = _reason(errors) or f"{os.path.basename(argv[0])} exited with status {status}"
        raise ToolError(f"{failure}: {reason}", output=errors)


def _drain(fd: int) -> str:
    """All the tool writes on stderr until it exits, of which the first _MAX_ERRORS bytes are kept."""
    kept: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 1 << 16):
        if size < _MAX_ERRORS:
            kept.append(chunk)
            size += len(chunk)
    return b"".join(kept)[:_MAX_ERRORS].decode(errors="replace")


class ToolError(ImageError):
    """A squashfs-tools program failed; `output` is what it wrote on stderr."""

    def __init__(self, message: str, *, output: str) -> None:
        super().__init__(message)
        self.output = output


def out_of_space(error: ImageError, directory: str) -> bool:
    """Whether `error` (a tool's failure, or an OSError turned into one) came from a full filesystem."""
    return says_no_space(error) or filesystem_full(directory)


def says_no_space(error: ImageError) -> bool:
    """Whether the error's text (or its tool's output) is ENOSPC's."""
    return "No space left on device" in (getattr(error, "output", "") or error.message)


def filesystem_full(directory: str) -> bool:
    """Whether the filesystem of `directory` has no block or no inode left for us now."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return info.f_bavail == 0 or info.f_bfree == 0 or (info.f_files > 0 and info.f_favail == 0)


def _reason(errors: str) -> str:
    """The line that says why: the FATAL ERROR one, else the first (a list of details may follow it)."""
    lines = [line.strip() for line in errors.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("FATAL ERROR:"):
            return line.removeprefix("FATAL ERROR:").strip()
    return lines[0] if lines else ""


def _terminal() -> tuple[int, int]:
    """A pseudo-terminal (ours, the tool's) 120 columns wide, for the tool's progress bar."""
    import fcntl
    import struct
    import termios

    ours, tools_end = os.openpty()
    fcntl.ioctl(tools_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    return ours, tools_end


def _follow(fd: int, label: str) -> None:
    """Feed the tool's own `done/total` counts (read from `fd`) to a rich progress bar on stderr.

    Until the tool has counted what it will do, the bar shows no count (not "0/?"); the elapsed time
    moves on in the meantime (a refresh every half second, without a thread).
    """
    import re
    import select

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    class Count(MofNCompleteColumn):
        def render(self, task: Any) -> Any:
            from rich.text import Text

            return super().render(task) if task.total is not None else Text("")

    count = re.compile(rb"(\d+)/(\d+)\s+\d+%")
    # No refresh thread (auto_refresh=False): the launcher must be single-threaded again
    # before unshare(CLONE_NEWUSER), which the kernel refuses to a threaded process.
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), Count(), TimeElapsedColumn(),
                  console=Console(stderr=True), auto_refresh=False, transient=True) as bar:
        task = bar.add_task(label, total=None)
        while True:
            if not select.select([fd], [], [], 0.5)[0]:
                bar.refresh()
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the tool closed its end of the terminal (it exited)
                break
            if not chunk:
                break
            counts = count.findall(chunk)
            if counts:
                done, total = counts[-1]
                bar.update(task, completed=int(done), total=int(total))
                bar.refresh()



"""Entry point, and THE error boundary.

`run`, `exec` and `shell` go through the fast parser without importing typer
(see singpy.cli.parse); every other command goes to the typer app. A
`SingpyError` from anywhere becomes one `FATAL:` line on stderr (plus a hint
at -v, the traceback at -d) and its exit code; nothing below this module
prints errors or exits. The line is escaped (singpy.console.escape): a
message quoting an image's text never forges a second line.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import NoReturn

FAST_COMMANDS = ("run", "exec", "shell", "test")


def main(argv: list[str] | None = None) -> int:
    # A launcher's life is a few milliseconds of allocation-heavy set-up followed by
    # exec: the cyclic garbage collector only costs time here (about 2 ms per run).
    import gc

    gc.disable()
    _open_standard_descriptors()
    if sys.flags.no_site and not _site_state:  # the tuned script (singpy.cli.launcher): site when needed
        _site_on_demand()
    args = sys.argv[1:] if argv is None else argv
    from singpy import console
    from singpy.errors import SingpyError

    debug = "-d" in args[:3] or "--debug" in args[:3] or _debug_variable()
    if debug:
        import traceback  # noqa: F401  now: see _print_traceback
    try:
        _refuse_setuid()
        if any(word.startswith(("docker://", "oras://")) for word in args):  # a tag's check over TLS, begun now
            from singpy.oci import tagcheck  # (by the tuned console script already: then this is a no-op)

            tagcheck.prepare_early(args, os.environ)
        return _dispatch(args)
    except SingpyError as error:
        if debug or console.level() >= console.DEBUG:
            _print_traceback(error)
        console.fatal(error.message)
        if error.hint and (console.level() >= console.VERBOSE or error.exit_code == 1):
            console.hint(error.hint)
        return int(error.exit_code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed by the reader (`... | head`): not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _open_standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 open, on /dev/null where the caller closed them (as Go's runtime does, so
    Apptainer): else the next file singpy opens takes that number (/dev/fuse as 0, a key pipe as 2), and a
    helper's stdin/stdout/stderr set-up covers it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if getattr(sys, _STREAMS[fd]) is None:  # Python left the stream None for a closed descriptor
                setattr(sys, _STREAMS[fd], open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


_STREAMS = ("stdin", "stdout", "stderr")


def _dispatch(args: list[str]) -> int:
    from singpy.cli.parse import split_global

    global_values, rest = split_global(args, os.environ)
    if global_values.get("version"):
        from singpy.cli.version import version_line

        print(version_line())
        return 0
    if rest and rest[0] in FAST_COMMANDS:
        from singpy.cli.actions import run_action

        _exit_now(run_action(rest[0], rest[1:], global_values))
    if "singpy.oci.tagcheck" in sys.modules:  # a check's helper begun on a guess (main): no run, no check
        from singpy.oci import tagcheck

        tagcheck.release()
    from singpy.image.tools import keep_interrupts

    keep_interrupts()  # a Ctrl-C that lands in importlib's callback as typer or a module loads: sent again, not lost
    run_site()  # typer and the rest: the interpreter as a plain `python3` start leaves it
    from singpy import console
    from singpy.cli.actions import verbosity

    console.set_level(verbosity(global_values))  # APPTAINER_QUIET=1 too: the typer callback sees flags only
    if global_values.get("config"):  # the commands typer runs (build, instance start) read the conf this way
        os.environ["SINGPY_CONFIG"] = global_values["config"]
    if global_values.get("nocolor"):  # the one colour singpy has: rich's progress bars of a pull, which honour it
        os.environ["NO_COLOR"] = "1"
    if rest and rest[0] == "pull":  # a download: typer's start-up was most of its cost (singpy.cli.fastpull)
        from singpy.cli.fastpull import run as fast_pull

        if (status := fast_pull(rest[1:])) is not None:
            return status
    from singpy.cli.app import run_app

    return run_app(args)


_site_state: list[int] = []  # [st_dev, st_ino] of the host's root while site waits; [0] once it has run
# What the standard library tries to import only to learn it is not on Windows (`subprocess` imports msvcrt): no
# reason to load site (~3 ms with its .pth files), which could not provide them either.
_WINDOWS_ONLY = frozenset(("msvcrt", "nt", "winreg", "_winapi", "_overlapped"))


def _site_on_demand() -> None:
    """Run site on the first import the standard library and singpy cannot answer (a last meta path finder).

    Never inside a container: once the root is not the host's (pivot_root), a
    missing module stays missing rather than site reading `.pth` files and
    `sitecustomize` from the image.
    """
    root = os.stat("/")
    _site_state[:] = [root.st_dev, root.st_ino]
    sys.meta_path.append(_SiteFinder)  # a class with a static find_spec is a finder, as the built-in ones are


class _SiteFinder:
    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name in _WINDOWS_ONLY:
            return None
        root = os.stat("/")
        if _site_state[:2] != [root.st_dev, root.st_ino]:
            return None
        run_site()
        from importlib.machinery import PathFinder

        return PathFinder.find_spec(name, path, target)


def run_site() -> None:
    """What `-S` skipped (site-packages, `.pth` files, sitecustomize), once; nothing in a plain start."""
    if not sys.flags.no_site or _site_state == [0]:
        return
    _site_state[:] = [0]
    if _SiteFinder in sys.meta_path:
        sys.meta_path.remove(_SiteFinder)
    import site

    site.main()


def _debug_variable() -> bool:
    """APPTAINER_DEBUG=1 (or SINGULARITY_/SINGPY_DEBUG): as -d, known before the command line is parsed."""
    return any(os.environ.get(prefix + "DEBUG", "").lower() in ("1", "true", "yes", "on")
               for prefix in ("SINGULARITY_", "APPTAINER_", "SINGPY_"))


def _print_traceback(error: BaseException) -> None:
    """The traceback at -d, importing nothing: the error may come from inside the container root.

    Once the container is the root (pivot_root), the package and the standard
    library are out of reach: an import there fails, or finds the image's own
    Python. `traceback` is imported before the launch when -d is among the
    first arguments (main); otherwise (`-d` given later on the command line)
    the frames are written here, without source lines. The message is the
    FATAL line's, escaped as it is: one line whatever an image put in it.
    """
    from singpy.console import escape  # imported already (main): no file is opened

    lines = ["Traceback (most recent call last):\n"]
    traceback = sys.modules.get("traceback")
    if traceback is not None:
        lines.extend(escape(frame, "\n") for frame in traceback.format_tb(error.__traceback__))
    else:
        frame = error.__traceback__
        while frame is not None:
            code = frame.tb_frame.f_code
            lines.append(f'  File "{escape(code.co_filename)}", line {frame.tb_lineno}, in {code.co_name}\n')
            frame = frame.tb_next
    lines.append(f"{type(error).__module__}.{type(error).__qualname__}: {escape(str(error))}\n")
    sys.stderr.write("".join(lines))


def _exit_now(status: int) -> NoReturn:
    """Leave without the interpreter's finalization (module teardown, a last GC).

    run/exec/shell return here only as a supervisor whose container has
    already exited (--pid, squashfuse, a host network) or after --dry-run or
    --help; nothing is left to tear down, and skipping it saves about 5 ms.
    But the tag check's helper, begun on a docker:// word (`exec --help
    docker://X`), is killed and reaped here: the exit handler that would do
    it is skipped too, and none is left for others to reap.
    """
    if "singpy.oci.tagcheck" in sys.modules:
        from singpy.oci import tagcheck

        tagcheck.release()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`singpy exec --dry-run ... | head -1`)
            status = status or 1
    if status < 0:  # a supervisor whose payload a signal killed ends by that signal (singpy.launch.exitstatus)
        from singpy.launch.exitstatus import exit_as

        exit_as(status)
    os._exit(status)


def _refuse_setuid() -> None:
    """singpy never runs setuid: privilege comes from user namespaces alone."""
    if os.getuid() != os.geteuid() or os.getgid() != os.getegid():
        from singpy.errors import SingpyError

        raise SingpyError("singpy must not be installed setuid or setgid; refusing to run")

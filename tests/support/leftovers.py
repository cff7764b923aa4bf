"""What a singpy run could leave behind, limited to what names our own paths.

Other programs, and other copies of this suite, run on the same machine: a
test never compares a listing of the whole /tmp, of all processes or of all
mounts. It takes `traces(image, workdir, ...)` before and after, which holds
only what names one of those paths:

* mounts (from /proc/self/mountinfo) whose mount point, root or source names one;
* loop devices whose backing file lies under one;
* processes whose command line names one, or that hold one open (a helper given /dev/fd/N of the image,
  as squashfuse and fuse2fs are), never this process or its ancestors;
* the entries of the TMPDIR the fixtures give singpy (`watch_tmpdir`).

    before = traces(image, workdir)
    result = singpy.run("exec", str(image), "true")
    assert settled(before, image, workdir) == before    # waits for the kernel's asynchronous releases

Two snapshots compare with ``==``; the repr lists each kind on its own line,
so an assertion message shows what was left.

The process helpers (`descendants`, `wait_for_descendants`, `alive`,
`in_pid_namespace`) follow one process tree or one namespace, never a name
that another program could also run (`sleep 300`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

_TMPDIRS: list[str] = []  # TMPDIRs handed to singpy by the fixtures (see watch_tmpdir)
_ESCAPE = re.compile(r"\\([0-7]{3})")


class Traces:
    """Mount lines, loop devices, processes and TMPDIR entries that name given paths."""

    __slots__ = ("mounts", "loops", "processes", "tmp")

    def __init__(self, mounts: Iterable[str] = (), loops: Iterable[str] = (), processes: Iterable[str] = (),
                 tmp: Iterable[str] = ()) -> None:
        self.mounts = tuple(sorted(mounts))
        self.loops = tuple(sorted(loops))
        self.processes = tuple(sorted(processes))
        self.tmp = tuple(sorted(tmp))

    def _key(self) -> tuple[tuple[str, ...], ...]:
        return self.mounts, self.loops, self.processes, self.tmp

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Traces) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __bool__(self) -> bool:
        return any(self._key())

    def __repr__(self) -> str:
        if not self:
            return "Traces(nothing)"
        parts = [f"  {name}:\n" + "".join(f"    {item}\n" for item in items)
                 for name, items in zip(self.__slots__, self._key(), strict=True) if items]
        return "Traces(\n" + "".join(parts) + ")"


def traces(*paths: str | Path) -> Traces:
    """A snapshot of what names one of `paths` (the image, the session workdir, a test's own directory).

    A background unpacking (singpy.image.warm: detached, on by default after a user's FUSE run) that names one
    is waited for first, up to UNPACKING_WAIT: it ends by itself, a test's trace only if it never does.
    """
    names = _variants(paths)
    _wait_for_unpackings(names)
    return Traces(mounts=_mounts(names), loops=_loops(names), processes=_processes(names), tmp=_tmp_entries())


def settled(before: Traces, *paths: str | Path, timeout: float = 5.0) -> Traces:
    """`traces(*paths)` once it equals `before`, or as it is after `timeout` seconds.

    The kernel releases loop devices and FUSE mounts, and reaps processes,
    shortly after the last user exits: a test allows it a moment.
    """
    deadline = time.monotonic() + timeout
    while (now := traces(*paths)) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def watch_tmpdir(path: str | Path) -> None:
    """Include the entries of `path` (a TMPDIR the fixtures give singpy) in every snapshot."""
    if str(path) not in _TMPDIRS:
        _TMPDIRS.append(str(path))


# --- process trees and namespaces -----------------------------------------------------------------------------------


def descendants(pid: int) -> dict[int, str]:
    """Every living descendant of `pid` (children, grandchildren...): pid -> command line, arguments space-separated."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        current = todo.pop()
        command = _cmdline(current)
        if command is not None:
            found[current] = command
        todo.extend(children.get(current, []))
    return found


def wait_for_descendants(pid: int, command: str, timeout: float = 10.0) -> list[int]:
    """The descendants of `pid` whose command line is exactly `command`, once there is one (else [])."""
    deadline = time.monotonic() + timeout
    while True:
        found = [child for child, line in descendants(pid).items() if line == command]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def alive(pids: Iterable[int], command: str) -> list[int]:
    """Those of `pids` still running `command` (a zombie's command line is empty: not alive)."""
    return [pid for pid in pids if _cmdline(pid) == command]


def wait_until_gone(pids: Iterable[int], command: str, timeout: float = 10.0) -> list[int]:
    """Wait for `pids` (known to run `command`) to end; return those still alive after `timeout`."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (left := alive(pids, command)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def in_pid_namespace(link: str, started_by: int | None = None) -> list[int]:
    """Processes whose /proc/PID/ns/pid reads `link` ("pid:[4026532...]", as `readlink` printed it inside).

    The kernel hands a freed namespace's number to the next namespace made, of any kind, by anyone (the lowest
    free one): once a namespace may have gone, `link` can name another copy's. Either hold it open
    (`pinned_pid_namespace`) or pass `started_by` (`boot_ticks()` while it surely lived): later processes are
    not of it."""
    found = []
    for pid in _pids():
        try:
            later = started_by is not None and (_start_ticks(pid) or 0) > started_by
            if os.readlink(f"/proc/{pid}/ns/pid") == link and _cmdline(pid) and not later:
                found.append(pid)
        except OSError:
            continue  # gone meanwhile, or not ours to look at
    return found


def wait_for_empty_pid_namespace(link: str, started_by: int | None = None, timeout: float = 10.0) -> list[int]:
    """Wait for `in_pid_namespace` to be empty (its processes die a moment after its PID 1); what is left."""
    deadline = time.monotonic() + timeout
    while (left := in_pid_namespace(link, started_by)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def boot_ticks() -> int:
    """Now, in the clock of a process's start time (/proc/PID/stat's 22nd field: ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")) + 1  # this tick's included


@contextlib.contextmanager
def pinned_pid_namespace(pid: int) -> Iterator[str]:
    """Hold PID's PID namespace open, so that its number names no other namespace while held; yields its link."""
    descriptor = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    try:
        yield os.readlink(f"/proc/self/fd/{descriptor}")
    finally:
        os.close(descriptor)


# --- internals -------------------------------------------------------------------------------------------------------

UNPACKING_WAIT = 60.0  # seconds: a busybox image unpacks in well under one, on a loaded machine


def _wait_for_unpackings(names: tuple[str, ...]) -> None:
    from singpy.image.warm import PROCESS_NAME

    deadline = time.monotonic() + UNPACKING_WAIT
    while time.monotonic() < deadline:
        unpacking = [pid for pid in _pids() if _comm(str(pid)) == PROCESS_NAME]  # one small read each: cheap
        if not any(_names_one(pid, names, _arguments(pid) or []) for pid in unpacking):
            return
        time.sleep(0.05)


def _names_one(pid: int, names: tuple[str, ...], arguments: list[str]) -> bool:
    """Whether process `pid` (its `arguments`) names one of `names`: in its arguments, or a file it holds open."""
    return any(_names(argument, names, _IN_ARGUMENT) for argument in arguments) or \
        any(_names(target, names, _IN_PATH) for target in _open_files(pid))


def _comm(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None



def _variants(paths: Iterable[str | Path]) -> tuple[str, ...]:
    """Each path as given (absolute) and resolved: the kernel reports loop backing files resolved."""
    names: set[str] = set()
    for path in paths:
        absolute = os.path.abspath(os.fspath(path))
        names.update({absolute.rstrip("/") or "/", os.path.realpath(absolute)})
    return tuple(sorted(names))


_IN_PATH = "/"  # what may follow one of our paths inside a path (a mountinfo field)
_IN_ARGUMENT = "/:,;= \t\n'\""  # inside a command-line argument: also separators (lowerdir=X,..., sh -c 'cmd X')


def _names(text: str, names: tuple[str, ...], after: str) -> bool:
    """Whether `text` contains one of `names` as a whole path (not /tmp/abc in /tmp/abcd): followed by the end
    of `text` or by one of the characters `after`."""
    for name in names:
        start = text.find(name)
        while start != -1:
            end = start + len(name)
            if end == len(text) or text[end] in after:
                return True
            start = text.find(name, start + 1)
    return False


def _under(path: str, names: tuple[str, ...]) -> bool:
    return any(path == name or path.startswith(name + "/") for name in names)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def _mounts(names: tuple[str, ...]) -> list[str]:
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            separator = fields.index("-")
            root, mount_point, source = fields[3], fields[4], fields[separator + 2]
            if any(_names(_unescape(field), names, _IN_PATH) for field in (root, mount_point, source)):
                found.append(line.rstrip("\n"))
    return found


def _loops(names: tuple[str, ...]) -> list[str]:
    found = []
    for device in os.listdir("/sys/block"):
        if not device.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{device}/loop/backing_file") as handle:
                backing = handle.read().rstrip("\n")
        except OSError:
            continue  # not attached (no loop/ directory), or detached meanwhile
        if _under(backing.removesuffix(" (deleted)"), names):
            found.append(f"/dev/{device} -> {backing}")
    return found


def _processes(names: tuple[str, ...]) -> list[str]:
    ours = _ancestors()
    found = []
    for pid in _pids():
        if pid in ours:
            continue
        arguments = _arguments(pid)
        if arguments and _names_one(pid, names, arguments):
            found.append(f"{pid} {' '.join(arguments)}")
    return found


def _open_files(pid: int) -> list[str]:
    """What the descriptors of `pid` name (readable as root, or for our own user's processes); [] if gone."""
    try:
        numbers = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    targets = []
    for number in numbers:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{number}").removesuffix(" (deleted)"))
        except OSError:
            continue  # closed meanwhile
    return targets


def _tmp_entries() -> list[str]:
    found: list[str] = []
    for tmpdir in _TMPDIRS:
        try:
            found.extend(os.path.join(tmpdir, name) for name in os.listdir(tmpdir))
        except FileNotFoundError:
            continue
    return found


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _arguments(pid: int) -> list[str] | None:
    """The arguments of `pid`; [] for a zombie or kernel thread; None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    arguments = raw.decode(errors="replace").split("\0")
    return arguments[:-1] if arguments[-1] == "" else arguments  # a program may rewrite its own, without the NUL


def _cmdline(pid: int) -> str | None:
    """The arguments of `pid` joined by spaces; "" for a zombie or kernel thread; None once it is gone."""
    arguments = _arguments(pid)
    return None if arguments is None else " ".join(arguments)


def _start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22; the name before may hold anything
    except (OSError, IndexError, ValueError):
        return None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[1])  # after "pid (comm) state": comm may hold spaces


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for pid in _pids():
        parent = _parent(pid)
        if parent is not None:
            parents[pid] = parent
    return parents


def _ancestors() -> set[int]:
    """This process and every process above it: pytest's own command line may name our paths."""
    found: set[int] = set()
    pid: int | None = os.getpid()
    while pid and pid not in found:
        found.add(pid)
        pid = _parent(pid)
    return found

"""Chosen files of a squashfs image unpacked, and nothing else: what `inspect` and `run-help` read.

`unsquashfs IMAGE DIR` unpacks all of DIR, and squashfs stores identical files
once: a 340 KB image can hold a 300 MB /.singularity.d/junk, or a
`runscript -> /usr` whose second round would unpack all of /usr (Apptainer's
inspect unpacks nothing). So the image is listed first (`unsquashfs -lls`,
squashfs-tools 4.3 and later: each entry's type and size, nothing written),
and only the entries asked for are unpacked, by exact name: a regular file
within the per-file limit (and all of them within _MAX_TOTAL bytes and
_MAX_FILES files), a link (a name, no data). A directory gets an empty
stand-in (an app's `scif` directory must exist to be an app); a device, a
FIFO, a socket or a file over the limits is not unpacked, and `notes` says
why, for the caller's warning (`left_out`). A link's target is for the caller
to `find` and `fetch` in a later round, which applies the same rules.

The listing is the image's text. A link target may hold a newline and so
forge a line; a forged line can only add a path (a name holds no '/'), which
the real listing then shows twice: such a path is left out. An image changed
between the listing and the unpacking is bounded still: unsquashfs runs with
RLIMIT_FSIZE at the per-file limit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

from singpy.errors import ImageError, PathError
from singpy.mounts.rootpath import Tree
from singpy.plan import ImageSpec

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    import subprocess

_MAX_TOTAL = 64 << 20  # bytes unpacked from one image in all: metadata is a few KB
_MAX_FILES = 4096  # entries unpacked from one image in all (env scripts, apps' files)
_MAX_LINE = 1 << 16  # a listing line longer than this (a huge link target) is skipped, never held whole
_ROOT = "squashfs-root"  # unsquashfs's default -d: the prefix of every listed path
# mode, owner, size (or "major, minor"), date, time, path (and " -> target" for a link)
_LINE = re.compile(r"([-dlpscb])\S* \S+ +(\d+|\d+, *\d+) \S+ \S+ " + _ROOT + r"(/.*)?", re.DOTALL)
_KINDS = {"d": "a directory", "p": "a FIFO", "s": "a socket", "c": "a character device", "b": "a block device"}


class Entry(NamedTuple):
    kind: str  # the listing's type letter: "-" regular file, "d", "l", "p", "s", "c", "b"
    size: int


class Picker:
    """Unpacks chosen entries of squashfs `part` into `tree` (created empty), within `limit` bytes a file."""

    def __init__(self, unsquashfs: str, part: ImageSpec, tree: str, *, limit: int, failure: str, label: str) -> None:
        self.unsquashfs, self.part, self.tree = unsquashfs, part, tree
        self.limit, self.failure, self.label = limit, failure, label
        self.notes: dict[str, str] = {}  # guest path -> why it was not unpacked ("a directory, not a regular file")
        self._files = self._bytes = 0
        os.mkdir(tree, 0o700)

    def survey(self, pattern: str, wanted: Callable[[str], bool]) -> dict[str, Entry]:
        """The entries below `pattern` (a path, its components shell patterns) that `wanted` keeps."""
        found: dict[str, Entry] = {}
        twice: set[str] = set()
        for path, entry in self._listed(pattern, wildcards=True):
            if not wanted(path):
                continue
            if path in found:
                twice.add(path)
            found[path] = entry
        for path in twice:  # a forged line (see the module's docstring): neither is believed
            del found[path]
            self.notes[path] = "listed twice by unsquashfs (a link target holding a newline?)"
        return found

    def find(self, paths: Iterable[str]) -> dict[str, Entry]:
        """Each of `paths` (exact guest paths) that the image has, as listed: its own line, its content unread."""
        found = {}
        for path in paths:
            if not path.strip("/"):
                found[path] = Entry("d", 0)  # the root: never listed as a path of its own
                continue
            listing = self._listed(path, wildcards=False)
            try:  # its first line is the real one: only its directories come before it, never a link's text
                entry = next((entry for listed, entry in listing if listed == path), None)
            finally:
                listing.close()  # a directory's content is not listed to the end (it is not wanted)
            if entry is not None:
                found[path] = entry
        return found

    def fetch(self, entries: Mapping[str, Entry]) -> None:
        """Unpack the regular files within the limits and the links of `entries`; note why the others are not."""
        chosen, directories = [], []
        for path, entry in sorted(entries.items()):
            why = self._refusal(entry)
            if why:
                self.notes[path] = why
            elif entry.kind == "d":
                directories.append(path)
            else:
                chosen.append(path.lstrip("/"))
        if chosen:
            from singpy.image import tools

            argv = [self.unsquashfs, "-o", str(self.part.offset), "-d", self.tree, "-f", "-no-xattrs",
                    "-no-wildcards", "-q", self.part.path, *chosen]
            with _files_at_most(self.limit):  # the listing said so; should the image change meanwhile
                tools.run_tool(argv, label=self.label, failure=self.failure)
        self._stand_ins(directories)

    def _refusal(self, entry: Entry) -> str:
        """Why `entry` is not unpacked ("" when it is), counting it against the image's budget."""
        if entry.kind not in ("-", "l", "d"):
            return f"{_KINDS.get(entry.kind, 'not a regular file')}, not a regular file"
        size = entry.size if entry.kind == "-" else 0
        if size > self.limit:
            return f"too large ({entry.size} bytes; at most {self.limit} are read)"
        if self._files >= _MAX_FILES or self._bytes + size > _MAX_TOTAL:
            return f"beyond what is read from one image ({_MAX_FILES} files, {_MAX_TOTAL >> 20} MiB in all)"
        self._files += 1
        self._bytes += size
        return ""

    def _stand_ins(self, directories: list[str]) -> None:
        """Empty directories where the image has the directories asked for (created inside the tree only)."""
        with Tree(self.tree) as tree:
            for path in directories:
                try:
                    found = tree.lookup(path)
                    if found.fd is None:
                        found.fd = tree.make(found, directory=True)
                    os.close(found.fd)
                except PathError:
                    continue  # a link of the image in the way: the directory stays missing

    def _listed(self, pattern: str, *, wildcards: bool) -> Generator[tuple[str, Entry], None, None]:
        """(guest path, entry) for each line of `unsquashfs -lls` of `pattern`; closing it ends unsquashfs."""
        import signal
        import subprocess

        from singpy.image import tools

        argv = [self.unsquashfs, "-lls", "-o", str(self.part.offset), *(() if wildcards else ("-no-wildcards",)),
                self.part.path, pattern.lstrip("/") or "."]
        parent, mask = os.getpid(), signal.pthread_sigmask(signal.SIG_BLOCK, [])
        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=lambda: tools.die_with(parent, mask))
        except OSError as error:
            raise ImageError(f"{self.failure}: can't run {argv[0]}: {error.strerror}") from None
        errors: list[bytes] = []
        try:
            for line in _lines(child, errors):
                parsed = _parse(line)
                if parsed is not None:
                    yield parsed
            if child.wait() != 0:
                raise ImageError(f"{self.failure}: {_reason(b''.join(errors))}")
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()


def _lines(child: subprocess.Popen[bytes], errors: list[bytes]) -> Iterator[bytes]:
    """The lines of the child's stdout, as they come; its stderr kept (the first 64 KiB) in `errors`."""
    import selectors

    assert child.stdout is not None and child.stderr is not None
    out, err = child.stdout.fileno(), child.stderr.fileno()
    pending, skipping = b"", False
    with selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        selector.register(err, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                elif key.fd == err:
                    if sum(map(len, errors)) < _MAX_LINE:
                        errors.append(chunk)
                else:
                    *complete, pending = (pending + chunk).split(b"\n")
                    for line in complete:
                        if not skipping:
                            yield line
                        skipping = False
                    if len(pending) > _MAX_LINE:  # the rest of this line is not wanted either
                        pending, skipping = b"", True
    if pending and not skipping:
        yield pending


def _reason(errors: bytes) -> str:
    """The line of unsquashfs's stderr that says why it failed: its FATAL ERROR, else the last."""
    lines = [line.strip() for line in errors.decode(errors="replace").splitlines() if line.strip()]
    fatal = [line.removeprefix("FATAL ERROR:").strip() for line in lines if line.startswith("FATAL ERROR:")]
    return (fatal or lines or ["unsquashfs could not list it"])[0]


def _parse(line: bytes) -> tuple[str, Entry] | None:
    """A listing line as (guest path, entry); None for anything else (the root, a garbled line)."""
    match = _LINE.fullmatch(os.fsdecode(line))
    if match is None or not match.group(3):
        return None
    kind, size, path = match.group(1), match.group(2), match.group(3)
    if kind == "l":
        path = path.split(" -> ", 1)[0]
    if any(part in ("", ".", "..") for part in path[1:].split("/")):
        return None
    return path, Entry(kind, int(size) if size.isdigit() else 0)


@contextmanager
def _files_at_most(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE at most `limit` for what is started meanwhile (unsquashfs: SIGXFSZ past it), then back."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    lowered = limit if soft == resource.RLIM_INFINITY else min(soft, limit)
    resource.setrlimit(resource.RLIMIT_FSIZE, (lowered, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def left_out(tree: Tree, guest: str, notes: Mapping[str, str]) -> str | None:
    """Why `guest` (missing from `tree`) was not unpacked, as a warning's end; None when it was not refused."""
    try:
        target = tree.dangling(guest)
    except PathError:
        target = None
    if target is not None and target in notes:
        return f"it is a link to {target}, which is {notes[target]}"
    return f"it is {notes[guest]}" if guest in notes else None


def noted_names(notes: Mapping[str, str], directory: str) -> list[str]:
    """The names in `directory` of the entries left out: listed with what was unpacked there."""
    return [os.path.basename(path) for path in notes if os.path.dirname(path) == directory]

"""The launch path's modules from one file: a bundle of their compiled code, checked against each source.

`singpy exec` imports ~40 of singpy's modules; the normal import pays for each a
search of `sys.path`, a stat of the source, an open, fstat and read of its `.pyc`:
~0.1 ms a module before its code runs (benchmarks/README.md, "Where the time goes").
`python -m singpy.cli.launcher` (make setup) writes the code of those modules into
one file beside them (`bundle_path`; the writer is launcher.py's: this module's
code, read at every launch, holds only what a launch runs); the tuned console
script installs a finder that serves a module from it only when

- the bundle is trusted: owned by root or by the user running singpy, neither it
  nor its directory writable by anyone else (ssh's rule for ~/.ssh), read without
  following a link, written by this very interpreter at the same optimization
  level (`interpreter_key`), whole, each module's code readable (else that module
  is imported normally);
- the module's source is the one it was compiled from: same path, same size, same
  mtime to the nanosecond (one stat); and the package being searched is the one
  holding that source (a PYTHONPATH that puts another singpy first wins).

Anything else (no bundle, a stale or foreign one, a module not in it) falls back
to the normal import, module by module. Tracebacks name the real source files.

The bundle also serves `singpy` and `singpy.cli`, and the script reads this
module's code from its `.pyc` itself (launcher.TEMPLATE): no directory of the
tree is searched or listed before the bundle serves (~1 ms). `singpy` comes
from the bundle only while no sys.path entry before the tree's provides one
(probed name by name; when unsure, the normal import's own search of those
entries decides). The bundle's code runs
without its `from __future__ import annotations` (compiled with the flag
instead): nothing on the launch path imports `__future__` (~0.2 ms); this
module quotes its annotations for the same reason.

The file has parts: the plain launch's modules, read at start-up, then those
that only some launches add (an image file or a cached docker:// or oras://
reference; a GPU flag; those both need: launcher.later_parts), each read with
one more `pread` the first time one of its modules is imported, from the file
read first (same inode, size and mtime, still trusted): a sandbox's launch
reads no more than its own modules (~0.5 MB: ~0.3 ms, most of it page faults),
a SIF's no GPU code.
"""

import _imp
import marshal
import os
import sys

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType

_LIMIT = 16 << 20  # the bundle is ~0.8 MB; anything far larger is not one we wrote
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_S_IFMT, _S_IFREG, _S_IFDIR = 0o170000, 0o100000, 0o040000  # stat's, without importing it
# What the normal import looks for in a directory, beside a package's directory: extension modules, then source,
# then a bare .pyc (FileFinder's loaders, in order)
_SUFFIXES = (*_imp.extension_suffixes(), ".py", ".pyc")


def bundle_path(package_dir: str) -> str:
    """Where the bundle of the package in `package_dir` lives (per interpreter, as `.pyc` files)."""
    return os.path.join(package_dir, "__pycache__", f"hotpath.{sys.implementation.cache_tag}.bundle")


def interpreter_key() -> str:
    """What a bundle's code depends on besides its sources: the interpreter, and its optimization level (`-O`
    compiles asserts and `__debug__` out, as the normal import's `.opt-1.pyc`)."""
    return f"{sys.version} -O{sys.flags.optimize}"


class _Entry:
    __slots__ = ("at", "code", "directory", "is_package", "length", "mtime_ns", "size", "source")

    # `code`: the marshalled code object (a view into the bundle's bytes: no copy), or empty for an extension
    # module (singpy.kernel._native), loaded from `source` by the interpreter's own loader: served here only to
    # spare its directory's listing; None until its later part is read (`at`, `length`: where it lies in the file).
    def __init__(self, source: str, directory: str, is_package: bool, mtime_ns: int, size: int,
                 code: memoryview | None, at: int = 0, length: int = 0):
        self.source, self.directory, self.is_package = source, directory, is_package
        self.mtime_ns, self.size, self.code, self.at, self.length = mtime_ns, size, code, at, length


class _Later:
    """Where the bundle's later parts lie (`ends`: where each ends, from `start`, the first part's end first), the
    file's identity when its first part was read, and the parts tried so far (each is read once at most)."""

    __slots__ = ("ends", "identity", "path", "start", "tried")

    def __init__(self, path: str, info: os.stat_result, start: int, ends: tuple[int, ...]) -> None:
        self.path, self.start, self.ends = path, start, ends
        self.tried: set[int] = set()
        self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class BundleFinder:
    """A meta path finder and loader for the bundle's modules (see the module's docstring)."""

    def __init__(self, entries: dict[str, _Entry], later: _Later | None = None) -> None:
        self.entries, self.later = entries, later

    def find_spec(self, name: str, path: "Sequence[str] | None",
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        entry = self.entries.get(name)
        if entry is None or (entry.directory not in path if path is not None else not _first_on_path(name, entry)):
            return None
        if entry.code is None and not self._read_later(entry.at):
            return None
        try:
            info = os.stat(entry.source)
        except OSError:
            return None
        if info.st_mtime_ns != entry.mtime_ns or info.st_size != entry.size:
            return None  # edited since `make setup`: the normal import compiles the new source
        # importlib.machinery's ModuleSpec and ExtensionFileLoader, without importing importlib (its bootstrap
        # is always loaded)
        if not entry.code:
            loader = sys.modules["_frozen_importlib_external"].ExtensionFileLoader(name, entry.source)
            spec: ModuleSpec = sys.modules["_frozen_importlib"].ModuleSpec(name, loader, origin=entry.source)
            spec.has_location = True
            return spec
        try:  # here, not in exec_module: bytes a trusted, whole bundle holds wrongly (a disk's fault, a row
            code = marshal.loads(entry.code)  # cut short) leave the normal import, not a traceback
        except (ValueError, EOFError, TypeError):
            return None
        spec = sys.modules["_frozen_importlib"].ModuleSpec(name, self, origin=entry.source,
                                                           is_package=entry.is_package)
        spec.loader_state = code
        if entry.is_package:
            spec.submodule_search_locations = [os.path.dirname(entry.source)]
        return spec  # no has_location: exec_module sets __file__ (the import would work out a __cached__ too)

    def _read_later(self, at: int) -> bool:
        """Read the later part holding file offset `at` into its entries, once: from the file the first part came
        from, still trusted."""
        later = self.later
        if later is None:
            return False
        part = next((index for index, end in enumerate(later.ends) if at < later.start + end), 0)
        if part == 0 or part in later.tried:
            return False
        later.tried.add(part)
        begin, end = later.start + later.ends[part - 1], later.start + later.ends[part]
        try:
            fd = os.open(later.path, _OPEN_FLAGS)
        except OSError:
            return False
        try:
            info = os.fstat(fd)
            same = _trusted(info) and (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) == later.identity
            view = memoryview(os.pread(fd, end - begin, begin) if same else b"")
        except (OSError, TypeError, ValueError):  # TypeError, ValueError: an index row of the wrong kind
            return False
        finally:
            os.close(fd)
        if len(view) != end - begin:
            return False
        for entry in self.entries.values():
            if entry.code is None and begin <= entry.at < end:
                entry.code = view[entry.at - begin:entry.at - begin + entry.length]
        return True

    def create_module(self, spec: "ModuleSpec") -> None:
        return None

    def exec_module(self, module: "ModuleType") -> None:
        spec = module.__spec__
        assert spec is not None
        code: CodeType = spec.loader_state  # find_spec's
        spec.loader_state = None
        module.__file__ = self.entries[module.__name__].source  # the real source: tracebacks and __file__ as
        exec(code, module.__dict__)  # with the normal import


def _first_on_path(name: str, entry: _Entry) -> bool:
    """Whether the normal import would find top-level `name` where it was bundled from: its directory is on
    sys.path and no entry before it provides that name (a PYTHONPATH's singpy wins)."""
    try:
        index = sys.path.index(entry.directory)
    except ValueError:
        return False
    earlier = sys.path[:index]
    if all(_absent(name, directory) for directory in earlier):
        return True
    # Something of that name, or an entry the probe can't judge: the normal import's own search of those entries
    return sys.modules["_frozen_importlib_external"].PathFinder.find_spec(name, earlier) is None


def _absent(name: str, directory: object) -> bool:
    """Whether the normal import surely finds no module `name` in sys.path's `directory`: a finder it already
    made says so, or, for a plain directory it has not looked into yet, none of the names it would look for
    exist (a few access() calls: listing the script's directory and lib-dynload, as the search would, costs
    ~0.2 ms, and the launch path imports nothing else from either). Anything else (a zip file, a path hook of someone's
    adding): not sure."""
    if directory in sys.path_importer_cache:
        finder = sys.path_importer_cache[directory]
        return finder is None or (hasattr(finder, "find_spec") and finder.find_spec(name) is None)
    if not isinstance(directory, str) or len(sys.path_hooks) != 2:  # zipimport's and FileFinder's, as started
        return False
    try:
        if os.stat(directory or ".").st_mode & _S_IFMT != _S_IFDIR:
            return False
    except OSError:
        return True  # none there: the import skips it
    # access(), not stat(): no exception raised for each name that is missing (~2 µs each). "name/": a directory
    # only (a package, or a namespace portion: the import goes on searching), not a file so named: the console
    # script itself is `singpy`, in sys.path[0].
    base = f"{directory}/{name}" if directory else name
    return not any(os.access(base + suffix, os.F_OK) for suffix in ("/", *_SUFFIXES))


def _trusted(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid()) and not info.st_mode & 0o022


def install(path: str) -> bool:
    """Serve the launch path's modules from the bundle at `path`, if it can be trusted; whether it was installed."""
    try:  # O_NONBLOCK: a FIFO put there never blocks the launch (it is refused below, as anything but a file)
        if not _trusted(os.stat(os.path.dirname(path))):
            return False
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not _trusted(info) or info.st_mode & _S_IFMT != _S_IFREG or info.st_size > _LIMIT:
            return False
        # The layout launcher.write_bundle makes: the index's length and the first part's (8 bytes each), the index, the
        # first part's code, each later part's.
        head = os.read(fd, 16)
        index_length, first = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:16], "little")
        view = memoryview(os.read(fd, index_length + first) if index_length + first < info.st_size else b"")
        version, rows, ends = marshal.loads(view[:index_length])
        total = sum(row[-1] for row in rows)
        if (version != interpreter_key() or len(view) != index_length + first or type(ends) is not tuple
                or not ends or ends[0] != first or list(ends) != sorted(ends) or ends[-1] != total
                or not all(type(number) is int and number >= 0 for row in rows for number in row[-2:])
                or not all(type(end) is int for end in ends)
                or info.st_size != 16 + index_length + total):  # another's, or cut short
            return False
        code, start = view[index_length:], 16 + index_length  # where the code starts in the file
        # An extension's row holds no code (length 0): never waits for a part, even one it ends.
        entries = {name: _Entry(source, directory, is_package, mtime_ns, size,
                                code[at:at + length] if at < first or not length else None, start + at, length)
                   for name, source, directory, is_package, mtime_ns, size, at, length in rows}
    except (OSError, ValueError, EOFError, TypeError, LookupError):  # not a bundle this code wrote
        return False
    finally:
        os.close(fd)
    later = _Later(path, info, start, tuple(ends)) if total > first else None
    sys.meta_path.insert(0, BundleFinder(entries, later))
    return True

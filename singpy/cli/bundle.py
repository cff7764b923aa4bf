"""The launch path's modules from one file: a bundle of their compiled code, checked against each source.

`singpy exec` imports ~40 of singpy's modules; the normal import pays for each a
search of `sys.path`, a stat of the source, an open, fstat and read of its `.pyc`:
~0.1 ms a module before its code runs (benchmarks/README.md, "Where the time goes").
`python -m singpy.cli.launcher` (make setup) writes the code of those modules into
one file beside them (`bundle_path`); the tuned console script installs a finder
that serves a module from it only when

- the bundle is trusted: owned by root or by the user running singpy, neither it
  nor its directory writable by anyone else (ssh's rule for ~/.ssh), read without
  following a link, written by this very interpreter (`sys.version`);
- the module's source is the one it was compiled from: same path, same size, same
  mtime to the nanosecond (one stat); and the package being searched is the one
  holding that source (a PYTHONPATH that puts another singpy first wins).

Anything else (no bundle, a stale or foreign one, a module not in it) falls back
to the normal import, module by module. Tracebacks name the real source files.
"""

from __future__ import annotations

import marshal
import os
import sys

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from importlib.machinery import ModuleSpec
    from types import CodeType, ModuleType

# The modules the exec path imports are those these import at module level (the same 40 as `-X importtime` of a
# plain `singpy exec` lists); what an option imports later comes through the normal import.
ENTRY_MODULES = ("singpy.cli.main", "singpy.cli.actions", "singpy.launch.launch")
_LIMIT = 16 << 20  # the bundle is ~0.5 MB; anything far larger is not one we wrote
_S_IFMT, _S_IFREG = 0o170000, 0o100000  # stat's, without importing it


def bundle_path(package_dir: str) -> str:
    """Where the bundle of the package in `package_dir` lives (per interpreter, as `.pyc` files)."""
    return os.path.join(package_dir, "__pycache__", f"hotpath.{sys.implementation.cache_tag}.bundle")


class _Entry:
    __slots__ = ("code", "directory", "is_package", "mtime_ns", "size", "source")

    # `code`: the marshalled code object (a view into the bundle's bytes: no copy), or empty for an extension
    # module (singpy.kernel._native), loaded from `source` by the interpreter's own loader: served here only to
    # spare its directory's listing.
    def __init__(self, source: str, directory: str, is_package: bool, mtime_ns: int, size: int,
                 code: memoryview):
        self.source, self.directory, self.is_package = source, directory, is_package
        self.mtime_ns, self.size, self.code = mtime_ns, size, code


class BundleFinder:
    """A meta path finder and loader for the bundle's modules (see the module's docstring)."""

    def __init__(self, entries: dict[str, _Entry]) -> None:
        self.entries = entries

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        entry = self.entries.get(name)
        if entry is None or path is None or entry.directory not in path:
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
        spec = sys.modules["_frozen_importlib"].ModuleSpec(name, self, origin=entry.source,
                                                           is_package=entry.is_package)
        if entry.is_package:
            spec.submodule_search_locations = [os.path.dirname(entry.source)]
        return spec  # no has_location: exec_module sets __file__ (the import would work out a __cached__ too)

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        entry = self.entries[module.__name__]
        code: CodeType = marshal.loads(entry.code)
        module.__file__ = entry.source  # the real source: tracebacks and __file__ read as with the normal import
        exec(code, module.__dict__)


def _trusted(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid()) and not info.st_mode & 0o022


def install(path: str) -> bool:
    """Serve the launch path's modules from the bundle at `path`, if it can be trusted; whether it was installed."""
    try:  # O_NONBLOCK: a FIFO put there never blocks the launch (it is refused below, as anything but a file)
        if not _trusted(os.stat(os.path.dirname(path))):
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not _trusted(info) or info.st_mode & _S_IFMT != _S_IFREG or info.st_size > _LIMIT:
            return False
        view = memoryview(os.read(fd, info.st_size + 1))
        # The layout `write_bundle` makes: the index's length (8 bytes), the index, then the code of each module.
        start = 8 + int.from_bytes(view[:8], "little")
        version, rows = marshal.loads(view[8:start])
        if version != sys.version or start + sum(row[-1] for row in rows) != len(view):  # another's, or cut short
            return False
        entries = {name: _Entry(source, directory, is_package, mtime_ns, size, view[start + at:start + at + length])
                   for name, source, directory, is_package, mtime_ns, size, at, length in rows}
    except (OSError, ValueError, EOFError, TypeError, IndexError):  # not a bundle this code wrote
        return False
    finally:
        os.close(fd)
    sys.meta_path.insert(0, BundleFinder(entries))
    return True


# Run in a fresh interpreter (`-I -S`: nothing of the caller's environment, no site) with the package root as
# argument: prints the singpy modules that importing ENTRY_MODULES loads, one "name path" a line.
_LIST_MODULES = """
import sys
sys.path.insert(0, sys.argv[1])
for entry in sys.argv[2:]:
    __import__(entry)
for name, module in list(sys.modules.items()):
    if name.startswith("singpy.") and (getattr(module, "__file__", None) or "").endswith((".py", ".so")):
        print(name, module.__file__)
"""
_NOT_BUNDLED = ("singpy.cli", "singpy.cli.bundle")  # imported before the bundle is installed


def hot_path_modules(package_root: str, entries: Sequence[str] = ENTRY_MODULES) -> list[tuple[str, str]]:
    """(name, source) of the singpy modules that importing `entries` loads, in a fresh interpreter's order."""
    import subprocess

    done = subprocess.run([sys.executable, "-I", "-S", "-c", _LIST_MODULES, package_root, *entries],
                          capture_output=True, text=True, check=True, timeout=120)
    pairs = [line.split(" ", 1) for line in done.stdout.splitlines()]
    return [(name, source) for name, source in pairs if name not in _NOT_BUNDLED]


def write_bundle(path: str, modules: Iterable[tuple[str, str]]) -> int:
    """Write the bundle of `modules` ((name, source) pairs, compiled from the sources as read now) to `path`,
    atomically; returns how many it holds."""
    rows, blobs, offset = [], [], 0
    for name, source in modules:
        with open(source, "rb") as file:
            info = os.fstat(file.fileno())
            text = file.read()
        code = b"" if source.endswith(".so") else marshal.dumps(compile(text, source, "exec", dont_inherit=True))
        is_package = os.path.basename(source) == "__init__.py"
        directory = os.path.dirname(os.path.dirname(source) if is_package else source)
        rows.append((name, source, directory, is_package, info.st_mtime_ns, info.st_size, offset, len(code)))
        blobs.append(code)
        offset += len(code)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    try:
        with open(partial, "wb") as out:
            index = marshal.dumps((sys.version, rows))
            out.write(len(index).to_bytes(8, "little") + index + b"".join(blobs))
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        if os.path.lexists(partial):
            os.unlink(partial)
        raise
    return len(rows)

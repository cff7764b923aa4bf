"""`python -m singpy.cli.launcher SCRIPT`: rewrite the `singpy` console script to start Python with `-S`.

A plain `python3` start runs `site`: the venv's site-packages and every `.pth`
file in it (setuptools' distutils shim, coloredlogs), plus Debian's
`sitecustomize`: about 4 ms of a 30 ms `singpy exec` (benchmarks/README.md,
"Where the time goes"), for modules the launch path never imports. The tuned
script starts the interpreter with `-S` (a shebang takes one argument: it is
that flag) and appends only the directory that holds the `singpy` package;
singpy.cli.main runs `site.main()` itself the moment anything else is needed
(every command but run/exec/shell/test at once, those four on the first
import the standard library and singpy cannot answer). `make setup` writes it;
pip writes the plain script, which works the same, only slower. The drop-in
names (singpy.cli.dropin) are links to this script, so they get it too.

It also writes the bundle of the launch path's modules that the script installs
(singpy.cli.bundle: the rules it is read by), and singpy.cli.bundle's own `.pyc`,
from which the script reads that module's code without searching for it.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import marshal
import os
import py_compile
import subprocess
import sys
import tempfile

from singpy.cli.bundle import bundle_path, interpreter_key

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from types import CodeType


TEMPLATE = """#!{python} -S
# singpy's console script, tuned by `python -m singpy.cli.launcher` (make setup): -S skips site and its .pth
# files; singpy.cli.main runs site.main() as soon as something outside the standard library and singpy is needed.
# No cyclic garbage collector in a launcher's few milliseconds (singpy.cli.main says why), from the first line.
# The launch path's modules come from one file (singpy.cli.bundle), each only while its source is unchanged; the
# bundle's code is read from its .pyc here, not searched for (that would list three directories: ~1 ms). Anything
# odd (a tree moved, no bundle): the normal import. A docker:// or oras:// word: the tag check's helper started
# as soon as the bundle serves (singpy.oci.tagcheck.prepare_early: its own rules; singpy.cli.main would, later).
import gc
gc.disable()
import sys
sys.path.append({package_root!r})
try:
    from _frozen_importlib_external import SourceFileLoader
    bundle = {{'__name__': 'singpy.cli.bundle', '__file__': {package_root!r} + '/singpy/cli/bundle.py'}}
    exec(SourceFileLoader(bundle['__name__'], bundle['__file__']).get_code(bundle['__name__']), bundle)
    bundle['install']({bundle!r})
    if any(word.startswith(('docker://', 'oras://')) for word in sys.argv):
        from singpy.oci.tagcheck import prepare_early
        prepare_early(sys.argv[1:], bundle['os'].environ)
except Exception:
    pass
from singpy.cli.main import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""

# The modules the exec path imports are those these import at module level (the same 40 as `-X importtime` of a
# plain `singpy exec` lists); what an option imports later comes through the normal import.
ENTRY_MODULES = ("singpy.cli.main", "singpy.cli.actions", "singpy.launch.launch")
# What an image file (a SIF: its mount, the extraction cache, an active ECL's recorded verdicts) and a cached
# docker:// or oras:// reference (the tag's check and its helper's module, the cache's records) import on top,
# lazily: a later part of the bundle (~26 modules, 0.4 MB), read only by the launches that import one of them
# (tests/unit/test_hot_path_imports.py checks the lists).
IMAGE_ENTRY_MODULES = ("singpy.image.squashfs", "singpy.image.cache", "singpy.image.tools", "singpy.image.warm",
                       "singpy.signing.eclrecord", "singpy.signing.eclfile", "singpy.signing.keyring",
                       "singpy.oci.tagcheck", "singpy.oci.pull", "singpy.oci.quickhead", "singpy.oci.quicktls",
                       "singpy.oci.tlsconf", "singpy.oci.oras", "singpy.oci.regfiles", "singpy.oci.mirrors",
                       "singpy.oci.manifest", "singpy.oci.platform", "singpy.oci._tlscheck")
# What a GPU flag imports on top (--nv with nvidia-container-cli or nvliblist.conf, CDI's --device, --rocm): a part of
# its own (~16 modules, 0.2 MB), which a SIF's launch never reads.
GPU_ENTRY_MODULES = ("singpy.gpu.request", "singpy.gpu.nvidia", "singpy.gpu.ldcache", "singpy.gpu.capabilities",
                     "singpy.gpu.listcache", "singpy.gpu.libsdir", "singpy.config.liblist", "singpy.gpu.elf",
                     "singpy.gpu.cdi", "singpy.gpu.cdiload", "singpy.gpu.cdicache", "singpy.gpu.sonames",
                     "singpy.gpu.rocm")


# Run in a fresh interpreter (`-I -S`: nothing of the caller's environment, no site) with the package root as
# argument: prints the singpy modules that importing ENTRY_MODULES loads, one "name path" a line.
_LIST_MODULES = """
import sys
sys.path.insert(0, sys.argv[1])
for entry in sys.argv[2:]:
    __import__(entry)
for name, module in list(sys.modules.items()):
    if name.split(".")[0] == "singpy" and (getattr(module, "__file__", None) or "").endswith((".py", ".so")):
        print(name, module.__file__)
"""
_NOT_BUNDLED = ("singpy.cli.bundle",)  # the script runs its code before installing the bundle


def hot_path_modules(package_root: str, entries: Sequence[str] = ENTRY_MODULES) -> list[tuple[str, str]]:
    """(name, source) of the singpy modules that importing `entries` loads, in a fresh interpreter's order."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _LIST_MODULES, package_root, *entries],
                          capture_output=True, text=True, check=True, timeout=120)
    pairs = [line.split(" ", 1) for line in done.stdout.splitlines()]
    return [(name, source) for name, source in pairs if name not in _NOT_BUNDLED]


def image_path_modules(package_root: str) -> list[tuple[str, str]]:
    """(name, source) of the singpy modules that IMAGE_ENTRY_MODULES load on top of the plain launch's."""
    return _on_top(package_root, IMAGE_ENTRY_MODULES)


def gpu_path_modules(package_root: str) -> list[tuple[str, str]]:
    """(name, source) of the singpy modules that GPU_ENTRY_MODULES load on top of the plain launch's."""
    return _on_top(package_root, GPU_ENTRY_MODULES)


def later_parts(package_root: str) -> list[list[tuple[str, str]]]:
    """The bundle's later parts: the image paths' modules, the GPU flags', then those both load (each part is
    read by the launches that import one of its modules: a SIF's launch reads no GPU code, nor `--nv` on a
    sandbox the image paths')."""
    image, gpu = image_path_modules(package_root), gpu_path_modules(package_root)
    both = {name for name, _ in image} & {name for name, _ in gpu}
    return [[pair for pair in image if pair[0] not in both], [pair for pair in gpu if pair[0] not in both],
            [pair for pair in image if pair[0] in both]]


def _on_top(package_root: str, entries: Sequence[str]) -> list[tuple[str, str]]:
    plain = {name for name, _ in hot_path_modules(package_root)}
    both = hot_path_modules(package_root, (*ENTRY_MODULES, *entries))
    return [(name, source) for name, source in both if name not in plain]


def write_bundle(path: str, modules: Iterable[tuple[str, str]], *later: Iterable[tuple[str, str]]) -> int:
    """Write the bundle of `modules`, then of each `later` part ((name, source) pairs, compiled from the sources
    as read now) to `path`, atomically; returns how many it holds."""
    rows: list[tuple[str, str, str, bool, int, int, int, int]] = []
    blobs: list[bytes] = []
    ends = [_compile(modules, rows, blobs, 0)]
    for part in later:
        ends.append(_compile(part, rows, blobs, ends[-1]))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    index = marshal.dumps((interpreter_key(), rows, tuple(ends)))
    _publish(path, len(index).to_bytes(8, "little") + ends[0].to_bytes(8, "little") + index + b"".join(blobs), 0o644)
    return len(rows)


def _publish(path: str, data: bytes, mode: int) -> None:
    """`data` as the file `path`, atomically: written to a new file of a name no one can guess (O_EXCL: never
    through a link someone put there), flushed to disk, then renamed over `path` (a launch reads the old file
    or the new one, whole)."""
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            os.fchmod(out.fileno(), mode)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def _compile(modules: Iterable[tuple[str, str]], rows: list[tuple[str, str, str, bool, int, int, int, int]],
             blobs: list[bytes], offset: int) -> int:
    """Append each module's index row and code, its code starting at `offset`; the offset after them."""
    for name, source in modules:
        with open(source, "rb") as file:
            info = os.fstat(file.fileno())
            text = file.read()
        code = b"" if source.endswith(".so") else marshal.dumps(_code(text, source))
        is_package = os.path.basename(source) == "__init__.py"
        directory = os.path.dirname(os.path.dirname(source) if is_package else source)
        rows.append((name, source, directory, is_package, info.st_mtime_ns, info.st_size, offset, len(code)))
        blobs.append(code)
        offset += len(code)
    return offset


def _code(text: bytes, source: str) -> CodeType:
    """The module's code as the normal import compiles it, less its `from __future__` imports: their features
    become compile flags, so running it imports nothing (the AST keeps every other line where it was)."""
    tree = ast.parse(text, source)
    flags, body = 0, []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                flags |= getattr(__future__, alias.name).compiler_flag
        else:
            body.append(node)
    tree.body = body
    code: CodeType = compile(tree, source, "exec", flags=flags, dont_inherit=True)
    return code


def script_text(python: str, package_root: str) -> str:
    """The tuned script for this interpreter and the directory holding the `singpy` package."""
    if any(character.isspace() for character in python) or len(python) > 200:  # a shebang splits on neither
        raise ValueError(f"{python!r}: not usable in a shebang line with an argument")
    bundle = bundle_path(os.path.join(package_root, "singpy"))
    return TEMPLATE.format(python=python, package_root=package_root, bundle=bundle)


def write(script: str, python: str, package_root: str) -> None:
    """Replace `script` atomically (a launch running it meanwhile reads the old or the new one, whole)."""
    _publish(script, script_text(python, package_root).encode(), 0o755)


def _interpreter(script: str) -> str | None:
    """The interpreter the installer wrote in the script's `#!` line, if it is a plain one."""
    try:
        with open(script, encoding="utf-8") as existing:
            first = existing.readline(300)
    except (OSError, UnicodeDecodeError):
        return None
    words = first.removeprefix("#!").split()
    return words[0] if first.startswith("#!/") and words[1:] in ([], ["-S"]) and "python" in words[0] else None


def _cache_bundle_code(source: str) -> None:
    """Write the `.pyc` the script reads singpy.cli.bundle's code from (without it, or stale, the script compiles
    the source at every launch: the import would, as a user who can't write __pycache__), even under
    PYTHONDONTWRITEBYTECODE; checked by timestamp, as the import's own."""
    py_compile.compile(source, importlib.util.cache_from_source(source), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m singpy.cli.launcher SCRIPT  (the singpy console script to rewrite)", file=sys.stderr)
        return 1
    import singpy

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(singpy.__file__)))
    python = _interpreter(argv[0]) or sys.executable
    try:
        write(argv[0], python, package_root)
    except (OSError, ValueError) as error:
        print(f"{argv[0]}: {error}", file=sys.stderr)
        return 1
    bundle = bundle_path(os.path.join(package_root, "singpy"))
    try:
        write_bundle(bundle, hot_path_modules(package_root), *later_parts(package_root))
        _cache_bundle_code(os.path.join(package_root, "singpy", "cli", "bundle.py"))
    except (OSError, SyntaxError, subprocess.SubprocessError, py_compile.PyCompileError) as error:
        # the script works without them, slower
        print(f"{bundle}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Small packages bundled with the real writer and imported in fresh interpreters (`-I -S`, as the tuned
script starts), for the bundle's tests (tests/unit/test_bundle*.py): what served each module is printed."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from singpy.cli import bundle, launcher

# Installs the bundle given as argv[2] for the package root argv[1], imports argv[3:], prints what served them.
IMPORTER = """
import sys
sys.path.append(sys.argv[1])
from singpy.cli.bundle import install
print("installed" if install(sys.argv[2]) else "not installed")
for name in sys.argv[3:]:
    module = __import__(name, fromlist=["x"])
    print(name, type(module.__spec__.loader).__name__, module.VALUE, module.__file__ == module.SOURCE)
"""


def make_package(root: Path) -> list[tuple[str, str]]:
    """pkg/ (imported normally, as `singpy` is) holding pkg/sub/__init__.py and pkg/sub/mod.py (bundled), each
    module knowing its VALUE and its own path."""
    package = root / "pkg" / "sub"
    package.mkdir(parents=True)
    paths = ((root / "pkg" / "__init__.py", "top"), (package / "__init__.py", "package"), (package / "mod.py", "first"))
    for path, value in paths:
        path.write_text(f"VALUE = {value!r}\nSOURCE = {str(path)!r}\n")
    return [("pkg.sub", str(package / "__init__.py")), ("pkg.sub.mod", str(package / "mod.py"))]


def run_importer(root: Path, path: Path, *names: str, flags: tuple[str, ...] = (), **ids: object) -> str:
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-I", "-S", *flags, "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n{IMPORTER}",
         str(root), str(path), *names], capture_output=True, text=True, timeout=60, check=False, cwd="/", **ids)
    assert done.returncode == 0, done.stderr
    output: str = done.stdout
    return output


def run_installed(root: Path, path: Path, body: str) -> str:
    """What `body` prints, run in a fresh interpreter (`-I -S`) once the bundle at `path` is installed for the
    package root `root`."""
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    script = (f"import sys; sys.path.insert(0, {singpy_root!r}); sys.path.append({str(root)!r})\n"
              f"from singpy.cli.bundle import install\nassert install({str(path)!r})\n{body}")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60,
                          check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    output: str = done.stdout
    return output


def built_package(workdir: Path) -> tuple[Path, Path]:
    """The package and its bundle, in the session's scratch directory (which the test user can reach)."""
    root = Path(tempfile.mkdtemp(dir=workdir, prefix="bundle-")) / "tree"
    modules = make_package(root)
    path = Path(bundle.bundle_path(str(root / "pkg")))
    assert launcher.write_bundle(str(path), modules) == 2
    return root, path


def source_stat(path: Path) -> tuple[int, int]:
    """(mtime_ns, size) of a source, as a bundle entry records it."""
    info = path.stat()
    return info.st_mtime_ns, info.st_size

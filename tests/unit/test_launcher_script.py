"""The tuned console script's start (singpy.cli.launcher.TEMPLATE): the bundle installed without a path search.

The script reads singpy.cli.bundle's code from its `.pyc` itself and the bundle
serves `singpy` and `singpy.cli` too, so no directory of the tree is listed
before the launch path's modules come from the bundle. Each case writes the
script with the real writer for a small tree in tmp_path: `singpy`, `singpy.cli`,
the real singpy.cli.bundle and a `singpy.cli.main` whose main() prints where the
three modules came from, whether `__future__` was imported (every module has
`from __future__ import annotations`; the bundle runs its code without it), and
whether a module named singpy.cli.bundle was (the script keeps its code apart).
"""

from __future__ import annotations

import marshal
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from singpy.cli import bundle, launcher

MAIN = '''from __future__ import annotations

import sys


def main() -> int:
    import singpy

    names = ("singpy", "singpy.cli", "singpy.cli.main")
    print(*(type(sys.modules[name].__spec__.loader).__name__ for name in names), singpy.VALUE,
          "__future__" in sys.modules, "singpy.cli.bundle" in sys.modules)
    return 0
'''
FROM_THE_BUNDLE = "BundleFinder BundleFinder BundleFinder tree False False\n"
NORMAL = "SourceFileLoader SourceFileLoader SourceFileLoader tree True False\n"


def make_tree(root: Path, value: str = "tree") -> list[tuple[str, str]]:
    (root / "singpy" / "cli").mkdir(parents=True)
    (root / "singpy" / "__init__.py").write_text(f"from __future__ import annotations\n\nVALUE = {value!r}\n")
    (root / "singpy" / "cli" / "__init__.py").write_text("from __future__ import annotations\n")
    (root / "singpy" / "cli" / "main.py").write_text(MAIN)
    return [(name, str(root / "singpy" / path)) for name, path in
            (("singpy", "__init__.py"), ("singpy.cli", "cli/__init__.py"), ("singpy.cli.main", "cli/main.py"))]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """The tree with make setup's work done (the bundle, bundle.py's .pyc) and its script, in bin/singpy."""
    root = tmp_path / "tree"
    modules = make_tree(root)
    shutil.copy(bundle.__file__, root / "singpy" / "cli" / "bundle.py")
    assert launcher.write_bundle(bundle.bundle_path(str(root / "singpy")), modules) == 3
    launcher._cache_bundle_code(str(root / "singpy" / "cli" / "bundle.py"))
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "singpy"
    launcher.write(str(script), sys.executable, str(root))
    return root, script


def run(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # PYTHONDONTWRITEBYTECODE: as a user who can't write __pycache__, nothing cached by one run helps the next
    return subprocess.run([str(script)], capture_output=True, text=True, timeout=60, check=False, cwd="/",
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", **env})


def test_the_packages_and_the_launch_path_come_from_the_bundle(tree: tuple[Path, Path]) -> None:
    root, script = tree
    assert f"sys.path.append({str(root)!r})" in script.read_text()
    done = run(script)
    assert (done.returncode, done.stdout, done.stderr) == (0, FROM_THE_BUNDLE, "")


@pytest.mark.parametrize("bundle_is", ["missing", "writable by others", "foreign", "not one"])
def test_without_a_usable_bundle_the_normal_import(tree: tuple[Path, Path], bundle_is: str) -> None:
    root, script = tree
    path = Path(bundle.bundle_path(str(root / "singpy")))
    if bundle_is == "missing":
        path.unlink()
    elif bundle_is == "writable by others":
        path.chmod(0o646)
    elif bundle_is == "foreign":  # another interpreter's (its sys.version in the index)
        data = path.read_bytes()
        index = 16 + int.from_bytes(data[:8], "little")
        _, rows, ends = marshal.loads(data[16:index])
        other = marshal.dumps(("3.0.0 (another interpreter)", rows, ends))
        path.write_bytes(len(other).to_bytes(8, "little") + data[8:16] + other + data[index:])
    else:
        path.write_bytes(b"\x00not a bundle")
    done = run(script)
    assert (done.returncode, done.stdout, done.stderr) == (0, NORMAL, "")


def test_another_singpy_on_pythonpath_wins(tree: tuple[Path, Path], tmp_path: Path) -> None:
    _, script = tree
    make_tree(tmp_path / "other", "other")
    done = run(script, PYTHONPATH=str(tmp_path / "other"))
    assert (done.returncode, done.stdout) == (0, NORMAL.replace("tree", "other")), done.stderr


def test_an_edited_module_is_imported_from_its_source(tree: tuple[Path, Path]) -> None:
    root, script = tree
    main = root / "singpy" / "cli" / "main.py"
    main.write_text(main.read_text() + "# edited\n")
    done = run(script)
    assert (done.returncode, done.stdout) == (0, FROM_THE_BUNDLE.replace("BundleFinder tree False",
                                                                         "SourceFileLoader tree True")), done.stderr


@pytest.mark.parametrize("edit", ["newer than its .pyc", "broken"])
def test_an_edited_bundle_module_still_launches(tree: tuple[Path, Path], edit: str) -> None:
    """bundle.py changed since make setup: its source compiled (as the import would), or, broken, no bundle."""
    root, script = tree
    source = root / "singpy" / "cli" / "bundle.py"
    source.write_text(source.read_text() + ("# edited\n" if edit == "newer than its .pyc" else "def (\n"))
    info = source.stat()
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns + 2_000_000_000))
    done = run(script)
    assert (done.returncode, done.stdout) == (0, FROM_THE_BUNDLE if edit != "broken" else NORMAL), done.stderr


def test_a_moved_tree_launches_from_pythonpath(tree: tuple[Path, Path], tmp_path: Path) -> None:
    """The script names the tree it was written for: moved, its bundle and .pyc are not found, the import is the
    normal one (and without a PYTHONPATH to it, a plain ImportError, as before)."""
    root, script = tree
    moved = root.rename(tmp_path / "moved")
    done = run(script, PYTHONPATH=str(moved))
    assert (done.returncode, done.stdout) == (0, NORMAL), done.stderr
    done = run(script)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'singpy'" in done.stderr

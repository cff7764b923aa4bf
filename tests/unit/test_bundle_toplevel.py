"""singpy.cli.bundle serving a top-level package (a tree appended to sys.path, as the console script does)
only where the normal import would have found that tree first, and the bundled code as the source's
(no __future__ import at run time, its line numbers kept). As test_bundle.py: a small package bundled with
the real writer, imported in a fresh interpreter that prints what served each module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from singpy.cli import bundle, launcher
from tests.support.bundles import built_package, make_package, source_stat


@pytest.fixture
def built(workdir: Path) -> tuple[Path, Path]:
    return built_package(workdir)


# Imports argv[3:] with the bundle argv[2] installed and the package root argv[1] appended to sys.path, after
# PYTHONPATH-like entries (the environment's SEARCH_FIRST, ":"-separated, inserted at sys.path[0] once the bundle's
# code is imported: no finder of theirs made yet, as in the console script).
TOP_IMPORTER = """
import os, sys
from singpy.cli.bundle import install
sys.path[0:0] = [entry for entry in os.environ.get("SEARCH_FIRST", "").split(":") if entry]
sys.path.append(sys.argv[1])
print("installed" if install(sys.argv[2]) else "not installed")
for name in sys.argv[3:]:
    module = __import__(name, fromlist=["x"])
    print(name, type(module.__spec__.loader).__name__, module.VALUE)
"""


def run_top_importer(root: Path, path: Path, *names: str, first: str = "") -> str:
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{TOP_IMPORTER}", str(root), str(path), *names], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/", env={"SEARCH_FIRST": first})
    assert done.returncode == 0, done.stderr
    output: str = done.stdout
    return output


@pytest.fixture
def built_with_top(tmp_path: Path) -> tuple[Path, Path]:
    """The package with its top level bundled too (as `singpy` is)."""
    root = tmp_path / "tree"
    modules = make_package(root)
    path = Path(bundle.bundle_path(str(root / "pkg")))
    assert launcher.write_bundle(str(path), [("pkg", str(root / "pkg" / "__init__.py")), *modules]) == 3
    return root, path


def test_the_top_level_package_comes_from_the_bundle(built_with_top: tuple[Path, Path], tmp_path: Path) -> None:
    """No directory before the tree's on sys.path holds it (a plain one, or one whose finder the import made)."""
    root, path = built_with_top
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "pkgother.py").write_text("VALUE = 'not this'\n")
    (tmp_path / "plain" / "pkg").write_text("#!/bin/sh\n")  # a file so named, as the console script is: no module
    served = "installed\npkg BundleFinder top\npkg.sub BundleFinder package\npkg.sub.mod BundleFinder first\n"
    assert run_top_importer(root, path, "pkg", "pkg.sub", "pkg.sub.mod", first=str(tmp_path / "plain")) == served
    assert run_top_importer(root, path, "pkgother", "pkg", "pkg.sub", "pkg.sub.mod",  # its finder made first
                            first=str(tmp_path / "plain")) == served.replace(
                                "installed\n", "installed\npkgother SourceFileLoader not this\n")
    assert run_top_importer(root, path, "pkg", first=f"{tmp_path}/none:{tmp_path}/plain/pkgother.py") == (
        "installed\npkg BundleFinder top\n")  # a missing entry, a file: the import skips both


@pytest.mark.parametrize("other", ["package", "module", "extension", "cached finder", "zip"])
def test_a_top_level_package_earlier_on_sys_path_wins(built_with_top: tuple[Path, Path], tmp_path: Path,
                                                      other: str) -> None:
    """A PYTHONPATH that provides another `pkg` (as another singpy): that one is imported, none of the bundle's."""
    root, path = built_with_top
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if other in ("package", "cached finder"):
        (elsewhere / "pkg" / "sub").mkdir(parents=True)
        (elsewhere / "pkg" / "__init__.py").write_text("VALUE = 'other'\n")
        (elsewhere / "pkg" / "sub" / "__init__.py").write_text("VALUE = 'other sub'\n")
        expected = "pkg SourceFileLoader other\npkg.sub SourceFileLoader other sub\n"
    elif other == "zip":
        import zipfile

        with zipfile.ZipFile(tmp_path / "elsewhere.zip", "w") as archive:
            archive.writestr("pkg/__init__.py", "VALUE = 'zipped'\n")
            archive.writestr("pkg/sub/__init__.py", "VALUE = 'zipped sub'\n")
        elsewhere = tmp_path / "elsewhere.zip"
        expected = "pkg zipimporter zipped\npkg.sub zipimporter zipped sub\n"
    else:  # a module of that name: its own loader, whatever it is (an .so that is no library fails to load)
        (elsewhere / ("pkg.py" if other == "module" else "pkg.cpython-311-x86_64-linux-gnu.so")).write_text(
            "VALUE = 'module'\n")
        if other == "extension":
            assert run_top_importer_fails(root, path, "pkg", first=str(elsewhere))
            return
        expected = "pkg SourceFileLoader module\n"
    names = ("pkg", "pkg.sub") if other != "module" else ("pkg",)
    if other == "cached finder":  # the import made the directory's finder before the bundle was asked
        (elsewhere / "warm.py").write_text("VALUE = 'warm'\n")
        names, expected = ("warm", *names), f"warm SourceFileLoader warm\n{expected}"
    assert run_top_importer(root, path, *names, first=str(elsewhere)) == f"installed\n{expected}"


def run_top_importer_fails(root: Path, path: Path, *names: str, first: str) -> bool:
    """Whether importing `names` fails as the normal import of what `first` holds would (not from the bundle)."""
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{TOP_IMPORTER}", str(root), str(path), *names], capture_output=True, text=True,
                          timeout=60, check=False, cwd="/", env={"SEARCH_FIRST": first})
    return done.returncode == 1 and "ImportError" in done.stderr and "BundleFinder" not in done.stdout


def test_a_namespace_directory_earlier_on_sys_path_leaves_the_normal_import(built_with_top: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    """A directory `pkg` without __init__.py earlier: the normal import decides (and finds the tree's package,
    whose modules the bundle then serves)."""
    root, path = built_with_top
    (tmp_path / "portion" / "pkg").mkdir(parents=True)
    assert run_top_importer(root, path, "pkg", "pkg.sub", first=str(tmp_path / "portion")) == (
        "installed\npkg SourceFileLoader top\npkg.sub BundleFinder package\n")


def test_the_tree_not_on_sys_path_serves_no_top_level(built_with_top: tuple[Path, Path]) -> None:
    root, path = built_with_top
    entries = {"pkg": bundle._Entry(str(root / "pkg" / "__init__.py"), str(root), True,
                                    *source_stat(root / "pkg" / "__init__.py"), memoryview(b"code"))}
    assert str(root) not in sys.path
    assert bundle.BundleFinder(entries).find_spec("pkg", None) is None


# A module whose code runs from the bundle: a __future__ import, an annotation naming nothing, a failure on line 9.
FUTURE_MODULE = '''"""A module."""

from __future__ import annotations

VALUE = "future"


def fail(argument: Undefined) -> None:
    raise ValueError(argument)
'''
FUTURE_CHECK = """
import sys, traceback
sys.path.append(sys.argv[1])
from singpy.cli.bundle import install
assert install(sys.argv[2])
import pkg.sub.mod
print(type(pkg.sub.mod.__spec__.loader).__name__, "__future__" in sys.modules, pkg.sub.mod.fail.__annotations__,
      hasattr(pkg.sub.mod, "annotations"))
try:
    pkg.sub.mod.fail(1)
except ValueError as error:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    print(frame.filename == pkg.sub.mod.__file__, frame.lineno, frame.line)
"""


def test_the_bundled_code_imports_no_future_and_keeps_its_lines(built: tuple[Path, Path]) -> None:
    """`from __future__ import annotations` becomes a compile flag: nothing imports __future__ (~0.2 ms), the
    annotations stay strings, and a traceback names the source's own file and line."""
    root, path = built
    source = root / "pkg" / "sub" / "mod.py"
    source.write_text(FUTURE_MODULE)
    assert launcher.write_bundle(str(path), [("pkg.sub", str(root / "pkg" / "sub" / "__init__.py")),
                                           ("pkg.sub.mod", str(source))]) == 2
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{FUTURE_CHECK}", str(root), str(path)], capture_output=True, text=True, timeout=60,
                          check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("BundleFinder False {'argument': 'Undefined', 'return': 'None'} False\n"
                           "True 9 raise ValueError(argument)\n")


def test_the_directories_before_the_tree_are_not_listed(built_with_top: tuple[Path, Path], tmp_path: Path) -> None:
    """The check that no earlier sys.path entry holds `pkg` stats the few names the import would look for, without
    the finder (and listing) the import would make for the directory: the console script, named `singpy`, lies in
    sys.path[0], a file, not a package (~0.2 ms for a venv's bin and lib-dynload)."""
    root, path = built_with_top
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pkg").write_text("#!/bin/sh\n")
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    script = (f"import sys; sys.path.insert(0, {singpy_root!r})\n"
              "from singpy.cli.bundle import install\n"
              f"sys.path[0:0] = [{str(tmp_path / 'bin')!r}]; sys.path.append({str(root)!r})\n"
              f"assert install({str(path)!r})\n"
              "import pkg\n"
              f"print(type(pkg.__spec__.loader).__name__, {str(tmp_path / 'bin')!r} in sys.path_importer_cache)\n")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60,
                          check=False, cwd="/")
    assert (done.returncode, done.stdout) == (0, "BundleFinder False\n"), done.stderr

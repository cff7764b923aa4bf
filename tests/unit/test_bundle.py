"""singpy.cli.bundle: the launch path's modules from one file, never stale, never from a place others can write.

Each case builds a small package in tmp_path, writes its bundle with the real writer, and imports it in a
fresh interpreter (`-I -S`, as the tuned script starts) that prints where each module came from: "bundle" or
the normal import's loader.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from singpy.cli import bundle
from tests.conftest import readable_by_all
from tests.support.users import ensure_test_user, is_root

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


def run_importer(root: Path, path: Path, *names: str, **ids: object) -> str:
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n{IMPORTER}",
         str(root), str(path), *names], capture_output=True, text=True, timeout=60, check=False, cwd="/", **ids)
    assert done.returncode == 0, done.stderr
    output: str = done.stdout
    return output


@pytest.fixture
def built(workdir: Path) -> tuple[Path, Path]:
    """The package and its bundle, in the session's scratch directory (which the test user can reach)."""
    root = Path(tempfile.mkdtemp(dir=workdir, prefix="bundle-")) / "tree"
    modules = make_package(root)
    path = Path(bundle.bundle_path(str(root / "pkg")))
    assert bundle.write_bundle(str(path), modules) == 2
    return root, path


def test_modules_come_from_the_bundle(built: tuple[Path, Path]) -> None:
    root, path = built
    assert oct(path.stat().st_mode & 0o777) == "0o644" and not list(path.parent.glob("*.tmp"))
    assert run_importer(root, path, "pkg", "pkg.sub", "pkg.sub.mod") == (
        "installed\npkg SourceFileLoader top True\npkg.sub BundleFinder package True\n"
        "pkg.sub.mod BundleFinder first True\n")


def test_a_changed_source_is_imported_from_the_source(built: tuple[Path, Path]) -> None:
    root, path = built
    source = root / "pkg" / "sub" / "mod.py"
    info = source.stat()
    source.write_text(source.read_text().replace("first", "other"))  # the same size
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns + 1))  # and a nanosecond later
    assert run_importer(root, path, "pkg.sub", "pkg.sub.mod") == (
        "installed\npkg.sub BundleFinder package True\npkg.sub.mod SourceFileLoader other True\n")
    source.write_text(source.read_text() + "# longer\n")
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))  # the same mtime, another size
    assert "pkg.sub.mod SourceFileLoader other True\n" in run_importer(root, path, "pkg", "pkg.sub", "pkg.sub.mod")


def test_a_removed_source_is_not_served(built: tuple[Path, Path]) -> None:
    root, path = built
    (root / "pkg" / "sub" / "mod.py").unlink()
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{IMPORTER}", str(root), str(path), "pkg.sub.mod"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and "ModuleNotFoundError: No module named 'pkg.sub.mod'" in done.stderr


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_bundle_others_can_write_is_ignored(built: tuple[Path, Path], where: str) -> None:
    root, path = built
    target = path if where == "file" else path.parent
    target.chmod(target.stat().st_mode | 0o002)
    assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"
    target.chmod(target.stat().st_mode & ~0o002 | 0o020)  # group-writable: the same
    assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"


def test_a_bundle_of_another_user_is_ignored(built: tuple[Path, Path]) -> None:
    """Root's bundle serves the test user (root owns the tree); the test user's bundle never serves root."""
    if not is_root():
        pytest.skip("needs root: chown to the test user")
    root, path = built
    user = ensure_test_user()
    readable_by_all(root.parent)
    ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    assert run_importer(root, path, "pkg.sub.mod", **ids) == "installed\npkg.sub.mod BundleFinder first True\n"
    os.chown(path, user.pw_uid, user.pw_gid)
    assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"
    assert run_importer(root, path, "pkg.sub.mod", **ids) == "installed\npkg.sub.mod BundleFinder first True\n"


def test_a_link_a_foreign_or_a_broken_bundle_is_ignored(built: tuple[Path, Path]) -> None:
    root, path = built
    link = path.parent / "link.bundle"
    link.symlink_to(path)
    assert run_importer(root, link, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"
    fifo = path.parent / "fifo.bundle"
    os.mkfifo(fifo, 0o644)  # would block a plain open: never waited on
    assert run_importer(root, fifo, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"
    data = path.read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")  # the index's length, the index, the code (write_bundle)
    _, rows = marshal.loads(data[8:start])
    index = marshal.dumps(("3.0.0 (another interpreter)", rows))
    foreign = len(index).to_bytes(8, "little") + index + data[start:]
    for content in (foreign, data[:start - 1], b"\xff" * 8 + data[8:], b"\x00garbage", b""):
        path.write_bytes(content)
        assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"


def test_a_package_found_elsewhere_is_not_served_from_the_bundle(built: tuple[Path, Path]) -> None:
    """A PYTHONPATH putting another copy first: the bundle serves only the directory it was built from."""
    root, path = built
    entries = {"pkg.sub.mod": bundle._Entry(str(root / "pkg" / "sub" / "mod.py"), str(root / "pkg" / "sub"), False,
                                        *_stat(root / "pkg" / "sub" / "mod.py"), memoryview(b"code"))}
    finder = bundle.BundleFinder(entries)
    assert finder.find_spec("pkg.sub.mod", ["/elsewhere/pkg/sub"]) is None
    assert finder.find_spec("pkg.sub.mod", None) is None
    spec = finder.find_spec("pkg.sub.mod", [str(root / "pkg" / "sub")])
    assert spec is not None and spec.origin == str(root / "pkg" / "sub" / "mod.py")


def _stat(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


def test_the_hot_path_modules_are_the_launch_path() -> None:
    package_root = str(Path(bundle.__file__).resolve().parents[2])
    names = [name for name, _ in bundle.hot_path_modules(package_root)]
    assert {"singpy.cli.main", "singpy.launch.launch", "singpy.mounts.apply", "singpy.plan"} <= set(names)
    assert "singpy.kernel._native" in names  # the extension: its directory is not listed at each launch
    assert not {"singpy.cli.bundle", "singpy.cli", "singpy.cli.app", "singpy.oci.pull"} & set(names)

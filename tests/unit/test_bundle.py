"""singpy.cli.bundle: the launch path's modules from one file, never stale, never from a place others can write.

Each case builds a small package in tmp_path, writes its bundle with the real writer, and imports it in a
fresh interpreter (`-I -S`, as the tuned script starts) that prints where each module came from: "bundle" or
the normal import's loader. A top-level package and the bundled code's lines: test_bundle_toplevel.py.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from singpy.cli import bundle, launcher
from tests.conftest import readable_by_all
from tests.support.bundles import IMPORTER, built_package, make_package, run_importer, run_installed, source_stat
from tests.support.users import ensure_test_user, is_root


@pytest.fixture
def built(workdir: Path) -> tuple[Path, Path]:
    return built_package(workdir)


def test_modules_come_from_the_bundle(built: tuple[Path, Path]) -> None:
    root, path = built
    assert oct(path.stat().st_mode & 0o777) == "0o644" and os.listdir(path.parent) == [path.name]
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
    ids: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
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
    # the index's length and the first part's (8 bytes each), the index, the code (write_bundle)
    start = 16 + int.from_bytes(data[:8], "little")
    _, rows, ends = marshal.loads(data[16:start])
    index = marshal.dumps(("3.0.0 (another interpreter)", rows, ends))
    foreign = len(index).to_bytes(8, "little") + data[8:16] + index + data[start:]
    longer = data[:8] + (len(data) - start + 1).to_bytes(8, "little") + data[16:]  # a first part past the end
    for content in (foreign, longer, data[:start - 1], data[:-1], data + b"\0", b"\xff" * 8 + data[8:],
                    b"\x00garbage", b""):
        path.write_bytes(content)
        assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"


def test_code_the_bundle_holds_wrongly_is_imported_normally(built: tuple[Path, Path]) -> None:
    """A trusted, whole bundle whose bytes for a module are not code (a disk's fault, a crash before the data
    reached it): that module comes from its source, no traceback; the others still from the bundle."""
    root, path = built
    data = bytearray(path.read_bytes())
    start = 16 + int.from_bytes(data[:8], "little")
    _, rows, _ = marshal.loads(bytes(data[16:start]))
    (at, length), = [(row[-2], row[-1]) for row in rows if row[0] == "pkg.sub.mod"]
    data[start + at:start + at + length] = b"\0" * length
    path.write_bytes(bytes(data))
    assert run_importer(root, path, "pkg.sub", "pkg.sub.mod") == (
        "installed\npkg.sub BundleFinder package True\npkg.sub.mod SourceFileLoader first True\n")


def test_a_bundle_for_another_optimization_level_is_ignored(built: tuple[Path, Path]) -> None:
    """Written at the default level, the bundle holds asserts and `__debug__`: `python -O` imports normally."""
    root, path = built
    assert run_importer(root, path, "pkg.sub.mod", flags=("-O",)) == (
        "not installed\npkg.sub.mod SourceFileLoader first True\n")


def test_the_bundle_is_never_written_through_a_link(built: tuple[Path, Path], tmp_path: Path) -> None:
    """A name planted beside the bundle (here the one the writer used before: PATH.PID.tmp) as a link to another
    file: make setup (root's) never writes through it, nor changes that file's mode."""
    root, path = built
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    planted = Path(f"{path}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    assert launcher.write_bundle(str(path), [("pkg.sub", str(root / "pkg" / "sub" / "__init__.py"))]) == 1
    assert victim.read_text() == "secret\n" and victim.stat().st_mode & 0o777 == 0o600
    assert path.is_file() and not path.is_symlink() and planted.is_symlink()
    assert sorted(os.listdir(path.parent)) == sorted([path.name, planted.name])


def test_a_package_found_elsewhere_is_not_served_from_the_bundle(built: tuple[Path, Path]) -> None:
    """A PYTHONPATH putting another copy first: the bundle serves only the directory it was built from."""
    root, path = built
    code = memoryview(marshal.dumps(compile("VALUE = 1", "mod.py", "exec")))
    entries = {"pkg.sub.mod": bundle._Entry(str(root / "pkg" / "sub" / "mod.py"), str(root / "pkg" / "sub"), False,
                                        *source_stat(root / "pkg" / "sub" / "mod.py"), code)}
    finder = bundle.BundleFinder(entries)
    assert finder.find_spec("pkg.sub.mod", ["/elsewhere/pkg/sub"]) is None
    assert finder.find_spec("pkg.sub.mod", None) is None
    spec = finder.find_spec("pkg.sub.mod", [str(root / "pkg" / "sub")])
    assert spec is not None and spec.origin == str(root / "pkg" / "sub" / "mod.py")


# Installs the bundle argv[2] for the package root argv[1], then does argv[3] to it ("replace": a copy renamed over
# it, "chmod": made writable by others, "keep": nothing) and imports argv[4:], printing what served them.
LATER_IMPORTER = """
import os, shutil, sys
sys.path.append(sys.argv[1])
from singpy.cli.bundle import install
print("installed" if install(sys.argv[2]) else "not installed")
if sys.argv[3] == "replace":
    shutil.copy(sys.argv[2], sys.argv[2] + ".new")
    os.replace(sys.argv[2] + ".new", sys.argv[2])
elif sys.argv[3] == "chmod":
    os.chmod(sys.argv[2], 0o666)
for name in sys.argv[4:]:
    module = __import__(name, fromlist=["x"])
    print(name, type(module.__spec__.loader).__name__, module.VALUE)
"""


@pytest.mark.parametrize(("change", "served_by"), [("keep", "BundleFinder"), ("replace", "SourceFileLoader"),
                                                   ("chmod", "SourceFileLoader")])
def test_the_second_part_is_read_from_the_same_trusted_file(workdir: Path, change: str, served_by: str) -> None:
    """The image paths' modules (the second part) are read when first imported, from the file the first part came
    from, still trusted: a bundle replaced or made writable by others since start-up serves none of them."""
    root = Path(tempfile.mkdtemp(dir=workdir, prefix="bundle-")) / "tree"
    first, later = make_package(root)
    path = Path(bundle.bundle_path(str(root / "pkg")))
    assert launcher.write_bundle(str(path), [first], [later]) == 2
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{LATER_IMPORTER}", str(root), str(path), change, "pkg.sub", "pkg.sub.mod"],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"installed\npkg.sub BundleFinder package\npkg.sub.mod {served_by} first\n"


# Counts the bytes the bundle code reads (os.read, os.pread) while installing argv[2] and importing argv[3:].
COUNTING_IMPORTER = """
import os, sys
sys.path.append(sys.argv[1])
counted = []
for name in ("read", "pread"):
    def counting(*args, real=getattr(os, name)):
        data = real(*args)
        counted.append(len(data))
        return data
    setattr(os, name, counting)
from singpy.cli.bundle import install
print("installed" if install(sys.argv[2]) else "not installed", sum(counted))
for name in sys.argv[3:]:
    module = __import__(name, fromlist=["x"])
    print(name, type(module.__spec__.loader).__name__, sum(counted))
"""


def test_the_first_part_is_read_alone(built: tuple[Path, Path]) -> None:
    """A launch reads the first part only; the second is read, once, when one of its modules is imported."""
    root, path = built
    package = root / "pkg" / "sub"
    assert launcher.write_bundle(str(path), [("pkg.sub", str(package / "__init__.py"))],
                               [("pkg.sub.mod", str(package / "mod.py"))]) == 2
    data = path.read_bytes()
    second = 16 + int.from_bytes(data[:8], "little") + int.from_bytes(data[8:16], "little")
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{COUNTING_IMPORTER}", str(root), str(path), "pkg.sub", "pkg.sub.mod"],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    assert 0 < second < len(data)
    assert done.stdout == (f"installed {second}\npkg.sub BundleFinder {second}\n"
                           f"pkg.sub.mod BundleFinder {len(data)}\n")


def test_each_later_part_is_read_alone(built: tuple[Path, Path]) -> None:
    """Several later parts (the image paths', the GPU flags', those both import): importing a module reads its own
    part only, once (a SIF's launch reads no GPU code, `--nv` on a sandbox none of the image paths')."""
    root, path = built
    package = root / "pkg" / "sub"
    for name in ("gpu", "both"):
        (package / f"{name}.py").write_text(f"VALUE = {name!r}\nSOURCE = {str(package / f'{name}.py')!r}\n")
    assert launcher.write_bundle(str(path), [("pkg.sub", str(package / "__init__.py"))],
                                 [("pkg.sub.mod", str(package / "mod.py"))], [("pkg.sub.gpu", str(package / "gpu.py"))],
                                 [("pkg.sub.both", str(package / "both.py"))]) == 4
    data = path.read_bytes()
    start = 16 + int.from_bytes(data[:8], "little")
    ends = marshal.loads(data[16:start])[2]
    singpy_root = str(Path(bundle.__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {singpy_root!r})\n"
                           f"{COUNTING_IMPORTER}", str(root), str(path), "pkg.sub", "pkg.sub.gpu", "pkg.sub.both",
                           "pkg.sub.gpu"], capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    first, gpu, both = start + ends[0], ends[2] - ends[1], ends[3] - ends[2]
    assert len(ends) == 4 and gpu > 0 and both > 0 and start + ends[3] == len(data)
    assert done.stdout == (f"installed {first}\npkg.sub BundleFinder {first}\npkg.sub.gpu BundleFinder {first + gpu}\n"
                           f"pkg.sub.both BundleFinder {first + gpu + both}\n"
                           f"pkg.sub.gpu BundleFinder {first + gpu + both}\n")


def test_an_extension_in_the_second_part_stays_one(built: tuple[Path, Path]) -> None:
    """An extension module's row holds no code (the interpreter's own loader loads the file): read from the second
    part, it must stay empty, not run on into the next module's code."""
    root, path = built
    package = root / "pkg" / "sub"
    (package / "ext.so").write_bytes(b"not loaded here")
    later = [("pkg.sub.ext", str(package / "ext.so")), ("pkg.sub.mod", str(package / "mod.py"))]
    assert launcher.write_bundle(str(path), [("pkg.sub", str(package / "__init__.py"))], later) == 3
    assert run_installed(root, path, "import pkg.sub.mod\n"
                                     "entries = sys.meta_path[0].entries\n"
                                     "print(pkg.sub.mod.VALUE, bytes(entries['pkg.sub.ext'].code), "
                                     "entries['pkg.sub.ext'].length)\n") == "first b'' 0\n"


def test_an_extension_that_ends_its_part_waits_for_no_part(built: tuple[Path, Path]) -> None:
    """An extension's row holds no code: last of its part (as singpy.oci._tlscheck is of the image paths' part), it
    is served without reading its part, nor the next one (which once got read for it, the GPU code for a docker://
    launch)."""
    root, path = built
    package = root / "pkg" / "sub"
    (package / "ext.so").write_bytes(b"not loaded here")
    (package / "gpu.py").write_text("VALUE = 'gpu'\n")
    assert launcher.write_bundle(str(path), [("pkg.sub", str(package / "__init__.py"))],
                                 [("pkg.sub.mod", str(package / "mod.py")), ("pkg.sub.ext", str(package / "ext.so"))],
                                 [("pkg.sub.gpu", str(package / "gpu.py"))]) == 4
    assert run_installed(root, path, "import pkg.sub\n"
                                     "finder = sys.meta_path[0]\n"
                                     "spec = finder.find_spec('pkg.sub.ext', pkg.sub.__path__)\n"
                                     "print(type(spec.loader).__name__, finder.entries['pkg.sub.mod'].code is None, "
                                     "finder.entries['pkg.sub.gpu'].code is None)\n") == \
        "ExtensionFileLoader True True\n"


def test_an_index_of_the_wrong_kinds_is_no_bundle(built: tuple[Path, Path]) -> None:
    """A trusted file whose index has the right shape but values of other kinds (a dict of part ends, an offset
    that is a float): not installed, no traceback, the normal import."""
    root, path = built
    data = path.read_bytes()
    start = 16 + int.from_bytes(data[:8], "little")
    key, rows, ends = marshal.loads(data[16:start])
    floated = [(*row[:-2], float(row[-2]), row[-1]) for row in rows]
    for index in ((key, rows, dict(enumerate(ends))), (key, floated, ends), (key, rows, [*ends])):
        blob = marshal.dumps(index)
        path.write_bytes(len(blob).to_bytes(8, "little") + data[8:16] + blob + data[start:])
        assert run_importer(root, path, "pkg.sub.mod") == "not installed\npkg.sub.mod SourceFileLoader first True\n"


def test_the_hot_path_modules_are_the_launch_path() -> None:
    package_root = str(Path(bundle.__file__).resolve().parents[2])
    names = [name for name, _ in launcher.hot_path_modules(package_root)]
    assert {"singpy.cli.main", "singpy.launch.launch", "singpy.mounts.apply", "singpy.plan"} <= set(names)
    assert "singpy.kernel._native" in names  # the extension: its directory is not listed at each launch
    assert {"singpy", "singpy.cli"} <= set(names)  # the packages too: no directory of the tree is listed
    assert not {"singpy.cli.bundle", "singpy.cli.app", "singpy.oci.pull"} & set(names)
    later = [name for name, _ in launcher.image_path_modules(package_root)]
    assert {"singpy.image.squashfs", "singpy.oci.pull", "singpy.oci.tagcheck", "singpy.oci.store",
            "singpy.signing.eclrecord", "singpy.signing.keyring"} <= set(later)  # an active ECL's record check
    assert not set(later) & set(names) and not {"singpy.oci.registry", "singpy.image.sif"} & set(later)
    gpu = [name for name, _ in launcher.gpu_path_modules(package_root)]
    assert {"singpy.gpu.nvidia", "singpy.gpu.ldcache", "singpy.gpu.cdi", "singpy.config.liblist"} <= set(gpu)
    assert not set(gpu) & set(names)
    parts = [[name for name, _ in part] for part in launcher.later_parts(package_root)]
    assert sorted(sum(parts, [])) == sorted(set(later) | set(gpu))  # each module once
    assert not set(parts[0]) & set(gpu) and not set(parts[1]) & set(later)  # a SIF reads no GPU code

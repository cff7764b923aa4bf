"""The tuned console script (singpy.cli.launcher, written by `make setup`): `python -S`, site only when needed.

Each case writes the script into the session's workdir from the venv's own,
then runs it as root and as the test user: a launch must work and skip site
(PYTHONPROFILEIMPORTTIME lists what the interpreter imported), a typer command
and the drop-in names must behave as with the plain script, and a fast command
that needs a package of the venv gets it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from singpy.cli import launcher
from tests.conftest import SINGPY, Singpy, assert_one_fatal


@pytest.fixture(scope="module")
def tuned(workdir: Path) -> Path:
    """The venv's script, tuned, in a directory both users reach."""
    directory = workdir / "tuned-bin"
    directory.mkdir(exist_ok=True)
    script = directory / "singpy"
    shutil.copy(SINGPY, script)
    assert launcher.main([str(script)]) == 0
    return script


def run(singpy: Singpy, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        argv, env=singpy.env(**env), cwd=str(singpy.workdir), capture_output=True, text=True, timeout=60,
        check=False, **singpy.switch())
    return done


def imported(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_the_script_starts_python_without_site(tuned: Path) -> None:
    first = tuned.read_text().splitlines()[0]
    assert first == f"#!{Path(sys.executable).parent / 'python3'} -S" or first.endswith(" -S")
    assert os.access(tuned, os.X_OK)


def test_exec_skips_site_and_runs(singpy: Singpy, image: Path, tuned: Path) -> None:
    done = run(singpy, [str(tuned), "exec", str(image), "echo", "tuned"], PYTHONPROFILEIMPORTTIME="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "tuned\n"
    modules = imported(done.stderr)
    assert "singpy.launch.launch" in modules
    assert not modules & {"site", "_distutils_hack", "sitecustomize"}
    assert not modules & {"ctypes", "enum", "collections"}  # the calls through singpy.kernel._native (issue 31)


# The tuned script's own lines up to its call of main, then a launch that fails before execve (a missing command),
# then where each singpy module came from.
FROM_THE_BUNDLE = """exec(open(sys.argv.pop(1)).read().split("if __name__")[0])
status = main(["exec", sys.argv[1], "/no/such/command"])
loaders = {type(module.__spec__.loader).__name__ for name, module in sys.modules.items()
           if name.startswith("singpy.") and name not in ("singpy.cli", "singpy.cli.bundle", "singpy.kernel._native")}
print(status, sorted(loaders), "singpy.launch.launch" in sys.modules)
"""


def test_the_launch_path_comes_from_the_bundle(singpy: Singpy, image: Path, tuned: Path) -> None:
    """`make setup` (launcher.main) wrote the bundle beside the package: every launch-path module is read from it."""
    done = run(singpy, [sys.executable, "-S", "-c", f"import sys\n{FROM_THE_BUNDLE}", str(tuned), str(image)])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "255 ['BundleFinder'] True\n"
    assert done.stderr.startswith("FATAL:") and "/no/such/command" in done.stderr


# The console script's code with singpy.kernel._native made unimportable, as in a tree where it was never built.
WITHOUT_NATIVE = ("import sys; sys.modules['singpy.kernel._native'] = None; sys.path.append(sys.argv.pop(1)); "
                  "from singpy.cli.main import main; sys.argv[0] = 'singpy'; sys.exit(main())")


def test_a_tree_without_the_extension_launches_through_ctypes(singpy: Singpy, image: Path) -> None:
    package_root = str(Path(launcher.__file__).resolve().parents[2])
    argv = [sys.executable, "-S", "-c", WITHOUT_NATIVE, package_root]
    done = run(singpy, [*argv, "exec", "--containall", "--hostname", "fallback", str(image), "cat",
                        "/proc/sys/kernel/hostname"], PYTHONPROFILEIMPORTTIME="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "fallback\n"
    assert {"ctypes", "singpy.kernel._libcalls"} <= imported(done.stderr)
    assert_one_fatal(run(singpy, [*argv, "exec", str(image), "/no/such/command"]), "/no/such/command")


def test_a_users_mistake_is_still_one_fatal_line(singpy: Singpy, image: Path, tuned: Path) -> None:
    assert_one_fatal(run(singpy, [str(tuned), "exec", str(image), "/no/such/command"]), "/no/such/command")


def test_typer_commands_get_site_first(singpy: Singpy, tuned: Path) -> None:
    done = run(singpy, [str(tuned), "version"], PYTHONPROFILEIMPORTTIME="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "singpy version 0.1.0\n"
    assert {"site", "typer"} <= imported(done.stderr)


def test_a_fast_command_needing_a_venv_package_gets_site(singpy: Singpy, image: Path, tuned: Path) -> None:
    """--drop-caps goes through python-prctl (site-packages): site runs at that import, on the host."""
    done = run(singpy, [str(tuned), "exec", "--drop-caps", "CAP_CHOWN", str(image), "echo", "dropped"],
               PYTHONPROFILEIMPORTTIME="1")
    modules = imported(done.stderr)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "dropped\n"
    if singpy.uid == 0:  # kept capabilities are set through prctl as root only (singpy.kernel.caps.preload)
        assert {"site", "prctl"} <= modules
    else:
        assert "prctl" not in modules


# site waiting as the tuned script leaves it (singpy.cli.main), then a module that imports msvcrt to learn it is not on
# Windows, then a package of the venv.
SITE_WAITS = """import sys
sys.path.append(sys.argv[1])
from singpy.cli import main
main._site_on_demand()
import subprocess
print("site" in sys.modules, end=" ")
import zstandard
print("site" in sys.modules)
"""


def test_a_probe_for_a_windows_module_does_not_load_site(singpy: Singpy) -> None:
    """`import subprocess` tries msvcrt: that miss is no reason to run site (~3 ms); a venv package still is."""
    package_root = str(Path(launcher.__file__).resolve().parents[2])
    done = run(singpy, [sys.executable, "-S", "-c", SITE_WAITS, package_root])
    assert (done.returncode, done.stdout) == (0, "False True\n"), done.stderr


def test_drop_in_names_get_the_tuned_script(singpy: Singpy, tuned: Path) -> None:
    link = tuned.parent / "apptainer"
    if not link.exists():
        link.symlink_to(tuned)
    done = run(singpy, [str(link), "--version"])
    assert (done.returncode, done.stdout) == (0, "apptainer version 1.5.3\n"), done.stderr


def test_rewriting_keeps_the_interpreter_and_refuses_a_bad_one(tmp_path: Path) -> None:
    script = tmp_path / "singpy"
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    assert launcher.main([str(script)]) == 0
    assert script.read_text().startswith(f"#!{sys.executable} -S\n")
    assert launcher.main([str(script)]) == 0  # twice: still one -S
    assert script.read_text().startswith(f"#!{sys.executable} -S\n")
    with pytest.raises(ValueError, match="shebang"):
        launcher.script_text("/opt/my python/bin/python3", "/srv")
    assert not list(tmp_path.glob("*.tmp"))

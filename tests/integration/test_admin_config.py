"""An admin's apptainer.conf carries over, and `pip install .` gives a working singpy (issue 11).

As root and as the test user: a stock apptainer.conf loads (notes only with --verbose), its
directives act as in Apptainer, a misspelt one is one FATAL with file:line; a wheel built from
the repository and installed into a fresh virtual environment runs a sandbox.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.sysconf_expected import IGNORED_IN_STOCK, STOCK_APPTAINER_CONF

REPO = Path(__file__).resolve().parents[2]


def _apptainer_dir(workdir: Path, name: str, text: str) -> Path:
    """A world-readable directory holding `apptainer.conf` (and the liblists beside it, as /etc/apptainer has)."""
    directory = workdir / name
    directory.mkdir(mode=0o755, exist_ok=True)
    (directory / "apptainer.conf").write_text(text)
    for liblist in ("nvliblist.conf", "rocmliblist.conf"):
        shutil.copy(REPO / "etc" / liblist, directory / liblist)
    return directory / "apptainer.conf"


def test_stock_apptainer_conf_runs(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _apptainer_dir(workdir, "apptainer-stock", STOCK_APPTAINER_CONF)
    quiet = singpy.run("--config", str(conf), "exec", str(image), "echo", "ran")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "ran\n", "")
    verbose = singpy.run("--verbose", "--config", str(conf), "exec", str(image), "true")
    assert verbose.returncode == 0, verbose.stderr
    notes = [line for line in verbose.stderr.splitlines() if "has no meaning for singpy" in line]
    assert [line.split("'")[1] for line in notes] == IGNORED_IN_STOCK  # one each, in file order
    assert f"configuration: {conf}" in verbose.stderr


def test_apptainer_conf_from_environment_applies_its_directives(singpy: Singpy, image: Path, workdir: Path) -> None:
    shared = workdir / "admin-site-data"
    shared.mkdir(mode=0o755, exist_ok=True)
    (shared / "readme").write_text("site\n")
    (shared / "readme").chmod(0o644)
    text = (STOCK_APPTAINER_CONF.replace("mount tmp = yes", "mount tmp = no")
            .replace("allow pid ns = yes", "allow pid ns = no")
            .replace("bind path = /etc/hosts", f"bind path = /etc/hosts,{shared}:/site"))
    conf = _apptainer_dir(workdir, f"apptainer-site-{singpy.profile}", text)
    env = singpy.env(SINGPY_CONFIG=str(conf))
    out = singpy.ok("exec", str(image), "sh", "-c", "cat /site/readme; ls -A /tmp | wc -l", env=env, cwd="/")
    assert out.split() == ["site", "0"]
    dropped = singpy.run("exec", "--pid", str(image), "sh", "-c", "echo $$", env=env)
    assert dropped.returncode == 0 and dropped.stdout.strip() != "1", dropped.stderr
    assert "(allow pid ns = no)" in dropped.stderr


@pytest.mark.parametrize(("line", "message"), [
    ("allow setuids = yes", ":3: unknown directive 'allow setuids'"),
    ("enable overlay = sometimes", ":3: enable overlay must be one of yes, no, try, driver, not 'sometimes'"),
    ("sessiondir max size = -16", ":3: sessiondir max size must be a number (0 or more), not '-16'"),
], ids=["misspelt", "bad-choice", "negative"])
def test_bad_apptainer_line_is_one_fatal(singpy: Singpy, image: Path, workdir: Path, line: str, message: str) -> None:
    conf = _apptainer_dir(workdir, f"apptainer-bad-{singpy.profile}", f"# site\nallow setuid = yes\n{line}\n")
    assert_one_fatal(singpy.run("--config", str(conf), "exec", str(image), "true"), f"{conf}{message}")


# --- pip install . -------------------------------------------------------------------------------------------------

_NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache",
                                     ".ruff_cache", ".pytest_cache")


@pytest.fixture(scope="module")
def installed(workdir: Path) -> Iterator[Path]:
    """A fresh virtual environment (world-readable, in the session's workdir) with `pip install` of a copy of the repo.

    The dependencies are not installed again: the environment sees the running interpreter's site-packages
    through a .pth line, after its own, so the singpy that runs is the installed wheel, not the clone.
    """
    root = workdir / "pip-install"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o755)
    source = root / "source"
    shutil.copytree(REPO, source, ignore=_NOT_COPIED, symlinks=True)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", where], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    Path(site, "singpy-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # Built as pip builds it for a user (isolated, setuptools and wheel from the configured index);
    # where no index answers, the test skips rather than fails.
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--quiet",
                          "--disable-pip-version-check", str(source)], capture_output=True, text=True, timeout=300,
                         check=False)
    if pip.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"pip could not build the repository (no package index?): {pip.stderr.strip()[-400:]}")
    readable_by_all(root)  # the test user runs it too (umask may have been 077)
    yield venv
    shutil.rmtree(root, ignore_errors=True)


def _run_installed(singpy: Singpy, venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        [str(venv / "bin" / "singpy"), *args], capture_output=True, text=True, timeout=120, check=False,
        env=singpy.env(), cwd="/", **singpy.switch())
    return result


def test_pip_install_gives_a_working_singpy(singpy: Singpy, installed: Path, image: Path) -> None:
    module = subprocess.run([str(installed / "bin" / "python"), "-c", "import singpy; print(singpy.__file__)"],
                            capture_output=True, text=True, check=True, timeout=60, cwd="/").stdout
    assert module.startswith(str(installed)), module  # the wheel's copy, not the clone
    shipped = installed / "etc" / "singpy" / "singpy.conf"
    assert shipped.read_text() == (REPO / "etc" / "singpy.conf").read_text()
    assert (installed / "etc" / "singpy" / "nvliblist.conf").is_file()
    result = _run_installed(singpy, installed, "--verbose", "exec", str(image), "echo", "ran")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    if not Path("/etc/singpy/singpy.conf").exists() and not Path("/etc/apptainer/apptainer.conf").exists() \
            and not Path("/etc/singularity/singularity.conf").exists():
        assert f"configuration: {shipped}" in result.stderr


def test_pip_install_without_its_data_files_uses_built_in_defaults(singpy: Singpy, installed: Path, image: Path,
                                                                  workdir: Path) -> None:
    """`pip install --target` or a wheel unpacked by hand has no <prefix>/etc/singpy: defaults, not an error."""
    shipped = installed / "etc" / "singpy"
    aside = workdir / f"pip-install-etc-aside-{singpy.profile}"
    shipped.rename(aside)
    try:
        result = _run_installed(singpy, installed, "--verbose", "exec", str(image), "echo", "ran")
    finally:
        aside.rename(shipped)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    assert "can't read configuration" not in result.stderr

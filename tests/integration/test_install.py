"""`make install` puts a working `singpy` on PATH (issue 11: "Installing like a Python tool")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, readable_by_all

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "singpy").exists(), reason="needs the clone's .venv (make setup)")
def test_make_install_links_a_working_singpy(tmp_path: Path) -> None:
    if Path(sys.executable).parent != REPO / ".venv" / "bin":
        pytest.skip("the suite runs outside the clone's .venv: `make install` would link another one")
    done = subprocess.run(["make", "-s", "-C", str(REPO), "install", f"PREFIX={tmp_path}"], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    command = tmp_path / "bin" / "singpy"
    assert command.is_symlink() and os.readlink(command) == str(REPO / ".venv" / "bin" / "singpy")
    assert f"add {tmp_path}/bin to your PATH" in done.stdout
    shown = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0 and shown.stdout.startswith("singpy version "), shown.stderr
    assert not (tmp_path / "bin" / "apptainer").exists()


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "singpy").exists(), reason="needs the clone's .venv (make setup)")
def test_make_install_drop_in_answers_as_apptainer(tmp_path: Path) -> None:
    """DROP_IN=yes: `apptainer` and `singularity` on PATH, answering as Apptainer; never over another command."""
    if Path(sys.executable).parent != REPO / ".venv" / "bin":
        pytest.skip("the suite runs outside the clone's .venv: `make install` would link another one")
    install = ["make", "-s", "-C", str(REPO), "install", f"PREFIX={tmp_path}", "DROP_IN=yes"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("apptainer", "singularity"):
        shown = subprocess.run([str(tmp_path / "bin" / name), "--version"], capture_output=True, text=True,
                               timeout=60, check=False)
        assert shown.stdout == "apptainer version 1.5.3\n", shown.stderr
    (tmp_path / "bin" / "singularity").unlink()
    (tmp_path / "bin" / "singularity").write_text("#!/bin/sh\necho the real one\n")
    again = subprocess.run(install, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode != 0 and "singularity exists and is not singpy" in again.stderr
    assert (tmp_path / "bin" / "singularity").read_text() == "#!/bin/sh\necho the real one\n"


# --- pipx install . ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pipx_installed(workdir: Path) -> Iterator[Path]:
    """`pipx install` of the tracked files into a PIPX_HOME of our own: the `singpy` command pipx links.

    pipx makes its own virtual environment and installs the dependencies into it from the package
    index, as it does for a user; where no index answers, the test skips rather than fails.
    """
    pipx = shutil.which("pipx")
    if pipx is None:
        pytest.skip("pipx is not installed (Debian package pipx)")
    root = workdir / "pipx-install"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o755)
    source = root / "source"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    env = {**os.environ, "PIPX_HOME": str(root / "home"), "PIPX_BIN_DIR": str(root / "bin")}
    done = subprocess.run([pipx, "install", "--python", os.path.realpath(sys.executable),
                           str(source)], capture_output=True, text=True, timeout=600, check=False, env=env)
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"pipx could not install the repository (no package index?): {done.stderr.strip()[-400:]}")
    readable_by_all(root)  # the test user runs it too (umask may have been 077)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_pipx_install_gives_a_working_singpy(singpy: Singpy, pipx_installed: Path, image: Path) -> None:
    command = pipx_installed / "bin" / "singpy"
    venv = pipx_installed / "home" / "venvs" / "singpy"
    assert command.resolve() == venv / "bin" / "singpy"
    shipped = venv / "etc" / "singpy" / "singpy.conf"
    assert shipped.read_text() == (REPO / "etc" / "singpy.conf").read_text()
    result = subprocess.run([str(command), "--verbose", "exec", str(image), "echo", "ran"],  # type: ignore[call-overload]
                            capture_output=True, text=True, timeout=120, check=False, env=singpy.env(), cwd="/",
                            **singpy.switch())
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"
    if not any(Path(path).exists() for path in ("/etc/singpy/singpy.conf", "/etc/apptainer/apptainer.conf",
                                                 "/etc/singularity/singularity.conf")):
        assert f"configuration: {shipped}" in result.stderr
    shown = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0 and shown.stdout.startswith("singpy version "), shown.stderr
    oci = next((venv / "lib").glob("python3*/site-packages/singpy/oci"))
    if list(oci.glob("_tlscheck.*.so")):  # built (a compiler, OpenSSL's headers): the TLS check's helper beside it
        found = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "from singpy.oci import _tlscheck; print(_tlscheck.helper())"],
                               capture_output=True, text=True, timeout=60, check=False, cwd="/")
        assert found.stdout == f"{oci / '_tlscheck_helper'}\n", found.stderr


def test_pipx_install_offers_the_drop_in_names_on_request(pipx_installed: Path, tmp_path: Path) -> None:
    """A pipx or pip installation gets `apptainer` and `singularity` with `python -m singpy.cli.dropin`."""
    venv = pipx_installed / "home" / "venvs" / "singpy"
    assert not (pipx_installed / "bin" / "apptainer").exists()  # only on request
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "singpy.cli.dropin", str(bin_dir)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for name in ("apptainer", "singularity"):
        assert os.readlink(bin_dir / name) == str(venv / "bin" / "singpy")
        shown = subprocess.run([str(bin_dir / name), "--version"], capture_output=True, text=True, timeout=60,
                               check=False)
        assert shown.stdout == "apptainer version 1.5.3\n", shown.stderr

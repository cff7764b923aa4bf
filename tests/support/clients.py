"""The programs that drive apptainer/singularity (cwltool, Snakemake, spython), run against singpy.

They find the container runtime by name on PATH (`singularity`, `apptainer`), as on a host where singpy
was installed with `make install DROP_IN=yes`: `drop_in_names` makes that directory of links, and
`client_env` puts it first on PATH, with the clients' own virtual environment after it. The images come
from the suite's plain-HTTP registry; a client never passes `--no-https`, so `APPTAINER_NOHTTPS=1` says
it, as a user of such a registry would with Apptainer.

`run_client` runs a client as the profile's user in a session of its own, so that a client that hangs is
killed with everything it started (its singpy, that singpy's payload) when the timeout ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import SINGPY, Singpy, default_signals

VENV_BIN = Path(sys.executable).parent  # cwltool, snakemake and the python that has spython
DROP_IN_NAMES = ("apptainer", "singularity")


def drop_in_names(workdir: Path) -> Path:
    """A directory holding `apptainer` and `singularity`, links to the singpy command (made once a session)."""
    links = workdir / "drop-in-names"
    links.mkdir(exist_ok=True)
    for name in DROP_IN_NAMES:
        link = links / name
        if not link.is_symlink():
            link.symlink_to(SINGPY)
    return links


def own_dir(singpy: Singpy, path: Path) -> Path:
    """A directory of the profile's user (the test user can't write pytest's tmp_path), made once."""
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def client_env(singpy: Singpy, workdir: Path, xdg_cache: Path, **extra: str) -> dict[str, str]:
    """The profile's environment with the drop-in names first on PATH, and what the clients write kept in
    `xdg_cache` (Snakemake's source cache would go to the user's ~/.cache otherwise)."""
    path = f"{drop_in_names(workdir)}:{VENV_BIN}:/usr/bin:/bin"
    return singpy.env(PATH=path, APPTAINER_NOHTTPS="1", XDG_CACHE_HOME=str(xdg_cache), **extra)


def run_client(singpy: Singpy, argv: list[str], *, env: dict[str, str], cwd: Path,
               timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a client as the profile's user; on timeout its whole session is killed, then the test fails."""
    process = subprocess.Popen(  # type: ignore[call-overload]
        argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, preexec_fn=default_signals, **singpy.switch())
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise AssertionError(f"{argv[0]} did not finish in {timeout} s\nstdout: {out}\nstderr: {err}") from None
    return subprocess.CompletedProcess(argv, process.returncode, out, err)

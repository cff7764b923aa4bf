"""The MPI payload and its container image for the HPC tests (issue 13), built with the host's Open MPI.

The image follows the **bind model** of Apptainer's MPI documentation: the container does not carry an MPI of
its own; the host's is bound in. Here the whole host /usr is bound read-only (`-B /usr:/usr:ro`, the
`BIND_USR` arguments), which brings libmpi, PMIx, the dynamic loader and a shell. The image itself is a
minimal usr-merged Debian layout: bin, lib, lib64 and sbin are symlinks into usr/ (empty: the bind fills it),
the directories singpy mounts over, and /opt/mpitest, the test program compiled on the host from
tests/data/mpitest.c. No /.singularity.d: singpy does not need it.

`build_mpi_images(directory)` makes the program, the sandbox and the same sandbox as a SIF (`singpy build`);
`missing()` says why that can't be done here. The session fixtures `mpi_images` (skipped without mpicc) and
`mpitest_host` (the program alone, run without any container) wrap it; benchmarks/hpc.py uses it directly.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "data" / "mpitest.c"
SINGPY = str(Path(sys.executable).parent / "singpy")
PROGRAM = "/opt/mpitest"  # where the image has the program
BIND_USR = ["-B", "/usr:/usr:ro"]
USR_LINKS = ("bin", "lib", "lib64", "sbin")
DIRS = ("usr", "etc", "tmp", "dev", "proc", "sys", "home", "root", "run", "var/tmp", "opt", "mnt")
LINE = re.compile(r"^rank (\d+)/(\d+) host (\S+) mntns (\S+) userns (\S+)$")


class MpiImages:
    """What build_mpi_images made."""

    def __init__(self, program: Path, sandbox: Path, sif: Path) -> None:
        self.program = program  # the compiled program on the host
        self.sandbox = sandbox
        self.sif = sif


class Rank:
    """One `rank R/N ...` line of mpitest."""

    def __init__(self, rank: int, size: int, host: str, mntns: str, userns: str) -> None:
        self.rank, self.size, self.host, self.mntns, self.userns = rank, size, host, mntns, userns

    def __repr__(self) -> str:
        return f"Rank({self.rank}/{self.size} mnt {self.mntns} user {self.userns})"


def ranks(output: str) -> list[Rank]:
    """The rank lines of mpitest's output, in the order printed."""
    found = []
    for line in output.splitlines():
        match = LINE.match(line.strip())
        if match:
            found.append(Rank(int(match.group(1)), int(match.group(2)), match.group(3), match.group(4),
                              match.group(5)))
    return found


CMA_WARNINGS = ("CMA is", "different user namespaces")  # pieces of Open MPI's vader warning (it wraps a line)


def check_mpitest(stdout: str, stderr: str, size: int = 2) -> list[Rank]:
    """Assert that mpitest ran right on `size` ranks: each rank once, the allreduce and the ping-pong done.

    Returns the rank lines (sorted by rank) for the namespace checks."""
    found = sorted(ranks(stdout), key=lambda rank: rank.rank)
    assert [(rank.rank, rank.size) for rank in found] == [(number, size) for number in range(size)], \
        f"each of {size} ranks once\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert f"allreduce {size * (size - 1) // 2}" in stdout.splitlines(), f"stdout:\n{stdout}\nstderr:\n{stderr}"
    if size >= 2:
        assert "pingpong ok 4194304" in stdout.splitlines(), f"stdout:\n{stdout}\nstderr:\n{stderr}"
    return found


def assert_no_cma_warning(stderr: str) -> None:
    for text in CMA_WARNINGS:
        assert text not in stderr, stderr


def missing() -> str | None:
    """Why the MPI program can't be built or run here, or None."""
    lacking = [tool for tool in ("mpicc", "mpirun") if shutil.which(tool, path="/usr/bin:/bin") is None]
    if lacking:
        return f"not installed: {', '.join(lacking)} (Debian: openmpi-bin libopenmpi-dev)"
    return None


def compile_program(out: Path) -> Path:
    """mpitest.c compiled by the host's mpicc into `out` (mode 0755)."""
    subprocess.run(["mpicc", "-O2", "-Wall", "-o", str(out), str(SOURCE)], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "LANG": "C"})
    out.chmod(0o755)
    return out


def build_sandbox(root: Path, program: Path) -> Path:
    """The bind-model sandbox (see the module's docstring), readable by everyone."""
    root.mkdir(mode=0o755)
    for name in DIRS:
        (root / name).mkdir(mode=0o755, parents=True, exist_ok=True)
    for name in USR_LINKS:
        (root / name).symlink_to(f"usr/{name}")
    (root / "tmp").chmod(0o1777)
    (root / "var" / "tmp").chmod(0o1777)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for name in ("hosts", "resolv.conf", "localtime"):
        (root / "etc" / name).touch()
    # The host's loader cache, so that the bound /usr's libraries in extra directories (ld.so.conf.d: Open MPI's
    # optional transports need libpsm_infinipath in /usr/lib/libpsm1) are found as on the host.
    if os.path.exists("/etc/ld.so.cache"):
        shutil.copy2("/etc/ld.so.cache", root / "etc" / "ld.so.cache")
    shutil.copy2(program, root / PROGRAM.lstrip("/"))
    os.chmod(root / PROGRAM.lstrip("/"), 0o755)
    return root


def build_sif(out: Path, sandbox: Path) -> None:
    """`singpy build OUT.sif SANDBOX`, as whoever runs the suite (a failure fails the tests that need it)."""
    subprocess.run([SINGPY, "-q", "build", str(out), str(sandbox)], capture_output=True, text=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8",
                        "SINGPY_CACHEDIR": str(out.parent / "cache"), "TMPDIR": str(out.parent)},
                   timeout=300, check=True)
    out.chmod(0o644)


def build_mpi_images(directory: Path) -> MpiImages:
    """The program, the sandbox and the SIF, under `directory` (made here, world-readable)."""
    directory.mkdir(mode=0o755)
    program = compile_program(directory / "mpitest")
    sandbox = build_sandbox(directory / "sandbox", program)
    (directory / "cache").mkdir(mode=0o700)
    build_sif(directory / "mpitest.sif", sandbox)
    return MpiImages(program, sandbox, directory / "mpitest.sif")


@pytest.fixture(scope="session")
def mpi_images(workdir: Path) -> MpiImages:
    """mpitest, its bind-model sandbox and SIF, built once per session; skipped without Open MPI."""
    why = missing()
    if why:
        pytest.skip(why)
    return build_mpi_images(workdir / "mpi")


@pytest.fixture(params=["sandbox", "sif"])
def mpi_image(request: pytest.FixtureRequest, mpi_images: MpiImages) -> Path:
    """The bind-model image, as a sandbox and as a SIF."""
    return mpi_images.sif if request.param == "sif" else mpi_images.sandbox


def mpirun_argv(size: int, *, as_root: bool) -> list[str]:
    """`mpirun -n SIZE --oversubscribe` (2 cores here), with what Open MPI demands to start ranks as root."""
    return ["mpirun", "-n", str(size), "--oversubscribe", *(["--allow-run-as-root"] if as_root else [])]


def mpirun_env(env: dict[str, str], *, as_root: bool) -> dict[str, str]:
    """`env` without any SLURM_* (this mpirun runs outside Slurm), plus Open MPI's root consent as root."""
    clean = {name: value for name, value in env.items() if not name.startswith("SLURM_")}
    if as_root:
        clean.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return clean


def mpirun(command: list[str], *, size: int = 2, env: dict[str, str], switch: dict[str, object], as_root: bool,
           cwd: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`mpirun -n SIZE COMMAND` outside Slurm, as the user of `switch`, in a session of its own.

    A hang (a ping-pong that never completes) fails the test after `timeout` seconds, with mpirun and every
    process of its session killed (mpirun's daemons and ranks stay in its session)."""
    argv = [*mpirun_argv(size, as_root=as_root), *command]
    process = subprocess.Popen(argv, env=mpirun_env(env, as_root=as_root), cwd=str(cwd), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               **switch)  # type: ignore[call-overload]
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_session(process)
        out, err = process.communicate()
        pytest.fail(f"mpirun still running after {timeout:.0f} s (killed):\nstdout:\n{out}\nstderr:\n{err}")
    _kill_session(process)  # a rank that outlived mpirun would hold the session's images
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _kill_session(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)

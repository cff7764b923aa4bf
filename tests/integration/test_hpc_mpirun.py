"""singpy under Open MPI's own launcher, outside Slurm (issue 13): `mpirun -n 2 singpy exec IMG /opt/mpitest`.

mpirun starts its ranks through its local daemon with a PMIx server of its own (PMIX_NAMESPACE is Open MPI's
numeric job id, also in OMPI_MCA_ess_base_jobid; PMIX_SERVER_TMPDIR is mpirun's session directory under
TMPDIR). As root Open MPI wants --allow-run-as-root and the OMPI_ALLOW_RUN_AS_ROOT* variables; as the test
user it needs nothing. `--oversubscribe`: this machine has 2 cores. A hang (the 4 MiB ping-pong between two
containers of different user namespaces) fails the test after TIMEOUT seconds, with everything of the
mpirun killed (tests/support/mpi.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.support.mpi import BIND_USR, PROGRAM, MpiImages, assert_no_cma_warning, check_mpitest, mpirun

TIMEOUT = 120


@pytest.fixture
def image(mpi_image: Path) -> Path:
    return mpi_image


def run(singpy: Singpy, command: list[str], *, env: dict[str, str] | None = None,  # type: ignore[no-untyped-def]
        size: int = 2):
    return mpirun(command, size=size, env=singpy.env(**(env or {})), switch=singpy.switch(),
                  as_root=singpy.profile == "root", cwd=singpy.workdir, timeout=TIMEOUT)


def exec_args(image: Path, *flags: str) -> list[str]:
    return [SINGPY, "exec", *flags, *BIND_USR, str(image)]


def lines_of(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


def test_mpitest_runs_under_plain_mpirun(singpy: Singpy, mpi_images: MpiImages) -> None:
    """The payload is right: mpirun without any container runs it to the end."""
    result = run(singpy, [str(mpi_images.program)])
    assert result.returncode == 0, result
    check_mpitest(result.stdout, result.stderr)


def test_mpirun_ranks_share_one_container(singpy: Singpy, image: Path) -> None:
    result = run(singpy, [*exec_args(image), PROGRAM])
    assert result.returncode == 0, result
    found = check_mpitest(result.stdout, result.stderr)
    assert_no_cma_warning(result.stderr)
    assert (found[0].mntns, found[0].userns) == (found[1].mntns, found[1].userns), found


def test_mpirun_no_sharens(singpy: Singpy, mpi_images: MpiImages) -> None:
    """--no-sharens under mpirun: a container per rank, and the ping-pong still completes (no CMA)."""
    result = run(singpy, [*exec_args(mpi_images.sandbox, "--no-sharens"), PROGRAM])
    assert result.returncode == 0, result
    found = check_mpitest(result.stdout, result.stderr)
    assert found[0].mntns != found[1].mntns, found


@pytest.mark.parametrize("isolation", ["--cleanenv", "--containall"])
def test_mpirun_environment_reaches_the_payload(singpy: Singpy, mpi_images: MpiImages, isolation: str) -> None:
    """OMPI_* and PMIX_* pass --cleanenv/--containall, and mpirun's session directory (PMIX_SERVER_TMPDIR, under
    the caller's TMPDIR, which --containall otherwise hides) is visible."""
    script = 'env; ls -d "$PMIX_SERVER_TMPDIR" >/dev/null && echo pmixdir-ok'
    result = run(singpy, [*exec_args(mpi_images.sandbox, isolation), "sh", "-c", script],
                 env={"OMPI_MCA_foo_bar": "from-the-test", "SINGPY_TEST_OTHER": "dropped"})
    assert result.returncode == 0, result
    assert sorted(lines_of(result.stdout, "OMPI_COMM_WORLD_RANK=")) == \
        ["OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_RANK=1"], result
    assert sorted(lines_of(result.stdout, "PMIX_RANK=")) == ["PMIX_RANK=0", "PMIX_RANK=1"], result
    assert len(lines_of(result.stdout, "PMIX_NAMESPACE=")) == 2, result
    assert lines_of(result.stdout, "OMPI_MCA_foo_bar=") == ["OMPI_MCA_foo_bar=from-the-test"] * 2, result
    assert lines_of(result.stdout, "SINGPY_TEST_OTHER=") == [], result
    assert result.stdout.splitlines().count("pmixdir-ok") == 2, result


def test_mpirun_of_one_rank_is_no_parallel_job(singpy: Singpy, mpi_images: MpiImages) -> None:
    """`mpirun -n 1` starts no parallel job (Apptainer knows none): --containall keeps its PID namespace and --net
    works, as outside a job, without a warning."""
    script = "readlink /proc/self/ns/pid /proc/self/ns/net"
    result = run(singpy, [*exec_args(mpi_images.sandbox, "--containall", "--net", "--network", "none"), "sh", "-c",
                          script], size=1)
    assert result.returncode == 0, result
    assert len(result.stdout.split()) == 2 and "WARNING" not in result.stderr, result
    pid, net = result.stdout.split()
    assert pid != os.readlink("/proc/self/ns/pid") and net != os.readlink("/proc/self/ns/net"), result

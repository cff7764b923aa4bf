"""singpy in a real Slurm job (issue 13): srun and sbatch with PMIx, Open MPI ranks in singpy containers.

The cluster is the session's own (tests/support/slurm.py: munged, slurmctld and slurmd on 127.0.0.1); the
payload is tests/data/mpitest.c, built against the host's Open MPI, in a bind-model image (host /usr bound
read-only, tests/support/mpi.py). Every case runs as root and as the unprivileged test user.

What a user of a cluster observes:
* the ranks of a step each know their rank (never two `rank 0/1`), the allreduce is right, and a 4 MiB
  ping-pong between two ranks on one node completes (Open MPI's shared-memory single copy, CMA, works only
  between processes of one user namespace: one container per rank as a user hangs or warns);
* by default the ranks of a step on a node share one container (same mount and user namespaces); with
  --no-sharens each has its own and Open MPI is told not to use CMA;
* the job's environment (SLURM_*, PMIX_*, OMPI_*) reaches the payload even under --cleanenv/--containall, as
  do /dev/shm and the PMIx server's directory; no network or PID namespace is made;
* scancel leaves nothing of the job; flags that can't work in a job fail (or warn) at once, on every rank.

The time-limit case is not here: Slurm's smallest time limit is one minute (`--time=1`), too slow for this
suite; scancel goes through the same path in slurmstepd (SIGCONT, SIGTERM, then SIGKILL after KillWait).
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.support.leftovers import descendants
from tests.support.mpi import BIND_USR, PROGRAM, MpiImages, assert_no_cma_warning, check_mpitest
from tests.support.slurm import Job, SlurmCluster

TIMEOUT = 120  # seconds a step may take before it counts as hung (then it is cancelled and the test fails)


@pytest.fixture
def image(mpi_image: Path) -> Path:
    return mpi_image


def srun(cluster: SlurmCluster, singpy: Singpy, args: list[str], *, env: dict[str, str] | None = None,
         timeout: float = TIMEOUT) -> Job:
    """srun ARGS as the profile's user, with the profile's environment (HOME, TMPDIR, SINGPY_CACHEDIR...)."""
    return cluster.srun(args, env=singpy.env(**(env or {})), switch=singpy.switch(), cwd=singpy.workdir,
                        timeout=timeout)


def exec_args(image: Path, *flags: str) -> list[str]:
    return [SINGPY, "exec", *flags, *BIND_USR, str(image)]


def lines_of(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


# --- the program itself, without singpy --------------------------------------------------------------------------


def test_mpitest_runs_under_plain_srun(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages) -> None:
    """The payload is right: without any container, srun --mpi=pmix runs it on 2 ranks to the end."""
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", str(mpi_images.program)])
    assert job.returncode == 0, job
    found = check_mpitest(job.stdout, job.stderr)
    assert found[0].mntns == found[1].mntns


def test_a_step_of_one_task_is_no_parallel_job(slurm_cluster: SlurmCluster, singpy: Singpy,
                                               mpi_images: MpiImages) -> None:
    """srun -n 1 (as `srun --pty bash` or salloc's interactive step) starts no parallel job (Apptainer knows
    none): --containall keeps its PID namespace and --net works, as outside a job, without a warning."""
    script = "readlink /proc/self/ns/pid /proc/self/ns/net"
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "1", *exec_args(mpi_images.sandbox, "--containall", "--net",
                                                                            "--network", "none"), "sh", "-c", script])
    assert job.returncode == 0, job
    assert len(job.stdout.split()) == 2 and "WARNING" not in job.stderr, job
    pid, net = job.stdout.split()
    assert pid != os.readlink("/proc/self/ns/pid") and net != os.readlink("/proc/self/ns/net"), job


# --- ranks in containers ------------------------------------------------------------------------------------------


def test_srun_ranks_share_one_container(slurm_cluster: SlurmCluster, singpy: Singpy, image: Path) -> None:
    """srun --mpi=pmix -n 2 singpy exec: two ranks of one job, one container, a 4 MiB ping-pong completes."""
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", *exec_args(image), PROGRAM])
    assert job.returncode == 0, job
    found = check_mpitest(job.stdout, job.stderr)
    assert_no_cma_warning(job.stderr)
    assert found[0].mntns == found[1].mntns, found
    assert found[0].userns == found[1].userns, found
    host_userns = os.readlink("/proc/self/ns/user")
    if singpy.profile == "user":
        assert found[0].userns != host_userns, "as a user the container has a user namespace"
    else:
        assert found[0].userns == host_userns, "as root no user namespace"


def test_sbatch_script_runs_srun_singpy(slurm_cluster: SlurmCluster, singpy: Singpy, image: Path) -> None:
    """An sbatch job whose script runs `srun --mpi=pmix -n 2 singpy exec ...`: the usual batch job."""
    command = " ".join([*exec_args(image), PROGRAM])
    script = f"#!/bin/sh\necho script SLURM_STEP_ID=${{SLURM_STEP_ID-unset}}\nsrun --mpi=pmix -n 2 {command}\n"
    job = slurm_cluster.sbatch(script, args=["-n", "2"], env=singpy.env(), switch=singpy.switch(),
                               directory=_job_dir(singpy), timeout=TIMEOUT)
    assert job.returncode == 0, job
    found = check_mpitest(job.stdout, job.stdout)
    assert_no_cma_warning(job.stdout)
    assert (found[0].mntns, found[0].userns) == (found[1].mntns, found[1].userns), found


def _job_dir(singpy: Singpy) -> Path:
    """A directory the profile's user writes (the batch script and its output go there)."""
    path = singpy.workdir / f"jobs-{singpy.profile}"
    if not path.exists():
        path.mkdir(mode=0o755)
        os.chown(path, singpy.uid, singpy.gid)
    return path


# --- --no-sharens --------------------------------------------------------------------------------------------------


def test_no_sharens_gives_each_rank_its_own_container(slurm_cluster: SlurmCluster, singpy: Singpy,
                                                      image: Path) -> None:
    """--no-sharens: a container per rank, Open MPI told not to use CMA, and the ping-pong still completes."""
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", *exec_args(image, "--no-sharens"), PROGRAM])
    assert job.returncode == 0, job
    found = check_mpitest(job.stdout, job.stderr)
    assert found[0].mntns != found[1].mntns, found


@pytest.mark.parametrize("how", ["flag", "SINGPY_NO_SHARENS", "APPTAINER_NO_SHARENS"])
def test_no_sharens_sets_single_copy_none(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages,
                                          how: str) -> None:
    flags = ["--no-sharens"] if how == "flag" else []
    env = {} if how == "flag" else {how: "1"}
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", *exec_args(mpi_images.sandbox, *flags), "env"],
               env=env)
    assert job.returncode == 0, job
    assert lines_of(job.stdout, "OMPI_MCA_btl_vader_single_copy_mechanism=") == \
        ["OMPI_MCA_btl_vader_single_copy_mechanism=none"] * 2, job


def test_no_sharens_keeps_the_users_single_copy_choice(slurm_cluster: SlurmCluster, singpy: Singpy,
                                                       mpi_images: MpiImages) -> None:
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2",
                                       *exec_args(mpi_images.sandbox, "--no-sharens"), "env"],
               env={"OMPI_MCA_btl_vader_single_copy_mechanism": "cma"})
    assert job.returncode == 0, job
    assert lines_of(job.stdout, "OMPI_MCA_btl_vader_single_copy_mechanism=") == \
        ["OMPI_MCA_btl_vader_single_copy_mechanism=cma"] * 2, job


def test_no_sharens_verbose_notes_single_copy(slurm_cluster: SlurmCluster, singpy: Singpy,
                                              mpi_images: MpiImages) -> None:
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", SINGPY, "--verbose", "exec", "--no-sharens",
                                       *BIND_USR, str(mpi_images.sandbox), "true"])
    assert job.returncode == 0, job
    notes = [line for line in job.stderr.splitlines() if "single-copy" in line.lower() or
             "single_copy" in line.lower()]
    assert len(notes) >= 2, job.stderr  # one per rank


# --- the job's environment and host resources ---------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ["--cleanenv", "--containall"])
def test_job_environment_reaches_the_payload(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages,
                                             isolation: str) -> None:
    """SLURM_*, PMIX_* and OMPI_* (Open MPI's mixed-case MCA names too) pass --cleanenv and --containall."""
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2",
                                       *exec_args(mpi_images.sandbox, isolation), "env"],
               env={"OMPI_MCA_foo_bar": "from-the-test", "SINGPY_TEST_OTHER": "dropped"})
    assert job.returncode == 0, job
    for name in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID", "PMIX_RANK", "PMIX_NAMESPACE",
                 "PMIX_SERVER_TMPDIR"):
        assert len(lines_of(job.stdout, f"{name}=")) == 2, f"{name} on both ranks\n{job}"
    assert sorted(lines_of(job.stdout, "SLURM_PROCID=")) == ["SLURM_PROCID=0", "SLURM_PROCID=1"], job
    assert sorted(lines_of(job.stdout, "PMIX_RANK=")) == ["PMIX_RANK=0", "PMIX_RANK=1"], job
    assert lines_of(job.stdout, "OMPI_MCA_foo_bar=") == ["OMPI_MCA_foo_bar=from-the-test"] * 2, job
    assert lines_of(job.stdout, "SINGPY_TEST_OTHER=") == [], "the rest of the host environment stays out"


@pytest.mark.parametrize("isolation", [[], ["--containall"]])
def test_dev_shm_and_pmix_directory_visible(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages,
                                            isolation: list[str]) -> None:
    """The host's /dev/shm (Open MPI's shared-memory segments) and the PMIx server's directory are inside."""
    name = f"singpy-test-{uuid.uuid4().hex}"
    marker = Path("/dev/shm") / name
    marker.write_text("host")
    try:
        script = f'cat /dev/shm/{name}; echo; ls -d "$PMIX_SERVER_TMPDIR" && echo pmixdir-ok'
        job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2",
                                           *exec_args(mpi_images.sandbox, *isolation), "sh", "-c", script])
    finally:
        marker.unlink()
    assert job.returncode == 0, job
    assert job.stdout.splitlines().count("host") == 2, job
    assert job.stdout.splitlines().count("pmixdir-ok") == 2, job


def test_no_network_and_no_pid_namespace(slurm_cluster: SlurmCluster, singpy: Singpy,
                                         mpi_images: MpiImages) -> None:
    """The ranks stay in the job's network and PID namespaces, as the same command under plain srun."""
    probe = ["sh", "-c", "readlink /proc/self/ns/net /proc/self/ns/pid"]
    plain = srun(slurm_cluster, singpy, ["-n", "1", *probe])
    contained = srun(slurm_cluster, singpy, ["-n", "2", *exec_args(mpi_images.sandbox), *probe])
    assert plain.returncode == 0 and contained.returncode == 0, (plain, contained)
    outside = plain.stdout.split()
    assert len(outside) == 2 and outside[0].startswith("net:"), plain
    assert contained.stdout.split() == outside * 2, (plain, contained)


@pytest.mark.parametrize("isolation", [[], ["--containall"]])
def test_home_and_user_resolve(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages,
                               isolation: list[str]) -> None:
    job = srun(slurm_cluster, singpy, ["-n", "2", *exec_args(mpi_images.sandbox, *isolation), "sh", "-c",
                                       'echo "home=$HOME user=$(id -un)"'])
    assert job.returncode == 0, job
    assert job.stdout.splitlines() == [f"home={singpy.home} user={singpy.user}"] * 2, job


# --- scancel ------------------------------------------------------------------------------------------------------


def test_scancel_leaves_nothing(slurm_cluster: SlurmCluster, singpy: Singpy, image: Path) -> None:
    """scancel of a 2-rank step of `singpy exec IMG sleep 300`: no rank, no holder, no slurmstepd left."""
    args = ["-n", "2", *exec_args(image), "sh", "-c", 'echo "pid $$ ns $(readlink /proc/self/ns/mnt)"; '
            "exec sleep 300"]
    name, process = slurm_cluster.start_srun(args, env=singpy.env(), switch=singpy.switch(), cwd=singpy.workdir)
    try:
        job_id = slurm_cluster.wait_for_job_id(name)
        printed = _read_lines(process, "pid ", 2, TIMEOUT)
        assert len(printed) == 2, f"both ranks started: {printed}"
        pids = _host_pids(printed)  # the payloads' own PIDs, as the host sees them
        tracked = slurm_cluster.listpids(job_id)
        assert tracked, "slurmd tracks the job's processes"
        before = {pid for pid in tracked} | {child for pid in tracked for child in descendants(pid)}
        done = slurm_cluster.scancel(job_id)
        assert done.returncode == 0, done.stderr
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            slurm_cluster.scancel_name(name)
            process.kill()
            process.communicate()
    assert slurm_cluster.wait_gone(job_id, 60), slurm_cluster.state(job_id)
    assert slurm_cluster.squeue(job_id) == ""
    left = _wait_for(lambda: [pid for pid in (*pids, *before) if _alive(pid)], 30)
    assert left == [], {pid: _cmdline(pid) for pid in left}
    assert _wait_for(lambda: slurm_cluster.listpids(job_id), 30) == []
    assert _wait_for(lambda: _carrying_job(slurm_cluster, job_id), 30) == []


def _read_lines(process: subprocess.Popen[str], prefix: str, count: int, timeout: float) -> list[str]:
    """Read srun's stdout until `count` lines start with `prefix` (the ranks are up), srun ends, or `timeout`.

    Straight from the pipe (os.read), so that the file object's buffer stays empty for communicate()."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    found: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while len(found) < count and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        found += [line for line in (raw.decode(errors="replace") for raw in complete) if line.startswith(prefix)]
    return found


def _host_pids(printed: list[str]) -> list[int]:
    """The PIDs the payloads printed. Without a PID namespace (the default in a job) they are the host's."""
    return [int(line.split()[1]) for line in printed]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def _wait_for(probe: object, timeout: float) -> list[int]:
    """Poll `probe()` (a list) until it is empty or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value: list[int] = probe()  # type: ignore[operator]
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def _carrying_job(cluster: SlurmCluster, job_id: int) -> list[int]:
    """Processes that carry this job of this cluster in their environment (SLURM_JOB_ID and our SLURM_CONF).

    Only as root (it reads other users' /proc/PID/environ); the two variables together name only what this
    session's cluster started for this job: a rank, its container's holder, a helper."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_CONF={cluster.conf}".encode()}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                variables = set(handle.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= variables and _alive(int(name)):
            found.append(int(name))
    return found


# --- flags that can't work in a job --------------------------------------------------------------------------------


def test_net_fails_on_every_rank(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages) -> None:
    job = srun(slurm_cluster, singpy, ["-n", "2", *exec_args(mpi_images.sandbox, "--net"), "true"], timeout=60)
    assert job.returncode != 0, job
    fatal = lines_of(job.stderr, "FATAL:")
    assert len(fatal) == 2 and all("--net" in line for line in fatal), job


def test_fakeroot_under_pmix_fails(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages) -> None:
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", *exec_args(mpi_images.sandbox, "--fakeroot"),
                                       "true"], timeout=60)
    assert job.returncode != 0, job
    fatal = lines_of(job.stderr, "FATAL:")
    assert len(fatal) == 2 and all(re.search("pmix", line, re.IGNORECASE) for line in fatal), job


def test_pid_warns_and_completes(slurm_cluster: SlurmCluster, singpy: Singpy, mpi_images: MpiImages) -> None:
    job = srun(slurm_cluster, singpy, ["--mpi=pmix", "-n", "2", *exec_args(mpi_images.sandbox, "--pid"), PROGRAM])
    assert job.returncode == 0, job
    check_mpitest(job.stdout, job.stderr)
    warnings = lines_of(job.stderr, "WARNING:")
    assert any("--pid" in line for line in warnings), job

"""Parallel jobs: which job step or MPI launch started this singpy, and what its ranks need.

Read from the environment only (no I/O), so the planner can call it on every
launch: Slurm's `srun` sets SLURM_JOB_ID and SLURM_STEP_ID in each task,
PMIx servers (Slurm's mpi/pmix plugin, Open MPI's mpirun) set PMIX_NAMESPACE
and PMIX_RANK, Open MPI's own launcher sets OMPI_COMM_WORLD_SIZE and the job
id. Ranks of one step on one node find each other by the step's identity
(singpy.launch.shared); the variables below must reach the payload for its MPI
library to find the launcher (a rank without them thinks it is alone:
`rank 0/1` twice).
"""

from __future__ import annotations

import os

from singpy.env.environ import EnvPlan
from singpy.errors import SingpyError
from singpy.plan import ImageSpec, LaunchPlan, ProcessSpec, ShareSpec
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping

    from singpy.launch.request import LaunchRequest

# Variables of the launchers, passed into the container even under --cleanenv (like CUDA_VISIBLE_DEVICES).
# Open MPI's MCA parameters are mixed case (OMPI_MCA_btl_vader_single_copy_mechanism): matched by prefix.
JOB_PREFIXES = ("SLURM_", "SLURMD_", "PMIX_", "PMI_", "OMPI_", "PRTE_")
# Open MPI's shared-memory transport (vader in 4.x, sm in 5.x): single-copy (CMA) needs both ranks in one user
# namespace and one PID namespace; refused otherwise (large messages then hang in 4.1), or worse: with a PID
# namespace per rank, it reads the memory of whatever process has the peer's pid (a segfault). Set for every
# rank of a job that does not share its container: under srun no OMPI_ variable exists before MPI_Init, so
# whether the payload is Open MPI can't be known; other programs ignore it.
SINGLE_COPY_VARIABLES = ("OMPI_MCA_btl_vader_single_copy_mechanism", "OMPI_MCA_btl_sm_single_copy_mechanism")


class JobStep(Record):
    """The parallel launch this process is one rank of."""

    key: str  # what identifies the step (or mpirun job) among the user's on this node
    origin: str  # in words, for messages: "Slurm job step 12.0", "mpirun job 3315..."
    pmix: bool  # ranks talk to a PMIx server (which checks their uid)


def detect(env: Mapping[str, str]) -> JobStep | None:
    """The job step of this rank, or None when singpy was not started by srun or an MPI launcher of more than
    one task: `srun --pty bash`, a salloc shell or `mpirun -n 1` start no parallel job (Apptainer knows none)."""
    tasks = _tasks(env)
    if tasks == 1:
        return None
    pmix = "PMIX_NAMESPACE" in env and "PMIX_RANK" in env
    if pmix:  # the most precise: an mpirun inside an srun step has a namespace of its own
        return JobStep(key=f"pmix:{env['PMIX_NAMESPACE']}", origin=f"PMIx namespace {env['PMIX_NAMESPACE']}",
                       pmix=True)
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
    if job and step and tasks > 1:
        return JobStep(key=f"slurm:{job}.{step}", origin=f"Slurm job step {job}.{step}", pmix=False)
    ompi_job = env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_ess_jobid")
    if ompi_job and _count(env.get("OMPI_COMM_WORLD_SIZE")) > 1:
        return JobStep(key=f"ompi:{ompi_job}", origin=f"mpirun job {ompi_job}", pmix=False)
    return None


def _tasks(env: Mapping[str, str]) -> int:
    """How many tasks the launch has (0: not said): mpirun's count (set in each rank, PMIx or not), else the
    Slurm step's (srun sets both counts, with or without PMIx; a batch script or salloc shell only the job's,
    which a step of its own then overrides). PMIx itself sets no count."""
    for name in ("OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if name in env:
            return _count(env[name])
    return 0


def _count(text: str | None) -> int:
    """A task count, 0 when it is none (absent, not a number)."""
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 10 else 0


def is_job_variable(name: str) -> bool:
    return name.startswith(JOB_PREFIXES)


def check_request(request: LaunchRequest, job: JobStep | None) -> tuple[LaunchRequest, tuple[str, ...]]:
    """What can't work under a parallel launcher fails here, before anything is set up, on every rank alike.

    A PID namespace per rank is dropped with a warning: Open MPI names its
    shared-memory segments after pids, which collide (every rank is PID 2 of
    its own namespace), and ranks crash in their first collective call.
    """
    if job is None:
        return request, ()
    if request.net or request.network:
        raise SingpyError(f"--net can't be used in {job.origin}: each rank would get a network namespace of its "
                          "own, and ranks could not reach each other or the launcher",
                          hint="leave out --net: ranks use the host's network")
    if request.fakeroot and job.pmix:
        raise SingpyError(f"--fakeroot can't be used in {job.origin}: PMIx (the launcher's rendezvous) and Open MPI's "
                          "shared memory need each rank to be the user the job runs as",
                          hint="build the image with --fakeroot beforehand; run it without")
    if not request.pid:
        return request, ()
    flag = "--containall" if request.contain and request.cleanenv else "--pid"
    return request.replace(pid=False), (f"{flag} in {job.origin}: no PID namespace, ranks keep the host's (in PID "
                                        "namespaces of their own, Open MPI's shared-memory segments collide)",)


def sharing(request: LaunchRequest, job: JobStep | None) -> tuple[tuple[str, str] | None, tuple[str, ...]]:
    """Whether this rank shares its container (singpy.launch.shared): (key, origin) or None; and --verbose notes.

    Ranks of one job step share by default (`--no-sharens` opts out);
    `--sharens` shares outside a job too, among the launches of one parent.
    """
    if job is None:
        if not request.sharens:
            return None, ()
        if request.pid or request.net or request.network:
            raise SingpyError("--sharens can't be used with --pid or --net: the containers share the namespaces "
                              "of the first one")
        parent = os.getppid()
        return (f"parent:{parent}", f"--sharens (parent process {parent})"), ()
    if request.no_sharens:
        return None, _single_copy_note(job, "--no-sharens")
    return (job.key, job.origin), ()


def shares(request: LaunchRequest, env: Mapping[str, str]) -> bool:
    """Whether this launch will share its container, as `sharing` decides (before the image is prepared)."""
    return request.sharens if detect(env) is None else not request.no_sharens


def _single_copy_note(job: JobStep, why: str) -> tuple[str, ...]:
    return (f"{why}: ranks of {job.origin} run in containers of their own; Open MPI's single-copy (CMA) transfers "
            "need one user namespace, so they are turned off "
            f"({SINGLE_COPY_VARIABLES[0]}=none unless set)",)


def without_single_copy(env_plan: EnvPlan, host_env: Mapping[str, str], request: LaunchRequest) -> EnvPlan:
    """Ranks in separate user namespaces: Open MPI must not try CMA (refused, and 4 MiB messages hang)."""
    chosen = {*host_env, *(name for name, _ in request.env), *(name for name, _ in request.env_file)}
    added = tuple((name, "none") for name in SINGLE_COPY_VARIABLES if name not in chosen)
    return env_plan.replace(injected=(*added, *env_plan.injected))


def unshared(plan: LaunchPlan, host_env: Mapping[str, str]) -> LaunchPlan:
    """`plan` for a rank that could not share its container (singpy.launch.shared: another user holds its
    name): a plain launch, with single-copy off in a job as `without_single_copy` turns it off (the variables
    the user set, from the host or with --env, kept)."""
    env = plan.process.env
    if detect(host_env) is not None:
        chosen = {*host_env, *(name for name, _ in env.injected)}
        env = env.replace(injected=(*((name, "none") for name in SINGLE_COPY_VARIABLES if name not in chosen),
                                    *env.injected))
    return plan.replace(share=None, process=plan.process.replace(env=env))


def share_spec(plan: LaunchPlan, key: tuple[str, str]) -> ShareSpec:
    """Where the ranks meet: the job step, and a digest of everything in the plan but the rank's own process.

    Ranks that differ in image, binds or flags get containers of their own.
    A record's repr is its whole content, in field order; the digest is
    SHA-256 from CPython's own module (hashlib's OpenSSL costs 3 ms at start-up).
    """
    shared_part = plan.replace(image=_one_root(plan.image),
                               process=ProcessSpec(action=plan.process.action, args=(), cwd="/",
                                                   env=EnvPlan(base=(), injected=()), app=plan.process.app))
    digest = _sha256(repr((key[0], shared_part)).encode())[:40]
    return ShareSpec(socket=f"singpy-shared/{plan.uid}/{digest}", origin=key[1])


def _one_root(image: ImageSpec) -> ImageSpec:
    """`image` as ranks compare it: with `unsquash in background` (singpy.image.warm), a SIF mounted with FUSE
    and the tree its unpacking left in the cache are one root, whichever a rank found as it started (a burst's
    first rank starts the unpacking, a late one may find it done). The container is made once, by its holder;
    a rank that joins it uses its root."""
    if not image.warm and image.strategy != "fuse":
        return image
    return image.replace(strategy="fuse", tool="", cache="", rootfs=None, warm="", unpacker="")


def _sha256(data: bytes) -> str:
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # CPython 3.11
    except ImportError:
        from hashlib import sha256
    return str(sha256(data).hexdigest())

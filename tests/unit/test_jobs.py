"""singpy.launch.jobs (which parallel launch started singpy, from the environment) and the planner's sharing choice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from singpy.errors import SingpyError
from singpy.launch import jobs
from singpy.launch.planner import Planned
from singpy.mounts.parse import parse_bind_list
from singpy.plan import ImageSpec
from tests.support.job_steps import PMIX, SLURM, planned

OMPI = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_ess_base_jobid": "3315"}
SINGLE_COPY = {name: "none" for name in jobs.SINGLE_COPY_VARIABLES}

# --- jobs.detect -------------------------------------------------------------------------------------------------


def test_no_launcher_variables_is_no_job() -> None:
    assert jobs.detect({"PATH": "/bin", "HOME": "/root"}) is None


def test_pmix_variables_name_the_step() -> None:
    step = jobs.detect(PMIX)
    assert step is not None
    assert (step.key, step.pmix) == ("pmix:slurm.pmix.42.0", True)
    assert "slurm.pmix.42.0" in step.origin


def test_slurm_job_and_step_name_the_step() -> None:
    step = jobs.detect(SLURM)
    assert step is not None
    assert (step.key, step.origin, step.pmix) == ("slurm:42.0", "Slurm job step 42.0", False)


def test_an_mpirun_job_without_pmix_is_found_by_open_mpi_variables() -> None:
    step = jobs.detect(OMPI)
    assert step is not None
    assert (step.key, step.pmix) == ("ompi:3315", False)


def test_pmix_wins_over_slurm_an_mpirun_inside_a_step_has_its_own_namespace() -> None:
    step = jobs.detect({**SLURM, **PMIX, "OMPI_COMM_WORLD_SIZE": "4"})
    assert step is not None
    assert (step.key, step.pmix) == ("pmix:slurm.pmix.42.0", True)


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "42"},  # salloc's shell, or sbatch's script: not a step
    {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "", "SLURM_STEP_NUM_TASKS": "2"},
    {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"},  # no count: not srun's
    {"PMIX_NAMESPACE": "x"},  # no rank
    {"PMIX_RANK": "0"},
    {"OMPI_MCA_ess_base_jobid": "3315"},  # an MCA parameter set by hand, no launcher
    {"OMPI_COMM_WORLD_SIZE": "2"},
], ids=["job-only", "empty-step", "step-no-count", "pmix-no-rank", "pmix-no-namespace", "ompi-no-size",
        "ompi-no-jobid"])
def test_incomplete_variables_are_no_job(env: dict[str, str]) -> None:
    assert jobs.detect(env) is None


# What the real launchers set (Slurm 23 with MpiDefault=pmix, Open MPI 4.1's mpirun): one task is no parallel job.
SRUN_1 = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1",
          "PMIX_NAMESPACE": "slurm.pmix.42.0", "PMIX_RANK": "0"}
MPIRUN_1 = {"OMPI_COMM_WORLD_SIZE": "1", "OMPI_MCA_ess_base_jobid": "3315", "PMIX_NAMESPACE": "3315",
            "PMIX_RANK": "0"}


@pytest.mark.parametrize("env", [
    SRUN_1,  # srun -n 1 (--pty bash)
    {key: value for key, value in SRUN_1.items() if not key.startswith("PMIX")},  # srun --mpi=none -n 1
    {**SRUN_1, "SLURM_NTASKS": "4"},  # salloc -n 4, its interactive step of one task
    MPIRUN_1,  # mpirun -n 1
    {key: value for key, value in MPIRUN_1.items() if not key.startswith("PMIX")},
    {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "x"},  # not a count: not srun's
], ids=["srun-1", "srun-1-no-pmix", "salloc-step", "mpirun-1", "mpirun-1-no-pmix", "bad-count"])
def test_a_launch_of_one_task_is_no_job(env: dict[str, str]) -> None:
    assert jobs.detect(env) is None


@pytest.mark.parametrize(("env", "key"), [
    ({**SRUN_1, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}, "pmix:slurm.pmix.42.0"),
    ({**SRUN_1, **MPIRUN_1, "OMPI_COMM_WORLD_SIZE": "2"}, "pmix:3315"),  # mpirun -n 2 in srun -n 1
    ({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "3"}, "slurm:42.0"),  # an older srun
    ({**MPIRUN_1, "OMPI_COMM_WORLD_SIZE": "2"}, "pmix:3315"),
], ids=["srun-2", "mpirun-in-srun-1", "ntasks-only", "mpirun-2"])
def test_a_launch_of_more_tasks_is_a_job(env: dict[str, str], key: str) -> None:
    step = jobs.detect(env)
    assert step is not None and step.key == key


def test_a_rank_that_cannot_share_runs_a_plain_launch_without_single_copy(image: ImageSpec) -> None:
    """singpy.launch.shared: a name another user holds; the variables the user set are kept."""
    name, other = jobs.SINGLE_COPY_VARIABLES
    plan = planned(image, {**PMIX, name: "cma"}).plan
    alone = jobs.unshared(plan, {**PMIX, name: "cma"})
    assert alone.share is None and alone.replace(process=plan.process) == plan.replace(share=None)
    assert dict(alone.process.env.injected)[other] == "none" and name not in dict(alone.process.env.injected)
    sharens = planned(image, {}, sharens=True).plan  # not a job: nothing added
    assert jobs.unshared(sharens, {}).process.env == sharens.process.env


@pytest.mark.parametrize(("name", "expected"), [
    ("SLURM_JOB_ID", True), ("SLURMD_NODENAME", True), ("PMIX_RANK", True), ("PMI_FD", True),
    ("OMPI_MCA_btl_vader_single_copy_mechanism", True), ("PRTE_MCA_x", True),
    ("SLURM", False), ("MY_SLURM_X", False), ("ompi_lower", False), ("PATH", False), ("PMIXY", False),
])
def test_job_variables_are_matched_by_prefix(name: str, expected: bool) -> None:
    assert jobs.is_job_variable(name) is expected


# --- the planner's decision -----------------------------------------------------------------------------------------


@pytest.fixture
def image(tmp_path: Path) -> ImageSpec:
    rootfs = tmp_path / "busybox.sandbox"
    (rootfs / "bin").mkdir(parents=True)
    return ImageSpec(kind="sandbox", path=str(rootfs), rootfs=str(rootfs))


def injected(result: Planned) -> dict[str, str]:
    return dict(result.plan.process.env.injected)


def test_outside_a_job_nothing_is_shared(image: ImageSpec) -> None:
    assert planned(image, {}).plan.share is None


@pytest.mark.parametrize("env", [PMIX, SLURM, OMPI], ids=["pmix", "slurm", "mpirun"])
def test_ranks_of_a_step_share_by_default(image: ImageSpec, env: dict[str, str]) -> None:
    share = planned(image, env).plan.share
    assert share is not None and share.create
    assert share.socket.startswith("singpy-shared/1000/")


def test_ranks_differing_only_in_their_own_process_meet_at_one_socket(image: ImageSpec) -> None:
    first = planned(image, {**PMIX, "PMIX_RANK": "0"}, args=("hostname",), env=(("A", "1"),))
    second = planned(image, {**PMIX, "PMIX_RANK": "1"}, args=("sleep", "1"), env=(("A", "2"),))
    assert first.plan.share is not None and second.plan.share is not None
    assert first.plan.share.socket == second.plan.share.socket


@pytest.mark.parametrize(("other_env", "fields", "uid"), [
    ({**PMIX, "PMIX_NAMESPACE": "another"}, {}, 1000),
    (PMIX, {"binds": parse_bind_list(["/srv"], "/")}, 1000),
    (PMIX, {"writable_tmpfs": True}, 1000),
    (PMIX, {"contain": True}, 1000),
    (PMIX, {}, 1001),
], ids=["other-step", "bind", "writable-tmpfs", "contain", "other-user"])
def test_another_step_flag_or_user_gets_another_container(image: ImageSpec, other_env: dict[str, str],
                                                          fields: dict[str, Any], uid: int) -> None:
    first, second = planned(image, PMIX).plan.share, planned(image, other_env, uid, **fields).plan.share
    assert first is not None and second is not None
    assert first.socket != second.socket


def test_no_sharens_gives_each_rank_its_own_container(image: ImageSpec) -> None:
    assert planned(image, PMIX, no_sharens=True).plan.share is None


@pytest.mark.parametrize("flags", [{"pid": True}, {"pid": True, "contain": True, "cleanenv": True}],
                         ids=["pid", "containall"])
def test_a_pid_namespace_in_a_job_is_dropped_with_a_warning(image: ImageSpec, flags: dict[str, bool]) -> None:
    result = planned(image, {**SLURM, "OMPI_COMM_WORLD_SIZE": "2"}, **flags)
    assert not result.plan.namespaces.pid
    assert result.plan.share is not None  # the ranks share their container as without the flag
    flag = "--containall" if flags.get("contain") else "--pid"
    assert len(result.warnings) == 1 and result.warnings[0].startswith(f"{flag} in Slurm job step 42.0: no PID")
    assert not set(injected(result)) & set(jobs.SINGLE_COPY_VARIABLES)


@pytest.mark.parametrize("env", [OMPI, PMIX, SLURM], ids=["mpirun", "pmix", "slurm"])
def test_separate_ranks_get_single_copy_turned_off(image: ImageSpec, env: dict[str, str]) -> None:
    # Under srun no OMPI_ variable exists before MPI_Init: every rank of a job that does not share gets it.
    assert injected(planned(image, env, no_sharens=True)).items() >= SINGLE_COPY.items()


def test_shared_ranks_and_plain_launches_keep_single_copy(image: ImageSpec) -> None:
    for result in (planned(image, OMPI), planned(image, PMIX), planned(image, {}, no_sharens=True)):
        assert not set(injected(result)) & set(jobs.SINGLE_COPY_VARIABLES)


@pytest.mark.parametrize("where", ["host", "env", "env_file"])
def test_a_single_copy_mechanism_chosen_by_the_user_is_kept(image: ImageSpec, where: str) -> None:
    name, other = jobs.SINGLE_COPY_VARIABLES
    chosen = ((name, "cma"),)
    env = {**OMPI, name: "cma"} if where == "host" else OMPI
    fields: dict[str, Any] = {} if where == "host" else {where: chosen}
    result = injected(planned(image, env, no_sharens=True, **fields))
    assert result.get(name) != "none"
    assert result[other] == "none"


def test_sharens_outside_a_job_meets_the_launches_of_the_same_parent(image: ImageSpec) -> None:
    share = planned(image, {}, sharens=True).plan.share
    assert share is not None and share.create
    assert share.origin == f"--sharens (parent process {os.getppid()})"


@pytest.mark.parametrize(("env", "fields", "message"), [
    ({}, {"sharens": True, "pid": True}, "--sharens"),
    ({}, {"sharens": True, "net": True}, "--sharens"),
    (SLURM, {"net": True}, "--net"),
    (SLURM, {"network": "bridge"}, "--net"),
    (PMIX, {"fakeroot": True}, "PMIx"),
], ids=["sharens-pid", "sharens-net", "job-net", "job-network", "pmix-fakeroot"])
def test_what_cannot_work_fails_before_anything_is_set_up(image: ImageSpec, env: dict[str, str],
                                                          fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SingpyError, match=message):
        planned(image, env, **fields)


def test_fakeroot_in_a_slurm_step_without_pmix_is_allowed(image: ImageSpec) -> None:
    assert planned(image, SLURM, uid=1000, fakeroot=True).plan.share is not None


def test_job_variables_pass_under_cleanenv(image: ImageSpec) -> None:
    env = {**SLURM, "PMIX_SERVER_URI": "x", "OMPI_MCA_foo_Bar": "1", "UNRELATED": "no"}
    kept = dict(planned(image, env, cleanenv=True).plan.process.env.host)
    assert {name: kept.get(name) for name in env} == {**env, "UNRELATED": None}

"""Shared containers: `--sharens`, and the ranks of a job step found through the environment alone.

Launches meant to share start at the same time and meet at a barrier in
their payloads (a file each in a directory of the test's own, bound with -B:
that bind also makes the plan, hence the container, unique to the test):
all of them run at once, so the namespaces they report can be compared
(a namespace's inode number is reused once it is freed). The holder of a
shared container is found by its mount namespace while the payloads hold
it, and must have gone once they have exited.

No Slurm or MPI is needed here: singpy knows a job step by SLURM_*, PMIX_*
and OMPI_* variables (tests/integration/test_hpc_*.py run the real ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support import sifs
from tests.support.leftovers import settled, traces, wait_until_gone

# Each payload: a file in the barrier directory, wait for N of them, print its namespaces, wait for the release.
# (mktemp, not $$: in PID namespaces of their own, payloads have the same pid.)
PAYLOAD = """mktemp {dir}/XXXXXX >/dev/null; i=0
while [ "$(ls {dir} | wc -l)" -lt {count} ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done
[ "$(ls {dir} | wc -l)" -ge {count} ] || {{ echo "barrier: the others never came"; exit 99; }}
echo "$(readlink /proc/self/ns/mnt) $(readlink /proc/self/ns/user)"
i=0; while [ ! -e {dir}.release ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done
{after}"""


@pytest.fixture(scope="module")
def sif(workdir: Path) -> Path:
    """A SIF of this module's own: what names its path (loop devices, squashfuse) is this module's doing."""
    return sifs.patched(sifs.siftool_sif(workdir), workdir / "sharens.sif", [])


@pytest.fixture(params=["sandbox", "sif"])
def any_image(request: pytest.FixtureRequest, image: Path, sif: Path) -> Path:
    return image if request.param == "sandbox" else sif


@pytest.fixture
def barrier(workdir: Path) -> Path:
    """A directory of this test's own that the payloads of both profiles can write to."""
    path = workdir / f"sharens-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


class Group:
    """Launches started at once; their payloads meet at `barrier` and wait there until `release`."""

    def __init__(self, singpy: Singpy, barrier: Path) -> None:
        self.singpy, self.barrier = singpy, barrier
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, image: Path, runs: list[list[str]], env: list[dict[str, str]] | None = None,
              after: str = "true") -> list[str]:
        """Start `runs` (flags of each) and return the namespaces each payload printed."""
        payload = PAYLOAD.format(dir=self.barrier, count=len(runs), after=after)
        for index, flags in enumerate(runs):
            self.processes.append(self.singpy.popen(
                ["exec", *flags, "-B", str(self.barrier), str(image), "sh", "-c", payload],
                env=self.singpy.env(**env[index]) if env else None, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        lines = []
        for process in self.processes:
            assert process.stdout is not None
            lines.append(process.stdout.readline().strip())
        assert all(line.startswith("mnt:") for line in lines), f"{lines}: {self.finish()}"
        return lines

    def finish(self) -> list[tuple[int, str, str]]:
        """Release the payloads; (exit status, rest of stdout, stderr) of each."""
        Path(f"{self.barrier}.release").touch()
        results = []
        for process in self.processes:
            out, err = process.communicate(timeout=60)
            results.append((process.returncode, out, err))
        return results


def in_mount_namespace(link: str) -> dict[int, str]:
    """Processes whose /proc/PID/ns/mnt reads `link` (a container of this test), with their comm."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/mnt") == link:
                    found[int(name)] = Path(f"/proc/{name}/comm").read_text().strip()
            except OSError:
                continue  # gone meanwhile
    return found


def holder_of(link: str) -> tuple[int, str]:
    """The one holder in the container whose mount namespace is `link`, and its command line."""
    holders = [pid for pid, comm in in_mount_namespace(link).items() if comm == "singpy-shared"]
    assert len(holders) == 1, in_mount_namespace(link)
    with open(f"/proc/{holders[0]}/cmdline", "rb") as handle:
        return holders[0], handle.read().rstrip(b"\0").replace(b"\0", b" ").decode()


# --- --sharens -------------------------------------------------------------------------------------------------------


def test_sharens_launches_share_one_container(singpy: Singpy, any_image: Path, barrier: Path) -> None:
    before = traces(any_image)
    group = Group(singpy, barrier)
    lines = group.start(any_image, [["--sharens"]] * 3)
    assert len(set(lines)) == 1, lines
    mnt, user = lines[0].split()
    assert mnt != os.readlink("/proc/self/ns/mnt")
    assert (user != os.readlink("/proc/self/ns/user")) == (singpy.profile == "user")
    holder, command = holder_of(mnt)
    assert os.getsid(holder) != os.getsid(0)  # a session of its own: it outlives the launch that made it
    assert [status for status, _, _ in group.finish()] == [0, 0, 0]
    assert wait_until_gone([holder], command) == [], "the holder outlived its last launch"

    again = Group(singpy, barrier / "again")
    again.barrier.mkdir(mode=0o777)
    again.barrier.chmod(0o777)
    (line,) = again.start(any_image, [["--sharens"]])
    second_holder, second_command = holder_of(line.split()[0])
    assert second_holder != holder  # a new container: the first one's holder has gone
    assert [status for status, _, _ in again.finish()] == [0]
    assert wait_until_gone([second_holder], second_command) == []
    assert settled(before, any_image) == before


def test_launches_with_other_mounts_get_another_container(singpy: Singpy, image: Path, barrier: Path,
                                                          workdir: Path) -> None:
    extra = workdir / f"sharens-extra-{uuid.uuid4().hex[:8]}"
    extra.mkdir()
    readable_by_all(extra)
    group = Group(singpy, barrier)
    lines = group.start(image, [["--sharens", "--env", "WHO=one"], ["--sharens", "--env", "WHO=two"],
                                ["--sharens", "-B", f"{extra}:/mnt"]], after='echo "$WHO"')
    assert lines[0] == lines[1]  # the payload's own environment is not part of the container
    assert lines[2].split()[0] != lines[0].split()[0]
    results = group.finish()
    assert [(status, out) for status, out, _ in results] == [(0, "one\n"), (0, "two\n"), (0, "\n")]


def test_a_setup_error_reaches_every_launch(singpy: Singpy, sif: Path) -> None:
    before = traces(sif)
    processes = [singpy.popen(["exec", "--sharens", "-B", "/etc:/bin/busybox/x", str(sif), "true"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert_one_fatal(subprocess.CompletedProcess(process.args, process.returncode, out, err),
                         "/bin/busybox is not a directory")
    assert settled(before, sif) == before


@pytest.mark.parametrize("flag", ["--pid", "--net"])
def test_sharens_refuses_namespaces_of_its_own(singpy: Singpy, image: Path, flag: str) -> None:
    assert_one_fatal(singpy.run("exec", "--sharens", flag, str(image), "true"), "--sharens can't be used with")


# --- job steps, known by their environment -----------------------------------------------------------------------


def pmix(rank: int, namespace: str) -> dict[str, str]:
    return {"PMIX_NAMESPACE": namespace, "PMIX_RANK": str(rank)}


def slurm(rank: int, job: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_STEP_NUM_TASKS": "2"}


@pytest.mark.parametrize("variables", [pmix, slurm], ids=["pmix", "slurm"])
def test_ranks_of_a_job_step_share_a_container(singpy: Singpy, image: Path, barrier: Path,
                                               variables: object) -> None:
    assert callable(variables)
    step = str(uuid.uuid4().int % 10**9)
    group = Group(singpy, barrier)
    lines = group.start(image, [[], []], env=[variables(rank, step) for rank in range(2)])
    assert lines[0] == lines[1]
    assert [status for status, _, _ in group.finish()] == [0, 0]


def test_ranks_in_containers_of_their_own(singpy: Singpy, image: Path, barrier: Path) -> None:
    step = uuid.uuid4().hex
    env = [{**pmix(rank, step), "OMPI_COMM_WORLD_SIZE": "2"} for rank in range(2)]
    group = Group(singpy, barrier)
    lines = group.start(image, [["--no-sharens"], ["--no-sharens"]], env=env,
                        after="echo $OMPI_MCA_btl_vader_single_copy_mechanism $OMPI_MCA_btl_sm_single_copy_mechanism")
    assert lines[0].split()[0] != lines[1].split()[0]
    for status, out, err in group.finish():
        assert (status, out) == (0, "none none\n"), err
        assert err == ""


def test_pid_in_a_job_is_dropped_and_ranks_share(singpy: Singpy, image: Path, barrier: Path) -> None:
    step = uuid.uuid4().hex
    group = Group(singpy, barrier)
    lines = group.start(image, [["--pid"], ["--pid"]], env=[pmix(rank, step) for rank in range(2)],
                        after="readlink /proc/self/ns/pid")
    assert lines[0] == lines[1]
    for status, out, err in group.finish():
        assert status == 0, err
        assert out == os.readlink("/proc/self/ns/pid") + "\n"  # the host's
        assert err.startswith("WARNING: --pid in PMIx namespace") and len(err.splitlines()) == 1, err


def test_a_single_copy_mechanism_set_by_the_user_is_kept(singpy: Singpy, image: Path) -> None:
    env = singpy.env(**pmix(0, uuid.uuid4().hex), OMPI_COMM_WORLD_SIZE="2",
                     OMPI_MCA_btl_vader_single_copy_mechanism="cma")
    script = "echo $OMPI_MCA_btl_vader_single_copy_mechanism $OMPI_MCA_btl_sm_single_copy_mechanism"
    assert singpy.ok("exec", "--no-sharens", str(image), "sh", "-c", script, env=env) == "cma none\n"


def test_shared_ranks_keep_single_copy(singpy: Singpy, image: Path) -> None:
    env = singpy.env(**pmix(0, uuid.uuid4().hex), OMPI_COMM_WORLD_SIZE="2")
    out = singpy.ok("exec", str(image), "sh", "-c", "env | grep single_copy || echo unset", env=env)
    assert out == "unset\n"


@pytest.mark.parametrize(("flags", "variables", "message"), [
    (["--net"], {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"},
     "--net can't be used in Slurm job step 7.0"),
    (["--fakeroot"], {"PMIX_NAMESPACE": "ns", "PMIX_RANK": "0"}, "PMIx"),
], ids=["net", "fakeroot-pmix"])
def test_what_cannot_work_in_a_job_fails(singpy: Singpy, image: Path, flags: list[str], variables: dict[str, str],
                                         message: str) -> None:
    result = singpy.run("exec", *flags, str(image), "true", env=singpy.env(**variables))
    assert_one_fatal(result, message)


@pytest.mark.parametrize("flag", ["--cleanenv", "--containall"])
def test_job_variables_pass_a_clean_environment(singpy: Singpy, image: Path, flag: str) -> None:
    variables = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": uuid.uuid4().hex, "SLURMD_NODENAME": "n1",
                 "PMIX_SERVER_URI": "pmix-server.1;tcp4://127.0.0.1:1", "PMI_FD": "5", "OMPI_MCA_foo_Bar": "x y",
                 "PRTE_MCA_z": "1"}
    env = singpy.env(**variables, NOT_A_JOB_VARIABLE="kept?")
    out = singpy.ok("exec", flag, str(image), "env", env=env)
    seen = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert {name: seen.get(name) for name in variables} == variables
    assert "NOT_A_JOB_VARIABLE" not in seen


def test_dry_run_shows_where_ranks_meet(singpy: Singpy, image: Path) -> None:
    namespace = uuid.uuid4().hex
    out = singpy.ok("exec", "--dry-run", str(image), "true", env=singpy.env(**pmix(0, namespace)))
    share = json.loads(out)["plan"]["share"]
    assert share["origin"] == f"PMIx namespace {namespace}"
    assert share["socket"].startswith(f"singpy-shared/{singpy.uid}/")
    assert json.loads(singpy.ok("exec", "--dry-run", str(image), "true"))["plan"]["share"] is None

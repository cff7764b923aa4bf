"""A real one-node Slurm cluster on 127.0.0.1, private to this session: munged, slurmctld and slurmd.

    with SlurmCluster(directory) as cluster:           # or the session fixture `slurm_cluster`
        result = cluster.srun(["-n", "2", "hostname"])

Everything lives in one directory of the session (the `slurm_cluster` fixture uses WORKDIR/slurm-XXXX):
the munge key and socket, slurm.conf, the controller's state, slurmd's spool (where the PMIx plugin makes
each step's PMIX_SERVER_TMPDIR) and the logs. Another copy of the suite may run a cluster of its own on the
same machine at the same time: the node and the cluster have names of their own, the ports are picked free
at start-up, and the clients find this cluster only through SLURM_CONF (`env()`), never /etc/slurm.
Nothing is started through systemd: the daemons run in the foreground as our children and are stopped by
their PIDs.

The daemons run as root (SlurmUser=root), as on a real cluster; jobs run as root and as the unprivileged test
user (srun/sbatch started with subprocess's user=/group=, like conftest's `Singpy.switch()`), which is why
the directory is world-searchable and munge's socket directory 0755.

Also used outside pytest by benchmarks/hpc.py: `SlurmCluster` is a context manager; `missing()` says why a
cluster can't be started here (not root, a binary missing).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("srun", "sbatch", "scancel", "squeue", "scontrol", "sinfo")
PLUGINS = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
SBIN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 60.0  # seconds for the node to become idle on a loaded 2-core machine
CPUS = 4  # declared (with config_overrides): -n 2 and -n 4 fit on this machine's 2 cores

SLURM_CONF = """\
# A one-node cluster of one test session (tests/support/slurm.py).
ClusterName={cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SrunPortRange={srun_first}-{srun_last}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={state}
FirstJobId={first_job}
SlurmdSpoolDir={spool}
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd-%n.pid
SlurmctldLogFile={log}/slurmctld.log
SlurmdLogFile={log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={conf_dir}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=2
UnkillableStepTimeout=30
NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


# Job ids start at a random point of this range, not at 1: PMIx names each step's namespace after its job and
# step ids (slurm.pmix.JOB.STEP), and what it keeps under that name outside the spool must not meet another
# copy of the suite's cluster's step 1.0 (srun: "task 0 launch failed" when two suites ran side by side).
FIRST_JOB_IDS = (1000, 60_000_000)  # Slurm's MaxJobId is 67,043,328


def missing() -> str | None:
    """Why a cluster can't be started here, or None."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (its daemons run as root)"
    lacking = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=SBIN_PATH) is None]
    if lacking:
        return f"not installed: {', '.join(lacking)} (Debian: slurmctld slurmd slurm-client munge)"
    if not (PLUGINS / "mpi_pmix.so").exists():
        return f"no {PLUGINS}/mpi_pmix.so (Debian: slurm-wlm-basic-plugins)"
    return None


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick); the daemon binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_range(count: int) -> tuple[int, int]:
    """`count` consecutive ports all free now, from the kernel's first pick upwards (for SrunPortRange)."""
    for _ in range(50):
        first = free_port()
        if first + count > 65535:
            continue
        if all(_port_free(port) for port in range(first, first + count)):
            return first, first + count - 1
    raise RuntimeError(f"no {count} consecutive free TCP ports found")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Job:
    """What one srun or sbatch gave: its id, exit status and output."""

    def __init__(self, job_id: int | None, returncode: int, stdout: str, stderr: str) -> None:
        self.job_id, self.returncode, self.stdout, self.stderr = job_id, returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"Job(id={self.job_id}, exit={self.returncode})\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class SlurmCluster:
    """munged + slurmctld + slurmd for one node, in `directory` (made here, removed by the caller)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        tag = uuid.uuid4().hex[:8]
        self.cluster = f"singpy{tag}"
        self.node = f"singpy-node-{tag}"
        self.partition = f"singpy{tag}"
        self.conf = directory / "etc" / "slurm.conf"
        self.munge_socket = directory / "munge" / "munge.socket"
        self.logs = directory / "log"
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._jobs = 0

    # --- the daemons --------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self._layout()
            self._start_munge()
            self._write_conf()
            self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._start("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel what still runs, then stop the daemons by PID (slurmd first: it ends its slurmstepds)."""
        if "slurmctld" in self._daemons and self._daemons["slurmctld"].poll() is None:
            self._client(["scancel", "--full", f"--partition={self.partition}"], timeout=20)
        for name in ("slurmd", "slurmctld", "munged"):
            process = self._daemons.pop(name, None)
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def _layout(self) -> None:
        for name, mode in (("", 0o755), ("etc", 0o755), ("munge", 0o755), ("munge-key", 0o700), ("state", 0o700),
                           ("spool", 0o755), ("run", 0o755), ("log", 0o755)):
            path = self.directory / name
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            path.chmod(mode)

    def _start_munge(self) -> None:
        """munged with a key of its own (0400, root's) and its socket in a 0755 directory of ours."""
        key = self.directory / "munge-key" / "munge.key"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True,
                       env={"PATH": SBIN_PATH})
        key.chmod(0o400)
        os.chown(key, 0, 0)
        private = self.directory / "munge-key"
        argv = ["munged", "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--log-file={self.logs / 'munged.log'}", f"--pid-file={private / 'munged.pid'}",
                f"--seed-file={private / 'munged.seed'}", "--num-threads=4"]
        self._start("munged", argv)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.munge_socket.exists():
            self._check_alive("munged")
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged made no socket in {START_TIMEOUT:.0f} s: {self._log('munged.log')}")
            time.sleep(0.05)

    def _write_conf(self) -> None:
        first, last = free_range(20)
        ports = {"ctld_port": free_port(), "slurmd_port": free_port()}
        while len({ports["ctld_port"], ports["slurmd_port"], first, last}) < 4 or any(
                first <= port <= last for port in ports.values()):
            first, last = free_range(20)
            ports = {"ctld_port": free_port(), "slurmd_port": free_port()}
        (self.conf.parent / "plugstack.conf").write_text("")
        self.conf.write_text(SLURM_CONF.format(
            cluster=self.cluster, node=self.node, partition=self.partition, cpus=CPUS, srun_first=first,
            srun_last=last, munge_socket=self.munge_socket, state=self.directory / "state",
            spool=self.directory / "spool", run=self.directory / "run", log=self.logs, conf_dir=self.conf.parent,
            first_job=FIRST_JOB_IDS[0] + uuid.uuid4().int % (FIRST_JOB_IDS[1] - FIRST_JOB_IDS[0]), **ports))

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.logs / f"{name}.out", "wb") as output:  # what a daemon says before its log file is open
            self._daemons[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output,
                                                   stderr=subprocess.STDOUT, env={**self.env(), "PATH": SBIN_PATH},
                                                   cwd=self.directory, start_new_session=True)

    def _check_alive(self, name: str) -> None:
        process = self._daemons[name]
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}): {self._log(f'{name}.out')}"
                               f"{self._log(f'{name}.log')}")

    def _log(self, name: str) -> str:
        try:
            return (self.logs / name).read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""

    def _wait_idle(self) -> None:
        """Poll the node's state until it is IDLE (slurmd registered, the node not down or drained)."""
        deadline = time.monotonic() + START_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            for name in self._daemons:
                self._check_alive(name)
            shown = self._client(["scontrol", "show", "node", self.node], timeout=20)
            match = re.search(r"\bState=(\S+)", shown.stdout)
            state = match.group(1) if match else shown.stderr.strip()
            if state == "IDLE":
                return
            time.sleep(0.2)
        raise RuntimeError(f"node {self.node} not idle after {START_TIMEOUT:.0f} s (state {state}):\n"
                           f"{self._log('slurmctld.log')}\n{self._log(f'slurmd-{self.node}.log')}")

    # --- the clients --------------------------------------------------------------------------------------------

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: a minimal PATH) plus what a Slurm client needs to find this cluster."""
        return {"PATH": "/usr/bin:/bin", **(base or {}), "SLURM_CONF": str(self.conf)}

    def _client(self, argv: list[str], *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False)
        except subprocess.TimeoutExpired as error:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out: {error}")

    def job_name(self) -> str:
        self._jobs += 1
        return f"{self.cluster}-{self._jobs}"

    def srun(self, args: list[str], *, env: dict[str, str] | None = None, switch: dict[str, object] | None = None,
             cwd: str | Path | None = None, timeout: float = 120) -> Job:
        """`srun ARGS` as the user of `switch` (conftest's Singpy.switch()), waited for.

        On a timeout the job is cancelled and srun killed, and the test fails with what it printed.
        """
        name = self.job_name()
        process = subprocess.Popen(["srun", f"--job-name={name}", *args], env=self.env(env), cwd=cwd or "/",
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True, **(switch or {}))  # type: ignore[call-overload]
        out, err = self._wait(process, name, timeout)
        return Job(self.job_id(name), process.returncode, out, err)

    def start_srun(self, args: list[str], *, env: dict[str, str] | None = None,
                   switch: dict[str, object] | None = None, cwd: str | Path | None = None
                   ) -> tuple[str, subprocess.Popen[str]]:
        """`srun ARGS` started, not waited for: its job name (for job_id/scancel) and the process."""
        name = self.job_name()
        process = subprocess.Popen(["srun", f"--job-name={name}", *args], env=self.env(env), cwd=cwd or "/",
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True, **(switch or {}))  # type: ignore[call-overload]
        return name, process

    def _wait(self, process: subprocess.Popen[str], name: str, timeout: float) -> tuple[str, str]:
        try:
            return process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.scancel_name(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            pytest.fail(f"srun job {name} still running after {timeout:.0f} s (cancelled):\nstdout:\n{out}\n"
                        f"stderr:\n{err}")

    def sbatch(self, script: str, *, args: list[str] = (), env: dict[str, str] | None = None,  # type: ignore[assignment]
               switch: dict[str, object] | None = None, directory: Path, timeout: float = 120) -> Job:
        """Submit `script` (written to DIRECTORY, which the job's user must be able to write: its output goes
        there too), wait until the job has left the queue, and return its exit code and output."""
        name = self.job_name()
        path = directory / f"{name}.sh"
        path.write_text(script)
        path.chmod(0o755)
        output = directory / f"{name}.out"
        submitted = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--output={output}", *args,
                                    str(path)], env=self.env(env), cwd=directory, capture_output=True, text=True,
                                   timeout=60, check=False, **(switch or {}))  # type: ignore[call-overload]
        if submitted.returncode != 0:
            return Job(None, submitted.returncode, "", submitted.stderr)
        job_id = int(submitted.stdout.strip().split(";")[0])
        if not self.wait_gone(job_id, timeout):
            self.scancel(job_id)
            self.wait_gone(job_id, 30)
            pytest.fail(f"sbatch job {job_id} still in the queue after {timeout:.0f} s (cancelled):\n"
                        f"{self._read(output)}")
        return Job(job_id, self.exit_code(job_id), self._read(output), "")

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def job_id(self, name: str) -> int | None:
        """The id of our job named `name`, while slurmctld still remembers it (MinJobAge)."""
        shown = self._client(["scontrol", "-o", "show", "job"])
        for line in shown.stdout.splitlines():
            if f" JobName={name} " in f" {line} ":
                match = re.match(r"JobId=(\d+)", line)
                if match:
                    return int(match.group(1))
        return None

    def wait_for_job_id(self, name: str, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while (job_id := self.job_id(name)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no job named {name} after {timeout:.0f} s")
            time.sleep(0.1)
        return job_id

    def exit_code(self, job_id: int) -> int:
        """The job's exit code as slurmctld reports it (-1 once it has forgotten the job)."""
        shown = self._client(["scontrol", "-o", "show", "job", str(job_id)])
        match = re.search(r"\bExitCode=(\d+):(\d+)", shown.stdout)
        if not match:
            return -1
        code, by_signal = int(match.group(1)), int(match.group(2))
        return code if not by_signal else 128 + by_signal

    def squeue(self, job_id: int) -> str:
        """squeue's line for the job ("" when it has left the queue)."""
        shown = self._client(["squeue", "-h", "-j", str(job_id), "-o", "%i %T"])
        return shown.stdout.strip()

    def state(self, job_id: int) -> str:
        """JobState in scontrol (e.g. RUNNING, COMPLETED, CANCELLED), "" once it is forgotten."""
        shown = self._client(["scontrol", "-o", "show", "job", str(job_id)])
        match = re.search(r"\bJobState=(\S+)", shown.stdout)
        return match.group(1) if match else ""

    def wait_gone(self, job_id: int, timeout: float) -> bool:
        """Whether the job finished (not pending, running, completing) within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(job_id) not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"):
                return True
            time.sleep(0.2)
        return False

    def scancel(self, job_id: int, *extra: str) -> subprocess.CompletedProcess[str]:
        return self._client(["scancel", *extra, str(job_id)])

    def scancel_name(self, name: str) -> None:
        self._client(["scancel", f"--name={name}"])

    def listpids(self, job_id: int) -> list[int]:
        """PIDs slurmd's proctrack still knows for the job, on our node (`scontrol listpids`)."""
        shown = self._client(["scontrol", "listpids", str(job_id), self.node])
        pids = []
        for line in shown.stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0].isdigit():
                pids.append(int(fields[0]))
        return pids

    def slurmd_pid(self) -> int:
        return self._daemons["slurmd"].pid


def _cluster_dir(workdir: Path) -> Path:
    path = Path(tempfile.mkdtemp(prefix="slurm-", dir=workdir))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def slurm_cluster(workdir: Path) -> Iterator[SlurmCluster]:
    """This session's one-node Slurm cluster (see the module's docstring); skipped where it can't run."""
    why = missing()
    if why:
        pytest.skip(why)
    with SlurmCluster(_cluster_dir(workdir)) as cluster:
        yield cluster

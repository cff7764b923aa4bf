"""A job step's ranks as the planner's job tests see them (tests/unit/test_jobs.py, test_jobs_shared_root.py): the
launcher variables of a PMIx rank and of a Slurm step, and build_plan for a rank (alice's, or another uid's) with
those variables on this host."""

from __future__ import annotations

from typing import Any

from singpy.config import sysconf
from singpy.host import host as host_module
from singpy.host.host import HostInfo
from singpy.launch.planner import LaunchRequest, Planned, build_plan
from singpy.plan import ImageSpec

PMIX = {"PMIX_NAMESPACE": "slurm.pmix.42.0", "PMIX_RANK": "3"}
SLURM = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}


def host(env: dict[str, str], uid: int = 1000) -> HostInfo:
    home = "/nonexistent/home/alice"
    return host_module.capture({"PATH": "/usr/bin:/bin", **env}).replace(
        uid=uid, gid=uid, user="alice", group="users", gecos="", shell="/bin/sh", home=home, cwd="/")


def planned(image: ImageSpec, host_env: dict[str, str], uid: int = 1000, **fields: Any) -> Planned:
    values: dict[str, object] = {"action": "exec", "image": image.path, "args": ("true",), "no_home": True}
    request = LaunchRequest(**{**values, **fields})
    return build_plan(request, sysconf.parse("", "test.conf"), host(host_env, uid), image)

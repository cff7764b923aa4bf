"""run(request): discover -> plan -> launch, and the launch phases in order.

Process model (the open point of docs/architecture.md, settled here):

* As an unprivileged user, the launcher unshares a user namespace (mapping
  the user to themselves) together with the mount namespace and any of
  uts/ipc/pid, all in its own process; as root, no user namespace is made.
* Without --pid, the same process then builds the container and execs the
  payload: no process stays behind, and exit status, signals and terminal
  are the payload's own.
* With --pid, it forks the namespace's PID 1 (`process.init`), which builds
  the container (a fresh /proc needs to be mounted from inside) and forks
  the payload; the launcher waits outside, forwarding signals.
* Mounts live only in the private mount namespace and scratch files only in
  its tmpfs, so whatever way the container ends, nothing is left on the host.
"""

from __future__ import annotations

import sys

from singpy import console, process, rootfs
from singpy.config.sysconf import SysConfig
from singpy.errors import ImageError
from singpy.gpu import GpuContribution
from singpy.host import HostInfo
from singpy.image.detect import detect
from singpy.kernel import syscalls as k
from singpy.kernel.idmap import write_id_maps
from singpy.mounts.apply import apply_mounts, missing_mount_points
from singpy.plan import LaunchPlan
from singpy.planner import LaunchRequest, build_plan

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn


def run(request: LaunchRequest, config: SysConfig, host: HostInfo, *, dry_run: bool = False) -> int:
    image = detect(request.image)
    if image.kind != "sandbox":
        raise ImageError(f"{request.image}: {image.kind} images are not supported yet")
    gpu = _gpus(request, config, host, image.rootfs)
    planned = build_plan(request, config, host, image, gpu_mounts=gpu.mounts, keep_host_env=gpu.keep_host_env)
    for warning in (*gpu.warnings, *planned.warnings):
        console.warning(warning)
    for note in gpu.notes:
        console.verbose(note)
    if dry_run:
        _print_dry_run(planned.plan, gpu, planned.warnings)
        return 0
    return launch(planned.plan)


def _gpus(request: LaunchRequest, config: SysConfig, host: HostInfo, rootfs: str | None) -> GpuContribution:
    """GPU discovery, only when --nv / --rocm (or the conf's `always use`) asks for it."""
    from singpy.gpu.request import discover_gpus, wanted

    nv, rocm = wanted(nv=request.nv, rocm=request.rocm, config=config)
    if not (nv or rocm):
        return GpuContribution()
    return discover_gpus(nv=nv, rocm=rocm, contain=request.contain, config=config, host_env=host.env,
                         rootfs=rootfs)


def _print_dry_run(plan: LaunchPlan, gpu: GpuContribution, warnings: tuple[str, ...]) -> None:
    """The plan as JSON, with what GPU support adds spelled out: nothing is started."""
    import json

    gpu_summary = {
        "devices": [spec.dest for spec in gpu.mounts if spec.dev],
        "libraries": [spec.source for spec in gpu.mounts if spec.dest.startswith("/.singularity.d/libs/")],
        "binaries": [spec.source for spec in gpu.mounts if spec.dest.startswith("/usr/bin/")],
        "files": [spec.source for spec in gpu.mounts
                  if spec.source and spec.source == spec.dest and not spec.dev],
        "keep_host_env": list(gpu.keep_host_env),
    }
    document = {"plan": plan.to_json_data(), "gpu": gpu_summary, "warnings": [*gpu.warnings, *warnings]}
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def launch(plan: LaunchPlan) -> int:
    """Run the phases; returns only with --pid (the payload's status), else execs."""
    enter_namespaces(plan)
    if plan.namespaces.pid:
        return process.supervise(lambda: _pid1(plan))
    build_container(plan)
    process.exec_process(plan.process)


def _pid1(plan: LaunchPlan) -> NoReturn:
    build_container(plan)
    process.init(lambda: process.exec_process(plan.process))


def enter_namespaces(plan: LaunchPlan) -> None:
    """Called first, in the launcher's only thread (the kernel refuses CLONE_NEWUSER otherwise)."""
    ns = plan.namespaces
    flags = k.CLONE_NEWNS
    flags |= k.CLONE_NEWUSER if ns.user else 0
    flags |= k.CLONE_NEWPID if ns.pid else 0
    flags |= k.CLONE_NEWIPC if ns.ipc else 0
    flags |= k.CLONE_NEWUTS if ns.uts else 0
    console.debug(f"unshare namespaces {ns}")
    k.unshare(flags)
    if ns.user:
        write_id_maps(plan.uid, plan.gid)


def build_container(plan: LaunchPlan) -> None:
    """Called in the new namespaces (inside the new PID namespace with --pid), before the payload starts."""
    assert plan.image.rootfs is not None
    rootfs.enter_staging()
    mount_points = missing_mount_points(plan.mounts, rootfs.host_path(plan.image.rootfs))
    for path, _ in mount_points:
        console.debug(f"mount point /{path} is missing from the image: adding it in an overlay layer")
    rootfs.mount_image(plan.image.rootfs, mount_points=mount_points, writable=plan.writable_tmpfs,
                       userns=plan.namespaces.user)
    apply_mounts(plan.mounts)
    rootfs.finish_root(writable=plan.writable_tmpfs)
    if plan.hostname is not None:
        k.sethostname(plan.hostname)

"""run(request): discover -> plan -> launch, and the launch phases in order.

Process model (the open point of docs/architecture.md, settled here):

* As an unprivileged user, the launcher unshares a user namespace (mapping
  the user to themselves) together with the mount namespace and any of
  uts/ipc/net, all in its own process; as root, no user namespace is made.
  The PID namespace is unshared later, once the image's helpers run.
* Without --pid, the same process then builds the container and execs the
  payload: no process stays behind, and exit status, signals and terminal
  are the payload's own.
* With --pid, it forks the namespace's PID 1 (`process.init`), which builds
  the container (a fresh /proc needs to be mounted from inside) and forks
  the payload; the launcher waits outside, forwarding signals.
* --net makes a network namespace in the same unshare, loopback up. As root
  with --network bridge|ptp, the launcher first wires one from the host side
  (singpy.kernel.netns), forks the container into it and stays outside as
  its supervisor, to remove the host's veth (and bridge) however it ends.
* --fakeroot with subordinate ranges: a helper forked before the unshare
  runs newuidmap/newgidmap on the launcher from outside (singpy.layers.fakeroot).
* Signals and a killed launcher, at any moment (singpy.launch.process): a
  supervisor blocks the forwarded signals before its fork, so that one sent
  while the container is being set up stays pending (a PID namespace's init
  without a handler would drop it) until the supervisor or init takes it
  (sigwaitinfo) and forwards it; one that comes before the payload exists
  ends the start-up with its default action, as it would have ended the
  payload. Every child (init, the payload under
  init, squashfuse, the --fakeroot helper, the --network child) comes from
  `process.fork_tied`: PR_SET_PDEATHSIG, then a check that the launcher did
  not die before it, so a SIGKILL of the launcher leaves nothing running.
* Mounts live only in the private mount namespace and scratch files only in
  its tmpfs, so whatever way the container ends, nothing is left on the host.

Images (singpy.image.squashfs has the three strategies for SIF/squashfs; a
Singularity 2.x ext3 image is mounted on /image as an ext3 overlay image is,
by singpy.image.extfs: the kernel's ext3 on a loop device as root, fuse2fs,
supervised as squashfuse is, otherwise):

* A sandbox directory, or a squashfs unpacked into the user's cache
  (`extract`, done on the host before any namespace), is bound from /oldroot.
* Otherwise the squashfs is mounted inside the new mount namespace, in the
  staging root (after the first pivot, before the image becomes the root),
  on /image. `loop` (root): the kernel mount alone holds the autoclear loop
  device, so both vanish with the namespace and the launcher still execs
  the payload in place. `fuse`: squashfuse serves the mount for the whole
  life of the container, so the launcher stays as a supervisor: it starts
  squashfuse (chrooted to /oldroot, in its own session, dying with the
  launcher), unshares the PID namespace only then (so squashfuse is not its
  PID 1), forks the container, waits, forwarding signals, and kills
  squashfuse when the container is gone. Done in the staging root, the
  mount needs no host directory, so a killed launcher leaves nothing behind.
"""

from __future__ import annotations

import os
import sys

from singpy import console
from singpy.config.sysconf import IMAGE_LIMITS, SysConfig
from singpy.constants import LIBS_DIR
from singpy.host.host import HostInfo
from singpy.image.detect import detect
from singpy.kernel import syscalls as k
from singpy.launch import process
from singpy.launch.exitstatus import exit_as
from singpy.launch.phases import (
    PreparedRoot,
    attach_image,
    build_container,
    enter_namespaces,
    import_for_phases,
    prepare_root,
)
from singpy.launch.planner import LaunchRequest, Planned, build_plan
from singpy.layers import rootfs
from singpy.plan import ImageSpec, LaunchPlan, MountOp

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

    from singpy.gpu import GpuContribution


def run(request: LaunchRequest, config: SysConfig, host: HostInfo, *, dry_run: bool = False) -> int:
    planned, gpu = plan_launch(request, config, host, dry_run=dry_run)
    if dry_run:
        _print_dry_run(planned.plan, gpu, planned.warnings, request.devices)
        return 0
    if planned.plan.join_cgroup:  # instance://NAME of an instance with limits: under them too, as Apptainer
        from singpy.cgroups import manager

        for directory in planned.plan.join_cgroup:
            manager.move(directory, os.getpid())
    if planned.plan.share is not None:
        from singpy.launch import shared

        return shared.run(planned.plan, launch)  # launch: a rank that can't share runs alone
    return launch(planned.plan)


def plan_launch(request: LaunchRequest, config: SysConfig, host: HostInfo, *,
                dry_run: bool = False) -> tuple[Planned, GpuContribution | None]:
    """The image prepared and the plan built, its warnings (and --verbose notes) printed."""
    image = prepare_image(request, config, host, dry_run=dry_run)
    gpu = _gpus(request, config, host, image)
    if gpu and gpu.env:  # CDI's env (and --nv's): injected as --env (which wins), literal: the text isn't the user's
        from singpy.env.environ import evaluates_to

        literal = gpu.env if request.no_eval else tuple((name, evaluates_to(value)) for name, value in gpu.env)
        request = request.replace(env=(*literal, *request.env))
    planned = build_plan(request, config, host, image, gpu_mounts=gpu.mounts if gpu else (),
                         keep_host_env=gpu.keep_host_env if gpu else ())
    if planned.plan.process.security is not None and not dry_run:  # imported and compiled while the host is here
        from singpy.launch import security

        security.prepare(planned.plan.process.security)
    for warning in (*(gpu.warnings if gpu else ()), *planned.warnings):
        console.warning(warning)
    if console.level() >= console.VERBOSE:  # the GPU notes cost a comparison of every mount
        for note in (*(_gpu_notes(gpu, planned.plan) if gpu else ()), *planned.notes):
            console.verbose(note)
    if request.nvccli and request.writable_tmpfs:
        console.info("--nvccli: the image is writable in memory (--writable-tmpfs), as with Apptainer")
    return planned, gpu


def _gpu_notes(gpu: GpuContribution, plan: LaunchPlan) -> tuple[str, ...]:
    """GPU discovery's notes, less the "binding" lines of binds the plan left out (singpy.launch.planner)."""
    from singpy.gpu import binding_note  # loaded already: there is a GPU contribution

    planned = set(plan.mounts)
    left_out = {binding_note(spec) for spec in gpu.mounts if spec not in planned}
    return tuple(note for note in gpu.notes if note not in left_out)


def _gpus(request: LaunchRequest, config: SysConfig, host: HostInfo, image: ImageSpec) -> GpuContribution | None:
    """GPU discovery, only when --nv / --rocm (or the conf's `always use`), --device or --containlibs asks for it;
    None otherwise.

    The flags are checked before the GPU package is imported: it pulls in `re`
    and `shutil`, several milliseconds that a plain exec must not pay. --nv and
    --device together both apply (singpy.gpu.merge binds a path once), where
    Apptainer's native mode drops the CDI devices.
    """
    nv = request.nv or (config.flag("always use nv") and not request.no_nv)  # --no-nv cancels only the conf's
    rocm = request.rocm or (config.flag("always use rocm") and not request.no_rocm)
    compat32 = request.compat32 or "compat32" in host.env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")
    if compat32 and not (nv or rocm):  # Apptainer's words (singpy.gpu.compat32, not imported for a warning)
        console.warning("ignoring --compat32, it requires a GPU option such as --nv or --rocm")
        compat32 = False
    if not (nv or rocm or request.intel_hpu or request.devices or request.containlibs):
        return None
    from singpy.gpu import merge

    parts = []
    if nv or rocm or request.intel_hpu:
        from singpy.gpu.request import discover_gpus

        parts.append(discover_gpus(nv=nv, rocm=rocm, contain=request.contain, config=config, host_env=host.env,
                                   rootfs=image.rootfs, nvccli=request.nvccli, image_spec=image,
                                   compat32=compat32, intel_hpu=_hpu_selection(request, host)))
    if request.devices:
        from singpy.gpu import CDI_DIRS, cdicache
        from singpy.host.cachefiles import cache_dir

        parts.append(cdicache.discover(tuple(request.devices), tuple(request.cdi_dirs or CDI_DIRS),
                                       cache=cache_dir(host.env, host.home)))
    if request.containlibs:  # last: a GPU library of the same name wins (singpy.gpu.containlibs)
        from singpy.gpu import containlibs

        parts.append(containlibs.contribution(request.containlibs, cwd=host.cwd,
                                              bind_control=config.flag("user bind control")))
    return merge(*parts)


def _hpu_selection(request: LaunchRequest, host: HostInfo) -> str | None:
    """--intel-hpu's HABANA_VISIBLE_DEVICES as the container is given it, `all` when it is not; None without the flag.

    As Apptainer, which reads it from the variables injected into the container (its APPTAINERENV_ map: the
    prefixed host variables, --env-file, --env), never from the host's own HABANA_VISIBLE_DEVICES.
    """
    if not request.intel_hpu:
        return None
    from singpy.env.environ import injected_from_host
    from singpy.gpu.intelhpu import SELECT_VAR

    injected, _ = injected_from_host(host.env)  # its warnings: the planner shows them
    injected.update({**dict(request.env_file), **dict(request.env)})  # --env-file < --env
    return injected.get(SELECT_VAR, "all")


def _print_dry_run(plan: LaunchPlan, gpu: GpuContribution | None, warnings: tuple[str, ...],
                   devices: tuple[str, ...] = ()) -> None:
    """The plan as JSON, with what GPU support adds spelled out: nothing is started.

    Values of credential-like variables (`*TOKEN*`, `*SECRET*`, `*KEY*`...) are
    shown as "<redacted>" unless --verbose: plans get pasted into bug reports.
    """
    import json

    from singpy.env.environ import redact_secrets
    from singpy.gpu import GpuContribution

    gpu = gpu or GpuContribution()
    gpu_summary = {
        "devices": [spec.dest for spec in gpu.mounts if spec.dev],
        "libraries": [spec.source for spec in gpu.mounts
                      if spec.op == MountOp.BIND and spec.dest.startswith(f"{LIBS_DIR}/")],
        "libraries32": [spec.source for spec in gpu.mounts  # --compat32's, in /.singularity.d/libs32
                        if spec.op == MountOp.BIND and spec.dest.startswith(f"{LIBS_DIR}32/")],
        "binaries": [spec.source for spec in gpu.mounts if spec.dest.startswith("/usr/bin/")],
        "files": [spec.source for spec in gpu.mounts
                  if spec.source and spec.source == spec.dest and not spec.dev],
        "keep_host_env": list(gpu.keep_host_env),
        "cdi_devices": list(devices),  # --device as given; what they add is in the lists here and below
        "env": dict(gpu.env),
        "links": [f"{spec.dest} -> {spec.source}" for spec in gpu.mounts if spec.op == MountOp.SYMLINK],
        "other_binds": [f"{spec.source} -> {spec.dest}" for spec in gpu.mounts
                        if spec.op == MountOp.BIND and not spec.dev and spec.source != spec.dest
                        and not spec.dest.startswith((f"{LIBS_DIR}/", f"{LIBS_DIR}32/", "/usr/bin/"))],
    }
    data = plan.to_json_data()
    if console.level() < console.VERBOSE:
        process = data["process"]
        assert isinstance(process, dict) and isinstance(process["env"], dict)
        redact_secrets(process["env"])
    document = {"plan": data, "gpu": gpu_summary, "warnings": [*gpu.warnings, *warnings]}
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _check_ecl(image: str, config_path: str, host: HostInfo) -> None:
    """The execution control list beside the configuration (singpy.signing.ecl), read only where there is one:
    a host without it pays one stat, and nothing of the signing code is imported. Allowed verdicts are recorded
    in the caller's cache (singpy.signing.eclrecord)."""
    directory = os.path.dirname(os.path.abspath(config_path)) if config_path else "/etc/singpy"
    if os.path.lexists(os.path.join(directory, "ecl.toml")):
        from singpy.host.cachefiles import cache_dir
        from singpy.signing import eclrecord

        records = cache_dir(host.env, host.home)
        if eclrecord.allowed(image, config_path, records):
            return
        from singpy.signing import ecl

        ecl.check(image, config_path, records=records)


def prepare_image(request: LaunchRequest, config: SysConfig, host: HostInfo, *, dry_run: bool) -> ImageSpec:
    """Detect the image and choose how to get its root; for `extract`, unpack it now.

    Called on the host, before any namespace: an extraction goes to the
    user's cache, which outlives the container (singpy.image.squashfs).
    """
    image = detect(request.image)
    if image.kind == "sif":
        _check_ecl(image.path, config.path, host)
    if host.uid != 0 and config.changed(IMAGE_LIMITS):  # before anything is extracted from a refused image
        from singpy.host import policy

        policy.check_image(image, config, host.uid)
    if image.kind == "sandbox":
        return image
    if request.writable:  # refused before anything is extracted
        from singpy.layers.overlay import check_writable_image

        check_writable_image(image, image.overlay_partition())
    if image.kind == "ext3":  # Singularity 2.x: mounted as an ext3 overlay image is, on IMAGE (image.extfs)
        from singpy.image import extfs

        if request.unsquash or config.flag("unsquash"):
            console.verbose("--unsquash (or `unsquash = yes`) applies to squashfs images only: mounting the ext3 "
                            "image")
        return extfs.choose_root(image, uid=host.uid, user_namespace=request.fakeroot or request.userns,
                                 writable=request.writable, env=host.env,
                                 allow_kernel=config.flag("allow kernel extfs"))
    if image.encryption and request.instance:  # joined: the instance holds it decrypted, no key is asked again
        return image
    if image.encryption:  # gocryptfs: mounted, never extracted (its clear text never reaches a disk)
        from singpy.image import cryptmount

        return cryptmount.prepare(image, uid=host.uid, env=host.env, prompt=request.passphrase,
                                  pem_path=request.pem_path, allowed=config.flag("allow container encrypted"),
                                  allow_kernel=config.flag("allow kernel squashfs"),
                                  user_namespace=request.fakeroot or request.userns)
    from singpy.host import cachefiles
    from singpy.image import squashfs

    image = squashfs.choose(image, uid=host.uid, unsquash=request.unsquash or config.flag("unsquash"),
                            allow_kernel=config.flag("allow kernel squashfs"), env=host.env,
                            cache=cachefiles.cache_dir(host.env, host.home),
                            user_namespace=request.fakeroot or request.userns,
                            # not --fakeroot: a tree is the user's, root's inside, where FUSE shows the image's owners
                            background=None if request.writable or request.fakeroot
                            or not config.flag("unsquash in background")
                            else int(str(config.get("unsquash in background max size"))) << 20)
    if image.warm:  # a rank of a shared container waits for no unpacking: the container's root is its holder's
        from singpy.image import warm
        from singpy.launch import jobs

        image = warm.shared(image) if jobs.shares(request, host.env) else image
    return image if dry_run else squashfs.prepare(image, root=host.uid == 0)


def launch(plan: LaunchPlan, net_fd: int | None = None, *, limited: bool = False) -> int:
    """Run the phases; returns only under a supervisor (--pid, squashfuse, a host network, a cgroup), else execs.

    `net_fd` is the network namespace `attach_network` wired, in its child;
    `limited`: this process is in the plan's cgroup already (singpy.launch.limits).
    """
    if net_fd is None and plan.network is not None and plan.network.type != "none":
        return attach_network(plan)
    if plan.cgroup is not None and not limited:  # resource limits: a supervisor outside removes the cgroup
        from singpy.launch import limits

        return limits.run_limited(plan.cgroup, lambda: exit_as(launch(plan, net_fd, limited=True)))
    import_for_phases(plan)
    _limit_loop_devices(plan)
    enter_namespaces(plan, net_fd)
    rootfs.enter_staging(plan.staging_fs, plan.staging_size, slave=plan.mount_slave)
    image_root, helpers = attach_image(plan)
    root, layer_helpers = prepare_root(plan, image_root)
    helpers = (*reversed(layer_helpers), *helpers)  # stopped top first: fuse-overlayfs, fuse2fs, squashfuse
    if plan.namespaces.pid:
        k.unshare(k.CLONE_NEWPID)  # only now: a helper must not become the new namespace's PID 1
        return process.supervise(lambda: _pid1(plan, root), helpers)
    if helpers:
        return process.supervise(lambda: _container(plan, root), helpers)
    scripts = build_container(plan, root)
    process.exec_process(plan.process, scripts)


def _limit_loop_devices(plan: LaunchPlan) -> None:
    """`max loop devices` and `avoid kernel features = loop_configure`, set before anything attaches one
    (the image's squashfs, an ext3 overlay)."""
    if plan.image.strategy == "loop" or any(layer.strategy == "loop" for layer in plan.overlays):
        from singpy.kernel import loop

        loop.set_max_devices(plan.max_loop_devices)
        loop.set_use_configure("loop_configure" not in plan.avoid_features)


def _pid1(plan: LaunchPlan, root: PreparedRoot) -> NoReturn:
    scripts = build_container(plan, root)
    if not plan.process.init:  # --no-init: the payload is PID 1, signals without a handler never reach it
        process.exec_process(plan.process, scripts)
    process.init(lambda: process.exec_process(plan.process, scripts))


def _container(plan: LaunchPlan, root: PreparedRoot) -> NoReturn:
    scripts = build_container(plan, root)
    process.exec_process(plan.process, scripts)


def attach_network(plan: LaunchPlan) -> int:
    """Root, --network bridge|ptp: wire a network namespace from the host side, run the container in it.

    Called on the host before any namespace. The launcher stays outside as
    the container's supervisor: the veth (and bridge) it made in the host's
    network namespace must be removed whatever way the container ends, which
    a launcher that became the payload could not do.
    """
    from singpy.kernel import netns

    assert plan.network is not None
    with netns.Attached(plan.network) as attachment:
        console.verbose(f"network {plan.network.type}: container address {attachment.address}, "
                        f"host end {attachment.host_link}")
        return process.supervise(lambda: _attached_container(plan, attachment.netns_fd))


def _attached_container(plan: LaunchPlan, net_fd: int) -> NoReturn:
    exit_as(launch(plan, net_fd))

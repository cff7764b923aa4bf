"""build_plan: what the user asked + admin config + host facts -> LaunchPlan.

Pure apart from read-only checks of host paths (a bind source that does not
exist fails here, before anything touches the kernel).
"""

from __future__ import annotations

import os
import stat

from singpy.config.sysconf import IMAGE_LIMITS, SysConfig, confdir
from singpy.constants import DEFAULT_PATH
from singpy.env.environ import EnvPlan, host_passthrough, injected_from_host, is_protected, split_path_rules
from singpy.errors import BindSpecError, SingpyError, UsageError
from singpy.host.host import HostInfo, root_entry
from singpy.host.hostfiles import path_problem, shown
from singpy.kernel import caps
from singpy.launch import jobs
from singpy.launch.request import LaunchRequest as LaunchRequest
from singpy.mounts import system
from singpy.plan import (
    CgroupSpec,
    FuseMountSpec,
    IdMap,
    ImageSpec,
    LaunchPlan,
    Missing,
    MountOp,
    MountSpec,
    Namespaces,
    NetworkSpec,
    Privileges,
    ProcessSpec,
    SecuritySpec,
    ShareSpec,
    Stage,
)
from singpy.plan import no_layer as plan_no_layer
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.launch.instance import InstanceRecord
    from singpy.layers.overlay import OverlayChoice
    from singpy.mounts.workdir import WorkdirPlan


class Planned(Record, kw_only=False):
    """A plan plus the warnings found while building it, and --verbose notes (printed by the caller)."""

    plan: LaunchPlan
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()


def build_plan(request: LaunchRequest, config: SysConfig, host: HostInfo, image: ImageSpec,
               gpu_mounts: tuple[MountSpec, ...] = (), keep_host_env: tuple[str, ...] = ()) -> Planned:
    if request.hostname is not None:
        system.check_hostname(request.hostname)
    job = jobs.detect(host.env)
    request, job_warnings = jobs.check_request(request, job)
    share_key, job_notes = jobs.sharing(request, job)
    fusemounts, fuse_points = _fusemounts(request, config, host)
    request = request.replace(pid=True) if fusemounts else request  # as Apptainer: --fusemount implies --pid
    pid, ipc, uts, hostname, dropped = _namespaces(request, config)
    if fusemounts and not pid:
        raise SingpyError("--fusemount needs a PID namespace, which `allow pid ns = no` refuses")
    network = _network(request, host, config)
    netns_path, netns_warnings = _netns_path(request, host, config)
    network = None if netns_path else network
    fakeroot = _fakeroot(request, host)
    privileges = _privileges(request, config, host)
    home_source, home_dest = _home(request, host)
    namespaces = Namespaces(user=host.uid != 0 or fakeroot is not None or request.userns, pid=pid,
                            ipc=ipc, uts=uts, net=network is not None)
    layers = _layers(request, config, host, image, namespaces.user)
    underlay = _underlay(request, config, namespaces.user and _no_userns_overlay(config))
    no_layer = plan_no_layer(writable=request.writable, overlays=bool(layers and layers.overlays), underlay=underlay,
                             overlay_driver=layers.driver if layers is not None else _default_driver(config))
    joined = _joined(request, host)  # instance://NAME: what it was started with, read once
    security = _security(request, host, privileges, joined)
    identity, identity_warnings = _identity_files(request, config, host, home_dest, security)
    mounts = _mounts(request, config, host, namespaces, home_source, home_dest, identity, no_layer=bool(no_layer))
    work = _workdir(request, config, mounts, home_dest) if request.workdir or request.scratch else None
    if work is not None:  # --workdir, --scratch (singpy.mounts.workdir, imported only then)
        mounts = work.mounts
    gpu_mounts, gpu_notes = _outside_host_dev(gpu_mounts, mounts)
    mounts += gpu_mounts
    if job is not None:
        mounts += system.job_mounts(host.env, contain=request.contain)
    mounts += _user_binds(request, config)
    mounts += fuse_points
    keep_host_env += tuple(name for name in host.env if jobs.is_job_variable(name))
    env_plan, warnings = _env_plan(request, host, image, home_dest, keep_host_env)
    if job is not None and share_key is None:
        env_plan = jobs.without_single_copy(env_plan, host.env, request)
    avoid = config.items("avoid kernel features")
    if layers is not None:
        if host.uid != 0 and config.changed(IMAGE_LIMITS):
            from singpy.host import policy

            policy.check_overlays(layers.overlays, image.path, config, host.uid)
        warnings += layers.warnings
    written = request.writable or (layers.writable_tmpfs or any(not layer.readonly for layer in layers.overlays)
                                   if layers is not None else request.writable_tmpfs)
    if written and (request.fakeroot or host.uid == 0 and not (security and security.uid)):  # root writing
        mounts = _without_identity_files(mounts)
    process = ProcessSpec(action=request.action, args=request.args, env=env_plan,
                          cwd=_cwd(request, host, home_dest), cwd_required=bool(request.pwd), shell=request.shell,
                          privileges=privileges, umask=0o022 if request.no_umask else None, init=not request.no_init,
                          app=request.app, security=security,
                          go_pipe=image.go_pipe,  # the background unpacking's go (singpy.image.warm)
                          in_use=image.in_use)  # the cache's tree held in use (singpy.image.squashfs.hold)
    if image.go_pipe[0] >= 0 or image.in_use[0] >= 0:  # the process's: ranks share a container if the rest matches
        image = image.replace(go_pipe=(-1, 0), in_use=(-1, 0))
    if request.runscript_timeout and request.action == "run":  # Apptainer's flag of `run` alone: a watchdog
        process = process.replace(env=process.env.replace(timer=True), runscript_timeout=request.runscript_timeout)
    plan = LaunchPlan(image=image, namespaces=namespaces, uid=host.uid, gid=host.gid,
                      mounts=tuple(sorted(mounts, key=lambda spec: spec.stage)), process=process,
                      hostname=hostname,
                      writable_tmpfs=layers.writable_tmpfs if layers is not None else request.writable_tmpfs,
                      writable=request.writable, overlays=tuple(layers.overlays) if layers is not None else (),
                      overlay_driver=layers.driver if layers is not None else _default_driver(config),
                      overlay_tool=layers.tool if layers is not None else "",
                      network=network, fakeroot=fakeroot, staging_fs=config.text("memory fs type"),
                      mount_slave=config.flag("mount slave"),
                      staging_size=_staging_size(config, host.uid),
                      max_loop_devices=config.number("max loop devices"),
                      underlay=underlay,
                      avoid_features=avoid, netns_path=netns_path, fusemounts=fusemounts)
    if request.allow_setuid or joined is not None and joined.allow_setuid and host.uid == 0:  # or root joins one
        from singpy.launch.setuid import allow_setuid  # (imported only then)

        plan = allow_setuid(plan)
    if request.limits:
        plan = plan.replace(cgroup=_cgroup(request, host, share_key))
    if request.instance:
        from singpy.launch.instance import instance_cgroup, socket_name

        plan = plan.replace(share=ShareSpec(socket=socket_name(host.home, host.user, host.uid, request.instance),
                                            origin=f"instance {request.instance}", create=False),
                            join_cgroup=instance_cgroup(host.home, host.user, host.uid, request.instance))
    elif share_key is not None:
        plan = plan.replace(share=jobs.share_spec(plan, share_key))
    if work is not None:
        plan = plan.replace(host_dirs=work.host_dirs)
        warnings += work.warnings
    return Planned(plan, (*job_warnings, *dropped, *netns_warnings, *identity_warnings, *warnings),
                   (*job_notes, *gpu_notes))


def _cgroup(request: LaunchRequest, host: HostInfo, share_key: tuple[str, str] | None) -> CgroupSpec:
    """Resource limits: the container's cgroup (singpy.cgroups, imported only then)."""
    from singpy.cgroups.hierarchy import plan_cgroup

    if request.instance:
        raise UsageError(f"resource limits are set when an instance starts: instance://{request.instance} runs "
                         "in the instance's cgroup")
    if share_key is not None:  # a shared container's holder is no launch of this rank's: its cgroup is not ours
        raise UsageError(f"resource limits need a container of its own, and the ranks of {share_key[1]} share "
                         "one: add --no-sharens (each rank gets its container and cgroup)")
    return plan_cgroup(request.limits, host.uid)


def _workdir(request: LaunchRequest, config: SysConfig, mounts: list[MountSpec], home_dest: str) -> WorkdirPlan:
    from singpy.mounts import workdir

    return workdir.plan(mounts, workdir=request.workdir, scratch=request.scratch, contain=request.contain,
                        home_dest=home_dest, default_home=request.home is None,
                        bind_control=config.flag("user bind control"))


def _outside_host_dev(gpu_mounts: tuple[MountSpec, ...],
                      mounts: list[MountSpec]) -> tuple[tuple[MountSpec, ...], tuple[str, ...]]:
    """The GPU mounts, less the binds of host /dev nodes onto themselves when the host's /dev is bound whole
    (no --contain: every /dev/nvidia* node is there, as in Apptainer; each bind cost a mount and changed nothing)."""
    if not gpu_mounts or not any(spec.op == MountOp.BIND and spec.source == "/dev" and spec.dest == "/dev"
                                 for spec in mounts):
        return gpu_mounts, ()
    kept = tuple(spec for spec in gpu_mounts if not (spec.dev and spec.op == MountOp.BIND and
                                                     spec.source == spec.dest and spec.dest.startswith("/dev/")))
    if len(kept) == len(gpu_mounts):
        return gpu_mounts, ()
    return kept, (f"{len(gpu_mounts) - len(kept)} GPU device node(s) come with the host's /dev (no --contain): "
                  "not bound one by one",)


def _layers(request: LaunchRequest, config: SysConfig, host: HostInfo, image: ImageSpec,
            user_namespace: bool) -> OverlayChoice | None:
    """--writable, --overlay, a SIF's overlay partition, `enable overlay` (layers.overlay, imported only then)."""
    enable = config.text("enable overlay")
    partition = image.overlay_partition()
    needed = request.writable or request.overlays or partition is not None
    # No overlayfs in a user namespace (avoided, or Linux < 5.11): the layers need fuse-overlayfs, as with `driver`.
    avoided = user_namespace and _no_userns_overlay(config)
    if not needed and not (request.writable_tmpfs and (enable in ("no", "driver") or avoided)):
        return None
    from singpy.layers.overlay import plan_overlays

    return plan_overlays(image=image, writable=request.writable, overlays=request.overlays,
                         writable_tmpfs=request.writable_tmpfs, enable=enable, uid=host.uid,
                         user_namespace=user_namespace, cwd=host.cwd, env=host.env, partition=partition,
                         kernel_avoided=avoided, kernel_extfs=config.flag("allow kernel extfs"))


def _no_userns_overlay(config: SysConfig) -> bool:
    """Whether overlayfs can't be mounted in a user namespace: avoided by the admin, or a kernel before 5.11
    (Ubuntu let users mount overlayfs earlier, but without `userxattr`, which singpy passes: the same)."""
    if "userns_overlay" in config.items("avoid kernel features"):
        return True
    release = os.uname().release.split(".")
    try:
        return (int(release[0]), int(release[1].split("-")[0])) < (5, 11)
    except (IndexError, ValueError):
        return False


def _underlay(request: LaunchRequest, config: SysConfig, no_userns_overlay: bool) -> str:
    """When the mount points the image lacks go in an underlay (singpy.layers.underlay) rather than an overlay
    layer. `no_userns_overlay`: a user namespace is made, and overlayfs can't be mounted there (_no_userns_overlay)."""
    enable = config.text("enable underlay")
    if enable == "no":
        if request.underlay:
            raise SingpyError("--underlay needs the underlay, but `enable underlay = no` in the configuration",
                              hint="the system administrator disabled the underlay (enable underlay = no)")
        return "no"
    wanted = request.underlay or enable == "preferred" or no_userns_overlay
    return "always" if wanted or config.text("enable overlay") == "no" else "fallback"


def _default_driver(config: SysConfig) -> str:
    """No overlay asked for: the layer of missing mount points is the kernel's overlayfs, or none at all."""
    return "none" if config.text("enable overlay") == "no" else "kernel"


def _without_identity_files(mounts: list[MountSpec]) -> list[MountSpec]:
    """Root (--fakeroot's too) writing the image keeps its own /etc/passwd and /etc/group (Apptainer binds none)."""
    from singpy import console

    console.verbose("not binding /etc/passwd and /etc/group: the container is writable and you are root in it")
    return [spec for spec in mounts if not (spec.op == MountOp.FILE and spec.dest in ("/etc/passwd", "/etc/group"))]


def _namespaces(request: LaunchRequest, config: SysConfig) -> tuple[bool, bool, bool, str | None, tuple[str, ...]]:
    """(pid, ipc, uts, hostname, warnings): what `allow pid/ipc/uts ns` leave (singpy.host.policy, loaded only then)."""
    uts = request.uts or request.hostname is not None
    refused = ((request.pid and not config.flag("allow pid ns")) or (request.ipc and not config.flag("allow ipc ns"))
               or (uts and not config.flag("allow uts ns")))
    if not refused:
        return request.pid, request.ipc, uts, request.hostname, ()
    from singpy.host import policy

    return policy.grant_namespaces(config, pid=request.pid, ipc=request.ipc, uts=uts, hostname=request.hostname)


def _staging_size(config: SysConfig, uid: int) -> int:
    """`sessiondir max size` (MiB) of the staging tmpfs: for users, as in Apptainer; root's and a ramfs have none."""
    if uid == 0 or config.text("memory fs type") != "tmpfs":
        return 0
    return config.number("sessiondir max size")


def _network(request: LaunchRequest, host: HostInfo, config: SysConfig) -> NetworkSpec | None:
    """--net, --network, --network-args; singpy.launch.network is imported only then (start-up time)."""
    if not (request.net or request.network or request.network_args):
        return None
    from singpy.launch import network as net

    return net.plan_network(net=request.net, network=request.network, network_args=request.network_args,
                            uid=host.uid, user=host.user, config=config)


def _netns_path(request: LaunchRequest, host: HostInfo, config: SysConfig) -> tuple[str, tuple[str, ...]]:
    """--netns-path, checked (singpy.launch.netnspath, imported only then); --net beside it is Apptainer's warning."""
    if not request.netns_path:
        return "", ()
    from singpy.launch import netnspath

    path = netnspath.plan_netns_path(request.netns_path, uid=host.uid, user=host.user, config=config)
    if request.net or request.network or request.network_args:
        return path, ("cannot join existing --netns-path and create a new network namespace with --net/-n",)
    return path, ()


def _fusemounts(request: LaunchRequest, config: SysConfig,
                host: HostInfo) -> tuple[tuple[FuseMountSpec, ...], tuple[MountSpec, ...]]:
    """--fusemount (singpy.launch.fusemount, imported only then): the specs and their mount points."""
    if not request.fusemount:
        return (), ()
    from singpy.launch.fusemount import plan_fusemounts

    return plan_fusemounts(request.fusemount, uid=host.uid, enabled=config.flag("enable fusemount"),
                           host_path=host.env.get("PATH", "") or DEFAULT_PATH)


def _joined(request: LaunchRequest, host: HostInfo) -> InstanceRecord | None:
    """The record of the instance joined (instance://NAME), None without one: its --security, --allow-setuid."""
    if not request.instance:
        return None
    from singpy.launch.instance import instance_record

    return instance_record(host.home, host.user, host.uid, request.instance)


def _security(request: LaunchRequest, host: HostInfo, privileges: Privileges,
              joined: InstanceRecord | None) -> SecuritySpec | None:
    """--security (singpy.launch.security, imported only then); joining an instance, the instance's too (its
    record's, after the command's own: the first value of a feature wins)."""
    values = (*request.security, *(joined.security if joined else ()))
    if not values:
        return None
    from singpy.launch.security import plan_security

    return plan_security(values, uid=host.uid, kept_caps=privileges.keep)


def _identity_files(request: LaunchRequest, config: SysConfig, host: HostInfo, home_dest: str,
                    security: SecuritySpec | None) -> tuple[list[MountSpec], tuple[str, ...]]:
    """/etc/passwd and /etc/group with the user's entries (root's with --fakeroot; with --security uid:/gid:,
    the target's, singpy.launch.security: imported only then), and the warnings."""
    passwd, group = config.flag("config passwd"), config.flag("config group")
    # instance://: the instance's container, files and all, written when it started (so no warning again)
    if security is None or not (security.uid or security.gids) or request.instance:
        specs = system.identity_files(host, home=home_dest, fakeroot=request.fakeroot, passwd=passwd, group=group,
                                      root=root_entry() if request.fakeroot and passwd else None)
        return specs, system.unknown_group(host.gid) if group and not host.group and not request.instance else ()
    from singpy.launch.security import target_identity

    target = target_identity(security, host)
    if target is None:
        return [], (f"--security uid:{security.uid}: the host has no passwd entry for uid {security.uid}: the "
                    "image's /etc/passwd and /etc/group are left as they are",)
    entry, groups = target  # uid: alone whose primary group has no name: no /etc/group, a warning (Apptainer's)
    warned = system.unknown_group(entry[2]) if group and not security.gids and not groups else ()
    return system.identity_files_of(entry, groups, home=home_dest, passwd=passwd, group=group), warned


def _fakeroot(request: LaunchRequest, host: HostInfo) -> IdMap | None:
    if not request.fakeroot:
        return None
    from singpy.layers.fakeroot import fakeroot_id_map

    return fakeroot_id_map(uid=host.uid, gid=host.gid, user=host.user, ignore_subuid=request.ignore_subuid,
                           ignore_userns=request.ignore_userns)


def _privileges(request: LaunchRequest, config: SysConfig, host: HostInfo) -> Privileges:
    default = config.text("root default capabilities")
    file_caps: tuple[str, ...] = ()
    if host.uid == 0 and default == "file" and not (request.fakeroot or request.keep_privs or request.no_privs):
        file_caps = caps.read_capability_file(os.path.join(confdir(config), "capability.json"), "root")
    return caps.plan_privileges(uid=host.uid, fakeroot=request.fakeroot, keep_privs=request.keep_privs,
                                no_privs=request.no_privs, add=caps.parse_names(request.add_caps, "--add-caps"),
                                drop=caps.parse_names(request.drop_caps, "--drop-caps"), root_default=default,
                                file_caps=file_caps)


def _home(request: LaunchRequest, host: HostInfo) -> tuple[str, str]:
    """(source, destination) of the home directory; --home is checked as --bind is (singpy.mounts.parse)."""
    if request.home is None:  # --fakeroot: root's home is /root, Apptainer binds the user's home there
        return host.home, "/root" if request.fakeroot else host.home
    bad = f"bad --home {shown(request.home)!r}"
    parts = request.home.split(":")
    # Mistakes in the flag's own text are the command line's (exit 1, docs/usage.md), as --bind's are.
    if len(parts) > 2 or not parts[0]:
        raise UsageError(f"{bad}: expected src[:dest]")
    source, dest = parts[0], parts[-1] or parts[0]
    if len(parts) == 2 and parts[1] and not os.path.isabs(parts[1]):
        raise UsageError(f"{bad}: destination must be an absolute path")
    from singpy.mounts.parse import checked_pair  # only for --home: not on a plain run's path

    try:
        return checked_pair(source, dest, host.cwd, bad=bad,
                            onto_root="--home can't use the container's root directory / as the home directory")
    except BindSpecError as error:
        raise UsageError(error.message, hint=error.hint) from None


def _mounts(request: LaunchRequest, config: SysConfig, host: HostInfo, namespaces: Namespaces, home_source: str,
            home_dest: str, identity: list[MountSpec], *, no_layer: bool) -> list[MountSpec]:
    skipped = set(request.no_mount)  # --no-mount
    dev = "minimal" if request.contain and config.text("mount dev") == "yes" else config.text("mount dev")
    mounts = system.kernel_mounts(new_pid=namespaces.pid, proc=config.flag("mount proc") and "proc" not in skipped,
                                  sys=config.flag("mount sys") and "sys" not in skipped,
                                  dev="no" if "dev" in skipped else dev,
                                  devpts=config.flag("mount devpts") and "devpts" not in skipped)
    mounts += identity
    mounts += system.host_files(system.kept_bind_paths(config.items("bind path"), skipped),
                                resolv_conf=config.flag("config resolv_conf") and not request.dns
                                and not skipped & {"bind-paths", "/etc/resolv.conf"})
    if request.dns:
        from singpy.launch import network as net

        mounts.append(net.resolv_conf(net.parse_dns(request.dns)))
    if request.hostname and namespaces.uts:  # the name in /etc/hostname too, as Apptainer's addHostnameMount
        mounts.append(system.hostname_file(request.hostname))
    if config.flag("mount hostfs") and "hostfs" not in skipped:
        mounts += system.hostfs_mounts(_read("/proc/self/mountinfo"))
    mounts += system.tmp_mounts(contain=request.contain, enabled=config.flag("mount tmp") and "tmp" not in skipped)
    home = system.home_mounts(source=_home_source(request, home_source), dest=home_dest,
                              enabled=_home_enabled(request, config, home_dest), asked=request.home is not None,
                              no_layer=no_layer, covered=mounts)
    mounts += home
    if not request.contain and "cwd" not in skipped:
        mounts += system.cwd_mount(host.cwd, home + mounts)
    return mounts


def _home_enabled(request: LaunchRequest, config: SysConfig, home_dest: str) -> bool:
    """Whether a home is mounted: a --home is even with `mount home = no`; a home of `/` (HOME=/, as for some
    system accounts) is not: it would hide the image. Both as in Apptainer."""
    if request.no_home or "home" in request.no_mount or home_dest == "/":
        return False
    if request.home is None:
        return config.flag("mount home")
    if not config.flag("user bind control"):
        raise BindSpecError("--home is disabled by the system administrator (user bind control = no)")
    return True


def _home_source(request: LaunchRequest, source: str) -> str | None:
    """The host directory bound as the home, or None for an empty one (a tmpfs): --contain empties the default
    home but binds a --home, and a home missing on the host is an empty one at its place, as in Apptainer."""
    if request.contain and request.home is None:
        return None
    try:
        is_dir = stat.S_ISDIR(os.stat(source).st_mode)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise BindSpecError(f"can't use home directory {shown(source)}: {error.strerror}") from None
    if not is_dir:
        raise BindSpecError(f"home directory {shown(source)} is not a directory")
    return source


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _user_binds(request: LaunchRequest, config: SysConfig) -> list[MountSpec]:
    if request.binds and not config.flag("user bind control"):
        raise BindSpecError("user binds are disabled by the system administrator (user bind control = no)")
    specs = []
    for bind in request.binds:
        if not os.path.exists(bind.source):
            raise BindSpecError(f"bind source {bind.source} does not exist")
        specs.append(MountSpec(op=MountOp.BIND, source=bind.source, dest=bind.dest, readonly=bind.readonly,
                               missing=Missing.REQUIRED, stage=Stage.USER, asked=True))
    return specs


def _env_plan(request: LaunchRequest, host: HostInfo, image: ImageSpec, home_dest: str,
              keep_host_env: tuple[str, ...]) -> tuple[EnvPlan, list[str]]:
    injected, warnings = injected_from_host(host.env)
    flags = dict(request.env)
    warnings += [f"ignored environment file variable {name}: override from --env" for name, value in request.env_file
                 if flags.get(name, value) != value and not is_protected(name)]  # Apptainer's words; see below
    # Apptainer turns both into APPTAINERENV_X: the names that injection may not set are refused here too.
    for origin, pairs in (("--env-file", request.env_file), ("--env", request.env)):  # --env-file < --env
        for name, value in pairs:
            if is_protected(name):
                warnings.append(f"overriding {name} environment variable with {origin} is not permitted")
                continue
            injected[name] = value
    injected, rules = split_path_rules(injected)
    base = {"HOME": home_dest, "PATH": DEFAULT_PATH}
    if request.cleanenv:
        base["LANG"] = "C"
    name = os.path.basename(image.path)
    # As Apptainer's launcher: the destinations of the user's binds, for a container started inside this one.
    binds = ",".join(bind.dest for bind in request.binds)
    for prefix in ("SINGULARITY", "APPTAINER"):
        base.update({f"{prefix}_CONTAINER": image.path, f"{prefix}_NAME": name,
                     f"{prefix}_COMMAND": request.action, f"{prefix}_BIND": binds})
        if request.shell:  # Apptainer sets it with --shell
            base[f"{prefix}_SHELL"] = request.shell
        if request.no_eval:  # the runscript of an OCI image reads it (Apptainer's launcher sets it too)
            base[f"{prefix}_NO_EVAL"] = "1"
        if request.app:  # the image's 95-apps.sh reads it: the app's PATH, LD_LIBRARY_PATH and env scripts
            base[f"{prefix}_APPNAME"] = request.app
    base["PS1"] = "Singpy> "
    host_env = host_passthrough(host.env, cleanenv=request.cleanenv, keep=keep_host_env, blocked=request.no_env)
    plan = EnvPlan(base=tuple(base.items()), injected=tuple(injected.items()),
                   prepend_path=rules.get("PREPEND_PATH", ""), append_path=rules.get("APPEND_PATH", ""),
                   path=rules.get("PATH", ""), host=tuple(host_env.items()), evaluate=not request.no_eval)
    return plan, warnings


def _cwd(request: LaunchRequest, host: HostInfo, home_dest: str) -> str:
    if request.pwd:
        problem = path_problem(request.pwd)
        if problem:
            raise UsageError(f"bad --pwd {shown(request.pwd)!r}: {problem}")
        return request.pwd
    return home_dest if request.contain else host.cwd

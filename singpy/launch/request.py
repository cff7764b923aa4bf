"""LaunchRequest: what the user asked for, typed (the command line makes it, the planner reads it).

Below the planner and singpy.launch.jobs, which both read it (the planner
re-exports it); imports only the base.
"""

from __future__ import annotations

from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.mounts.parse import BindSpec


class LaunchRequest(Record):
    """What the user asked for, typed and validated by the command line."""

    action: str  # "exec", "run", "shell" or "test"
    image: str  # image reference as given
    args: tuple[str, ...]  # payload arguments (for exec: the command and its arguments)
    binds: tuple[BindSpec, ...] = ()
    contain: bool = False
    cleanenv: bool = False
    env: tuple[tuple[str, str], ...] = ()  # --env, in order
    env_file: tuple[tuple[str, str], ...] = ()  # merged --env-file contents, in order
    home: str | None = None  # --home src[:dest]
    no_home: bool = False
    pwd: str | None = None
    writable_tmpfs: bool = False
    writable: bool = False  # --writable: the image (a sandbox) or its overlay partition (a SIF) is written
    overlays: tuple[str, ...] = ()  # --overlay values, as given (PATH[:ro], comma lists)
    hostname: str | None = None
    pid: bool = False
    ipc: bool = False
    uts: bool = False
    shell: str | None = None
    no_eval: bool = False  # --no-eval: injected values are not evaluated by the container's shell
    unsquash: bool = False  # --unsquash: extract a SIF/squashfs image instead of mounting it
    passphrase: bool = False  # --passphrase: ask for an encrypted image's passphrase (image.cryptkey)
    pem_path: str = ""  # --pem-path: the RSA private key of an encrypted image
    nv: bool = False  # --nv (or `always use nv`)
    rocm: bool = False  # --rocm (or `always use rocm`)
    intel_hpu: bool = False  # --intel-hpu: Intel Gaudi accelerators in a minimal /dev (singpy.gpu.intelhpu)
    net: bool = False  # --net: a new network namespace
    network: str | None = None  # --network TYPE (implies --net)
    network_args: tuple[str, ...] = ()  # --network-args values, as given
    dns: tuple[str, ...] = ()  # --dns values, as given (comma lists)
    fakeroot: bool = False  # --fakeroot: uid 0 inside a user namespace
    ignore_subuid: bool = False  # --ignore-subuid (hidden): --fakeroot's single mapping, whatever /etc/subuid says
    ignore_userns: bool = False  # --ignore-userns (hidden): no single mapping (singpy.layers.fakeroot_id_map)
    keep_privs: bool = False  # --keep-privs (root)
    no_privs: bool = False  # --no-privs
    allow_setuid: bool = False  # --allow-setuid (root, no user namespace): set-uid programs work (singpy.launch.setuid)
    add_caps: tuple[str, ...] = ()  # --add-caps values, as given
    drop_caps: tuple[str, ...] = ()  # --drop-caps values, as given
    no_mount: tuple[str, ...] = ()  # --no-mount names, checked (singpy.mounts.system.check_no_mount)
    no_init: bool = False  # --no-init: with --pid, the payload is PID 1
    no_umask: bool = False  # --no-umask: the payload starts with umask 0022, not the caller's
    userns: bool = False  # -u/--userns: a user namespace even as root (root mapped to itself)
    nvccli: bool = False  # --nvccli: the library list must come from nvidia-container-cli
    compat32: bool = False  # --compat32: with --nv/--rocm, the 32-bit GPU libraries too (singpy.gpu.compat32)
    containlibs: tuple[str, ...] = ()  # --containlibs (hidden): host files into /.singularity.d/libs, PATH[:NAME]
    app: str = ""  # --app NAME: a SCIF app of the image (its environment; `run` runs its runscript)
    instance: str = ""  # the NAME of instance://NAME: join that running instance (singpy.launch.instance)
    sharens: bool = False  # --sharens: share the container with the others started by the same parent process
    no_sharens: bool = False  # --no-sharens: no shared container for the ranks of a job step (singpy.launch.shared)
    underlay: bool = False  # --underlay: the mount points the image lacks in an underlay, not an overlay
    devices: tuple[str, ...] = ()  # --device values, as given (CDI names VENDOR/CLASS=NAME, comma lists)
    cdi_dirs: tuple[str, ...] = ()  # --cdi-dirs directories, in order; () for the CDI defaults (singpy.gpu.cdi)
    netns_path: str = ""  # --netns-path: join this network namespace (singpy.launch.netnspath)
    security: tuple[str, ...] = ()  # --security values, as given (singpy.launch.security)
    fusemount: tuple[str, ...] = ()  # --fusemount specs, as given (singpy.launch.fusemount)
    workdir: str = ""  # -W/--workdir: absolute, an existing directory (singpy.mounts.workdir)
    scratch: tuple[str, ...] = ()  # -S/--scratch: absolute container paths, normalised (singpy.mounts.workdir)
    no_env: tuple[str, ...] = ()  # --no-env: host variables kept out of the container (singpy.env.environ)
    no_nv: bool = False  # --no-nv: `always use nv = yes` does not apply
    no_rocm: bool = False  # --no-rocm: `always use rocm = yes` does not apply
    runscript_timeout: str = ""  # run --runscript-timeout, a Go duration checked by singpy.launch.scripttimer
    limits: tuple[tuple[str, object], ...] = ()  # resource limit flags as given (LIMIT_OPTIONS): singpy.cgroups


# The resource limit flags (their `dest`s): a launch with none of them has no cgroup (singpy.cgroups.request).
LIMIT_OPTIONS = ("apply_cgroups", "cpus", "cpu_shares", "cpuset_cpus", "cpuset_mems", "memory", "memory_reservation",
                 "memory_swap", "oom_kill_disable", "pids_limit", "blkio_weight", "blkio_weight_device")

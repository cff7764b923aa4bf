"""The launch plan: frozen data handed from the planner to the launch phases.

Nothing here does I/O. A plan is built once by `singpy.launch.planner.build_plan`
and never mutated; `--dry-run` prints it as JSON.
"""

from __future__ import annotations

from singpy.env.environ import EnvPlan
from singpy.record import Record

# MountOp, Missing and Stage are classes of plain constants, not enums: `enum` and what it imports cost ~4 ms
# of every `singpy exec` (issue 31). For mypy each has a Literal type (MountOpName, MissingPolicy, StageOrder)
# whose members the constants are, so a `match` over them still ends in an exhaustive `assert_never`.
TYPE_CHECKING = False  # `typing` itself is not loaded at start-up; mypy treats this name as True
if TYPE_CHECKING:
    from typing import Final, Literal, TypeAlias

    MountOpName: TypeAlias = Literal["bind", "tmpfs", "proc", "devpts", "mqueue", "file", "symlink", "seal"]
    MissingPolicy: TypeAlias = Literal["required", "skip"]
    StageOrder: TypeAlias = Literal[10, 20, 30, 40, 50]


class MountOp:
    """What one mount step does; `singpy.mounts.apply` handles every member."""

    BIND: Final = "bind"  # bind a host path (file or directory, recursively)
    TMPFS: Final = "tmpfs"  # an empty, writable tmpfs
    PROC: Final = "proc"  # a fresh procfs (only inside a new pid namespace)
    DEVPTS: Final = "devpts"  # a private devpts instance, with /dev/ptmx pointing at it
    MQUEUE: Final = "mqueue"  # a POSIX message queue filesystem (new ipc namespace)
    FILE: Final = "file"  # a file written by the launcher (passwd, group), bound read-only
    SYMLINK: Final = "symlink"  # a symbolic link created in a tmpfs (minimal /dev)
    # make `dest`, a TMPFS, and every mount below it read-only, nosuid, nodev; it ends the tmpfs's block: the
    # TMPFS, then only BINDs and SYMLINKs directly in it, then the SEAL (singpy.gpu.merge keeps them so)
    SEAL: Final = "seal"
    ALL: Final = frozenset({BIND, TMPFS, PROC, DEVPTS, MQUEUE, FILE, SYMLINK, SEAL})


class Missing:
    """What to do when a mount cannot be made as planned.

    That is: its host source is absent, or its destination can't be made without
    leaving the container's own filesystems (a missing mount point is created
    only in the image's overlay layer or in a tmpfs singpy mounted, never in a
    directory bound from the host), or the path leads nowhere (a link loop, a
    file where a directory must be).
    """

    REQUIRED: Final = "required"  # the launch fails with one FATAL line naming the path
    SKIP: Final = "skip"  # the mount is left out, with a --verbose note (host facts and images vary)
    ALL: Final = frozenset({REQUIRED, SKIP})


class Stage:
    """Order in which mounts are applied; a later stage wins over an earlier one."""

    KERNEL: Final = 10  # /proc, /sys, /dev
    SYSTEM_FILES: Final = 20  # passwd, group, hosts, resolv.conf, bind path
    HOME_TMP: Final = 30  # home, /tmp, /var/tmp, cwd
    GPU: Final = 40  # --nv / --rocm devices, libraries, binaries
    USER: Final = 50  # --bind
    ALL: Final = frozenset({KERNEL, SYSTEM_FILES, HOME_TMP, GPU, USER})


class MountSpec(Record):
    """One mount step inside the container root."""

    op: MountOpName
    dest: str  # absolute path inside the container
    source: str | None = None  # absolute host path (BIND) or link target (SYMLINK)
    content: str | None = None  # file content (FILE)
    readonly: bool = False  # BIND, FILE: mounted read-only
    mode: str = "0755"  # TMPFS: octal mode of its root directory ("1777" for /tmp, /var/tmp, /dev/shm)
    missing: MissingPolicy = Missing.REQUIRED  # when the mount can't be made as planned; see Missing
    stage: StageOrder = Stage.USER  # ordering key; see Stage
    dev: bool = False  # keep device nodes usable (nodev is set otherwise on binds from /dev)
    merge: bool = True  # FILE: merged with the image's file as Apptainer (passwd, group: mounts.system); False: replace
    setuid: bool = False  # BIND, TMPFS: without nosuid, a host bind's cleared too (--allow-setuid: launch.setuid)
    asked: bool = False  # BIND: named by the user (--bind, --mount, --home SRC:DST); another asked bind below
    #                      it may get its mount point made in this one's host directory (singpy.mounts.apply)


class HostDir(Record):
    """A host directory the launch makes before the mounts, where missing (--workdir's tmp, var_tmp, home and
    scratch: singpy.mounts.workdir); it is the user's and stays."""

    path: str  # absolute host path; its parent exists or comes earlier in the plan
    mode: str = "0755"  # octal mode it gets when made ("1777" for tmp and var_tmp)


class Namespaces(Record):
    """Which namespaces the container gets (mount is always new)."""

    user: bool  # a new user namespace (always, unless the invoker is root)
    pid: bool = False
    ipc: bool = False
    uts: bool = False
    net: bool = False


class Privileges(Record):
    """The payload's capabilities (singpy.kernel.caps applies them just before execve)."""

    keep: tuple[str, ...] | None = None  # names of the capabilities kept ("CAP_NET_RAW"); None: all, no change
    as_root: bool = False  # the payload runs as uid 0 (root, --fakeroot): every set is trimmed, not just bounding


class NetworkSpec(Record):
    """The container's network namespace (--net); see singpy.launch.network."""

    type: str  # "none" (loopback only), "bridge" or "ptp"
    bridge: str = ""  # host bridge the container's veth joins (bridge)
    subnet: str = ""  # IPv4 CIDR the container's address comes from; its first address is the gateway
    address: str = ""  # address asked for with --network-args IP=, "" to take a free one


class IdMap(Record):
    """--fakeroot: how ids inside the user namespace map to host ids (singpy.layers.fakeroot)."""

    uids: tuple[tuple[int, int, int], ...]  # (first id inside, first id outside, count), as in uid_map
    gids: tuple[tuple[int, int, int], ...]  # the same for groups
    helper: bool  # written from outside by newuidmap/newgidmap (subordinate ranges), else by the launcher
    note: str  # which mapping was chosen and why, printed at --verbose


class SeccompRule(Record):
    """One rule of a --security seccomp: profile: these system calls get this action (under these conditions)."""

    names: tuple[str, ...]  # system call names, as libseccomp resolves them
    action: str  # SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL...
    errno: int = 1  # SCMP_ACT_ERRNO's error number (the profile's errnoRet; EPERM without one)
    args: tuple[tuple[int, str, int, int], ...] = ()  # (index, SCMP_CMP_EQ..., value, valueTwo), all must hold


class SeccompFilter(Record):
    """--security seccomp:PROFILE.json: the profile as read (singpy.launch.security), installed just before execve."""

    profile: str  # the host path it was read from, for messages
    default_action: str
    default_errno: int = 1
    architectures: tuple[str, ...] = ()  # SCMP_ARCH_* besides the native one
    rules: tuple[SeccompRule, ...] = ()


class SecuritySpec(Record):
    """--security: what singpy.launch.security applies to the payload just before execve."""

    uid: int | None = None  # uid:N (root only): the payload's user id
    gids: tuple[int, ...] = ()  # gid:N[:M...] (root only): its group, then its supplementary groups
    seccomp: SeccompFilter | None = None  # seccomp:PROFILE
    apparmor: str = ""  # apparmor:PROFILE, the AppArmor profile it is executed under
    selinux: str = ""  # selinux:CONTEXT, the SELinux context it is executed in


class FuseMountSpec(Record):
    """--fusemount: a FUSE program serving a mount the launcher made on /dev/fuse (singpy.launch.fusemount)."""

    side: str  # "host": the program runs in the host's file tree; "container": in the container's
    program: tuple[str, ...]  # the program (host: its host path) and its arguments; `/dev/fd/N` is added last
    mountpoint: str  # absolute path inside the container (a TMPFS of the mount plan makes it, the FUSE mount covers it)
    daemon: bool = False  # host-daemon / container-daemon: as host / container (the container's PID 1 outlives it)


class ProcessSpec(Record):
    """What is executed inside the container.

    The runscript, the shell and the env scripts are looked up inside the
    container root once it is in place (a SIF's content is not known before).
    """

    action: str  # "exec", "run", "shell", "test" or "boot" (an instance's PID 1 is /sbin/init: singpy.launch.boot)
    args: tuple[str, ...]  # exec: command and arguments; run: runscript arguments
    env: EnvPlan  # the environment rules, applied in the container (singpy.env.environ)
    cwd: str  # working directory inside the container
    cwd_required: bool = False  # --pwd: a cwd missing in the container is an error, not a fallback to the home
    shell: str | None = None  # --shell, for the shell action
    privileges: Privileges = Privileges()  # capabilities left to the payload (applied just before execve)
    umask: int | None = None  # --no-umask: the payload's umask (0o022); None keeps the caller's, as Apptainer
    init: bool = True  # with a PID namespace: singpy's init is PID 1 (False: --no-init, the payload is)
    no_new_privs: bool = True  # set before execve; False only for --allow-setuid (singpy.launch.setuid)
    app: str = ""  # --app: a SCIF app of the image; `run` executes /scif/apps/APP/scif/runscript
    runscript_timeout: str = ""  # run --runscript-timeout (Go duration): the env scripts' deadline (launch.scripttimer)
    security: SecuritySpec | None = None  # --security: seccomp filter, ids, AppArmor/SELinux (None: none asked)
    # (descriptor, inode of its pipe): one byte written on it right before the payload's execve, and only then: the
    # go of the image's background unpacking (ImageSpec.go_pipe, singpy.image.warm), which a failed launch never
    # sends; close-on-exec, so the payload never holds it; skipped if the descriptor is no longer that pipe (a process
    # that closed it: an instance's holder); (-1, 0): none
    go_pipe: tuple[int, int] = (-1, 0)
    # (descriptor, inode of its file): a shared flock on the in-use file of the cache entry whose tree is the root
    # (ImageSpec.in_use, singpy.image.cache.hold_entry), which `singpy cache clean` never removes while it is held;
    # made inheritable right before the payload's execve, so the payload holds it for the container's whole life
    # (as a supervisor does, never exec'ing); skipped if the descriptor is no longer that file; (-1, 0): none
    in_use: tuple[int, int] = (-1, 0)


class ImageSpec(Record):
    """Where the root filesystem comes from."""

    kind: str  # "sandbox", "sif", "squashfs" or "ext3" (Singularity 2.x; mounted by singpy.image.extfs)
    path: str  # absolute host path of the image
    rootfs: str | None = None  # host directory of the root filesystem, when known at plan time
    offset: int = 0  # byte offset of the squashfs partition (or ext3 filesystem) inside the file
    size: int = 0  # size in bytes of that partition (0: to the end)
    arch: str = ""  # image architecture when the format records it
    strategy: str = "directory"  # how the root is obtained: directory, loop, fuse or extract (image.squashfs)
    tool: str = ""  # host path of the program the strategy runs (squashfuse, unsquashfs)
    cache: str = ""  # the user's extraction cache directory (extract)
    # `unsquash in background` (singpy.image.warm), for a user's FUSE run: "cached" (the tree a background unpacking
    # left in `cache`, used as `extract`), "background" (FUSE now, the image unpacked into `cache` behind this run),
    # "background-or-wait" (the same, or, if an unpacking of this small image is under way, wait for it and use its
    # tree), "" (none)
    warm: str = ""
    unpacker: str = ""  # host path of unsquashfs for `warm` ("background", "background-or-wait")
    # warm "background": the write end of the go pipe the detached unpacking waits on, and the pipe's inode, from
    # singpy.image.warm.start to the planner, which moves it into ProcessSpec.go_pipe (the launch sends its byte at
    # the payload's execve); (-1, 0): none (no unpacking started, --dry-run, or in a LaunchPlan)
    go_pipe: tuple[int, int] = (-1, 0)
    # a tree of the cache (extract, warm "cached"): its held in-use lock, from singpy.image.squashfs.prepare to the
    # planner, which moves it into ProcessSpec.in_use; (-1, 0): none (not a cached tree, --dry-run, in a LaunchPlan)
    in_use: tuple[int, int] = (-1, 0)
    overlay_offset: int = 0  # sif: byte offset of its writable overlay partition (ext3), 0 when it has none
    overlay_size: int = 0  # sif: that partition's size in bytes
    encryption: str = ""  # sif: "gocryptfs" or "luks" (dm-crypt) for an encrypted root (image.cryptmount), or ""
    gocryptfs: str = ""  # host path of gocryptfs (encrypted images)
    key: str = ""  # where the key came from ("passphrase from --passphrase"): never the key (image.cryptkey)

    def overlay_partition(self) -> tuple[int, int] | None:
        """(offset, size) of the SIF's overlay partition, found with its primary partition (image.detect)."""
        return (self.overlay_offset, self.overlay_size) if self.overlay_offset else None


class OverlaySpec(Record):
    """One layer put over the image's root: an --overlay, or the SIF's own overlay partition with --writable.

    Apptainer's layout: the layer's files are in `upper/` and the kernel's
    scratch in `work/`, both at the top of the directory or of the ext3
    filesystem.
    """

    path: str  # absolute host path: a directory, an ext3 image file, or the SIF holding the partition
    kind: str  # "dir" (a host directory) or "extfs" (an ext3 filesystem in a file)
    readonly: bool = False  # :ro, a lower layer only; the one writable overlay (at most one) is the top layer
    offset: int = 0  # extfs: byte offset of the filesystem in the file (a SIF partition), 0 for a whole file
    size: int = 0  # extfs: its size in bytes (0: to the end of the file)
    strategy: str = "directory"  # directory (kind dir), loop (root: kernel ext3 on a loop device) or fuse (fuse2fs)
    tool: str = ""  # host path of fuse2fs (strategy fuse)


class ShareSpec(Record):
    """Ranks of one job step on one node in one container (singpy.launch.shared)."""

    socket: str  # abstract unix socket name where the ranks meet: the job step and a digest of the plan
    origin: str  # in words, for messages: "Slurm job step 12.0", "--sharens (parent 4242)", "instance web"
    create: bool = True  # the first rank makes the container; False: join a running instance only
    runscript: bool = False  # an instance started by `instance run`: it runs the runscript, not the startscript


class CgroupSpec(Record):
    """The container's cgroup (resource limits: singpy.cgroups), made before it starts and removed when it ends."""

    version: int  # 1 (a hierarchy per controller) or 2 (the unified hierarchy)
    dirs: tuple[str, ...]  # the cgroup's directories, made by singpy (v1: one per controller used), removed at the end
    writes: tuple[tuple[str, str], ...]  # (file, value): the limits, written in this order before anything joins
    origin: str = ""  # where the limits come from, for messages: "--apply-cgroups FILE" or "the limit flags"


class LaunchPlan(Record):
    """Everything the launch phases need; nothing after the planner reads argv, env or conf."""

    image: ImageSpec
    namespaces: Namespaces
    uid: int  # the invoking user's id, mapped to itself inside (to 0 with --fakeroot)
    gid: int  # the invoking user's primary group id, mapped to itself inside (to 0 with --fakeroot)
    mounts: tuple[MountSpec, ...]  # applied in this order
    process: ProcessSpec
    hostname: str | None = None  # sethostname() in the new uts namespace
    writable_tmpfs: bool = False  # overlay a writable tmpfs on the image root
    writable: bool = False  # --writable: the image itself (a sandbox) or its overlay partition (a SIF) is written
    overlays: tuple[OverlaySpec, ...] = ()  # layers over the image, lowest first (--overlay, a SIF's partition)
    network: NetworkSpec | None = None  # the network namespace's set-up (with --net), None without
    fakeroot: IdMap | None = None  # --fakeroot: uid 0 inside, mapped to `uid` (and ranges) outside
    staging_fs: str = "tmpfs"  # `memory fs type`: the staging root's filesystem (tmpfs or ramfs): singpy.layers.rootfs
    staging_size: int = 0  # `sessiondir max size` in MiB for it (a user's tmpfs), 0: no limit
    mount_slave: bool = True  # `mount slave`: host mounts made later (automounts) reach the container; else private
    max_loop_devices: int = 256  # `max loop devices`: loop devices numbered below this only (singpy.kernel.loop)
    overlay_driver: str = "kernel"  # root overlay: kernel (overlayfs) or fuse (fuse-overlayfs): layers.overlay
    overlay_tool: str = ""  # host path of fuse-overlayfs: driver fuse, or kernel's fallback should it refuse ("": none)
    # Mount points the image lacks, without an overlay (singpy.layers.underlay): "fallback" (where the kernel refuses
    # the overlay), "always" (`enable underlay = preferred`, --underlay, `enable overlay = no`, an avoided userns
    # overlay) or "no" (never: the overlay's failure is fatal).
    underlay: str = "fallback"
    # `avoid kernel features`: interfaces not used on this kernel, each replaced by its fallback (docs/kernels.md):
    # mount_setattr (a remount per mount), loop_configure (LOOP_SET_FD + LOOP_SET_STATUS64), userns_overlay.
    avoid_features: tuple[str, ...] = ()
    share: ShareSpec | None = None  # join (or make) the container of the other ranks of this job step on this node
    cgroup: CgroupSpec | None = None  # resource limits: the cgroup the container's processes start in (singpy.cgroups)
    join_cgroup: tuple[str, ...] = ()  # instance://NAME: the instance's cgroup directories, joined first
    fusemounts: tuple[FuseMountSpec, ...] = ()  # --fusemount, in order: mounted and started by the container's PID 1
    netns_path: str = ""  # --netns-path: the network namespace joined, on the host, before any other (launch.netnspath)
    host_dirs: tuple[HostDir, ...] = ()  # made on the host, as the user, before any namespace (singpy.mounts.workdir)
    # --allow-setuid (root, no user namespace): the image's root and its layers mounted without nosuid, before the
    # mounts (those marked `setuid` too); /proc, /sys, /dev, the launcher's files and GPU libraries keep it
    allow_setuid: bool = False

    def no_layer(self) -> str:
        """Why the mount points the image lacks can't be added to it ("" when they can); see `no_layer`."""
        return no_layer(writable=self.writable, overlays=bool(self.overlays), overlay_driver=self.overlay_driver,
                        underlay=self.underlay)

    def to_json_data(self) -> dict[str, object]:
        """A JSON-ready dict (enums as their values) for --dry-run and logging."""
        return self.as_dict()


def no_layer(*, writable: bool, overlays: bool, overlay_driver: str, underlay: str) -> str:
    """Why a launch gets no layer of the mount points the image lacks ("" when it does: an overlay layer or
    the underlay). The planner stages the home for such a launch (singpy.mounts.system.home_mounts) and
    apply_mounts names the reason when a mount point is missing."""
    if writable and not overlays:  # the image itself is the root, read-write (a sandbox, an ext3 image)
        return "with --writable, singpy makes no mount point in the image"
    if overlay_driver == "none" and underlay == "no":
        return ("`enable overlay = no` and `enable underlay = no` in the configuration: singpy can't add mount "
                "points to the image")
    return ""

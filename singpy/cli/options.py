"""Every flag of `run`, `exec` and `shell`, declared once.

Each `Option` names its long and short forms, whether it takes a value, the
environment variables that set it (`SINGULARITY_X`, `APPTAINER_X` and
`SINGPY_X`, as Apptainer's `EnvKeys`), and its help. The fast parser in
`singpy.cli.parse` and the help text are both generated from this table.
Apptainer's names are kept so that users' habits and scripts carry over.
"""

from __future__ import annotations

from singpy.record import Record

ENV_PREFIXES = ("SINGULARITY_", "APPTAINER_", "SINGPY_")


class Option(Record, kw_only=False):
    dest: str  # attribute name in the parsed result
    long: str  # e.g. "--bind"
    help: str  # one line
    short: str = ""  # e.g. "-B"
    value: str = ""  # metavar when the option takes a value, "" for a boolean flag
    repeat: bool = False  # may be given several times (values collected in order)
    env: str = ""  # suffix of the SINGULARITY_/APPTAINER_/SINGPY_ variables, "" for none
    env_also: tuple[str, ...] = ()  # further suffixes read the same way (Apptainer's other EnvKeys)
    env_appends: bool = False  # the variable adds to command-line values instead of standing in for them
    group: str = "Options"  # help section
    # the commands that take it ("run", "instance run"...), () for every one; elsewhere the flag is unknown and its
    # variables are not read (Apptainer's RegisterFlagForCmd)
    commands: tuple[str, ...] = ()
    hidden: bool = False  # taken, and left out of the help (as Apptainer's Hidden flags)


ACTION_OPTIONS: tuple[Option, ...] = (
    Option("bind", "--bind", "bind a host path: src[:dest[:ro|rw]], comma lists allowed ('\\,' is a comma)", "-B",
           "SPEC", repeat=True, env="BIND", env_appends=True, env_also=("BINDPATH",), group="Mounts"),
    Option("mount", "--mount", "a bind in docker's syntax: type=bind,src=PATH,dst=PATH[,ro] (CSV quoting)",
           value="SPEC", repeat=True, env="MOUNT", env_appends=True, group="Mounts"),
    Option("no_mount", "--no-mount", "leave out default mounts: home,tmp,cwd,hostfs,bind-paths,dev,devpts,proc,sys "
           "or a `bind path` destination", value="LIST", repeat=True, env="NO_MOUNT", group="Mounts"),
    Option("contain", "--contain", "minimal /dev, empty /tmp and home; no cwd bind", "-c", env="CONTAIN",
           group="Isolation"),
    Option("containall", "--containall", "--contain plus --cleanenv, --pid and --ipc", "-C",
           env="CONTAINALL", group="Isolation"),
    Option("compat", "--compat", "OCI/Docker-like: --containall, --no-init, --no-umask, --no-eval, --writable-tmpfs",
           env="COMPAT", group="Isolation"),
    Option("cleanenv", "--cleanenv", "do not pass the host environment into the container", "-e",
           env="CLEANENV", group="Environment"),
    Option("env", "--env", "set a container variable: NAME=VALUE (comma lists allowed)", value="NAME=VALUE",
           repeat=True, group="Environment"),
    Option("env_file", "--env-file", "read container variables from a file of shell assignments (NAME=VALUE)",
           value="FILE", repeat=True, env="ENV_FILE", group="Environment"),
    Option("home", "--home", "home directory: src[:dest] (default: your home)", "-H", "SPEC", env="HOME",
           group="Mounts"),
    Option("no_home", "--no-home", "do not bind the home directory", env="NO_HOME", group="Mounts"),
    Option("pwd", "--pwd", "initial working directory inside the container (must exist there)", value="DIR",
           env="PWD", env_also=("TARGET_PWD",), group="Mounts"),
    Option("pwd", "--cwd", "synonym for --pwd", value="DIR", env="CWD", env_also=("TARGET_CWD",), group="Mounts"),
    Option("writable_tmpfs", "--writable-tmpfs", "make the image writable, changes kept in memory only",
           env="WRITABLE_TMPFS", group="Mounts"),
    Option("writable", "--writable", "write the image itself: a sandbox, or a SIF's overlay partition", "-w",
           env="WRITABLE", group="Mounts"),
    Option("overlay", "--overlay", "an overlay over the image: a directory or ext3 image, PATH[:ro] (comma lists)",
           "-o", "PATH", repeat=True, env="OVERLAY", env_also=("OVERLAYIMAGE",), group="Mounts"),
    Option("underlay", "--underlay", "use underlay instead of overlay: the mount points the image lacks as binds "
           "of its entries", env="UNDERLAY", group="Mounts"),
    Option("unsquash", "--unsquash", "extract a SIF/squashfs image to the cache instead of mounting it",
           env="UNSQUASH", group="Mounts"),
    # Encrypted images: the key's variables (ENCRYPTION_PASSPHRASE, _PEM_PATH, _PEM_DATA) are read by
    # singpy.image.cryptkey in Apptainer's order, not as these flags' values (Apptainer's getEncryptionMaterial).
    Option("passphrase", "--passphrase", "prompt for an encryption passphrase (an encrypted image)", group="Images"),
    Option("pem_path", "--pem-path", "the RSA private key (PEM) of an encrypted image", value="PRIVATE.pem",
           group="Images"),
    Option("hostname", "--hostname", "set the container's hostname (implies --uts)", value="NAME",
           env="HOSTNAME", group="Isolation"),
    Option("pid", "--pid", "run in a new PID namespace", "-p", env="PID", env_also=("UNSHARE_PID",),
           group="Isolation"),
    Option("sharens", "--sharens", "share one container with the others started by the same parent process",
           env="SHARENS", group="Isolation"),
    Option("no_sharens", "--no-sharens", "in a Slurm or MPI job, give each rank a container of its own",
           env="NO_SHARENS", group="Isolation"),
    Option("no_init", "--no-init", "with --pid, the payload itself is PID 1 (no init process)", env="NOSHIMINIT",
           env_also=("NO_INIT",), group="Isolation"),
    Option("ipc", "--ipc", "run in a new IPC namespace", "-i", env="IPC", env_also=("UNSHARE_IPC",),
           group="Isolation"),
    Option("boot", "--boot", "run the image's /sbin/init as the instance's PID 1 (root only; implies --contain, "
           "--pid, --uts, --net)", env="BOOT", group="Isolation", commands=("instance start", "instance run")),
    Option("uts", "--uts", "run in a new UTS namespace", env="UTS", env_also=("UNSHARE_UTS",), group="Isolation"),
    Option("net", "--net", "run in a new network namespace (root: bridge network; users: loopback only)", "-n",
           env="NET", env_also=("UNSHARE_NET",), group="Network"),
    Option("network", "--network", "network type: bridge (root's default), ptp, or none (loopback only)",
           value="TYPE", env="NETWORK", group="Network"),
    Option("network_args", "--network-args", "network arguments: IP=ADDRESS to choose the address",
           value="ARGS", repeat=True, env="NETWORK_ARGS", group="Network"),
    Option("dns", "--dns", "DNS servers for the container's /etc/resolv.conf (comma list)", value="IP,...",
           env="DNS", group="Network"),
    Option("netns_path", "--netns-path", "join the network namespace at this path (root, or as allowed by "
           "`allow netns paths` in singpy.conf)", value="PATH", env="NETNS_PATH", group="Network"),
    Option("fusemount", "--fusemount", "a FUSE mount: 'host:PROGRAM ARGS... MOUNTPOINT' or 'container:...' (where "
           "PROGRAM runs; -daemon forms too); implies --pid", value="SPEC", repeat=True, env="FUSESPEC",
           group="Mounts"),
    Option("security", "--security", "security features: seccomp:PROFILE.json, uid:N, gid:N[:N...] (root), "
           "apparmor:PROFILE, selinux:CONTEXT (comma lists)", value="SPEC", repeat=True, env="SECURITY",
           group="Privileges"),
    Option("fakeroot", "--fakeroot", "be root inside the container (in a user namespace), yourself outside", "-f",
           env="FAKEROOT", group="Privileges"),
    # Apptainer's hidden switches of its fakeroot modes (its tests force one with them): singpy.layers.fakeroot
    Option("ignore_subuid", "--ignore-subuid", "--fakeroot: ignore entries inside /etc/subuid (a single mapping)",
           env="IGNORE_SUBUID", group="Privileges", hidden=True),
    Option("ignore_userns", "--ignore-userns", "--fakeroot: ignore user namespaces (no single mapping)",
           env="IGNORE_USERNS", group="Privileges", hidden=True),
    Option("ignore_fakeroot_command", "--ignore-fakeroot-command", "ignore the fakeroot command (singpy never uses "
           "it)", env="IGNORE_FAKEROOT_COMMAND", group="Privileges", hidden=True),
    Option("userns", "--userns", "run in a new user namespace, even as root", "-u", env="USERNS",
           env_also=("UNSHARE_USERNS",), group="Privileges"),
    Option("keep_privs", "--keep-privs", "root keeps all its capabilities, whatever singpy.conf says",
           env="KEEP_PRIVS", group="Privileges"),
    Option("no_privs", "--no-privs", "drop all capabilities (root, --fakeroot)", env="NO_PRIVS", group="Privileges"),
    Option("allow_setuid", "--allow-setuid", "allow set-uid programs in the container (root only)",
           env="ALLOW_SETUID", group="Privileges"),
    Option("add_caps", "--add-caps", "capabilities root keeps in addition (CAP_NET_RAW or net_raw, comma list)",
           value="CAPS", repeat=True, env="ADD_CAPS", group="Privileges"),
    Option("drop_caps", "--drop-caps", "capabilities to drop (comma list)", value="CAPS", repeat=True,
           env="DROP_CAPS", group="Privileges"),
    Option("no_eval", "--no-eval", "take --env and *ENV_ values literally (no shell evaluation inside)",
           env="NO_EVAL", group="Environment"),
    Option("no_umask", "--no-umask", "start with umask 0022 instead of yours", env="NO_UMASK", group="Environment"),
    Option("shell", "--shell", "shell started by `singpy shell`", "-s", "PATH", env="SHELL",
           group="Environment"),
    Option("app", "--app", "a SCIF app of the image (/scif/apps/NAME): its environment, and its runscript for "
           "`run`", value="NAME", env="APP", env_also=("APPNAME",), group="Environment"),
    # Resource limits (singpy.cgroups), Apptainer's flags and EnvKeys (its --cpus reads APPTAINER_CPU_SHARES, a slip
    # singpy does not copy: APPTAINER_CPUS)
    Option("apply_cgroups", "--apply-cgroups", "apply the cgroup limits of a TOML file (Apptainer's, the OCI layout)",
           value="FILE", env="APPLY_CGROUPS", group="Resource limits"),
    Option("cpus", "--cpus", "number of CPUs available to the container (fractions allowed: 1.5)", value="N",
           env="CPUS", group="Resource limits"),
    Option("cpu_shares", "--cpu-shares", "CPU shares (relative weight) for the container", value="N",
           env="CPU_SHARES", group="Resource limits"),
    Option("cpuset_cpus", "--cpuset-cpus", "host CPUs the container may use (0-3,7)", value="LIST",
           env="CPUSET_CPUS", group="Resource limits"),
    Option("cpuset_mems", "--cpuset-mems", "host memory nodes the container may use (0,1)", value="LIST",
           env="CPUSET_MEMS", group="Resource limits"),
    Option("memory", "--memory", "memory limit: bytes, or with a unit (512M, 2G)", value="SIZE", env="MEMORY",
           group="Resource limits"),
    Option("memory_reservation", "--memory-reservation", "memory soft limit: bytes, or with a unit", value="SIZE",
           env="MEMORY_RESERVATION", group="Resource limits"),
    Option("memory_swap", "--memory-swap", "memory plus swap limit, -1 for unlimited swap", value="SIZE",
           env="MEMORY_SWAP", group="Resource limits"),
    Option("oom_kill_disable", "--oom-kill-disable", "disable the OOM killer (cgroup v1)", env="OOM_KILL_DISABLE",
           group="Resource limits"),
    Option("pids_limit", "--pids-limit", "limit the number of the container's processes, -1 for unlimited",
           value="N", env="PIDS_LIMIT", group="Resource limits"),
    Option("blkio_weight", "--blkio-weight", "block IO relative weight in range 10-1000, 0 to disable", value="N",
           env="BLKIO_WEIGHT", group="Resource limits"),
    Option("blkio_weight_device", "--blkio-weight-device", "device specific block IO weight: DEVICE:WEIGHT",
           value="DEVICE:WEIGHT", repeat=True, env="BLKIO_WEIGHT_DEVICE", group="Resource limits"),
    # Issue 28's action flags, with Apptainer's EnvKeys (its action_flags.go)
    Option("workdir", "--workdir", "host directory of the --scratch directories and, with --contain, of /tmp, "
           "/var/tmp and the home", "-W", "DIR", env="WORKDIR", group="Mounts"),
    Option("scratch", "--scratch", "a writable scratch directory at PATH in the container (in memory, or under "
           "--workdir; comma lists)", "-S", "PATH", repeat=True, env="SCRATCH", env_also=("SCRATCHDIR",),
           group="Mounts"),
    Option("no_env", "--no-env", "keep this host variable out of the container (comma lists)", value="NAME",
           repeat=True, env="NOENV", group="Environment"),
    Option("no_pid", "--no-pid", "no new PID namespace, even with --containall or --pid", env="NO_PID",
           group="Isolation"),
    Option("no_nv", "--no-nv", "no NVIDIA GPU support, even with `always use nv = yes`", env="NV_OFF",
           env_also=("NO_NV",), group="GPU"),
    Option("no_rocm", "--no-rocm", "no ROCm GPU support, even with `always use rocm = yes`", env="ROCM_OFF",
           env_also=("NO_ROCM",), group="GPU"),
    Option("disable_cache", "--disable-cache", "pull a docker://... image into a temporary directory, not the cache",
           env="DISABLE_CACHE", group="Images"),
    Option("runscript_timeout", "--runscript-timeout", "run: the deadline of the image's env scripts, a duration "
           "(30s, 1m30s); a command still running then is killed", value="DURATION", env="RUNSCRIPT_TIMEOUT",
           group="Environment", commands=("run", "instance run")),
    Option("nv", "--nv", "enable NVIDIA GPU support", env="NV", group="GPU"),
    Option("nvccli", "--nvccli", "--nv with the library list from nvidia-container-cli (which must be there)",
           env="NVCCLI", group="GPU"),
    Option("rocm", "--rocm", "enable AMD ROCm GPU support", env="ROCM", group="GPU"),
    Option("intel_hpu", "--intel-hpu", "enable Intel(R) Gaudi accelerator support while using a minimal /dev",
           env="INTEL_HPU", group="GPU"),
    Option("compat32", "--compat32", "with --nv or --rocm: the host's 32-bit GPU libraries too, in "
           "/.singularity.d/libs32 (for 32-bit programs)", env="COMPAT32", group="GPU"),
    # Singularity 2's hidden flag, which Apptainer still takes: host library files bound where --nv binds its own
    Option("containlibs", "--containlibs", "host libraries for /.singularity.d/libs: PATH[:NAME] (comma lists)",
           value="PATH", repeat=True, env="CONTAINLIBS", group="GPU", hidden=True),
    Option("device", "--device", "a CDI device: VENDOR/CLASS=NAME, as nvidia.com/gpu=all or =0 (comma lists)",
           value="NAME", repeat=True, group="GPU"),
    Option("cdi_dirs", "--cdi-dirs", "directories of CDI specs, later ones winning (default: /etc/cdi,/var/run/cdi)",
           value="DIR,...", repeat=True, group="GPU"),
    Option("docker_login", "--docker-login", "ask for the registry's username and password (docker:// images)",
           env="DOCKER_LOGIN", group="Images"),
    Option("authfile", "--authfile", "registry credentials in docker's config.json format", value="FILE",
           env="AUTH_FILE", env_also=("AUTHFILE",), group="Images"),
    # Apptainer's hidden flags of these variables (singpy.cli.flagvars): a password on a command line is seen by
    # every user of the host, which is why neither Apptainer nor singpy shows them. No env=: their variables are
    # read where they act (singpy.oci.auth, singpy.oci.store), which names the one that was set
    Option("docker_username", "--docker-username", "the username for the image's registry (docker://, oras://)",
           value="NAME", group="Images", hidden=True),
    Option("docker_password", "--docker-password", "the password for the image's registry (docker://, oras://)",
           value="PASSWORD", group="Images", hidden=True),
    Option("tmpdir", "--tmpdir", "where a docker://... image is converted (as SINGPY_TMPDIR)", value="DIR",
           group="Images", hidden=True),
    Option("no_https", "--no-https", "talk to docker:// registries over plain HTTP", env="NOHTTPS",
           env_also=("NO_HTTPS",), group="Images"),
    # Apptainer still takes its deprecated spelling, and scripts written for Singularity 2/3 pass it
    Option("no_https", "--nohttps", "synonym for --no-https (deprecated)", group="Images"),
    Option("dry_run", "--dry-run", "print the launch plan as JSON and exit without running", group="Output"),
    Option("quiet", "--quiet", "print only warnings and errors", "-q", group="Output"),
    Option("silent", "--silent", "print only errors", group="Output"),
    Option("verbose", "--verbose", "print each step (mounts, image preparation)", "-v", group="Output"),
    Option("debug", "--debug", "print debugging messages and tracebacks", "-d", group="Output"),
    Option("help", "--help", "show this help and exit", "-h", group="Output"),
)

# Flags that may come before the command, as `singpy -v exec ...` (Apptainer's global flags), with
# Apptainer's EnvKeys: APPTAINER_DEBUG=1 is -d for every command.
GLOBAL_OPTIONS: tuple[Option, ...] = (
    Option("quiet", "--quiet", "print only warnings and errors", "-q", env="QUIET"),
    Option("silent", "--silent", "print only errors (-s after run/exec/shell is --shell)", "-s", env="SILENT"),
    Option("verbose", "--verbose", "print each step", "-v", env="VERBOSE"),
    Option("debug", "--debug", "print debugging messages and tracebacks", "-d", env="DEBUG"),
    Option("config", "--config", "read this singpy.conf instead of the default", "-c", value="FILE",
           env="CONFIG_FILE"),
    # singpy's messages have no colour; only a pull's progress bars (rich) have some, which NO_COLOR turns off
    Option("nocolor", "--nocolor", "print without colour (a pull's progress bars)", env="NOCOLOR"),
    Option("build_config", "--build-config", "the configuration of builds: no `bind path` binds, no home "
           "directory, no devpts (as Apptainer's)"),
    Option("version", "--version", "print the version and exit"),
    Option("help", "--help", "show this help and exit", "-h"),
)

ACTIONS = {
    "exec": ("IMAGE COMMAND [ARGS...]", "run a command inside a container"),
    "run": ("IMAGE [ARGS...]", "run the container's runscript"),
    "shell": ("IMAGE", "start an interactive shell inside a container"),
    "test": ("IMAGE [ARGS...]", "run the user-defined tests within a container (its %test section)"),
}

# Apptainer's action flags that singpy does not have: flag -> (the commands Apptainer has it for, why). A clear
# refusal where "unknown flag" would suggest a typing mistake (singpy.cli.parse).
_INSTANCE = ("instance start", "instance run")
NO_DMTCP = "singpy has no DMTCP checkpointing (Apptainer's experimental `checkpoint` commands)"
NO_DOCKER_DAEMON = "singpy reads images from no Docker daemon (Apptainer's docker-daemon: sources)"
NOT_SUPPORTED = {
    "--dmtcp-launch": (_INSTANCE, NO_DMTCP),
    "--dmtcp-restart": (_INSTANCE, NO_DMTCP),
    "--docker-host": ((*ACTIONS, *_INSTANCE), NO_DOCKER_DAEMON),
}

# The Examples section of each command's help, as Apptainer's help has one (its docs/content.go).
EXAMPLES = {
    "exec": ("singpy exec image.sif cat /etc/os-release",
             "singpy exec -B /data:/mnt image.sif ls /mnt",
             "cat script.py | singpy exec image.sif python3",
             "singpy exec --containall --pwd /work -B \"$PWD:/work\" docker://python:3 python3 run.py",
             "singpy exec instance://web ps"),
    "run": ("singpy run image.sif one two three",
            "singpy run --app foo image.sif",
            "SINGULARITY_BIND=/scratch singpy run image.sif"),
    "shell": ("singpy shell image.sif",
              "singpy shell -C image.sif",
              "singpy shell --shell /bin/ash instance://web"),
    "test": ("singpy test image.sif", "singpy test --app foo image.sif", "singpy test --contain -B /data image.sif"),
    "instance run": ("singpy instance run image.sif web --port 8080",
                     "singpy instance run --pid-file web.pid --memory 2G --cpus 2 image.sif web"),
    "instance start": ("singpy instance start image.sif web",
                       "singpy instance start --containall -B /data image.sif db --port 5432",
                       "singpy exec instance://web ps"),
}

"""Names and tables several modules share, each defined once.

Imports nothing: this is read on the start-up path of every `singpy exec`.
"""

# Apptainer's layout inside an image ([1] Apptainer internal/pkg/build/sources/base_environment.go).
SINGULARITY_D = "/.singularity.d"
ENV_DIR = f"{SINGULARITY_D}/env"  # env scripts, sourced in the order of their names
RUNSCRIPT = f"{SINGULARITY_D}/runscript"  # what `run` executes
STARTSCRIPT = f"{SINGULARITY_D}/startscript"  # what `instance start` runs
SCIF_APPS = "/scif/apps"  # SCIF apps of a definition file (%apprun NAME...): /scif/apps/NAME
LIBS_DIR = f"{SINGULARITY_D}/libs"  # the host libraries of --nv/--rocm; always last on LD_LIBRARY_PATH
LIBS32_DIR = f"{LIBS_DIR}32"  # --compat32: the host's 32-bit GPU libraries, apart from their 64-bit namesakes

# PATH in a container when nothing else sets one (Apptainer's action scripts).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# PATH of the host tools singpy runs itself (squashfuse, ldconfig, newuidmap): never the user's.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# Go's GOARCH names, indexed by the two-digit code a SIF header or partition stores ([1] sif.md section 3).
ARCHES = ("unknown", "386", "amd64", "arm", "arm64", "ppc64", "ppc64le", "mips", "mipsle", "mips64", "mips64le",
          "s390x", "riscv64", "loong64")
# The kernel's machine names (os.uname().machine) for them.
MACHINE_ARCH = {
    "x86_64": "amd64", "amd64": "amd64", "i386": "386", "i486": "386", "i586": "386", "i686": "386",
    "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "ppc64": "ppc64", "s390x": "s390x",
    "riscv64": "riscv64", "loongarch64": "loong64",
}

# Images singpy pulls rather than opens (singpy.oci.ref parses them; this is the cheap test of the hot path).
FUSE_DEVICE = "/dev/fuse"  # opened by the launcher for squashfuse, fuse-overlayfs; fuse2fs opens its own
IMAGE_URI_PREFIXES = ("docker://", "oci:", "oci-archive:", "docker-archive:")
# ...and every transport the launch, `instance start` and `inspect` pull first (singpy.cli.actions.pulled): the
# SIFs of oras://, library:// and http(s):// are cached as they are
PULLED_URI_PREFIXES = (*IMAGE_URI_PREFIXES, "oras://", "library://", "http://", "https://")

# mksquashfs's cache bound, for every image singpy squashes (pull, build). Unbounded it takes 25% of the host's
# memory and fills it with what it reads ahead (1.1 GiB of RSS for a 1.2 GB tree, 1.9 GiB for a 2 GiB one: a login
# node's memory limit kills the pull). At 256M it peaks at 160-270 MiB and writes the same bytes (docs/pull.md,
# "Big images: memory and time").
SQUASH_MEMORY = ("-mem", "256M")

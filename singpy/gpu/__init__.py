"""GPU discovery for --nv (NVIDIA), --rocm (AMD) and --intel-hpu (Intel Gaudi): leaf modules that return data.

`singpy.gpu.nvidia.discover` and `singpy.gpu.rocm.discover` look at the host
(device nodes, the ld cache, $PATH, a few files under /proc and /var/run) and
return a `GpuContribution`; they never mount, never read the plan and never
import `singpy.kernel` (architecture convention 5, modelled on Apptainer's
`internal/pkg/util/gpu` package: lists out, the launcher binds).

This module stays import-light (no subprocess): the launcher imports it to
type its arguments even when no GPU flag is given.
"""

from __future__ import annotations

from singpy.constants import LIBS_DIR
from singpy.plan import MountOp, MountSpec
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # where CDI specs are looked for (--device), by default
CDI_SPEC_SUFFIXES = (".json", ".yaml", ".yml")  # the files of those directories that are specs


class GpuHost(Record):
    """The host as --nv and --rocm look at it, read by `singpy.gpu.request.gpu_host`.

    Every path has its real default and can be pointed elsewhere: that is how
    the tests put a simulated GPU host in place of this one.
    """

    env: Mapping[str, str]  # the launcher's environment (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES...)
    path_env: str  # PATH searched for the tools (nvidia-smi, rocminfo...)
    nvliblist: str  # nvliblist.conf
    rocmliblist: str  # rocmliblist.conf
    nvidia_container_cli: str | None = None  # its path when singpy.conf lets it be used
    nvccli: bool = False  # --nvccli: the library list comes from nvidia-container-cli or the launch fails
    dev_dir: str = "/dev"
    sys_dir: str = "/sys"  # where --intel-hpu finds the accelerators' RDMA devices (class/infiniband)
    ldconfig: str = "/sbin/ldconfig"  # the fallback when the ld cache can't be read directly
    ld_cache_file: str | None = None  # the ld cache read directly (None: /etc/ld.so.cache)
    persistenced_socket: str = "/var/run/nvidia-persistenced/socket"
    proc_driver_version: str = "/proc/driver/nvidia/version"
    inherited_libs_dir: str = LIBS_DIR  # a parent container's GPU libraries (nested singpy)


class ImageHints(Record):
    """What the GPU checks read from the image before the launch (only from an image that is a directory)."""

    glibc: str | None = None  # its glibc release ("2.36"), None for none or not known
    env: Mapping[str, str] | None = None  # CUDA_VERSION / NVIDIA_REQUIRE_CUDA as its env scripts set them


class GpuContribution(Record):
    """What one GPU vendor adds to a launch; every mount is at Stage.GPU."""

    mounts: tuple[MountSpec, ...] = ()  # devices, libs tmpfs + binds, binaries, files; in order
    env: tuple[tuple[str, str], ...] = ()  # variables forced into the container
    keep_host_env: tuple[str, ...] = ()  # host variable names that must survive --cleanenv
    libs_dir_used: bool = False  # something is bound under /.singularity.d/libs
    warnings: tuple[str, ...] = ()  # shown at normal verbosity
    notes: tuple[str, ...] = ()  # shown with -v ("binding SRC -> DEST", per-library misses)


def binding_note(spec: MountSpec) -> str:
    """The -v line of one GPU bind ("binding SRC -> DEST"): made by discovery, matched to leave out a bind's."""
    return f"binding {spec.source} -> {spec.dest}"


def merge(*contribs: GpuContribution) -> GpuContribution:
    """Combine --nv and --rocm contributions (Apptainer >= 1.2.3 allows both).

    The first mount for a destination wins, so the one tmpfs at
    /.singularity.d/libs stays ahead of every library bind and a library
    listed by both vendors (libOpenCL.so, libdrm.so) is bound once. Each seal
    comes once every vendor's entries are in place below it, right after
    them, before the rest: a tmpfs filled and sealed in one block is made in
    the staging root, for about half the cost per entry (singpy.mounts.apply).
    """
    mounts: dict[str, MountSpec] = {}
    seals: dict[str, MountSpec] = {}
    notes: list[str] = []
    for contrib in contribs:
        for spec in contrib.mounts:
            if spec.op == MountOp.SEAL:
                seals.setdefault(spec.dest, spec)
                continue
            kept = mounts.setdefault(spec.dest, spec)
            if kept is not spec and kept != spec:
                notes.append(f"{spec.dest}: keeping {kept.source or kept.op}, ignoring {spec.source}")
    env: dict[str, str] = {}
    for contrib in contribs:
        for name, value in contrib.env:
            env.setdefault(name, value)
    blocks: list[MountSpec] = []
    for dest, seal in seals.items():
        blocks += [spec for spec in mounts.values() if spec.dest == dest or spec.dest.rsplit("/", 1)[0] == dest]
        blocks.append(seal)
    placed = {id(spec) for spec in blocks}
    return GpuContribution(
        mounts=(*blocks, *(spec for spec in mounts.values() if id(spec) not in placed)),
        env=tuple(env.items()),
        keep_host_env=_unique(name for contrib in contribs for name in contrib.keep_host_env),
        libs_dir_used=any(contrib.libs_dir_used for contrib in contribs),
        warnings=_unique(text for contrib in contribs for text in contrib.warnings),
        notes=_unique([text for contrib in contribs for text in contrib.notes] + notes),
    )


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))

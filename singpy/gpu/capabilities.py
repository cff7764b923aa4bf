"""NVIDIA_DRIVER_CAPABILITIES: which of the driver's libraries and tools --nv binds.

The groups are libnvidia-container's (`src/nvc_info.c` lists, `src/options.h`
capability -> option map): `utility` binds nvidia-smi and NVML, `compute`
libcuda and its JIT/OpenCL companions, `video` the codec libraries (and the
compute ones, which they load), `graphics` the GL/EGL/Vulkan libraries and the
ICD JSON files, `display` the X driver pieces (and graphics). A library or tool
the toolkit does not list (an administrator's addition to nvliblist.conf) is
bound whatever the capabilities: Apptainer binds the whole list.

Where the values come from (`nvidia_env`): the image's environment, then the
host's plain `NVIDIA_*` variables (as Apptainer's --nvccli reads them), then
`SINGULARITYENV_NVIDIA_*`, then `APPTAINERENV_NVIDIA_*`: the later wins.
Unset everywhere: `utility,compute` (the toolkit's default) for an image made
for the toolkit (it sets a `NVIDIA_*` variable or `CUDA_VERSION`), and
everything for any other image, as Apptainer's --nv, which ignores these
variables, has always done.

Device nodes follow the capabilities too, but only when NVIDIA_DRIVER_CAPABILITIES
is given (`select_nodes`): as libnvidia-container mounts them, /dev/nvidia-uvm and
/dev/nvidia-uvm-tools need `compute` (or `video`, which brings the compute
libraries), /dev/nvidia-modeset needs `display`; nvidiactl, the GPU nodes and
/dev/nvidia-caps are always bound. Without the variable every node is bound.
"""

from __future__ import annotations

from singpy.gpu.ldcache import HostFiles
from singpy.plan import MountSpec

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

KNOWN = ("compute", "compat32", "display", "graphics", "ngx", "utility", "video")
TOOLKIT_DEFAULT = frozenset({"utility", "compute"})
EVERYTHING = frozenset(KNOWN)
HOST_PREFIXES = ("SINGULARITYENV_", "APPTAINERENV_")  # in increasing precedence
VARIABLE = "NVIDIA_DRIVER_CAPABILITIES"

# Library stem (file name up to ".so") or binary name -> the capabilities that bind it.
_UTILITY = ("utility",)
_COMPUTE = ("compute", "video")  # options.h: video = video libs + compute libs
_VIDEO = ("video",)
_GRAPHICS = ("graphics", "display")  # options.h: display = display + graphics libs
_DISPLAY = ("display",)
_GROUPS: dict[tuple[str, ...], tuple[str, ...]] = {
    _UTILITY: ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
               "libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    ("compute",): ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
    _COMPUTE: ("libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
               "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
               "libnvidia-pkcs11-openssl3", "libnvidia-nvvm", "libnvidia-tileiras", "libOpenCL",
               # Tegra / CUDA companions of Apptainer's list that the toolkit discovers with CUDA
               "libnvcucompat", "libnvcudla", "libnvcuextend", "libnvidia-rmapi-tegra", "libnvos", "libnvrm_chip",
               "libnvrm_gpu", "libnvrm_host1x", "libnvrm_mem", "libnvrm_stream", "libnvrm_surface",
               "libnvrm_sync", "libnvsciipc", "libnvsocsys", "libnvtegrahv", "libnvosd"),
    _VIDEO: ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    _GRAPHICS: ("libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
                "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
                "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-cbl", "libGL",
                "libEGL", "libGLESv1_CM", "libGLESv2", "libGLX", "libGLdispatch", "libOpenGL",
                "libEGL_installertest", "libGLX_installertest", "tls_test_", "libnvidia-egl-wayland",
                "libnvidia-egl-gbm", "libnvidia-egl-xcb", "libnvidia-egl-xlib", "libnvidia-vulkan-producer"),
    _DISPLAY: ("libnvidia-gtk2", "libnvidia-gtk3", "libnvidia-wfb", "nvidia_drv", "libglx", "libglxserver_nvidia"),
    ("ngx",): ("libnvidia-ngx",),
}
_BY_NAME = {name: caps for caps, names in _GROUPS.items() for name in names}


def nvidia_env(image_env: Mapping[str, str], host_env: Mapping[str, str]) -> dict[str, str]:
    """The `NVIDIA_*` and `CUDA_VERSION` values that drive --nv: the image's, overridden by the host's."""
    merged = {name: value for name, value in image_env.items() if _ours(name)}
    for prefix in ("", *HOST_PREFIXES):
        for name, value in host_env.items():
            if name.startswith(prefix) and name != prefix and _ours(name[len(prefix):]) \
                    and name[len(prefix):] != "CUDA_VERSION":
                merged[name[len(prefix):]] = value
    return merged


def _ours(name: str) -> bool:
    return name.startswith("NVIDIA_") or name == "CUDA_VERSION"


def driver_capabilities(env: Mapping[str, str], image_env: Mapping[str, str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The capabilities asked for in `env` (from `nvidia_env`), and warnings for unknown names."""
    value = env.get(VARIABLE)
    if value is None or not value.strip():
        return (TOOLKIT_DEFAULT if any(_ours(name) for name in image_env) else EVERYTHING), ()
    wanted: set[str] = set()
    warnings: list[str] = []
    for item in (part.strip().lower() for part in value.split(",") if part.strip()):
        if item == "all":
            wanted |= EVERYTHING
        elif item == "none":
            continue
        elif item in KNOWN:
            wanted.add(item)
        else:
            warnings.append(f"{VARIABLE}: unknown capability '{item}' ignored (known: all, {', '.join(KNOWN)})")
    return frozenset(wanted), tuple(warnings)


# Device nodes the toolkit binds only for some capabilities (libnvidia-container nvc_mount.c, nvc_driver_mount):
# the UVM pair (a major other than the driver's 195) only with compute libraries, which `compute` and `video`
# bring (options.h), nvidia-modeset (195:254) only with `display`. nvidiactl and the GPU nodes always.
_NODE_CAPS = {"/dev/nvidia-uvm": ("compute", "video"), "/dev/nvidia-uvm-tools": ("compute", "video"),
              "/dev/nvidia-modeset": ("display",)}


def is_set(env: Mapping[str, str]) -> bool:
    """Whether NVIDIA_DRIVER_CAPABILITIES is given (by the image or the host), not defaulted."""
    return bool(env.get(VARIABLE, "").strip())


def wants_node(dest: str, wanted: frozenset[str]) -> bool:
    """Whether the device node at `dest` ("/dev/nvidia-uvm") is bound for `wanted`."""
    return dest not in _NODE_CAPS or bool(wanted.intersection(_NODE_CAPS[dest]))


def select_nodes(mounts: tuple[MountSpec, ...], wanted: frozenset[str]
                 ) -> tuple[tuple[MountSpec, ...], tuple[str, ...]]:
    """The device binds `wanted` asks for, and a -v note naming the nodes left out."""
    left = [spec.dest for spec in mounts if not wants_node(spec.dest, wanted)]
    if not left:
        return mounts, ()
    kept = tuple(spec for spec in mounts if spec.dest not in left)
    return kept, (f"{VARIABLE}={','.join(sorted(wanted)) or 'none'}: not binding {', '.join(left)}",)


def capabilities_of(name: str) -> tuple[str, ...] | None:
    """Which capabilities bind a library ("libcuda.so.1") or binary ("nvidia-smi"); None: not the toolkit's."""
    return _BY_NAME.get(name.partition(".so")[0])


def select(files: HostFiles, wanted: frozenset[str]) -> HostFiles:
    """Only the libraries, binaries and plain files `wanted` asks for; a -v note names what is left out."""
    if wanted >= EVERYTHING:
        return files

    def keep(name: str) -> bool:
        caps = capabilities_of(name)
        return caps is None or bool(wanted.intersection(caps))

    libraries = tuple(pair for pair in files.libraries if keep(pair[0]))
    binaries = tuple(pair for pair in files.binaries if keep(pair[0]))
    graphics = bool(wanted.intersection(_GRAPHICS))  # ICD/EGL JSON, nvoptix.bin: the toolkit's graphics mounts
    plain = files.files if graphics else ()
    left = [name for name, _ in files.libraries + files.binaries if not keep(name)]
    left += [] if graphics else list(files.files)
    notes = (f"{VARIABLE}={','.join(sorted(wanted)) or 'none'}: not binding {', '.join(left)}",) if left else ()
    return files.replace(libraries=libraries, binaries=binaries, files=plain, notes=files.notes + notes)

"""--rocm: find the host's AMD GPU devices, libraries and tools; return data only.

Apptainer's `--rocm` (`internal/pkg/util/gpu/rocm.go`, `setRocmConfig`):
the same liblist + `ldconfig -p` lookup as `--nv` (shared here through
`singpy.gpu.ldcache.find_host_files`), and as devices the whole `/dev/dri`
directory (render nodes renderD128+ are what ROCm opens; the whole directory
since Apptainer 1.2.0) plus `/dev/kfd` (the compute interface), "the same
paths as the ROCm Docker container documentation".  Apptainer sets no ROCm
variables; singpy additionally keeps the ROCm device-selection variables
through --cleanenv, as it does CUDA_VISIBLE_DEVICES for --nv (Slurm sets
ROCR_VISIBLE_DEVICES for AMD GPU jobs).
"""

from __future__ import annotations

import os

from singpy.config.liblist import load_liblist
from singpy.errors import ConfigError
from singpy.gpu import GpuContribution, GpuHost, ImageHints, binding_note
from singpy.gpu.ldcache import HostFiles, find_host_files
from singpy.plan import Missing, MountOp, MountSpec, Stage

SELECT_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")  # kept through --cleanenv
DEVICES = ("kfd", "dri")  # /dev/kfd (char device), /dev/dri (directory)
NO_DEVICES = "no AMD GPU devices found (no /dev/kfd or /dev/dri): the container will run without GPU access"


def discover(host: GpuHost, *, contain: bool, image: ImageHints | None = None) -> GpuContribution:
    """Everything --rocm binds, as data.  Never raises for host facts.

    `contain` changes only a note: the device binds are needed with a minimal
    /dev and harmless over a full one.
    """
    devices, warnings, notes = device_mounts(host.dev_dir)
    files = _host_files(host, (image or ImageHints()).glibc)
    if not contain and devices:
        notes = (*notes, "without --contain the whole host /dev is visible; the /dev/kfd and /dev/dri binds are no-ops")
    mounts = files.mounts()
    return GpuContribution(
        mounts=devices + mounts,
        keep_host_env=tuple(name for name in SELECT_VARS if name in host.env),
        libs_dir_used=bool(files.libraries),
        warnings=warnings + files.warnings,
        notes=notes + files.notes + files.bind_notes(mounts),
    )


def device_mounts(dev_dir: str) -> tuple[tuple[MountSpec, ...], tuple[str, ...], tuple[str, ...]]:
    """(dev binds for /dev/kfd and /dev/dri, warnings, notes)."""
    present = [name for name in DEVICES if os.path.exists(os.path.join(dev_dir, name))]
    mounts = tuple(
        MountSpec(op=MountOp.BIND, source=os.path.join(dev_dir, name), dest=f"/dev/{name}", dev=True,
                  missing=Missing.REQUIRED, stage=Stage.GPU)
        for name in present
    )
    warnings: tuple[str, ...] = ()
    if not present:
        warnings = (NO_DEVICES,)
    elif "kfd" not in present:
        message = (
            f"no AMD GPU compute device ({dev_dir}/kfd is missing; the {dev_dir}/dri nodes may belong to "
            "another GPU): ROCm programs will find no GPU; check that the amdgpu kernel module is loaded"
        )
        warnings = (message,)
    notes = tuple(binding_note(spec) for spec in mounts)
    return mounts, warnings, notes


def _host_files(host: GpuHost, image_glibc: str | None) -> HostFiles:
    try:
        liblist = load_liblist(host.rocmliblist)
    except ConfigError as exc:
        return HostFiles(warnings=(f"while finding rocm bind points: {exc.message}",))
    return find_host_files(liblist, "rocm", host, image_glibc)

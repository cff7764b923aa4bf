"""What the GPU discovery tests share (tests/gpu/test_discover*.py): the simulated host as the GPU modules see it
(`sim_gpu_host`), discover() pointed at it, and readings of a contribution's mounts (`binds`, `lib_binds`, what a
container path shows, the files bound into /.singularity.d/libs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from singpy.gpu import GpuContribution, GpuHost, ImageHints, nvidia, rocm
from singpy.plan import MountOp

from .simhost import SimHost

REPO = Path(__file__).resolve().parents[2]
SHIPPED_NV = REPO / "etc/nvliblist.conf"
SHIPPED_ROCM = REPO / "etc/rocmliblist.conf"
LIBS = "/.singularity.d/libs"
CONTROL_NODES = {
    "/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps",
}  # fmt: skip


def sim_gpu_host(host: SimHost, **fields: Any) -> GpuHost:
    """The simulated host as the GPU modules see it; keyword fields win."""
    values: dict[str, Any] = {
        "env": {},
        "path_env": host.path_env,
        "nvliblist": str(host.liblist),
        "rocmliblist": str(host.liblist),
        "dev_dir": str(host.dev_dir),
        "ldconfig": host.ldconfig,
        "ld_cache_file": str(host.ld_cache),
        "persistenced_socket": str(host.persistenced_socket),
        "proc_driver_version": str(host.proc_version),
        "inherited_libs_dir": str(host.root / "no-parent-container"),
    }
    return GpuHost(**{**values, **fields})


def discover_nv(host: SimHost, *, contain: bool = False, image: ImageHints | None = None,
                **fields: Any) -> GpuContribution:
    """nvidia.discover pointed at the simulated host."""
    return nvidia.discover(sim_gpu_host(host, **fields), contain=contain, image=image)


def discover_rocm(host: SimHost, *, contain: bool = True, **fields: Any) -> GpuContribution:
    return rocm.discover(sim_gpu_host(host, **fields), contain=contain)


def binds(contrib: GpuContribution) -> dict[str, str]:
    """Destination -> host source of every bind."""
    return {m.dest: m.source or "" for m in contrib.mounts if m.op == MountOp.BIND}


def dev_dests(contrib: GpuContribution) -> set[str]:
    return {m.dest for m in contrib.mounts if m.dev}


def lib_binds(contrib: GpuContribution) -> dict[str, str]:
    """What each name in /.singularity.d/libs is inside the container: name -> the host file it leads to.

    The container's view, worked out from the mounts as the kernel would: a
    bind shows its source file, a link in the tmpfs leads (relative: to
    another entry of the directory, absolute: to a path bound in the
    container) to what is there. The host files compared against are real
    paths (os.path.realpath), so a name leading to the wrong file, or to
    nothing, fails.
    """
    seen: dict[str, str] = {}
    for name in {spec.dest.removeprefix(LIBS + "/") for spec in contrib.mounts if spec.dest.startswith(LIBS + "/")}:
        seen[name] = container_file(contrib, f"{LIBS}/{name}")
    return seen


def container_file(contrib: GpuContribution, path: str, depth: int = 0) -> str:
    """The host file (real path) that container path `path` shows; "" for nothing (a dangling link)."""
    spec = next((m for m in contrib.mounts if m.dest == path and m.op in (MountOp.BIND, MountOp.SYMLINK)), None)
    if spec is None or spec.source is None or depth > 8:
        return ""
    if spec.op == MountOp.BIND:
        return os.path.realpath(spec.source)
    assert spec.op == MountOp.SYMLINK and path.startswith(LIBS + "/")  # links are made only in the tmpfs
    return container_file(contrib, os.path.normpath(os.path.join(LIBS, spec.source)), depth + 1)


def real(path: Path | str) -> str:
    return os.path.realpath(path)


def bound_files(contrib: GpuContribution) -> list[str]:
    """Host files bound into /.singularity.d/libs, in order (one bind each, the other names are links)."""
    return [os.path.realpath(m.source or "") for m in contrib.mounts
            if m.op == MountOp.BIND and m.dest.startswith(LIBS + "/")]

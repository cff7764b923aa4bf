"""From --nv / --rocm and singpy.conf to one GpuContribution.

The launcher calls `discover_gpus` before planning; the vendor modules stay
leaves that take every host path as an argument. What the image needs (its
CUDA version, its glibc) is read here from the image root when it is a
directory already; for other images those checks are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy.config.sysconf import SysConfig, confdir
from singpy.gpu import GpuContribution, merge
from singpy.gpu.ldcache import which
from singpy.gpu.versions import major_minor

_CUDA_VARIABLES = ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA")
_GLIBC_RELEASE = b"release version "
_LIBC_PATHS = ("lib/x86_64-linux-gnu/libc.so.6", "lib/aarch64-linux-gnu/libc.so.6", "lib64/libc.so.6",
               "lib/powerpc64le-linux-gnu/libc.so.6", "usr/lib64/libc.so.6", "lib/libc.so.6")


def discover_gpus(*, nv: bool, rocm: bool, contain: bool, config: SysConfig, host_env: Mapping[str, str],
                  rootfs: str | None) -> GpuContribution:
    """Devices, libraries, binaries and warnings for the requested vendors."""
    path_env = host_env.get("PATH", os.defpath)
    ldconfig = config.text("ldconfig path")
    image_env = image_env_hints(rootfs) if rootfs else None
    glibc = image_glibc(rootfs) if rootfs else None
    parts = []
    if nv:
        from singpy.gpu import nvidia

        parts.append(nvidia.discover(
            liblist_path=os.path.join(confdir(config), "nvliblist.conf"), ldconfig=ldconfig, path_env=path_env,
            nvidia_container_cli=_container_cli(config, path_env), contain=contain, host_env=host_env,
            image_env=image_env, image_glibc=glibc))
    if rocm:
        from singpy.gpu import rocm as amd

        parts.append(amd.discover(
            liblist_path=os.path.join(confdir(config), "rocmliblist.conf"), ldconfig=ldconfig, path_env=path_env,
            contain=contain, host_env=host_env, image_glibc=glibc))
    return merge(*parts)


def _container_cli(config: SysConfig, path_env: str) -> str | None:
    """nvidia-container-cli: the conf's path, else the one on PATH; none with `use nvidia-container-cli = no`."""
    if not config.flag("use nvidia-container-cli"):
        return None
    return config.text("nvidia-container-cli path") or which("nvidia-container-cli", path_env)


def image_env_hints(rootfs: str) -> dict[str, str]:
    """CUDA_VERSION / NVIDIA_REQUIRE_CUDA as the image's env scripts set them (a text scan, no shell)."""
    found: dict[str, str] = {}
    env_dir = os.path.join(rootfs, ".singularity.d", "env")
    try:
        names = sorted(os.listdir(env_dir))
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(env_dir, name), errors="replace") as handle:
                found.update(_cuda_assignments(handle.read()))
        except OSError:
            continue
    return found


def image_glibc(rootfs: str) -> str | None:
    """The image's glibc release ("2.36"), read from its libc.so.6; None when it has none (busybox)."""
    for relative in _LIBC_PATHS:
        try:
            with open(os.path.join(rootfs, relative), "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        start = data.find(_GLIBC_RELEASE)
        version = major_minor(data[start + len(_GLIBC_RELEASE):start + 32].decode("ascii", "replace"))
        if start >= 0 and version:
            return f"{version[0]}.{version[1]}"
    return None


def _cuda_assignments(script: str) -> list[tuple[str, str]]:
    """`[export] CUDA_VERSION="12.4.1"` lines of an env script, as (name, value)."""
    found = []
    for line in script.splitlines():
        words = line.strip().removeprefix("export ").lstrip()
        name, sep, value = words.partition("=")
        if sep and name in _CUDA_VARIABLES:
            # "12.4.1", or an OCI image's `"${CUDA_VERSION:-"12.4.1"}"` default
            found.append((name, value.strip().rpartition(":-")[2].strip("\"'{}")))
    return found

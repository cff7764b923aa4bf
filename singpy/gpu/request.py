"""From --nv / --rocm / --intel-hpu and singpy.conf to one GpuContribution.

The launcher calls `discover_gpus` before planning; the vendor modules stay
leaves that take every host path as an argument. What the image needs (its
CUDA version and other NVIDIA_* variables, its glibc) is read here from the
image root when it is a directory already; for a SIF or squashfs image that
will be mounted, its env scripts are unpacked alone (`squashfs_hints`, --nv
only) and its glibc is not checked.
"""

from __future__ import annotations

import os

from singpy.config.sysconf import SysConfig, confdir
from singpy.constants import ENV_DIR
from singpy.errors import GpuError, PathError
from singpy.gpu import GpuContribution, GpuHost, ImageHints, merge
from singpy.gpu.versions import major_minor
from singpy.host.hostfiles import which
from singpy.mounts.rootpath import Tree
from singpy.plan import ImageSpec

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

_SCRIPT_LIMIT = 16 << 20  # env scripts are a few KB
_LIBC_LIMIT = 64 << 20  # glibc's libc.so.6 is 2 MB
_GLIBC_RELEASE = b"release version "
_LIBC_PATHS = ("lib/x86_64-linux-gnu/libc.so.6", "lib/aarch64-linux-gnu/libc.so.6", "lib64/libc.so.6",
               "lib/powerpc64le-linux-gnu/libc.so.6", "usr/lib64/libc.so.6", "lib/libc.so.6")


def discover_gpus(*, nv: bool, rocm: bool, contain: bool, config: SysConfig, host_env: Mapping[str, str],
                  rootfs: str | None, nvccli: bool = False, image_spec: ImageSpec | None = None,
                  compat32: bool = False, intel_hpu: str | None = None) -> GpuContribution:
    """Devices, libraries, binaries and warnings for the requested vendors.

    GpuError (one FATAL) when the image's NVIDIA_REQUIRE_* do not hold on this host.
    `image_spec` lets --nv read a mounted SIF's environment (`squashfs_hints`).
    `compat32`: each vendor's 32-bit libraries too, in /.singularity.d/libs32 (singpy.gpu.compat32).
    `intel_hpu`: with --intel-hpu, the accelerators to bind (HABANA_VISIBLE_DEVICES: singpy.gpu.intelhpu).
    """
    host = gpu_host(config, host_env)
    if nvccli:
        host = host.replace(nvidia_container_cli=_required_container_cli(config, host.path_env), nvccli=True)
    if not (nv or rocm):  # --intel-hpu alone reads nothing from the image
        image = ImageHints()
    elif rootfs:
        image = image_hints(rootfs)
    elif nv and image_spec is not None and image_spec.kind in ("sif", "squashfs"):
        image = squashfs_hints(image_spec, host_env)
    else:
        image = ImageHints()
    parts = []
    if nv:
        from singpy.gpu import nvidia

        require_warnings = nvidia.check_requirements(host, image)
        found = nvidia.discover(host, contain=contain, image=image)
        parts.append(found.replace(warnings=require_warnings + found.warnings))
    if rocm:
        from singpy.gpu import rocm as amd

        parts.append(amd.discover(host, contain=contain, image=image))
    if intel_hpu is not None:
        from singpy.gpu import intelhpu

        parts.append(intelhpu.discover(host, contain=contain, selection=intel_hpu))
    if compat32:
        from singpy.gpu import compat32 as bits32

        parts += [bits32.discover(host, platform, image) for platform, asked in (("nv", nv), ("rocm", rocm)) if asked]
    return merge(*parts)


def gpu_host(config: SysConfig, host_env: Mapping[str, str]) -> GpuHost:
    """This host, as singpy.conf and the environment describe it to the GPU modules."""
    path_env = host_env.get("PATH", os.defpath)
    return GpuHost(env=host_env, path_env=path_env, nvliblist=os.path.join(confdir(config), "nvliblist.conf"),
                   rocmliblist=os.path.join(confdir(config), "rocmliblist.conf"),
                   nvidia_container_cli=_container_cli(config, path_env), ldconfig=config.text("ldconfig path"))


def _container_cli(config: SysConfig, path_env: str) -> str | None:
    """nvidia-container-cli: the conf's path, else the one on PATH; none with `use nvidia-container-cli = no`."""
    if not config.flag("use nvidia-container-cli"):
        return None
    return config.text("nvidia-container-cli path") or which("nvidia-container-cli", path_env)


def _required_container_cli(config: SysConfig, path_env: str) -> str:
    """--nvccli: nvidia-container-cli, even with `use nvidia-container-cli = no` (the flag asks for it, as in
    Apptainer); an error when there is none to run, never a quiet fallback to nvliblist.conf."""
    configured = config.text("nvidia-container-cli path")
    found = configured or which("nvidia-container-cli", path_env)
    if found is None or not (os.path.isfile(found) and os.access(found, os.X_OK)):
        where = f"at {configured} (`nvidia-container-cli path`)" if configured else "on PATH"
        raise GpuError(f"--nvccli: no executable nvidia-container-cli {where}",
                       hint="install libnvidia-container-tools, or use --nv alone")
    return found


def image_hints(rootfs: str) -> ImageHints:
    """What the GPU checks read from an image that is a directory: its glibc release, and the CUDA its env
    scripts declare.

    Read through the one door (singpy.mounts.rootpath), the image opened once:
    links stay inside the image, and what is not a small regular file is not
    read. These are hints: what can't be read is passed over.
    """
    try:
        image = Tree(rootfs)
    except PathError:
        return ImageHints()
    with image:
        return ImageHints(glibc=_glibc(image), env=_cuda_hints(image))


def squashfs_hints(image: ImageSpec, host_env: Mapping[str, str]) -> ImageHints:
    """The env scripts' CUDA_VERSION / NVIDIA_* of a SIF or squashfs image that is mounted, not extracted.

    `unsquashfs` unpacks /.singularity.d/env alone (a few small files) into a
    temporary directory: no mount, one short process, and only for --nv. Its
    glibc is not read (a 2 MB libc is not worth unpacking for a hint).
    """
    saved = _saved_hints(image, host_env)
    if saved is not None and os.path.exists(saved):
        return ImageHints(env=_read_hints(saved))
    import tempfile

    from singpy.errors import ImageError
    from singpy.image.squashpick import Picker

    unsquashfs = which("unsquashfs", host_env.get("PATH", os.defpath)) or which("unsquashfs", "/usr/sbin:/usr/bin")
    if unsquashfs is None:
        return ImageHints()
    with tempfile.TemporaryDirectory(prefix="singpy-nv-") as scratch:
        try:  # listed first, the env scripts alone unpacked: a 300 MB env/junk of a 1 MB image is never written
            picker = Picker(unsquashfs, image, f"{scratch}/root", limit=_SCRIPT_LIMIT, label="Reading env scripts",
                            failure=f"can't read the env scripts of {image.path}")
            picker.fetch(picker.survey(f"{ENV_DIR}/*", lambda path: path.endswith(".sh")))
            with Tree(f"{scratch}/root") as unpacked:
                hints = _cuda_hints(unpacked)
        except (OSError, ImageError, PathError):
            return ImageHints()
    if saved is not None:
        _save_hints(saved, hints)
    return ImageHints(env=hints)


def _saved_hints(image: ImageSpec, host_env: Mapping[str, str]) -> str | None:
    """Where the hints of this image file are kept: the user's cache, keyed by the file's identity (a rewrite of
    the image changes it), so that only the first --nv run of an image pays for `unsquashfs` (15-25 ms here)."""
    from singpy.host import cachefiles
    from singpy.image import cache

    try:
        key = cache.index_key(image.path, image.offset, image.size)
    except OSError:
        return None
    directory = cachefiles.cache_dir(host_env, host_env.get("HOME", ""))
    return f"{directory}/nv-hints/{key}" if os.path.isabs(directory) else None  # no HOME, no cache variable


def _read_hints(path: str) -> dict[str, str]:
    """NAME=VALUE pairs (singpy.host.cachefiles.read_fields)."""
    from singpy.host.cachefiles import read_fields

    return dict(field.split("=", 1) for field in read_fields(path) or () if "=" in field)


def _save_hints(path: str, hints: dict[str, str]) -> None:
    from singpy.host.cachefiles import write_fields

    write_fields(path, (f"{name}={value}" for name, value in hints.items()))


def _cuda_hints(image: Tree) -> dict[str, str]:
    """CUDA_VERSION / NVIDIA_* as the image's env scripts set them (a text scan, no shell)."""
    found: dict[str, str] = {}
    try:
        names = sorted(image.listdir(ENV_DIR))
    except PathError:
        return found
    for name in names:
        text = _image_file(image, f"{ENV_DIR}/{name}", _SCRIPT_LIMIT)
        if text is not None:
            found.update(_cuda_assignments(text.decode(errors="replace")))
    return found


def _glibc(image: Tree) -> str | None:
    """The image's glibc release ("2.36"), read from its libc.so.6; None when it has none (busybox)."""
    for relative in _LIBC_PATHS:
        data = _image_file(image, relative, _LIBC_LIMIT) or b""
        start = data.find(_GLIBC_RELEASE)
        version = major_minor(data[start + len(_GLIBC_RELEASE):start + 32].decode("ascii", "replace"))
        if start >= 0 and version:
            return f"{version[0]}.{version[1]}"
    return None


def _image_file(image: Tree, guest: str, limit: int) -> bytes | None:
    """A file of the image for a hint: None when it is missing, special or too large."""
    try:
        return image.read(guest, limit=limit)
    except PathError:
        return None


def _cuda_assignments(script: str) -> list[tuple[str, str]]:
    """`[export] CUDA_VERSION="12.4.1"` (or NVIDIA_...) lines of an env script, as (name, value)."""
    found = []
    for line in script.splitlines():
        words = line.strip().removeprefix("export ").lstrip()
        name, sep, value = words.partition("=")
        if sep and (name == "CUDA_VERSION" or name.startswith("NVIDIA_")) and name.isidentifier():
            # "12.4.1", or an OCI image's `"${CUDA_VERSION:-"12.4.1"}"` default
            found.append((name, value.strip().rpartition(":-")[2].strip("\"'{}")))
    return found

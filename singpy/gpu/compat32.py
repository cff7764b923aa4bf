"""--compat32: the host's 32-bit GPU driver libraries, bound into /.singularity.d/libs32.

Apptainer main, after 1.5 (commit 4074793d7, "Provision 32-bit NVIDIA/AMD
driver libraries"): alongside --nv or --rocm, the libraries of the vendor's
liblist are resolved a second time, for the 32-bit counterpart of the host's
architecture (`compat32Machine`: x86-64 -> i386 only, where vendors ship
32-bit drivers), and bound into a directory of their own: they have the same
names as the 64-bit ones, and a 32-bit program (Wine, Steam) needs both sets at
once. LD_LIBRARY_PATH then ends with that directory, after
/.singularity.d/libs (the dynamic loader skips a library of the wrong class,
so 64-bit programs are not disturbed: singpy.env.environ).

Where --nv's list comes from nvidia-container-cli (--nvccli, or
`use nvidia-container-cli`), --compat32 is its `compat32` capability:
`nvidia-container-cli list --libraries --compat32` lists the 32-bit
libraries too, and those of the 32-bit class go to libs32. Without --nv or
--rocm the flag is ignored with a warning, as Apptainer's; it is implied by a
host NVIDIA_DRIVER_CAPABILITIES naming `compat32` (both decided in
singpy.launch.launch, before any GPU module is imported).

Nothing is mounted here: data out, as the other vendor modules.
"""

from __future__ import annotations

import os

from singpy.constants import LIBS32_DIR
from singpy.errors import ConfigError, GpuError
from singpy.gpu import GpuContribution, GpuHost, ImageHints
from singpy.gpu.elf import ElfIdentity, elf_identity, host_elf_identity
from singpy.gpu.ldcache import (
    HostFiles,
    drop_newer_glibc,
    inherited_libraries,
    read_ld_cache,
    resolve_libraries,
    so_links,
)
from singpy.gpu.libsdir import libs_dir_mounts

UNSUPPORTED = "32-bit compatibility libraries are not supported on this architecture"
_EM_386, _EM_X86_64 = 3, 62
_COMPAT32_MACHINE = {_EM_X86_64: _EM_386}  # the host's ELF machine -> the machine of its 32-bit programs


def compat32_identity(host: ElfIdentity | None = None) -> ElfIdentity | None:
    """The ELF class and machine of the host's 32-bit libraries; None where there are none we know of."""
    native = host or host_elf_identity()
    machine = _COMPAT32_MACHINE.get(native.machine) if native.elf_class == 2 else None
    return None if machine is None else ElfIdentity(elf_class=1, machine=machine)


def discover(host: GpuHost, platform: str, image: ImageHints | None = None,
             native: ElfIdentity | None = None) -> GpuContribution:
    """The libs32 tmpfs, its binds and links for `platform` ("nv" or "rocm"); warnings, never an error for
    host facts (a failing --nvccli listing is a GpuError, as for the 64-bit list). `native`: the host's own
    ELF identity (the running interpreter's by default)."""
    image = image or ImageHints()
    wanted = compat32_identity(native)
    if wanted is None:
        return GpuContribution(warnings=(f"while finding 32-bit {platform} bind points: {UNSUPPORTED}",))
    files = _nv_files(host, wanted, image) if platform == "nv" else _liblist_files(host.rocmliblist, "rocm", host,
                                                                                     wanted)
    files = drop_newer_glibc(files, image.glibc)
    mounts = libs_dir_mounts(files.libraries, directory=LIBS32_DIR)
    warnings = files.warnings + (() if files.libraries else (f"could not find any 32-bit {platform} libraries "
                                                              "on this host",))
    return GpuContribution(mounts=mounts, warnings=warnings, notes=files.notes + files.bind_notes(mounts))


def _nv_files(host: GpuHost, wanted: ElfIdentity, image: ImageHints) -> HostFiles:
    """From nvidia-container-cli when --nv takes its list from there, else from nvliblist.conf; then only the
    libraries NVIDIA_DRIVER_CAPABILITIES asks for, as for the 64-bit ones (singpy.gpu.capabilities)."""
    from singpy.gpu.capabilities import driver_capabilities, nvidia_env, select

    files: HostFiles | None = None
    fallback: tuple[str, ...] = ()
    cli = host.nvidia_container_cli
    if cli is not None and os.path.isfile(cli) and os.access(cli, os.X_OK):
        import subprocess

        try:
            files = files_from_container_cli(cli, wanted)
        except (OSError, subprocess.SubprocessError) as exc:
            stderr = getattr(exc, "stderr", None)  # the tool's own last line says why ("nvml error: ...")
            why = (stderr.strip().splitlines() if isinstance(stderr, str) else [])[-1:] or [str(exc)]
            if host.nvccli:
                raise GpuError(f"--nvccli: {cli} list --compat32 failed: {why[0]}") from None
            fallback = (f"nvidia-container-cli list --compat32 failed ({why[0]}); using {host.nvliblist} instead",)
    if files is None:
        files = _liblist_files(host.nvliblist, "nv", host, wanted)
    capabilities, _ = driver_capabilities(nvidia_env(image.env or {}, host.env), image.env or {})
    return select(files.replace(warnings=fallback + files.warnings), capabilities)


def files_from_container_cli(cli: str, wanted: ElfIdentity) -> HostFiles:
    """`<cli> list --libraries --compat32`: the listed libraries of the 32-bit class, under each of their names."""
    import subprocess

    done = subprocess.run([cli, "list", "--libraries", "--compat32"], capture_output=True, text=True, timeout=60,
                          check=True)
    libraries: dict[str, str] = {}
    directories: dict[str, dict[str, list[str]]] = {}
    for path in (line.strip() for line in done.stdout.splitlines()):
        if path.startswith("/") and ".so" in os.path.basename(path) and elf_identity(path) == wanted:
            for source in (path, *so_links(path, directories)):
                libraries.setdefault(os.path.basename(source), path)
    return HostFiles(libraries=tuple(libraries.items()), notes=(f"32-bit libraries listed by {cli} --compat32",))


def _liblist_files(liblist: str, platform: str, host: GpuHost, wanted: ElfIdentity) -> HostFiles:
    """The liblist's library entries resolved in the ld cache for the 32-bit class (Apptainer's
    `ResolveCompat32`); a parent container's libs32 is inherited first, as libs is."""
    from singpy.config.liblist import load_liblist

    try:
        entries = load_liblist(liblist).libraries
        bare = tuple(entry for entry in entries if not entry.startswith("/"))
        cache = read_ld_cache(host.ldconfig, host.ld_cache_file, bare) if bare else {}
    except (ConfigError, GpuError) as exc:
        return HostFiles(warnings=(f"while finding 32-bit {platform} bind points: {exc.message}",))
    found, missing, notes = resolve_libraries(entries, cache, wanted,
                                              inherited=inherited_libraries(f"{host.inherited_libs_dir}32"))
    notes = [note.replace("of the host's architecture", "of the host's 32-bit architecture") for note in notes]
    notes += [f"32-bit {platform} library {name} not found on this host" for name in missing]
    return HostFiles(libraries=tuple(found), notes=tuple(notes))

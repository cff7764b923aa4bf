"""--nv: find the host's NVIDIA devices, driver libraries and tools; return data only.

Library lookup follows Apptainer's legacy mode (nvliblist.conf + `ldconfig
-p`, see `singpy.gpu.ldcache`), or, when an executable
`nvidia-container-cli` is configured, its `list --binaries --libraries`
output, as SingularityCE 3.7 did (absolute paths honoured, every versioned
symlink to them bound too).  Devices are every `/dev/nvidia*` node
(Apptainer `NvidiaDevices(true)`); with --contain, `NVIDIA_VISIBLE_DEVICES`
picks the GPU nodes (and MIG devices, `singpy.gpu.mig`), as
`nvidia-container-cli --device=` does, and a set NVIDIA_DRIVER_CAPABILITIES
leaves out the UVM and modeset nodes it does not need
(`singpy.gpu.capabilities.select_nodes`).

Nothing is mounted here.  Problems are warnings: a launch with --nv on a
host without GPUs still runs (Apptainer behaves the same).
"""

from __future__ import annotations

import os

from singpy.errors import ConfigError, GpuError
from singpy.gpu import GpuContribution, GpuHost, ImageHints, binding_note
from singpy.gpu.capabilities import driver_capabilities, is_set, nvidia_env, select, select_nodes, wants_node
from singpy.gpu.ldcache import (
    HostFiles,
    drop_newer_glibc,
    find_host_files,
    glibc_needs,
    so_links,
)
from singpy.gpu.versions import after, dotted, driver_version_text, is_number, major_minor
from singpy.host.hostfiles import which
from singpy.plan import Missing, MountOp, MountSpec, Stage
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping

    from singpy.gpu.mig import MigDevice
    from singpy.gpu.require import Facts

SELECT_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")  # kept through --cleanenv
NO_DEVICES = "no NVIDIA GPU devices found on this host (no /dev/nvidia*): the container will run without GPU access"
UVM_MISSING = ("{dev_dir}/nvidia-uvm is missing although the NVIDIA driver is loaded: CUDA programs will fail with "
               "CUDA_ERROR_UNKNOWN; run 'modprobe nvidia_uvm' on the host (or start nvidia-persistenced, or run any "
               "CUDA program once on the host), then retry")

# Minimum Linux driver per CUDA toolkit (GA release), newest first: NVIDIA "CUDA Toolkit
# Release Notes", table "CUDA Toolkit and Corresponding Driver Versions".
CUDA_MIN_DRIVER: tuple[tuple[tuple[int, int], tuple[int, ...]], ...] = (
    ((13, 0), (580, 65, 6)),
    ((12, 9), (575, 51, 3)),
    ((12, 8), (570, 26)),
    ((12, 6), (560, 28, 3)),
    ((12, 5), (555, 42, 2)),
    ((12, 4), (550, 54, 14)),
    ((12, 3), (545, 23, 6)),
    ((12, 2), (535, 54, 3)),
    ((12, 1), (530, 30, 2)),
    ((12, 0), (525, 60, 13)),
    ((11, 8), (520, 61, 5)),
    ((11, 7), (515, 43, 4)),
    ((11, 6), (510, 39, 1)),
    ((11, 5), (495, 29, 5)),
    ((11, 4), (470, 42, 1)),
    ((11, 3), (465, 19, 1)),
    ((11, 2), (460, 27, 3)),
    ((11, 1), (455, 23)),
    ((11, 0), (450, 36, 6)),
    ((10, 2), (440, 33)),
    ((10, 1), (418, 39)),
    ((10, 0), (410, 48)),
)


def discover(host: GpuHost, *, contain: bool, image: ImageHints | None = None) -> GpuContribution:
    """Everything --nv binds, as data.  Never raises for host facts; see module doc.

    The image's NVIDIA_DRIVER_CAPABILITIES (or the host's) picks the libraries
    and tools, its NVIDIA_VISIBLE_DEVICES (the host's wins) the GPU nodes:
    `singpy.gpu.capabilities`.
    """
    image = image or ImageHints()
    env = nvidia_env(image.env or {}, host.env)
    selection = {**host.env, **{name: env[name] for name in ("NVIDIA_VISIBLE_DEVICES",) if name in env}}
    devices = device_mounts(dev_dir=host.dev_dir, contain=contain, host_env=selection, path_env=host.path_env,
                            proc_dir=os.path.dirname(host.proc_driver_version))
    wanted, cap_warnings = driver_capabilities(env, image.env or {})
    if is_set(env):  # only then: an image that says nothing gets every node, as with Apptainer
        devices = _nodes_for(devices, wanted, host.dev_dir)
    files = select(_host_files(host, image.glibc), wanted)
    socket = host.persistenced_socket
    if os.path.exists(socket):
        files = files.replace(files=(*files.files, socket))
    else:
        files = files.replace(notes=(*files.notes, f"persistenced socket {socket} not found"))
    cuda_warning = check_cuda_version(host.proc_driver_version, env, host.env)
    mounts = files.mounts()
    return GpuContribution(
        mounts=devices.mounts + mounts,
        keep_host_env=tuple(name for name in SELECT_VARS if name in host.env),
        libs_dir_used=bool(files.libraries),
        warnings=devices.warnings + cap_warnings + files.warnings + cuda_warning,
        notes=devices.notes + files.notes + files.bind_notes(mounts),
    )


# --- devices -------------------------------------------------------------------------


class _Devices(Record, kw_only=False):
    mounts: tuple[MountSpec, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]


def device_mounts(*, dev_dir: str, contain: bool, host_env: Mapping[str, str], path_env: str,
                  proc_dir: str = "/proc/driver/nvidia") -> _Devices:
    """Dev binds for every /dev/nvidia* node; GPU nodes filtered by NVIDIA_VISIBLE_DEVICES under --contain.

    A MIG instance selected as GPU:GI:CI brings its GPU's node and, instead of
    the whole /dev/nvidia-caps directory, the two capability nodes that grant
    access to that GPU instance and compute instance (`mig_caps`).
    """
    try:
        names = sorted((n for n in os.listdir(dev_dir) if n.startswith("nvidia")), key=_node_order)
    except OSError:
        names = []
    if not names:
        return _Devices((), (NO_DEVICES,), ())
    warnings: list[str] = []
    notes: list[str] = []
    if "nvidiactl" in names and "nvidia-uvm" not in names:
        warnings.append(UVM_MISSING.format(dev_dir=dev_dir))
    caps: list[str] = []
    wanted = _wanted_gpus(names, contain, host_env, path_env, warnings, notes, (proc_dir, dev_dir, caps))
    kept = [n for n in names if (i := gpu_index(n)) is None or wanted is None or i in wanted]
    if caps:
        kept = [n for n in kept if n != "nvidia-caps"] + [f"nvidia-caps/{cap}" for cap in caps]
    mounts = tuple(
        MountSpec(op=MountOp.BIND, source=os.path.join(dev_dir, name), dest=f"/dev/{name}", dev=True,
                  missing=Missing.REQUIRED, stage=Stage.GPU)
        for name in kept
    )
    notes += [binding_note(spec) for spec in mounts]
    return _Devices(mounts, tuple(warnings), tuple(notes))


def _nodes_for(devices: _Devices, wanted: frozenset[str], dev_dir: str) -> _Devices:
    """The device binds the capabilities ask for (`singpy.gpu.capabilities.select_nodes`); the "binding" note
    of a node left out goes, and so does the missing-UVM warning when UVM is not wanted."""
    nodes, node_notes = select_nodes(devices.mounts, wanted)
    left = {binding_note(spec) for spec in devices.mounts if spec not in nodes}
    unwanted = () if wants_node("/dev/nvidia-uvm", wanted) else (UVM_MISSING.format(dev_dir=dev_dir),)
    return devices.replace(mounts=nodes, notes=tuple(n for n in devices.notes if n not in left) + node_notes,
                           warnings=tuple(w for w in devices.warnings if w not in unwanted))


def gpu_index(name: str) -> int | None:
    """N for a GPU node "nvidiaN"; None for the others (nvidiactl, nvidia-uvm, nvidia-caps)."""
    number = name[len("nvidia"):]
    return int(number) if name.startswith("nvidia") and is_number(number) else None


def _node_order(name: str) -> tuple[int, int, str]:
    index = gpu_index(name)
    return (1, index, name) if index is not None else (0, 0, name)


def _wanted_gpus(
    names: list[str], contain: bool, host_env: Mapping[str, str], path_env: str,
    warnings: list[str], notes: list[str], mig: tuple[str, str, list[str]],
) -> set[int] | None:
    """GPU minors to bind, or None for all (nvidia-container-toolkit's NVIDIA_VISIBLE_DEVICES values)."""
    value = host_env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in ("", "all"):
        return None
    if not contain:
        # Without --contain the whole host /dev is bound, so no selection is possible.
        notes.append("NVIDIA_VISIBLE_DEVICES selects GPU device nodes only with --contain; all are visible")
        return None
    if value in ("none", "void"):
        return set()
    from singpy.gpu.mig import find, mig_caps  # only for a selection: not on every --nv run

    present = {i for n in names if (i := gpu_index(n)) is not None}
    uuids: dict[str, int] | None = None
    migs: list[MigDevice] | None = None
    wanted: set[int] = set()
    for item in (part.strip() for part in value.split(",") if part.strip()):
        if item[:4].upper() == "MIG-" or item.count(":") == 1:  # a MIG device by UUID or as GPU:MIG
            if migs is None:
                migs = host_mig_devices(path_env, warnings)
            device = find(item, migs)
            if device is None:
                warnings.append(f"NVIDIA_VISIBLE_DEVICES: no MIG device '{item}' on this host (nvidia-smi -L lists "
                                "them); ignored")
                continue
            notes.append(f"NVIDIA_VISIBLE_DEVICES: MIG device {item} is GPU:GI:CI {device.name}")
            item = device.name
        if item.count(":") == 2:
            found = mig_caps(item, mig[0], mig[1], warnings)
            if found is not None and found[0] in present:
                wanted.add(found[0])
                mig[2].extend(cap for cap in found[1] if cap not in mig[2])
            elif found is not None:
                warnings.append(f"NVIDIA_VISIBLE_DEVICES: no GPU device node for '{item}'; ignored")
            continue
        if is_number(item):
            index: int | None = int(item)
        else:
            if uuids is None:
                uuids = gpu_uuids(path_env, warnings)
            index = uuids.get(item)
        if index is None or index not in present:
            warnings.append(f"NVIDIA_VISIBLE_DEVICES: no GPU device node for '{item}'; ignored")
        else:
            wanted.add(index)
    return wanted


def host_mig_devices(path_env: str, warnings: list[str]) -> list[MigDevice]:
    """The host's MIG devices, from `nvidia-smi -L` and the MIG table of `nvidia-smi` (`singpy.gpu.mig`)."""
    if (which("nvidia-smi", path_env) if path_env else None) is None:
        warnings.append("NVIDIA_VISIBLE_DEVICES names MIG devices but nvidia-smi is not on PATH to resolve them")
        return []
    from singpy.gpu.mig import mig_devices

    return mig_devices(_smi(path_env, "-L"), _smi(path_env))


def gpu_uuids(path_env: str, warnings: list[str]) -> dict[str, int]:
    """UUID -> index from `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`.

    The index is taken as the /dev/nvidiaN minor, which holds on hosts where
    nvidia-smi enumerates in device-minor order (the default PCI bus order).
    """
    smi = which("nvidia-smi", path_env) if path_env else None
    if smi is None:
        warnings.append("NVIDIA_VISIBLE_DEVICES lists GPU UUIDs but nvidia-smi is not on PATH to resolve them")
        return {}
    import subprocess  # only here and for nvidia-container-cli: not on every --nv run

    argv = [smi, "--query-gpu=index,uuid", "--format=csv,noheader"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        warnings.append(f"could not resolve GPU UUIDs with {' '.join(argv)}: {_why(exc)}")
        return {}
    table: dict[str, int] = {}
    for line in done.stdout.splitlines():
        index, _, uuid = (part.strip() for part in line.partition(","))
        if is_number(index) and uuid:
            table[uuid] = int(index)
    return table


# --- libraries and binaries -------------------------------------------------------------


def _host_files(host: GpuHost, image_glibc: str | None) -> HostFiles:
    """From nvidia-container-cli when configured and it works, else from the liblist."""
    fallback_warning: tuple[str, ...] = ()
    cli = host.nvidia_container_cli
    if cli is not None and os.path.isfile(cli) and os.access(cli, os.X_OK):
        from singpy.gpu import listcache

        saved = listcache.entry(cli, host)
        kept = listcache.load(saved, cli) if saved is not None else None
        if kept is not None:
            return drop_newer_glibc(kept, image_glibc)
        import subprocess  # only when the tool runs: its imports cost ~9 ms, which a kept listing spares

        try:
            files = files_from_container_cli(cli)
            if saved is not None and files.libraries:
                files = files.replace(glibc=glibc_needs(files))  # read once, kept with the listing
                listcache.save(saved, files)
            return drop_newer_glibc(files, image_glibc)
        except (OSError, subprocess.SubprocessError) as exc:
            if host.nvccli:
                raise GpuError(f"--nvccli: {cli} list failed: {_why(exc)}") from None
            fallback_warning = (f"nvidia-container-cli list failed ({_why(exc)}); using {host.nvliblist} instead",)
    try:
        from singpy.config.liblist import load_liblist

        liblist = load_liblist(host.nvliblist)
    except ConfigError as exc:
        return HostFiles(warnings=(*fallback_warning, f"while finding nv bind points: {exc.message}"))
    files = find_host_files(liblist, "nv", host, image_glibc)
    return files.replace(warnings=fallback_warning + files.warnings)


def _why(exc: Exception) -> str:
    """The tool's own last stderr line when it has one ("nvml error: driver not loaded")."""
    stderr = getattr(exc, "stderr", None)
    lines = stderr.strip().splitlines() if isinstance(stderr, str) else []
    return lines[-1] if lines else str(exc)


def files_from_container_cli(cli: str) -> HostFiles:
    """Run `<cli> list --binaries --libraries`; absolute paths, one per line.

    Libraries of another ELF class/machine are skipped silently; each library
    is also bound under the name of every symlink beside it that resolves to
    it (libcuda.so.1 -> libcuda.so.550.54.14), since programs open the soname.
    """
    import subprocess

    argv = [cli, "list", "--binaries", "--libraries"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    from singpy.gpu.elf import elf_identity, host_elf_identity

    host = host_elf_identity()
    libraries: dict[str, str] = {}
    binaries: dict[str, str] = {}
    notes: list[str] = []
    directories: dict[str, dict[str, list[str]]] = {}  # each library directory listed once
    for path in (line.strip() for line in done.stdout.splitlines()):
        if not path.startswith("/"):
            continue
        name = os.path.basename(path)
        if ".so" not in name:
            binaries.setdefault(name, path)
        elif elf_identity(path) != host:
            notes.append(f"ignoring {path}: not an ELF library of the host's architecture")
        else:
            for source in (path, *so_links(path, directories)):  # each name of the file, bound from the file
                libraries.setdefault(os.path.basename(source), path)
    warnings = () if libraries else ("could not find any nv libraries on this host",)
    return HostFiles(
        libraries=tuple(libraries.items()), binaries=tuple(binaries.items()), warnings=warnings,
        notes=(f"libraries and binaries listed by {cli}", *notes),
    )


# --- CUDA version check ------------------------------------------------------------------


def check_cuda_version(
    proc_driver_version: str, image_env: Mapping[str, str], host_env: Mapping[str, str]
) -> tuple[str, ...]:
    """A warning when the image's CUDA is newer than the host driver supports."""
    wanted = image_cuda_version(image_env)
    if wanted is None:
        return ()
    from singpy.gpu.require import disabled

    drv = driver_version_text(proc_driver_version)
    if disabled(image_env) or disabled(host_env) or drv is None:
        return ()  # NVIDIA_DISABLE_REQUIRE: the toolkit's opt-out of its own `cuda>=` requirement check
    driver = tuple(int(part) for part in drv.split("."))
    supported = max_cuda_for_driver(driver)
    newest_known = CUDA_MIN_DRIVER[0][0]
    if supported is not None and (wanted <= supported or supported == newest_known):
        return ()  # supported, or newer than this table knows about: cannot judge
    have = f"CUDA up to {supported[0]}.{supported[1]}" if supported else "no CUDA >= 10.0"
    message = (
        f"the image needs CUDA {wanted[0]}.{wanted[1]} but the host NVIDIA driver {drv} supports {have}: "
        "CUDA programs may fail with 'CUDA driver version is insufficient for CUDA runtime version' "
        "(update the host driver, or use an image built for an older CUDA)"
    )
    return (message,)


def image_cuda_version(image_env: Mapping[str, str]) -> tuple[int, int] | None:
    """From NVIDIA_REQUIRE_CUDA ("cuda>=12.4 brand=...") or else CUDA_VERSION ("12.4.1")."""
    return after(image_env.get("NVIDIA_REQUIRE_CUDA", ""), "cuda>=") or major_minor(image_env.get("CUDA_VERSION", ""))


def driver_version(proc_driver_version: str) -> tuple[int, ...] | None:
    """The driver version as integers, for comparisons: (550, 54, 14)."""
    text = driver_version_text(proc_driver_version)
    return tuple(int(part) for part in text.split(".")) if text else None


def max_cuda_for_driver(driver: tuple[int, ...]) -> tuple[int, int] | None:
    """Newest CUDA whose minimum driver is <= `driver`; None if older than every entry."""
    return next((cuda for cuda, minimum in CUDA_MIN_DRIVER if driver >= minimum), None)


# --- NVIDIA_REQUIRE_* ----------------------------------------------------------------------


def check_requirements(host: GpuHost, image: ImageHints | None = None) -> tuple[str, ...]:
    """GpuError (one FATAL) when the image's NVIDIA_REQUIRE_* (or legacy CUDA_VERSION) do not hold here.

    Warnings for requirements that cannot be parsed. Nothing is checked without a
    loaded driver (no /proc/driver/nvidia/version): --nv then warns and runs anyway.
    """
    env = nvidia_env((image.env if image else None) or {}, host.env)
    if not any(name.startswith("NVIDIA_REQUIRE_") or name == "CUDA_VERSION" for name in env):
        return ()  # nothing to check (most images): singpy.gpu.require is not even loaded
    if driver_version(host.proc_driver_version) is None:
        return ()
    from singpy.gpu.require import describe, unmet

    facts = host_facts(host)
    failed, warnings = unmet(env, facts)
    if failed is not None:
        name, value = failed
        raise GpuError(
            f"the image requires {value!r} ({name}) but this host has {describe(facts, value)}; "
            "SINGULARITYENV_NVIDIA_DISABLE_REQUIRE=1 skips this check",
            hint="update the host NVIDIA driver, or use an image built for an older CUDA",
        )
    return warnings


def host_facts(host: GpuHost) -> Facts:
    """The driver's facts, each learnt once and only when a condition asks for it."""
    def gpus(field: str) -> tuple[str, ...] | None:
        return tuple(line.strip() for line in _smi(host.path_env, f"--query-gpu={field}", "--format=csv,noheader")
                     .splitlines() if line.strip()) or None

    def archs() -> tuple[tuple[int, ...], ...] | None:
        found = tuple(v for text in gpus("compute_cap") or () if (v := dotted(text)))
        return found or None

    def brands() -> tuple[str, ...] | None:
        lines = _smi(host.path_env, "-q").splitlines()
        found = tuple(line.partition(":")[2].strip() for line in lines if line.strip().startswith("Product Brand"))
        return found or None

    from functools import cache

    from singpy.gpu.require import Facts

    return Facts(cuda=cache(lambda: driver_cuda_version(host)),
                 driver=cache(lambda: driver_version(host.proc_driver_version)), archs=cache(archs),
                 brands=cache(brands))


def driver_cuda_version(host: GpuHost) -> tuple[int, int] | None:
    """The newest CUDA the driver supports: from the release table, else cuDriverGetVersion() of libcuda.so.1.

    The table is exact for the drivers it covers and costs nothing; libcuda is
    loaded only for a driver newer than its newest entry.
    """
    driver = driver_version(host.proc_driver_version)
    supported = max_cuda_for_driver(driver) if driver else None
    if supported is not None and supported != CUDA_MIN_DRIVER[0][0]:
        return supported
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        number = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(number)) == 0 and number.value > 0:
            return number.value // 1000, number.value % 1000 // 10
    except (OSError, AttributeError):
        pass
    return supported


def _smi(path_env: str, *args: str) -> str:
    """nvidia-smi's output, or "" when it is missing or fails (the fact is then unknown)."""
    smi = which("nvidia-smi", path_env) if path_env else None
    if smi is None:
        return ""
    import subprocess

    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""

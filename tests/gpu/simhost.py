"""A simulated GPU host in a directory: real device nodes, real ELF libraries, real ld cache.

Nothing here is a mock.  `build_nvidia_host` creates, under one directory:

* ``dev/``: character devices made with mknod(2) carrying NVIDIA's majors and
  minors (nvidiactl 195:255, nvidiaN 195:N, nvidia-modeset 195:254, the UVM
  pair on a dynamic major, 511 here) and a ``nvidia-caps/`` directory, with the
  capability nodes of two MIG instances (`MIG_INSTANCES`) that
  ``proc/driver/nvidia/capabilities`` names;
* ``usr/lib/x86_64-linux-gnu/``: stand-in driver libraries compiled with gcc
  (``libcuda.so.550.54.14`` exporting cuInit/cuDriverGetVersion, soname
  symlinks as the driver installer makes them), one of them linked against
  GLIBC_2.34 symbols, and, when ``gcc -m32`` can link, an i386 libcuda in
  ``usr/lib/i386-linux-gnu/`` (needing libc.so.6, linked against a stub of it:
  ldconfig lists it as "libc6" beside the "libc6,x86-64" one, as on a multiarch
  host; --compat32 binds it); a copy whose ELF header says AArch64 stands
  for a foreign-architecture file;
* ``etc/ld.so.cache``: built by the real ``ldconfig -C`` over those
  directories (glibc's ldconfig always adds the system directories too, so the
  cache also holds the host's own libraries, as a real one would);
* ``usr/bin/``: ``nvidia-smi`` and ``nvidia-container-cli`` shell stubs (the latter lists the i386
  libraries too when given ``--compat32``);
* ``proc/driver/nvidia/version``, ``run/nvidia-persistenced/socket`` (a socket
  inode), a Vulkan ICD JSON, and ``etc/nvliblist.conf`` naming all of it.

Every path is in the returned `SimHost`, so the same host can be handed to
`discover(GpuHost(...))` directly or bound over /dev and /etc/ld.so.cache inside a
private mount namespace by integration tests.  mknod needs CAP_MKNOD (root).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

DRIVER = "550.54.14"
NVIDIA_MAJOR = 195  # fixed by the NVIDIA driver (nvidiactl is 195:255)
UVM_MAJOR = 511  # dynamic on real hosts; any free major will do
DRM_MAJOR = 226  # /dev/dri/cardN and renderD128+
KFD_MAJOR = 234  # dynamic on real hosts
EM_AARCH64 = 183
COMPUTE_CAP = "9.0"  # what the nvidia-smi stub answers for --query-gpu=compute_cap (H100)
BRAND = "NVIDIA"  # and for "Product Brand" in -q (an H100's brand)

LIBCUDA_C = """
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *version) { *version = 12040; return 0; }
"""
LIBNVML_C = """
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
"""
# Uses pthread_create/dlopen, which glibc >= 2.34 versions as GLIBC_2.34: a host library
# that an older image (glibc 2.31) cannot load.
GLCORE_C = """
#include <dlfcn.h>
#include <pthread.h>
static void *run(void *arg) { return arg; }
int glcore_spawn(void) {
    pthread_t thread;
    void *handle = dlopen("libc.so.6", RTLD_LAZY);
    if (pthread_create(&thread, 0, run, handle) != 0) return 1;
    return pthread_join(thread, 0);
}
"""
ROCM_C = "int rocm_stub(void) { return 0; }\n"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SimHost:
    """Paths of one simulated host; everything lives under `root`."""

    root: Path
    dev_dir: Path  # GpuHost.dev_dir
    lib_dir: Path  # 64-bit libraries
    lib32_dir: Path | None  # i386 libraries, None when gcc -m32 cannot link here
    ld_conf: Path  # the directories ldconfig scanned
    ld_cache: Path  # GpuHost.ld_cache_file
    ldconfig: str  # the real ldconfig binary
    bin_dir: Path
    path_env: str  # GpuHost.path_env
    liblist: Path  # a liblist naming the simulated files
    libs: dict[str, Path]  # soname -> real file, 64-bit
    lib32: dict[str, Path]  # soname -> real file, i386
    foreign_lib: Path  # an AArch64 ELF (absolute entry in the liblist)
    files: tuple[Path, ...]  # plain files present (ICD JSON)
    proc_version: Path
    persistenced_socket: Path
    container_cli: Path  # stub nvidia-container-cli
    uuids: tuple[str, ...]  # GPU-... per index
    gpus: int
    mig_uuids: dict[str, str] = dataclasses.field(default_factory=dict)  # "GPU:GI:CI" -> MIG-..., as nvidia-smi -L


def build_nvidia_host(
    tmp: Path, *, gpus: int = 2, uvm: bool = True, devices: bool = True, driver: str = DRIVER
) -> SimHost:
    """Create a simulated NVIDIA host under `tmp` (which must exist)."""
    root = Path(tmp)
    dev_dir = root / "dev"
    dev_dir.mkdir(parents=True, exist_ok=True)
    if devices:
        _nvidia_nodes(dev_dir, gpus, uvm)
        _mig_instances(root, gpus)
    lib_dir = root / "usr/lib/x86_64-linux-gnu"
    libs = {
        "libcuda.so.1": _shared_lib(lib_dir, "libcuda", driver, "libcuda.so.1", LIBCUDA_C, dev_link=True),
        "libnvidia-ml.so.1": _shared_lib(lib_dir, "libnvidia-ml", driver, "libnvidia-ml.so.1", LIBNVML_C),
        f"libnvidia-glcore.so.{driver}": _shared_lib(
            lib_dir, "libnvidia-glcore", driver, f"libnvidia-glcore.so.{driver}", GLCORE_C
        ),
    }
    lib32_dir: Path | None = root / "usr/lib/i386-linux-gnu"
    lib32: dict[str, Path] = {}
    try:
        lib32["libcuda.so.1"] = _shared_lib(root / "usr/lib/i386-linux-gnu", "libcuda", driver, "libcuda.so.1",
                                            LIBCUDA_C, m32=True)
    except subprocess.CalledProcessError:
        lib32_dir = None  # gcc -m32 cannot link here: no i386 library in this host
    foreign = _foreign_copy(libs["libnvidia-ml.so.1"], root / "usr/lib/aarch64-linux-gnu")
    ld_conf, ld_cache, ldconfig = build_ld_cache(root, [lib_dir, *([lib32_dir] if lib32_dir else [])])
    bin_dir = root / "usr/bin"
    uuids = tuple(f"GPU-{index:08x}-5a3c-4f7e-9d2b-{0xC0FFEE000000 + index:012x}" for index in range(gpus))
    migs = {item: mig_uuid(item) for item in MIG_INSTANCES if int(item.split(":")[0]) < gpus} if devices else {}
    _write_script(bin_dir / "nvidia-smi", _nvidia_smi_script(uuids, driver, migs))
    cli_paths = [str(bin_dir / "nvidia-smi"), *(str(lib_dir / f"{stem}.so.{driver}") for stem in
                 ("libcuda", "libnvidia-ml", "libnvidia-glcore"))]
    container_cli = _write_script(bin_dir / "nvidia-container-cli",
                                  container_cli_script(cli_paths, [str(path) for path in lib32.values()]))
    icd = _write(root / "usr/share/vulkan/icd.d/nvidia_icd.json", _ICD_JSON.format(driver=driver))
    proc_version = _write(root / "proc/driver/nvidia/version", proc_version_text(driver))
    socket_path = root / "run/nvidia-persistenced/socket"
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(socket_path, stat.S_IFSOCK | 0o666)  # a socket inode; nobody listens on it
    socket_path.chmod(0o666)
    liblist = _write(root / "etc/nvliblist.conf", _nv_liblist(foreign, icd, root))
    return SimHost(
        root=root, dev_dir=dev_dir, lib_dir=lib_dir, lib32_dir=lib32_dir, ld_conf=ld_conf, ld_cache=ld_cache,
        ldconfig=ldconfig, bin_dir=bin_dir, path_env=str(bin_dir), liblist=liblist, libs=libs, lib32=lib32,
        foreign_lib=foreign, files=(icd,), proc_version=proc_version, persistenced_socket=socket_path,
        container_cli=container_cli, uuids=uuids, gpus=gpus, mig_uuids=migs,
    )


def build_rocm_host(tmp: Path, *, kfd: bool = True, dri: bool = True, render_nodes: int = 1) -> SimHost:
    """Create a simulated AMD ROCm host under `tmp`: /dev/kfd, /dev/dri/{card0,renderD128..}, libs (one also
    built for i386, in opt/rocm/lib32, for --compat32), stubs."""
    root = Path(tmp)
    dev_dir = root / "dev"
    dev_dir.mkdir(parents=True, exist_ok=True)
    if kfd:
        _char_device(dev_dir / "kfd", KFD_MAJOR, 0)
    if dri:
        (dev_dir / "dri").mkdir()
        for index in range(render_nodes):
            _char_device(dev_dir / f"dri/card{index}", DRM_MAJOR, index)
            _char_device(dev_dir / f"dri/renderD{128 + index}", DRM_MAJOR, 128 + index)
    lib_dir = root / "opt/rocm/lib"
    # Names from rocmliblist.conf that a stock Debian host does not have, so the simulated
    # copies are the only match in the cache.
    libs = {
        "libamdocl64.so": _shared_lib(lib_dir, "libamdocl64", "", "libamdocl64.so", ROCM_C),
        "librocr_debug_agent64.so.2": _shared_lib(
            lib_dir, "librocr_debug_agent64", "2.0.0", "librocr_debug_agent64.so.2", ROCM_C
        ),
        "libCXLActivityLogger.so": _shared_lib(lib_dir, "libCXLActivityLogger", "", "libCXLActivityLogger.so", ROCM_C),
    }
    foreign = _foreign_copy(libs["libamdocl64.so"], root / "opt/rocm/lib-aarch64")
    lib32_dir: Path | None = root / "opt/rocm/lib32"  # the 32-bit build of one of them, under the same name
    lib32: dict[str, Path] = {}
    try:
        lib32["libCXLActivityLogger.so"] = _shared_lib(root / "opt/rocm/lib32", "libCXLActivityLogger", "",
                                                       "libCXLActivityLogger.so", ROCM_C, m32=True)
    except subprocess.CalledProcessError:
        lib32_dir = None
    ld_conf, ld_cache, ldconfig = build_ld_cache(root, [lib_dir, *([lib32_dir] if lib32_dir else [])])
    bin_dir = root / "opt/rocm/bin"
    _write_script(bin_dir / "rocminfo", _ROCMINFO)
    _write_script(bin_dir / "rocm-smi", _ROCM_SMI)
    liblist = _write(
        root / "etc/rocmliblist.conf",
        "# simulated rocmliblist.conf\nrocm-smi\nrocminfo\n\n"
        "libamdocl64.so\nlibrocr_debug_agent64.so\nlibCXLActivityLogger.so\nlibhc_am.so\n",
    )
    return SimHost(
        root=root, dev_dir=dev_dir, lib_dir=lib_dir, lib32_dir=lib32_dir, ld_conf=ld_conf, ld_cache=ld_cache,
        ldconfig=ldconfig, bin_dir=bin_dir, path_env=str(bin_dir), liblist=liblist, libs=libs, lib32=lib32,
        foreign_lib=foreign, files=(), proc_version=root / "proc/driver/nvidia/version",
        persistenced_socket=root / "run/nvidia-persistenced/socket", container_cli=bin_dir / "nvidia-container-cli",
        uuids=(), gpus=render_nodes if dri else 0,
    )


# --- pieces that tests may also use on their own ----------------------------------------


def proc_version_text(driver: str = DRIVER) -> str:
    """The first lines of /proc/driver/nvidia/version for the proprietary module."""
    return (
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


def container_cli_script(paths: list[str], compat32: list[str] | None = None) -> str:
    """A `nvidia-container-cli` that answers `list --binaries --libraries` with `paths`, and `compat32` too when
    `--compat32` is among its arguments (libnvidia-container lists the 32-bit libraries then)."""
    body = "\n".join(paths)
    body32 = "\n".join(compat32 or [])
    return f"""#!/bin/sh
# stand-in for libnvidia-container's CLI: only the 'list' command
if [ "$1" != list ]; then echo "nvidia-container-cli: unsupported command: $1" >&2; exit 1; fi
cat <<'EOF'
{body}
EOF
case " $* " in *" --compat32 "*) cat <<'EOF'
{body32}
EOF
;; esac
"""


def write_file(path: Path, text: str) -> Path:
    """Create parents and write `text`."""
    return _write(path, text)


def build_elf_library(directory: Path, soname: str, source: str = ROCM_C, *, m32: bool = False) -> Path:
    """Compile one shared object `directory/soname` (no version suffix, no symlinks)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / soname
    _compile(source, target, soname=soname, m32=m32)
    return target


def char_device(path: Path, major: int, minor: int) -> Path:
    """mknod a character device (needs CAP_MKNOD)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _char_device(path, major, minor)
    return path


# --- internals --------------------------------------------------------------------------


def _nvidia_nodes(dev_dir: Path, gpus: int, uvm: bool) -> None:
    _char_device(dev_dir / "nvidiactl", NVIDIA_MAJOR, 255)
    _char_device(dev_dir / "nvidia-modeset", NVIDIA_MAJOR, 254)
    for index in range(gpus):
        _char_device(dev_dir / f"nvidia{index}", NVIDIA_MAJOR, index)
    if uvm:
        _char_device(dev_dir / "nvidia-uvm", UVM_MAJOR, 0)
        _char_device(dev_dir / "nvidia-uvm-tools", UVM_MAJOR, 1)
    caps = dev_dir / "nvidia-caps"
    caps.mkdir()
    _char_device(caps / "nvidia-cap1", 237, 1)  # MIG config capability; dynamic major too
    _char_device(caps / "nvidia-cap2", 237, 2)


# MIG instances "GPU:GI:CI" -> (GI access minor, CI access minor): /dev/nvidia-caps/nvidia-capM nodes and the
# /proc/driver/nvidia/capabilities/gpuN/mig/giG[/ciC]/access files naming them, as the driver publishes them. In
# this order, each is its GPU's MIG device 0, 1... (nvidia-smi's "Device N" and "MIG Dev").
MIG_INSTANCES = {"0:1:0": (12, 13), "0:2:1": (15, 16), "1:2:0": (21, 22)}


def mig_uuid(item: str) -> str:
    """The simulated MIG device's UUID ("MIG-" and a UUID made of GPU, GI and CI)."""
    gpu, gi, ci = (int(part) for part in item.split(":"))
    return f"MIG-{gpu:08x}-{gi:04x}-4{ci:03x}-8e1f-{0xD15C0 + gpu:012x}"


def mig_index(item: str) -> int:
    """The MIG device's index on its GPU: its rank among that GPU's instances in MIG_INSTANCES."""
    gpu = item.split(":")[0]
    return [name for name in MIG_INSTANCES if name.split(":")[0] == gpu].index(item)


def _mig_instances(root: Path, gpus: int) -> None:
    for item, minors in MIG_INSTANCES.items():
        gpu, gi, ci = item.split(":")
        if int(gpu) >= gpus:
            continue
        instance = root / f"proc/driver/nvidia/capabilities/gpu{gpu}/mig/gi{gi}"
        for access, minor in ((instance / "access", minors[0]), (instance / f"ci{ci}" / "access", minors[1])):
            _write(access, f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
            _char_device(root / "dev/nvidia-caps" / f"nvidia-cap{minor}", 237, minor)


def _char_device(path: Path, major: int, minor: int) -> None:
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    path.chmod(0o666)  # as the driver creates them; mknod's mode is cut by the umask


_COMPILED: dict[str, bytes] = {}  # gcc output by (source, flags) digest: compile once per session


def _compile(source: str, target: Path, *, soname: str, m32: bool = False) -> None:
    flags = ["-shared", "-fPIC", "-O1", f"-Wl,-soname,{soname}"]
    if m32:
        flags += ["-m32", "-nostdlib"]  # no i386 crt/libgcc installed: a libc-less object still links
    key = hashlib.sha256("\0".join([source, *flags]).encode()).hexdigest()
    if key not in _COMPILED:
        source_file = target.with_name(target.name + ".c")
        source_file.write_text(source)
        with tempfile.TemporaryDirectory() as stub_dir:
            libc = _libc32_needed(Path(stub_dir)) if m32 else []
            subprocess.run(["gcc", *flags, "-o", str(target), str(source_file), *libc], check=True,
                           capture_output=True)
        source_file.unlink()
        _COMPILED[key] = target.read_bytes()
    target.write_bytes(_COMPILED[key])
    target.chmod(0o755)


def _libc32_needed(stub_dir: Path) -> list[str]:
    """Link flags that make an i386 object need libc.so.6, as a real 32-bit driver library does (ldconfig lists it
    as "libc6", not "ELF"): linked against a libc-less stub of that name, since no i386 libc is installed."""
    stub = stub_dir / "libc.so.6"
    subprocess.run(["gcc", "-m32", "-nostdlib", "-shared", "-Wl,-soname,libc.so.6", "-o", str(stub), "-x", "c",
                    "-"], input="int singpy_libc_stub;\n", text=True, check=True, capture_output=True)
    return ["-Wl,--no-as-needed", str(stub)]


def _shared_lib(
    directory: Path, stem: str, version: str, soname: str, source: str, *, m32: bool = False, dev_link: bool = False
) -> Path:
    """`stem.so.version` plus the soname symlink (and `stem.so` with dev_link), as installers make them."""
    directory.mkdir(parents=True, exist_ok=True)
    real = directory / (f"{stem}.so.{version}" if version else f"{stem}.so")
    _compile(source, real, soname=soname, m32=m32)
    links = [soname] + ([f"{stem}.so"] if dev_link else [])
    for link in links:
        if link != real.name:
            (directory / link).symlink_to(real.name if link == soname else soname)
    return real


def _foreign_copy(library: Path, directory: Path) -> Path:
    """A copy of `library` whose e_machine says AArch64: the ELF filter must refuse it."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / library.name
    data = bytearray(library.read_bytes())
    data[18:20] = struct.pack("<H", EM_AARCH64)
    target.write_bytes(bytes(data))
    return target


def build_ld_cache(root: Path, dirs: list[Path]) -> tuple[Path, Path, str]:
    """`ldconfig -X -C cache -f conf` over `dirs` (-X: leave the symlinks as made).

    glibc's ldconfig rewrites /var/cache/ldconfig/aux-cache on every cache build,
    even with -C and -i; as root it is run in a private mount namespace with a tmpfs
    there so building a test cache leaves the host untouched.
    """
    ldconfig = shutil.which("ldconfig", path="/sbin:/usr/sbin:/usr/bin:/bin") or "/sbin/ldconfig"
    conf = _write(root / "etc/ld.so.conf", "".join(f"{d}\n" for d in dirs))
    cache = root / "etc/ld.so.cache"
    argv = [ldconfig, "-i", "-X", "-C", str(cache), "-f", str(conf)]
    unshare = shutil.which("unshare")
    if os.geteuid() == 0 and unshare:
        script = 'mount -t tmpfs singpy-test /var/cache/ldconfig && exec "$0" "$@"'
        private = [unshare, "--mount", "--propagation", "private", "sh", "-c", script, *argv]
        if subprocess.run(private, capture_output=True, check=False).returncode == 0:
            return conf, cache, ldconfig
    subprocess.run(argv, check=True, capture_output=True)  # unprivileged: the aux cache is not writable
    return conf, cache, ldconfig


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _write_script(path: Path, text: str) -> Path:
    _write(path, text)
    path.chmod(0o755)
    return path


def _nv_liblist(foreign: Path, icd: Path, root: Path) -> str:
    return f"""# simulated nvliblist.conf (Apptainer format)
# put binaries here
nvidia-smi
nvidia-persistenced

# put libs here (must end in .so)
libcuda.so
libnvidia-ml.so
libnvidia-glcore.so
libnvidia-opencl.so
{foreign}

# put non-library file paths here (must be absolute path)
{icd}
{root}/usr/share/glvnd/egl_vendor.d/10_nvidia.json
"""


def _nvidia_smi_script(uuids: tuple[str, ...], driver: str, migs: dict[str, str]) -> str:
    """nvidia-smi's answers; `migs` ("GPU:GI:CI" -> MIG UUID) appear in -L and in the summary's MIG table."""
    csv = "\n".join(f"{index}, {uuid}" for index, uuid in enumerate(uuids))
    lines = []
    for i, u in enumerate(uuids):
        lines.append(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})")
        lines += [f"  MIG 1g.10gb     Device  {mig_index(item)}: (UUID: {uuid})" for item, uuid in migs.items()
                  if int(item.split(":")[0]) == i]
    listing = "\n".join(lines)
    rows = [f"| {item.split(':')[0]:>2} {item.split(':')[1]:>4} {item.split(':')[2]:>3} {mig_index(item):>3}  |"
            "     11MiB /  9984MiB | 16      0 |  1   0    1    0    1 |\n"
            "|                  |      0MiB / 16383MiB |           |                       |" for item in migs]
    mig_table = ("| MIG devices:                                                                            |\n"
                 "+------------------+----------------------+-----------+-----------------------+\n"
                 "| GPU  GI  CI  MIG |         Memory-Usage |        Vol|        Shared         |\n"
                 "|      ID  ID  Dev |           BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |\n"
                 "|==================+======================+===========+=======================|\n"
                 + "\n".join(rows) + "\n+------------------+----------------------+-----------+"
                 "-----------------------+") if migs else "| MIG: none"
    caps = "\n".join(COMPUTE_CAP for _ in uuids)
    query = "\n".join(f"GPU 0000000{i}:00.0\n    Product Name : NVIDIA H100 80GB HBM3\n"
                      f"    Product Brand : {BRAND}\n    Product Architecture : Hopper" for i in range(len(uuids)))
    return f"""#!/bin/sh
# stand-in for nvidia-smi: --query-gpu=index,uuid or compute_cap CSV, -L, -q (brands), or a summary table
case "$*" in
  *--query-gpu=index,uuid*) cat <<'EOF'
{csv}
EOF
  ;;
  *--query-gpu=compute_cap*) cat <<'EOF'
{caps}
EOF
  ;;
  -q) cat <<'EOF'
{query}
EOF
  ;;
  -L) cat <<'EOF'
{listing}
EOF
  ;;
  *) cat <<'EOF'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: 12.4     |
+-----------------------------------------------------------------------------------------+
| simulated host: {len(uuids)} GPU(s)
+-----------------------------------------------------------------------------------------+
{mig_table}
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
EOF
  ;;
esac
"""


_ICD_JSON = """{{
    "file_format_version" : "1.0.1",
    "ICD": {{
        "library_path": "libGLX_nvidia.so.0",
        "api_version" : "1.3.277"
    }},
    "comment": "simulated NVIDIA driver {driver}"
}}
"""
_ROCMINFO = """#!/bin/sh
# stand-in for rocminfo
echo "ROCk module is loaded"
echo "HSA System Attributes"
echo "  Name:                    gfx90a"
"""
_ROCM_SMI = """#!/bin/sh
# stand-in for rocm-smi
echo "========================= ROCm System Management Interface ========================="
echo "GPU  Temp   AvgPwr  SCLK    MCLK     Fan  Perf  PwrCap  VRAM%  GPU%"
echo "0    35.0c  40.0W   800Mhz  1600Mhz  0%   auto  300.0W    0%   0%"
"""

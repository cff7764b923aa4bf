"""The start-up benchmark's images (sandbox, SIF, singpy.conf variants) and its simulated NVIDIA GPU host."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from startup_records import GpuSetup, Images, Row
from startup_repo import REPO
from startup_runner import Runner

if TYPE_CHECKING:
    from tests.gpu.simhost import SimHost

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"  # PATH of the commands; the simulated GPU host puts its tools first


def build_sandbox(workdir: Path) -> Path:
    from tests.support.images import build_busybox_rootfs

    return build_busybox_rootfs(workdir / "sandbox")


def build_sif(workdir: Path, sandbox: Path) -> tuple[Path | None, str]:
    """A SIF made as `apptainer build` makes one: a squashfs of the sandbox in a SIF container."""
    mksquashfs = shutil.which("mksquashfs", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if mksquashfs is None:
        return None, "mksquashfs not installed (Debian squashfs-tools)"
    squash = workdir / "rootfs.squashfs"
    done = subprocess.run([mksquashfs, str(sandbox), str(squash), "-noappend", "-all-root", "-no-progress"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None, f"mksquashfs failed: {done.stderr.strip()[-200:]}"
    from singpy.image.sif import host_arch
    from singpy.image.sifwrite import build_sif_from_squashfs

    sif = workdir / "busybox.sif"
    build_sif_from_squashfs(sif, squash, arch=host_arch())
    sif.chmod(0o755)
    return sif, ""


def nvliblist_libraries() -> list[str]:
    from singpy.config.liblist import load_liblist

    return [name for name in load_liblist(str(REPO / "etc" / "nvliblist.conf")).libraries if not name.startswith("/")]


def build_gpu_host(workdir: Path) -> tuple[SimHost | None, str]:
    """The simulated NVIDIA host plus one stand-in library for each nvliblist.conf library name."""
    if os.geteuid() != 0:
        return None, "the simulated GPU host needs root (mknod, a private mount namespace)"
    if shutil.which("gcc") is None:
        return None, "gcc not installed (the simulated driver libraries are compiled)"
    from tests.gpu import simhost

    root = workdir / "gpuhost"
    root.mkdir()
    host = simhost.build_nvidia_host(root, gpus=4)
    have = {path.name.split(".so")[0] for path in host.lib_dir.iterdir()}
    for entry in nvliblist_libraries():
        stem = entry[: entry.index(".so")]
        if stem in have:
            continue
        simhost._shared_lib(host.lib_dir, stem, simhost.DRIVER, f"{stem}.so.1", simhost.ROCM_C)
    dirs = [host.lib_dir, *([host.lib32_dir] if host.lib32_dir else [])]
    simhost.build_ld_cache(root, dirs)
    # The stand-in nvidia-container-cli lists every driver file too (a real one also asks the driver, through
    # NVML, which takes longer than this shell script's `cat`).
    listed = [str(host.bin_dir / "nvidia-smi")]
    listed += [str(path) for directory in dirs for path in sorted(directory.iterdir())
               if path.is_file() and not path.is_symlink()]
    host.container_cli.write_text(simhost.container_cli_script(listed))
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return host, ""


def write_cdi_spec(directory: Path, host: SimHost) -> Path:
    """The spec `nvidia-ctk cdi generate` would write for the simulated host (tests/gpu/test_cdi.py), with every
    driver library of the host mounted, as the real one lists them: `directory`, holding nvidia.json."""
    from tests.gpu.test_cdi import LIB_DIR, OPTIONS, nvidia_spec

    spec = nvidia_spec(host)
    edits = spec["containerEdits"]
    assert isinstance(edits, dict)
    listed = {mount["hostPath"] for mount in edits["mounts"]}
    edits["mounts"] += [{"hostPath": str(path), "containerPath": f"{LIB_DIR}/{path.name}", "options": OPTIONS}
                        for path in sorted(host.lib_dir.iterdir())
                        if path.is_file() and not path.is_symlink() and str(path) not in listed]
    directory.mkdir(mode=0o755)
    (directory / "nvidia.json").write_text(json.dumps(spec, indent=1))
    (directory / "nvidia.json").chmod(0o644)
    return directory


def enter_gpu_host(host: SimHost) -> None:
    """Put the simulated host in place of this machine's /dev and ld.so.cache, for this process and its children.

    tests/gpu/simrun.py makes the private mount namespace; /dev/fuse is added so that squashfuse still works.
    """
    from tests.gpu.simrun import simulate

    fuse = os.stat("/dev/fuse").st_rdev if os.path.exists("/dev/fuse") else None
    simulate(str(host.root))
    # The driver's version file too (a tmpfs over /proc/driver): --nv reads it, and keeps nvidia-container-cli's
    # listing per driver version (singpy.gpu.listcache), as on a real host.
    from singpy.kernel import syscalls as k

    k.mount("simproc", "/proc/driver", "tmpfs", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, "mode=0755")
    shutil.copytree(host.root / "proc/driver/nvidia", "/proc/driver/nvidia")
    if fuse is not None:
        os.mknod("/dev/fuse", stat.S_IFCHR | 0o666, fuse)
        os.chmod("/dev/fuse", 0o666)


def write_conf(directory: Path, extra: str = "") -> Path:
    """The shipped singpy.conf (plus `extra` lines) with the shipped liblists beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("nvliblist.conf", "rocmliblist.conf"):
        shutil.copy(REPO / "etc" / name, directory / name)
    conf = directory / "singpy.conf"
    conf.write_text(extra + (REPO / "etc" / "singpy.conf").read_text())  # first: a directive's first value counts
    directory.chmod(0o755)
    return conf


def build_signed(workdir: Path, sif: Path) -> tuple[Path | None, Path | None, str]:
    """A copy of the SIF signed by a fresh key, and a configuration whose ecl.toml (root's) whitelists that key
    alone, its public half in the global keyring beside it: (signed SIF, singpy.conf, why not)."""
    if os.geteuid() != 0:
        return None, None, "an active ECL must be root's: run the benchmark as root"
    singpy = str(REPO / ".venv" / "bin" / "singpy")
    site = workdir / "conf-ecl"
    conf = write_conf(site, "unsquash in background = no\n")  # compared with the SIF's FUSE row
    env = {"PATH": DEFAULT_PATH, "HOME": str(workdir), "APPTAINER_KEYSDIR": str(workdir / "signer-keys"),
           "LANG": "C.UTF-8", "SINGPY_CONFIG": str(conf)}
    signed = workdir / "signed" / "busybox.sif"
    signed.parent.mkdir(mode=0o755)
    shutil.copy(sif, signed)
    steps = [["key", "newpair", "-N", "Bench Signer", "-E", "bench@example.org", "-C", "", "-P", "", "-b", "2048"],
             ["sign", str(signed)], ["key", "import", "--global", str(workdir / "signer-keys" / "pgp-public")]]
    outputs = []
    for step in steps:
        done = subprocess.run([singpy, *step], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None, None, f"singpy {step[0]} {step[1]} failed: {done.stderr.strip()[-200:]}"
        outputs.append(done.stdout)
    fingerprint = outputs[0].split("Key fingerprint: ")[1].split()[0]
    (site / "ecl.toml").write_text(f'activated = true\n[[execgroup]]\ntagname = "bench"\nmode = "whitelist"\n'
                                   f'keyfp = ["{fingerprint}"]\n')
    for path in (signed, site / "ecl.toml", site / "global-pgp-public"):
        path.chmod(0o755 if path == signed else 0o644)
    return signed, conf, ""


def prepare_images(workdir: Path) -> Images:
    print(f"building images in {workdir} ...", file=sys.stderr)
    sandbox = build_sandbox(workdir)
    sif, sif_reason = build_sif(workdir, sandbox)
    # "fuse": every run of the SIF through squashfuse, as a first run is (by default a user's FUSE run unpacks the
    # image behind itself and later runs start from the tree: the row "second run")
    confs = {"default": write_conf(workdir / "conf"),
             "fuse": write_conf(workdir / "conf-fuse", "unsquash in background = no\n"),
             "unsquash": write_conf(workdir / "conf-unsquash", "unsquash = yes\n"),
             "liblist": write_conf(workdir / "conf-liblist", "use nvidia-container-cli = no\n")}
    signed, ecl_conf, signed_reason = build_signed(workdir, sif) if sif else (None, None, sif_reason)
    if ecl_conf is not None:
        confs["ecl"] = ecl_conf
    return Images(sandbox=sandbox, sif=sif, sif_reason=sif_reason, confs=confs, signed=signed,
                  signed_reason=signed_reason)


def prepare_gpu_host(workdir: Path, wanted: bool) -> GpuSetup:
    """Build the simulated GPU host and enter it (this process's own mount namespace), if wanted and possible."""
    if not wanted:
        return GpuSetup(path=DEFAULT_PATH, reason="--no-gpu-host", note="not simulated (--no-gpu-host)")
    print("building the simulated GPU host ...", file=sys.stderr)
    host, reason = build_gpu_host(workdir)
    if host is None:
        return GpuSetup(path=DEFAULT_PATH, reason=reason, note=f"not simulated: {reason}")
    cdi_dir = write_cdi_spec(workdir / "cdi", host)
    enter_gpu_host(host)
    return GpuSetup(path=f"{host.bin_dir}:{DEFAULT_PATH}", reason="", note="", cdi_dir=str(cdi_dir))


def nv_summary(runner: Runner, singpy: str, sandbox: Path, env: dict[str, str] | None) -> str:
    """What --nv binds on the simulated host, from the dry-run report."""
    done = runner.capture([singpy, "exec", "--nv", "--dry-run", str(sandbox), "true"], env)
    try:
        report = json.loads(done.stdout)
        gpu = report["gpu"]
        return (f"{len(gpu['libraries'])} library files, {len(gpu['devices'])} device nodes and "
                f"{len(gpu['binaries'])} tool(s)")
    except (ValueError, KeyError, TypeError):
        return "dry-run report unreadable"


def gpu_host_note(runner: Runner, singpy: str, sandbox: Path, rows: dict[str, Row], gpu: GpuSetup) -> str:
    """The report's "GPU host" line; with the host in place, what each --nv mode binds there."""
    if gpu.reason:
        return gpu.note
    if rows["nv"].na and rows["nv-liblist"].na:
        return "simulated, but `singpy exec --nv` fails there (see the table)"
    return ("simulated (tests/gpu/simhost.py, 4 GPUs, one gcc-built stand-in per nvliblist.conf "
            "library), in place of /dev and /etc/ld.so.cache for every row; --nv binds "
            f"{nv_summary(runner, singpy, sandbox, rows['nv'].env)} through nvidia-container-cli, "
            f"{nv_summary(runner, singpy, sandbox, rows['nv-liblist'].env)} through nvliblist.conf")

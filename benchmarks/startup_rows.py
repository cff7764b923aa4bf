"""The rows of the start-up table: the floors, the plain exec, the other launchers, singpy's variants, imports."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from startup_records import GpuSetup, Images, Row

# Standard-library modules the launcher keeps off its hot path (or imports only when a flag needs them);
# `python3 -c "import X"` runs beside the others so the doc can say what each would cost.
STDLIB = ("enum", "signal", "re", "shutil", "subprocess", "ctypes", "json", "pathlib", "typing", "dataclasses")


def make_rows(singpy: str, python: str, images: Images, cache: Path, gpu: GpuSetup) -> list[Row]:
    """Every row, in the table's order; a row whose tool is not installed is n/a."""
    env = {"SINGPY_CONFIG": str(images.confs["default"]), "SINGPY_CACHEDIR": str(cache)}
    rows = [*reference_rows(singpy, python, str(images.sandbox), env), *variant_rows(singpy, images, env, gpu)]
    rows += [Row(f"mod-{name}", f"import {name}", [python, "-c", f"import {name}"],
                 display=f"python3 -c 'import {name}'") for name in STDLIB]
    packages = {"ch-run": "charliecloud-runtime", "bwrap": "bubblewrap"}
    for row in rows:
        if row.argv[0] in packages and shutil.which(row.argv[0]) is None:
            row.na = f"{row.argv[0]} not installed (Debian {packages[row.argv[0]]})"
    return rows


def reference_rows(singpy: str, python: str, sb: str, env: dict[str, str]) -> list[Row]:
    """The floors, the plain exec and the other launchers."""
    bwrap = ["bwrap", "--unshare-user", "--bind", sb, "/", "--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc",
             "--ro-bind", "/sys", "/sys", "--bind", "/tmp", "/tmp", "--", "true"]
    return [
        Row("true", "spawn floor (/bin/true on the host)", ["/bin/true"]),
        Row("python", "python3 -c pass (interpreter floor)", [python, "-c", "pass"], display="python3 -c pass"),
        Row("typer", "python3 -c 'import typer' (CLI framework)", [python, "-c", "import typer"],
            display="python3 -c 'import typer'"),
        Row("version", "singpy --version (fast parser, no container)", [singpy, "--version"], env=env,
            display="singpy --version"),
        Row("singpy", "singpy exec SANDBOX true", [singpy, "exec", sb, "true"], env=env,
            display="singpy exec SANDBOX true"),
        Row("chrun", "ch-run SANDBOX -- true", ["ch-run", sb, "--", "true"], display="ch-run SANDBOX -- true"),
        Row("bwrap", "bwrap, user+mount namespaces", bwrap,
            display="bwrap --unshare-user --bind SANDBOX / --dev-bind /dev /dev --bind /proc /proc "
                    "--ro-bind /sys /sys --bind /tmp /tmp -- true"),
    ]


def variant_rows(singpy: str, images: Images, env: dict[str, str], gpu: GpuSetup) -> list[Row]:
    """singpy exec with a SIF, --nv, --device and the isolation flags, then the typer path."""
    gpu_reason = gpu.reason
    cache_env = {**env, "SINGPY_CONFIG": str(images.confs["unsquash"])}
    fuse_env = {**env, "SINGPY_CONFIG": str(images.confs["fuse"])}
    liblist_env = {**env, "SINGPY_CONFIG": str(images.confs["liblist"])}
    sb, sif, sif_reason = str(images.sandbox), str(images.sif), images.sif_reason
    return [
        Row("sif-fuse", "singpy exec SIF true (squashfuse)", [singpy, "exec", sif, "true"], env=fuse_env,
            display="singpy exec SIF true  # first run: squashfuse (unsquash in background = no)", na=sif_reason),
        Row("sif-cache", "singpy exec SIF true (extraction cache)", [singpy, "exec", sif, "true"],
            env=cache_env, display="singpy exec SIF true  # unsquash = yes", na=sif_reason),
        warm_row(singpy, images, env),
        ecl_row(singpy, images, env),
        Row("nv", "singpy exec --nv (nvidia-container-cli)", [singpy, "exec", "--nv", sb, "true"], env=env,
            display="singpy exec --nv SANDBOX true", na=gpu_reason),
        Row("nv-liblist", "singpy exec --nv (nvliblist.conf + ld cache)", [singpy, "exec", "--nv", sb, "true"],
            env=liblist_env, display="singpy exec --nv SANDBOX true  # use nvidia-container-cli = no",
            na=gpu_reason),
        Row("cdi", "singpy exec --device nvidia.com/gpu=all (CDI)",
            [singpy, "exec", "--cdi-dirs", gpu.cdi_dir, "--device", "nvidia.com/gpu=all", sb, "true"], env=env,
            display="singpy exec --device nvidia.com/gpu=all SANDBOX true", na=gpu_reason),
        Row("contain", "singpy exec --contain", [singpy, "exec", "--contain", sb, "true"], env=env,
            display="singpy exec --contain SANDBOX true"),
        Row("containall", "singpy exec --containall", [singpy, "exec", "--containall", sb, "true"], env=env,
            display="singpy exec --containall SANDBOX true", host_namespace=True),
        Row("writable-tmpfs", "singpy exec --writable-tmpfs", [singpy, "exec", "--writable-tmpfs", sb, "true"],
            env=env, display="singpy exec --writable-tmpfs SANDBOX true"),
        Row("typer-path", "singpy version (typer path, off the hot path)", [singpy, "version"], env=env,
            display="singpy version"),
    ]


def warm_row(singpy: str, images: Images, env: dict[str, str]) -> Row:
    """The SIF's second and later runs under `unsquash in background = yes` (singpy.image.warm): its first run
    (the probe) mounted it with squashfuse and unpacked it behind itself into a cache of its own."""
    from startup_images import write_conf

    workdir = Path(images.confs["default"]).parent.parent
    conf = write_conf(workdir / "conf-warm", "unsquash in background = yes\n")
    user_cache = Path(env["SINGPY_CACHEDIR"])
    cache = user_cache.parent / "cache-warm"
    cache.mkdir(mode=0o700, exist_ok=True)
    os.chown(cache, user_cache.stat().st_uid, user_cache.stat().st_gid)
    return Row("sif-warm", "singpy exec SIF true (second run)", [singpy, "exec", str(images.sif), "true"],
               env={**env, "SINGPY_CONFIG": str(conf), "SINGPY_CACHEDIR": str(cache)},
               display="singpy exec SIF true  # second run, unsquash in background = yes", na=images.sif_reason)


def ecl_row(singpy: str, images: Images, env: dict[str, str]) -> Row:
    """The SIF signed, under an ecl.toml that whitelists its signer (compared with the unsigned SIF's row)."""
    conf = images.confs.get("ecl")
    return Row("sif-ecl", "singpy exec SIGNED.sif true (active ECL)",
               [singpy, "exec", str(images.signed), "true"], env={**env, "SINGPY_CONFIG": str(conf)},
               display="singpy exec SIGNED.sif true  # ecl.toml: a whitelist of its signer",
               na=images.signed_reason)

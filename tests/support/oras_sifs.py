"""SIFs in a registry as the `oras://` tests (tests/integration/test_oras*.py, test_pull_fastpath.py,
test_instance_transports.py) make them: directories and caches of the profile's user (under oras-out/, caches named
oras-NAME: not pulling.py's), a copy of siftool's busybox SIF, and pushes by an independent client, the `oras` Python
SDK, as Apptainer pushes (the SIF as the one layer, the SIF config type)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import oras.client  # type: ignore[import-untyped]  # the SDK ships no type hints

from tests.conftest import Singpy
from tests.support import pulling
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache, siftool_sif

SIF_LAYER = "application/vnd.sylabs.sif.layer.v1.sif"
SIF_CONFIG = "application/vnd.sylabs.sif.config.v1+json"


def user_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """An empty directory the profile's user owns (in workdir/oras-out)."""
    return pulling.user_dir(singpy, workdir, name, "oras-out")


def cache_env(singpy: Singpy, workdir: Path, name: str, **extra: str) -> dict[str, str]:
    return singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"oras-{name}")), **extra)


def sif_copy(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A SIF siftool made (busybox), copied where the profile's user can read it, under a name of the test's."""
    folder = user_dir(singpy, workdir, name)
    target = folder / f"{name}.sif"
    shutil.copyfile(siftool_sif(workdir), target)
    os.chown(target, singpy.uid, singpy.gid)
    return target


def sdk(registry: RegistryServer) -> oras.client.OrasClient:
    return oras.client.OrasClient(hostname=registry.host, insecure=not registry.https)


def sdk_push(registry: RegistryServer, sif: Path, repository: str) -> None:
    """What Apptainer pushes, made by the oras SDK: the SIF as the one layer, the SIF config type."""
    sdk(registry).push(target=f"{registry.host}/{repository}", files=[f"{sif}:{SIF_LAYER}"],
                       manifest_config=f"/dev/null:{SIF_CONFIG}", disable_path_validation=True)


def sdk_pushed(singpy: Singpy, registry: RegistryServer, workdir: Path, name: str,
               repository: str) -> tuple[Path, str]:
    """A SIF of the test's (`name`) pushed by the oras SDK as REPOSITORY:TAG; the file and its oras:// reference."""
    sif = sif_copy(singpy, workdir, name)
    sdk_push(registry, sif, repository)
    return sif, f"oras://{registry.host}/{repository}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

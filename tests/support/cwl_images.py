"""Stand-ins for the Docker Hub images of the CWL v1.2 conformance tests, built with mmdebstrap (issue 25).

The tests pull docker.io/debian:stable-slim, python:3-slim, bash:4.4 and alpine:latest; the suite has no
network but Debian's package mirror, so each is made from Debian 12 by `mmdebstrap --variant=minbase`:

    debian:stable-slim  minbase
    python:3-slim       minbase + python3 and python-is-python3 (the tests call both `python` and `python3`)
    bash:4.4            minbase (its bash is 5.2) + Docker's `docker-entrypoint.sh` as ENTRYPOINT, CMD bash:
                        the image runs `bash ARGS` when the first argument is an option (test docker_entrypoint)
    alpine:latest       minbase: a SUBSTITUTION (no Alpine packages can be had here); the tests that use it
                        call only sh, echo, ln, mkdir and touch, which minbase has too

A rootfs tar is built once per recipe and kept in the session's work directory under a name made from the
recipe (`cwl-images/RECIPE_KEY.tar`), so a session builds each recipe once whatever asks for it. `push_all`
uploads the images to a registry as library/NAME:TAG, which a registries.conf mirror for docker.io then
serves under the names the tests use.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.oci import Image, Layer, directory, file
from tests.support.registry import RegistryServer

MMDEBSTRAP = "/usr/bin/mmdebstrap"
SUITE = "bookworm"
MIRROR = "deb http://deb.debian.org/debian bookworm main"
SLIM = ("path-exclude=/usr/share/doc/*", "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/info/*")
TAR_LAYER = "application/vnd.oci.image.layer.v1.tar"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILD_TIMEOUT = 600

RECIPES: dict[str, tuple[str, ...]] = {"minbase": (), "python": ("python3", "python-is-python3")}

# Docker's bash image entrypoint (docker-library/bash, docker-entrypoint.sh), as it is.
BASH_ENTRYPOINT = """\
#!/usr/bin/env bash
set -Eeuo pipefail

# first arg is `-f` or `--some-option`
# or there are no args
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
\t# docker run bash -c 'echo hi'
\texec bash "$@"
fi

exec "$@"
"""


class StandIn:
    """One image of the tests: its Docker Hub name, the recipe of its rootfs and what Docker's image adds."""

    def __init__(self, name: str, tag: str, recipe: str, *, entrypoint: tuple[str, ...] = (),
                 cmd: tuple[str, ...] = ("bash",)) -> None:
        self.name, self.tag, self.recipe, self.entrypoint, self.cmd = name, tag, recipe, entrypoint, cmd

    @property
    def reference(self) -> str:
        return f"docker.io/{self.name}:{self.tag}"


STAND_INS = (
    StandIn("debian", "stable-slim", "minbase"),
    StandIn("python", "3-slim", "python", cmd=("python3",)),
    StandIn("bash", "4.4", "minbase", entrypoint=("docker-entrypoint.sh",)),
    StandIn("alpine", "latest", "minbase", cmd=("/bin/sh",)),
)


def recipe_key(recipe: str) -> str:
    """A name that changes with anything that changes the rootfs: suite, mirror, packages, exclusions."""
    words = [SUITE, MIRROR, *RECIPES[recipe], *SLIM]
    return f"{recipe}-{hashlib.sha256(chr(0).join(words).encode()).hexdigest()[:16]}"


def rootfs_tar(workdir: Path, recipe: str) -> Path:
    """The recipe's rootfs as a tar, built by mmdebstrap on first use in this session (under a lock, so that
    two fixtures asking at once build it once)."""
    cache = workdir / "cwl-images"
    cache.mkdir(mode=0o755, exist_ok=True)
    tar = cache / f"{recipe_key(recipe)}.tar"
    fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not tar.exists():
            _mmdebstrap(recipe, tar)
    finally:
        os.close(fd)
    return tar


def _mmdebstrap(recipe: str, tar: Path) -> None:
    partial = tar.with_suffix(".partial.tar")
    packages = RECIPES[recipe]
    argv = [MMDEBSTRAP, "--quiet", "--variant=minbase", "--skip=output/dev", "--format=tar",
            *(f"--dpkgopt={option}" for option in SLIM), *([f"--include={','.join(packages)}"] if packages else []),
            SUITE, str(partial), MIRROR]
    # stdin closed: with no terminal there, mmdebstrap would read more sources from it
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR": str(tar.parent),
                               "SOURCE_DATE_EPOCH": "1700000000"})
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"mmdebstrap {recipe} failed:\n{done.stderr[-3000:]}")
    partial.rename(tar)


def image_of(stand_in: StandIn, workdir: Path) -> Image:
    """The OCI image: the recipe's rootfs as one uncompressed layer (+ the entrypoint's layer)."""
    layers = [Layer.raw(rootfs_tar(workdir, stand_in.recipe).read_bytes(), TAR_LAYER)]
    if stand_in.entrypoint:
        layers.append(Layer([directory("usr/local/bin"),
                             file("usr/local/bin/docker-entrypoint.sh", BASH_ENTRYPOINT, mode=0o755)]))
    return Image(layers, env=[PATH_ENV], entrypoint=list(stand_in.entrypoint) or None, cmd=list(stand_in.cmd))


def push_all(registry: RegistryServer, workdir: Path) -> list[str]:
    """Every stand-in uploaded as library/NAME:TAG; their docker.io references."""
    for stand_in in STAND_INS:
        registry.upload(image_of(stand_in, workdir), f"library/{stand_in.name}", stand_in.tag)
    return [stand_in.reference for stand_in in STAND_INS]


def mmdebstrap_missing() -> str:
    """Why the stand-ins can't be built here ('' when they can)."""
    if shutil.which(MMDEBSTRAP) is None:
        return "mmdebstrap is not installed (make test-packages)"
    if os.geteuid() != 0:
        return "mmdebstrap's root mode needs root"
    return ""

"""What the `singpy pull` tests share (tests/integration/test_pull*.py): the main image (owners, modes and
special files a user build could not make), the registry holding the tests' images, a fresh cache per case,
directories the profile's user owns, and the owners in a pulled SIF as unsquashfs (the reference tool) lists
them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import (
    busybox_image,
    char_device,
    directory,
    fifo,
    file,
    multiarch_index,
    write_layout,
)
from tests.support.registry import (
    RegistryServer,
)
from tests.support.sifs import new_cache

IMAGE_ENV = ["PATH=/opt/tool/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "GREETING=hello from the image", "IMAGE_WINS=image value"]


def main_image() -> oci.Image:
    """busybox plus owners, modes and special files a user build could not make: the SIF must keep them."""
    return busybox_image(
        extra=[directory("home"), directory("home/user", uid=1000, gid=1000), file("home/user/notes", "mine\n",
               uid=1000, gid=1000, mode=0o600), file("usr/bin/suid-tool", "#!/bin/sh\n", mode=0o4755),
               directory("opt/tool/bin"), file("opt/tool/bin/tool", "#!/bin/sh\necho tool ran \"$@\"\n", mode=0o755),
               char_device("dev/null", 1, 3), fifo("run/pipe", mode=0o620, uid=1000, gid=1000),
               file("etc/image-marker", "main image\n")],
        env=IMAGE_ENV, entrypoint=["/opt/tool/bin/tool"], cmd=["default arg"],
        labels={"org.example.team": "singpy tests"})


def pushed(registry_plain: RegistryServer, workdir: Path) -> RegistryServer:
    """registry_plain holding the pull tests' images, pushed once per session (whichever module asks first)."""
    layouts = workdir / "pull-layouts"
    if (layouts / "pushed").exists():
        return registry_plain
    registry_plain.push(write_layout(layouts / "main", {"latest": main_image()}), "pull/main")
    registry_plain.upload(multiarch_index(), "pull/multi")
    registry_plain.upload(multiarch_index(docker=True), "pull/multi-docker")
    registry_plain.push(write_layout(layouts / "v2s2", {"latest": main_image()}), "pull/v2s2", format="v2s2",
                        all=False)
    registry_plain.upload(busybox_image(extra=[file("etc/image-marker", "no media type\n")],
                                        media_type_field=False), "pull/no-media-type")
    (layouts / "pushed").touch()
    return registry_plain


def cache_env(singpy: Singpy, workdir: Path, name: str, **extra: str) -> dict[str, str]:
    return singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, name)), **extra)


def user_dir(singpy: Singpy, workdir: Path, name: str, folder: str = "pull-out") -> Path:
    """An empty directory the profile's user owns, for what singpy writes: workdir/FOLDER/PROFILE-NAME."""
    path = workdir / folder / f"{singpy.profile}-{name}"
    path.mkdir(parents=True)
    (workdir / folder).chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def owners(sif: Path) -> dict[str, str]:
    """`path -> "mode uid/gid"` of the SIF's root filesystem, as unsquashfs (the reference tool) lists it."""
    offset = subprocess.run(["siftool", "info", "4", str(sif)], capture_output=True, text=True, check=True).stdout
    start = re.search(r"Offset:\s+(\d+)", offset)
    assert start, offset
    listing = subprocess.run(["unsquashfs", "-lln", "-o", start.group(1), str(sif)], capture_output=True,
                             text=True, check=True).stdout
    found = {}
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[-1].startswith("squashfs-root"):
            name = fields[-1].removeprefix("squashfs-root") or "/"
            found[name if " -> " not in line else fields[-3].removeprefix("squashfs-root")] = \
                f"{fields[0]} {fields[1]}"
    return found

"""`singpy build`: a SIF from a sandbox directory, and a sandbox from a SIF or squashfs.

A SIF is written as `apptainer build` writes one ([1] sif.md sections 9 and
14; Apptainer internal/pkg/build/assemblers/sif.go): the root filesystem
squashed by `mksquashfs` (gzip, which every kernel and squashfuse can read),
then, all in group 1, a Deffile object, a GenericJSON `inspect-metadata.json`
(labels, scripts, environment, as `singpy inspect` reads them back) and the
squashfs as the primary system partition for this host's architecture.
As Apptainer's unprivileged (fakeroot) builds do, a user's files are
owned by root inside the image (`-all-root`), so that the image does not
depend on the builder's uid.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from singpy import __version__, console
from singpy.errors import ImageError
from singpy.image import cache, tools
from singpy.image.detect import classify, host_arch, sif_partition


def build(target: str, source: str, *, force: bool, env: Mapping[str, str]) -> str:
    """Build `target` from `source`; the kind of source decides the kind of target. Returns a summary."""
    image = classify(source)
    target = os.path.abspath(target)
    if os.path.lexists(target) and not force:
        raise ImageError(f"{target} already exists (use --force to overwrite it)")
    if image.kind == "sandbox":
        if os.path.isdir(target):
            raise ImageError(f"{target} is a directory: a SIF built from a sandbox needs a file name")
        build_sif(target, image.path, env=env)
        return f"built SIF image {target}"
    unpack(target, image.path, env=env)
    return f"unpacked {image.path} into the sandbox {target}"


def build_sif(target: str, sandbox: str, *, env: Mapping[str, str]) -> None:
    import tempfile

    from singpy.image.metadata import read_tree
    from singpy.image.sifwrite import build_sif_from_squashfs

    mksquashfs = tools.require_tool("mksquashfs", env, "build a SIF image")
    arch = host_arch()
    deffile = f"bootstrap: localimage\nfrom: {sandbox}\n"
    attributes = read_tree(f"{sandbox}/.singularity.d")
    attributes["labels"] = {**attributes.get("labels", {}), **_build_labels(arch, sandbox)}
    attributes.setdefault("deffile", deffile)
    scratch = tempfile.mkdtemp(prefix=".singpy-build-", dir=os.path.dirname(target))
    try:
        squashfs = f"{scratch}/rootfs.squashfs"
        owner = [] if os.getuid() == 0 else ["-all-root"]
        tools.run_tool([mksquashfs, sandbox, squashfs, "-noappend", "-comp", "gzip", *owner],
                       label=f"Squashing {os.path.basename(sandbox)}", failure=f"can't build {target}")
        console.verbose(f"writing {target} ({os.path.getsize(squashfs)} bytes of squashfs, {arch})")
        build_sif_from_squashfs(target, squashfs, arch=arch, deffile=deffile,
                                inspect_metadata={"data": {"attributes": attributes}, "type": "container"})
    finally:
        cache.remove_tree(scratch)


def _build_labels(arch: str, sandbox: str) -> dict[str, str]:
    """The labels Apptainer's build adds (org.label-schema.*), singpy standing in for apptainer."""
    return {
        "org.label-schema.build-arch": arch,
        "org.label-schema.build-date": time.strftime("%A_%-d_%B_%Y_%H:%M:%S_UTC", time.gmtime()),
        "org.label-schema.schema-version": "1.0",
        "org.label-schema.usage.singularity.deffile.bootstrap": "localimage",
        "org.label-schema.usage.singularity.deffile.from": sandbox,
        "org.label-schema.usage.singpy.version": __version__,
    }


def unpack(target: str, image: str, *, env: Mapping[str, str]) -> None:
    """Unpack a SIF's primary partition (or a bare squashfs) `image` into the new directory `target`.

    Unpacked beside the target and renamed into place, so that a failure
    leaves no half-written sandbox; an existing target (--force) is replaced
    only once the new tree is complete.
    """
    import tempfile

    kind = classify(image).kind
    offset = sif_partition(image, check_arch=False).offset if kind == "sif" else 0
    unsquashfs = tools.require_tool("unsquashfs", env, "unpack a squashfs image")
    root = os.getuid() == 0
    scratch = tempfile.mkdtemp(prefix=".singpy-unpack-", dir=os.path.dirname(target))
    try:
        tree = f"{scratch}/root"
        tools.run_tool([unsquashfs, *cache.unpack_options(offset, tree, root=root), image,
                        *cache.unpack_filter(root)], label=f"Unpacking {os.path.basename(image)}",
                       failure=f"can't unpack {image}")
        os.makedirs(f"{tree}/dev", mode=0o755, exist_ok=True)
        if os.path.lexists(target):
            os.rename(target, f"{scratch}/old")
        os.rename(tree, target)
    finally:
        cache.remove_tree(scratch)

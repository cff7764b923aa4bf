"""The base root filesystem of a stage, from its `Bootstrap:` and `From:` headers.

Agents, as Apptainer names them ([1] Apptainer internal/pkg/build/sources):
`docker`, `oci`, `oci-archive`, `docker-archive` (the SIF singpy's pull
keeps in its cache), `localimage` (a SIF, squashfs or sandbox image on this
host) and `scratch` (nothing): `resolve` finds the image, `populate` unpacks
or copies it where it does not lie under an overlay (singpy.recipe.layered). Every rootfs then gets Apptainer's base
layout: the directories a container needs as mount points and empty
/etc/hosts and /etc/resolv.conf, made inside the image (its links resolved
in it, never on the host).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from singpy import console
from singpy.errors import ImageError
from singpy.plan import IdMap
from singpy.recipe.deffile import DefinitionError, Stage

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from singpy.oci.pull import PullOptions
    from singpy.recipe.sections import Runner

AGENTS = ("docker", "oci", "oci-archive", "docker-archive", "oras", "library", "localimage", "scratch")
_URI_PREFIX = {"docker": "docker://", "oci": "oci:", "oci-archive": "oci-archive:", "docker-archive": "docker-archive:",
               "oras": "oras://", "library": "library://"}  # oras, library: a SIF (singpy.oci.oras,
# singpy.library.pull), used as a local image once cached
OCI_PREFIXES = tuple(prefix for agent, prefix in _URI_PREFIX.items() if agent not in ("oras", "library"))
# The agents that make the root filesystem with a host tool, not from an image (singpy.recipe.osbootstrap).
OS_AGENTS = ("debootstrap", "yum", "dnf", "zypper", "arch", "busybox")


def check(stage: Stage, origin: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse an unknown agent, a missing `From:`, header or host tool before anything is fetched (file:line
    of the stage)."""
    agent = stage.get("bootstrap").strip().lower()
    where = f"{origin}:{stage.line}"
    if not agent:
        raise DefinitionError(f"{where}: the stage has no Bootstrap: header")
    if agent not in AGENTS and agent not in OS_AGENTS:
        raise DefinitionError(f"{where}: Bootstrap: {agent} is not supported (singpy builds from "
                              f"{', '.join((*AGENTS, *OS_AGENTS))})")
    if agent in OS_AGENTS:
        from singpy.recipe import osbootstrap

        osbootstrap.check(stage, where, os.environ if env is None else env)
        return
    if agent != "scratch" and not stage.get("from").strip():
        raise DefinitionError(f"{where}: Bootstrap: {agent} needs a From: header")


def source(stage: Stage, cwd: str, *, library: str = "") -> str:
    """What the stage starts from, as `singpy build` would take it: docker://REF, oci:DIR, a path, or ''.
    `library`: build --library, which wins over the stage's `Library:` header (as Apptainer's)."""
    agent = stage.get("bootstrap").strip().lower()
    base = stage.get("from").strip()
    if agent == "scratch" or agent in OS_AGENTS:  # no image: populate makes the root filesystem
        return ""
    if agent == "localimage":
        return os.path.join(cwd, base)
    prefix = _URI_PREFIX[agent]
    if agent in ("docker", "oras", "library"):
        base = base.removeprefix(prefix)
        if agent == "library" and stage.get("library").strip() and not library:  # Library: URL names the host
            base = stage.get("library").strip().split("://", 1)[-1].rstrip("/") + "/" + base
    elif not base.startswith("/") and base.removeprefix(prefix) == base:
        base = os.path.join(cwd, base)
    return base if base.startswith(prefix) else prefix + base


def resolve(base: str, *, options: PullOptions, env: Mapping[str, str], home: str, library: str = "") -> str:
    """The image file or directory a stage starts from ('' for scratch), fetched first when it must be.

    An OCI image is the SIF `pull` keeps in singpy's cache (pulled and
    converted first if it is not there yet). Called for every stage before
    any of them runs, as the user: the cache is the user's. `library`: the
    library of a library:// base (build --library; default: the remote's).
    """
    if not base:
        return ""
    if base.startswith("library://"):  # the default remote's library, or library://HOST/...
        from singpy.library.pull import LibraryOptions
        from singpy.library.pull import cached_image as cached_library_image

        return cached_library_image(base, LibraryOptions(arch=options.arch, https=options.https, library=library),
                                    env, home)
    if base.startswith("oras://"):
        from singpy.oci.oras import cached_sif

        return cached_sif(base, options, env, home)
    if base.startswith(tuple(_URI_PREFIX.values())):
        from singpy.oci.pull import cached_image

        return cached_image(base, options, env, home)
    from singpy.image.detect import classify

    image = classify(base)
    console.info(f"Using the local image {image.path}")
    return image.path


def populate(image: str, rootfs: str, *, env: Mapping[str, str], idmap: IdMap | None, stage: Stage | None = None,
             work: str = "", runner: Runner | None = None) -> None:
    """Make `rootfs` (which must not exist) from `image` (see `resolve`): empty, unpacked, or copied; or, for
    an agent of OS_AGENTS, by the stage's host tool (singpy.recipe.osbootstrap).

    With subordinate ids, unsquashfs runs as root of the build's user
    namespace, so that the image's owners are kept (as those ids), as in
    Apptainer's fakeroot builds.
    """
    agent = stage.get("bootstrap").strip().lower() if stage is not None else ""
    if not image and agent in OS_AGENTS and stage is not None and runner is not None:
        from singpy.recipe import osbootstrap

        osbootstrap.bootstrap(stage, rootfs, env=env, idmap=idmap, work=work, runner=runner)
    elif not image:
        console.info("Creating an empty root filesystem (Bootstrap: scratch)")
        os.mkdir(rootfs, 0o755)
    elif not os.path.isdir(image):
        _unpack(image, rootfs, env, idmap)
    else:
        _copy_sandbox(image, rootfs)


def _copy_sandbox(image: str, rootfs: str) -> None:
    import subprocess

    os.mkdir(rootfs, 0o755)
    copied = subprocess.run(["cp", "-a", "--", f"{image}/.", rootfs], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    if copied.returncode != 0:
        said = [line for line in copied.stderr.splitlines() if line.strip()]
        raise ImageError(f"can't copy the sandbox {image}: {said[-1] if said else 'cp failed'}")


def _unpack(image: str, rootfs: str, env: Mapping[str, str], idmap: IdMap | None) -> None:
    from singpy.image.builder import unsquash
    from singpy.recipe import mapped

    unsquash(image, rootfs, env=env, prefix=mapped.command(idmap) if idmap is not None and idmap.helper else ())
    if not os.path.lexists(f"{rootfs}/dev"):  # unsquashfs leaves /dev out for a user (no device nodes)
        os.mkdir(f"{rootfs}/dev", 0o755)


def lay_out_base(rootfs: str) -> None:
    """Apptainer's base environment (directories, links, action and env scripts), where the image lacks it."""
    from singpy.oci.convert import install_base

    install_base(rootfs)

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
from collections.abc import Mapping, Sequence

from singpy import __version__, console
from singpy.constants import SQUASH_MEMORY
from singpy.errors import ImageError
from singpy.host.hostfiles import path_problem, shown
from singpy.image import cache, tools
from singpy.image.detect import classify, host_arch, sif_partition


def build(target: str, source: str, *, force: bool, env: Mapping[str, str], sandbox: bool = False,
          squash_args: Sequence[str] = ()) -> str:
    """Build `target` from the image `source`: a sandbox with `sandbox` (--sandbox), else a SIF, whatever the
    source's kind (as Apptainer: the output's kind comes from --sandbox alone). Returns a summary.
    `squash_args`: --mksquashfs-args, after mksquashfs's own flags.

    Whatever happens (a tool fails, the disk fills up, SIGTERM, SIGHUP or
    SIGINT arrives), nothing is left behind: no scratch directory next to the
    target, no partial target, no tool still running; an existing target
    (--force) is replaced only by a complete one.
    """
    image = classify(source)
    target = os.path.abspath(target)
    problem = path_problem(target)
    if problem:
        raise ImageError(f"can't write {shown(target)}: {problem}")
    if os.path.lexists(target) and not force:
        raise ImageError(f"{target} already exists (use --force to overwrite it)")
    if not sandbox and os.path.isdir(target) and not os.path.islink(target):
        raise ImageError(f"{target} is a directory: give the name of the SIF file to write (or --sandbox)")
    with tools.Interruptible():
        try:
            if image.kind == "sandbox" and sandbox:
                copy_sandbox(target, image.path)
                return f"copied the sandbox {image.path} to {target}"
            if image.kind == "sandbox":
                build_sif(target, image.path, env=env, squash_args=squash_args)
                return f"built SIF image {target}"
            if sandbox:
                unpack(target, image.path, env=env)
                return f"unpacked {image.path} into the sandbox {target}"
            resquash(target, image.path, env=env, squash_args=squash_args)
            return f"built SIF image {target} from {image.path}"
        except tools.Interrupted as interrupted:
            raise tools.Interrupted(f"build of {target} {interrupted.message}: nothing was written") from None
        except ImageError as error:
            if tools.out_of_space(error, os.path.dirname(target)):
                raise ImageError(f"can't build {target}: no space left on device in {os.path.dirname(target)}",
                                 hint="free some space there, or build into another directory") from None
            raise


def scratch_dir(target: str, prefix: str) -> str:
    """A private directory next to `target`, for what becomes it (same filesystem: a rename publishes it)."""
    import tempfile

    try:
        return tempfile.mkdtemp(prefix=prefix, dir=os.path.dirname(target))
    except OSError as error:
        raise ImageError(f"can't write {target}: {error.strerror} ({os.path.dirname(target)})") from None


def build_sif(target: str, sandbox: str, *, env: Mapping[str, str], source: str = "",
              squash_args: Sequence[str] = ()) -> None:
    """A SIF `target` of the directory `sandbox`; `source`: the image the build names as its `from` (default:
    the sandbox itself; a SIF rebuilt through a scratch tree names the SIF, never that tree)."""
    from singpy.image import builddate
    from singpy.image.metadata import read_tree
    from singpy.image.sifwrite import build_sif_from_squashfs

    mksquashfs = tools.require_tool("mksquashfs", env, "build a SIF image")
    arch = host_arch()
    deffile = f"bootstrap: localimage\nfrom: {source or sandbox}\n"
    attributes = read_tree(sandbox)
    attributes["labels"] = {**attributes.get("labels", {}), **_sandbox_labels(arch, source or sandbox)}
    attributes.setdefault("deffile", deffile)
    scratch = scratch_dir(target, ".singpy-build-")
    try:
        squashfs = f"{scratch}/rootfs.squashfs"
        owner = root_mode_options(sandbox) if os.getuid() == 0 else ["-all-root"]
        compression = tools.compression_flags(squash_args, ("-comp", "gzip"))
        tools.run_tool([mksquashfs, sandbox, squashfs, "-noappend", *compression, *SQUASH_MEMORY, *owner, *squash_args],
                       label=f"Squashing {os.path.basename(sandbox)}", failure=f"can't build {target}")
        console.verbose(f"writing {target} ({os.path.getsize(squashfs)} bytes of squashfs, {arch})")
        build_sif_from_squashfs(target, squashfs, arch=arch, deffile=deffile,
                                inspect_metadata={"data": {"attributes": attributes}, "type": "container"},
                                deterministic=builddate.from_env(os.environ) is not None)
    finally:
        cache.remove_tree(scratch)


def copy_sandbox(target: str, sandbox: str) -> None:
    """A copy of the directory image `sandbox` as the new sandbox `target` (owners kept as root, `cp -a`)."""
    import shutil

    cp = shutil.which("cp") or "/bin/cp"
    scratch = scratch_dir(target, ".singpy-copy-")
    try:
        tree = f"{scratch}/root"
        # -H: a link named on the command line (the sandbox given as a link to it) is copied as what it names
        tools.run_tool([cp, "-a", "-H", "--", sandbox, tree], label=f"Copying {os.path.basename(sandbox)}",
                       failure=f"can't copy {sandbox}", squashfs_tool=False)
        try:
            publish_tree(tree, target, f"{scratch}/old")
        except OSError as error:
            raise ImageError(f"can't write {target}: {error.strerror}") from None
    finally:
        cache.remove_tree(scratch)


def resquash(target: str, image: str, *, env: Mapping[str, str], squash_args: Sequence[str] = ()) -> None:
    """A SIF `target` from a SIF or squashfs `image`: its tree unpacked beside the target, then squashed."""
    scratch = scratch_dir(target, ".singpy-resquash-")
    try:
        tree = f"{scratch}/root"
        unsquash(image, tree, env=env)
        build_sif(target, tree, env=env, source=image, squash_args=squash_args)
    finally:
        cache.remove_tree(scratch)


def build_labels(arch: str) -> dict[str, str]:
    """The labels Apptainer's build adds to every image (org.label-schema.*), singpy standing in for apptainer;
    dated by SOURCE_DATE_EPOCH where it is set (singpy.image.builddate)."""
    from singpy.image import builddate

    now = builddate.label_time(builddate.from_env(os.environ))
    return {
        "org.label-schema.build-arch": arch,
        "org.label-schema.build-date": time.strftime("%A_%-d_%B_%Y_%H:%M:%S_UTC", now),
        "org.label-schema.schema-version": "1.0",
        "org.label-schema.usage.singpy.version": __version__,
        "org.opencontainers.image.architecture": arch,
        "org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
    }


def _sandbox_labels(arch: str, sandbox: str) -> dict[str, str]:
    return {**build_labels(arch), "org.label-schema.usage.singularity.deffile.bootstrap": "localimage",
            "org.label-schema.usage.singularity.deffile.from": sandbox}


def unpack(target: str, image: str, *, env: Mapping[str, str]) -> None:
    """Unpack a SIF's primary partition (or a bare squashfs) `image` into the new directory `target`.

    Unpacked beside the target and renamed into place, so that a failure
    leaves no half-written sandbox; an existing target (--force) is replaced
    only once the new tree is complete.
    """
    scratch = scratch_dir(target, ".singpy-unpack-")
    try:
        tree = f"{scratch}/root"
        unsquash(image, tree, env=env)
        try:
            if not os.path.lexists(f"{tree}/dev"):  # the image's own dev, even a link, is left as it is
                os.mkdir(f"{tree}/dev", 0o755)
            publish_tree(tree, target, f"{scratch}/old")
        except OSError as error:
            raise ImageError(f"can't write {target}: {error.strerror}") from None
    finally:
        cache.remove_tree(scratch)


def unsquash(image: str, tree: str, *, env: Mapping[str, str], prefix: Sequence[str] = ()) -> None:
    """unsquashfs of a SIF's primary partition (or a bare squashfs) `image` into the new directory `tree`.

    `prefix` runs unsquashfs as root of a user namespace with subordinate ids
    (singpy.recipe.mapped): the owners recorded in the image are then given,
    as those ids.
    """
    spec = classify(image)
    if spec.kind == "ext3":
        raise ImageError(f"can't build from {image}: singpy runs Singularity 2.x ext3 images but does not unpack "
                         "them", hint=f"as root, mount it (mount -o loop,ro,offset={spec.offset} {image} DIR) and "
                         "build from the directory: singpy build NEW.sif DIR")
    # a SIF's primary partition, a bare squashfs (0), a .simg's squashfs after its launch line
    offset = sif_partition(image, check_arch=False).offset if spec.kind == "sif" else spec.offset
    unsquashfs = tools.require_tool("unsquashfs", env, "unpack a squashfs image")
    root = os.getuid() == 0
    tools.run_tool([unsquashfs, *cache.unpack_options(offset, tree, root=root), image, *cache.unpack_filter(root)],
                   label=f"Unpacking {os.path.basename(image)}", failure=f"can't unpack {image}", prefix=prefix)


def publish_tree(tree: str, target: str, old: str) -> None:
    """Rename `tree` to `target`; an existing target goes to `old`, and comes back if the swap is cut short.

    Every sandbox singpy writes comes here (`build --sandbox` from an image,
    a SIF or squashfs, a definition file). Root's is made private first
    (`make_private`).
    """
    if os.geteuid() == 0:
        make_private(tree, target)
    if not os.path.lexists(target):
        os.rename(tree, target)
        return
    os.rename(target, old)
    try:
        os.rename(tree, target)
    except BaseException:
        os.rename(old, target)
        raise


# --- root's sandboxes --------------------------------------------------------------------------------------


def make_private(tree: str, target: str) -> None:
    """Root's sandbox `tree` (about to become `target`) gets mode 0700 at its top, as umoci's rootfs.

    As root the tree keeps the image's set-uid files and device nodes, as a
    faithful image must; outside a container, on the host's filesystem, no
    nosuid or nodev applies to them: a set-uid root program of an untrusted
    image would give root to any user who can reach it, a device node the
    host's disks. 0700 keeps them root's. The tree lies in a private (0700)
    directory until it is renamed: it is never reachable with another mode.
    The user is told when there is something to keep (docs/build.md: how to
    share a sandbox).
    """
    os.chmod(tree, 0o700)
    setid, devices = _risky(tree)
    if not setid and not devices:
        console.verbose(f"{target} is private to root (mode 0700): chmod 755 it to share it")
        return
    held = [f"{len(found)} {what} (/{_shortened(found[0])}{', ...' if len(found) > 1 else ''})"
            for found, what in ((setid, "set-uid/set-gid file(s)"), (devices, "device node(s)")) if found]
    console.info(f"{target} is private to root (mode 0700): it holds {' and '.join(held)}, which would give "
                 f"root or the host's devices to any user of this host who could reach them (docs/build.md)")


def _risky(tree: str) -> tuple[list[str], list[str]]:
    """Paths (relative to `tree`) of its set-uid or set-gid files and of its device nodes."""
    import stat

    from singpy.image import trees

    setid: list[str] = []
    devices: list[str] = []
    for directory, name, info in trees.walk(tree):
        mode = info.st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            devices.append(f"{directory}/{name}" if directory else name)
        elif not stat.S_ISDIR(mode) and mode & (stat.S_ISUID | stat.S_ISGID):  # a set-gid directory gives nothing
            setid.append(f"{directory}/{name}" if directory else name)
    return setid, devices


def _shortened(path: str) -> str:
    return path if len(path) <= 120 else f"{path[:60]}...{path[-57:]}"  # a deep tree's path: one line still


def root_mode_options(sandbox: str) -> list[str]:
    """mksquashfs options for root squashing `sandbox`: a top made private by `make_private` is the
    image's "/" again, 0755 (inside a container, "/" must be open to its users)."""
    info = os.lstat(sandbox)
    if info.st_uid == 0 and info.st_mode & 0o7777 == 0o700:
        return ["-root-mode", "755"]
    return []

"""--writable, --overlay and a SIF's overlay partition: which layers go over the image, and how they are mounted.

Planner side (on the host, before any namespace; imported only when one of
them is asked for, or a SIF has an overlay partition). Apptainer 1.4's rules
([1] internal/pkg/runtime/engine/apptainer/prepare_linux.go, setSessionLayer,
loadImages, loadOverlayImages; [2] launch/launcher_linux.go):

* `--writable` makes the image itself writable: a sandbox directory is bound
  read-write; a SIF needs an overlay partition, which becomes the writable top
  layer; a bare squashfs can't be written. It excludes --overlay, and
  --writable-tmpfs is dropped with a warning.
* `--overlay PATH[:ro]` (repeatable, comma lists): a directory, or an ext3
  image file (singpy.image.extfs), or a SIF holding an overlay partition.
  Its files are in `upper/` (the kernel's scratch in `work/`). At most one
  writable overlay, and not with --writable-tmpfs; the writable one is the top
  layer, the read-only ones below it in the order given (a later one above an
  earlier one). An overlay the user can't write is used read-only, with a
  warning.
* A SIF's overlay partition is a read-only layer on every run, the writable
  top layer with --writable.
* `enable overlay = no` refuses all of these (--writable-tmpfs included);
  `driver` mounts them with fuse-overlayfs (Apptainer's image driver), as
  `avoid kernel features = userns_overlay` does in a user namespace. None of
  them can use the underlay (singpy.layers.underlay), which only adds mount points.

The container's overlay is the kernel's overlayfs (with `userxattr` inside a
user namespace, Linux >= 5.11) unless a layer sits where the kernel's
overlayfs is known to fail (Apptainer's list, [3] util/fs/overlay: an upper
layer on NFS or FUSE, any layer on ecryptfs, Lustre, GPFS or PanFS), or the
admin asked for `driver`: then fuse-overlayfs. When fuse-overlayfs is usable,
the plan names it (`overlay_tool`) and the launch falls back to it if the
kernel refuses the mount anyway (singpy.layers.overlayfs).
"""

from __future__ import annotations

import os
import stat

from singpy import console
from singpy.constants import FUSE_DEVICE
from singpy.errors import ImageError, SingpyError
from singpy.host.hostfiles import kind_name, reason, shown
from singpy.plan import ImageSpec, OverlaySpec

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

FUSE_OVERLAYFS = "fuse-overlayfs"
EXT_MAGIC_AT = 1080  # s_magic of an ext2/3/4 superblock (which starts at byte 1024)
EXT_MAGIC = b"\x53\xef"

# Filesystem types (as /proc/self/mountinfo names them, before any ".subtype") on which the kernel's
# overlayfs fails: as the upper layer, or as any layer ([3]).
_BAD_FOR_UPPER = {"nfs": "NFS", "nfs4": "NFS", "fuse": "FUSE", "fuseblk": "FUSE"}
_BAD_FOR_ANY = {"ecryptfs": "ecryptfs", "lustre": "Lustre", "gpfs": "GPFS", "panfs": "PanFS"}


class OverlayChoice:
    """What the planner puts in the LaunchPlan for the layers over the image."""

    def __init__(self) -> None:
        self.overlays: list[OverlaySpec] = []  # lowest first; the writable one, if any, last
        self.writable_tmpfs = False
        self.driver = "kernel"  # kernel (fuse-overlayfs as a fallback when `tool` is set) or fuse
        self.tool = ""  # host path of fuse-overlayfs, "" when it is not usable
        self.warnings: list[str] = []


def split_values(values: tuple[str, ...]) -> list[str]:
    """--overlay values as given: each may be a comma list (a pflag StringSlice in Apptainer)."""
    return [item for value in values for item in value.split(",") if item]


def plan_overlays(*, image: ImageSpec, writable: bool, overlays: tuple[str, ...], writable_tmpfs: bool,
                  enable: str, uid: int, user_namespace: bool, cwd: str, env: Mapping[str, str],
                  partition: tuple[int, int] | None, kernel_avoided: bool = False,
                  kernel_extfs: bool = True) -> OverlayChoice:
    """The layers over `image`, checked; `partition` is the SIF's overlay partition (offset, size), if any.

    `kernel_avoided`: `avoid kernel features = userns_overlay` in a user namespace, so fuse-overlayfs.
    `kernel_extfs`: `allow kernel extfs` (no: ext3 overlay images through fuse2fs, root's too).
    """
    choice = OverlayChoice()
    given = split_values(overlays)
    if writable and given:
        raise SingpyError("--overlay can't be used with --writable (the image itself is written)")
    if writable and writable_tmpfs:
        choice.warnings.append("--writable-tmpfs is ignored: it can't be used with --writable")
        writable_tmpfs = False
    if enable == "no":
        _refuse_disabled(given, writable_tmpfs, partition, image)
    choice.writable_tmpfs = writable_tmpfs
    if writable:
        check_writable_image(image, partition)
    specs = [_overlay(value, cwd) for value in given]
    if partition is not None:
        specs.insert(0, OverlaySpec(path=image.path, kind="extfs", readonly=not writable, offset=partition[0],
                                    size=partition[1]))
    specs = [_usable(spec, choice) for spec in specs]
    choice.overlays = _ordered(specs, writable_tmpfs)
    choice.overlays = [_strategy(spec, uid=uid, user_namespace=user_namespace, env=env, kernel_extfs=kernel_extfs)
                       for spec in choice.overlays]
    if choice.overlays or writable_tmpfs:
        _choose_driver(choice, image, enable="avoided" if kernel_avoided and enable != "driver" else enable,
                       uid=uid, env=env)
    return choice


def _refuse_disabled(given: list[str], writable_tmpfs: bool, partition: tuple[int, int] | None,
                     image: ImageSpec) -> None:
    """`enable overlay = no`: Apptainer refuses every overlay the user or the image asks for."""
    hint = "the system administrator disabled overlays (enable overlay = no)"
    if given:
        raise SingpyError("--overlay needs overlays, but `enable overlay = no` in the configuration", hint=hint)
    if writable_tmpfs:
        raise SingpyError("--writable-tmpfs needs overlays, but `enable overlay = no` in the configuration",
                          hint=hint)
    if partition is not None:
        raise SingpyError(f"the overlay partition of {image.path} needs overlays, but `enable overlay = no` in "
                          "the configuration", hint=hint)


def check_writable_image(image: ImageSpec, partition: tuple[int, int] | None) -> None:
    """--writable: a sandbox or a SIF with an overlay partition, which the user may write."""
    if image.kind == "squashfs":
        raise ImageError(f"--writable: {image.path} is a squashfs image, which can't be written",
                         hint="use --writable-tmpfs, an --overlay, or a sandbox directory (singpy build --sandbox)")
    if image.kind == "sif" and partition is None:
        raise ImageError(f"--writable: {image.path} has no writable overlay partition",
                         hint=f"add one with `singpy overlay create {image.path}`, or use --writable-tmpfs")
    if not os.access(image.path, os.W_OK):
        raise ImageError(f"--writable: can't write {image.path} (permission denied)")


def _overlay(value: str, cwd: str) -> OverlaySpec:
    """One --overlay PATH[:ro|:rw], its kind read from the host (no FIFO or device is ever opened)."""
    path, _, mode = value.rpartition(":") if value.endswith((":ro", ":rw")) else (value, "", "")
    if not path:
        raise SingpyError(f"bad --overlay {shown(value)!r}: expected PATH[:ro]")
    path = os.path.normpath(os.path.join(cwd, path))
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ImageError(f"overlay {shown(path)} does not exist") from None
    except (OSError, ValueError) as error:
        raise ImageError(f"can't use overlay {shown(path)}: {reason(error)}") from None
    readonly = mode == "ro"
    if stat.S_ISDIR(info.st_mode):
        return OverlaySpec(path=path, kind="dir", readonly=readonly)
    if not stat.S_ISREG(info.st_mode):
        raise ImageError(f"overlay {shown(path)} is not a directory or an image file ({kind_name(info.st_mode)})")
    return _image_file(path, readonly)


def _image_file(path: str, readonly: bool) -> OverlaySpec:
    """An ext3 image file, or a SIF with an overlay partition; anything else is refused."""
    from singpy.host.hostfiles import open_regular

    fd = open_regular(path, what="overlay", error=ImageError)
    try:
        sif_magic = os.pread(fd, 9, 32)
        ext_magic = os.pread(fd, 2, EXT_MAGIC_AT)
    except OSError as error:
        raise ImageError(f"can't read overlay {shown(path)}: {reason(error)}") from None
    finally:
        os.close(fd)
    if sif_magic == b"SIF_MAGIC":
        from singpy.image.detect import overlay_partition

        found = overlay_partition(path)
        if found is None:
            raise ImageError(f"overlay {shown(path)} is a SIF without an overlay partition")
        return OverlaySpec(path=path, kind="extfs", readonly=readonly, offset=found[0], size=found[1])
    if ext_magic != EXT_MAGIC:
        raise ImageError(f"overlay {shown(path)} is not a directory or an ext3 image",
                         hint="make one with `singpy overlay create FILE`")
    return OverlaySpec(path=path, kind="extfs", readonly=readonly)


def _usable(spec: OverlaySpec, choice: OverlayChoice) -> OverlaySpec:
    """A writable overlay the user can't write is used read-only, with a warning (as Apptainer does)."""
    if spec.readonly or os.access(spec.path, os.W_OK):
        return spec
    choice.warnings.append(f"overlay {spec.path} is not writable by you: using it read-only")
    return spec.replace(readonly=True)


def _ordered(specs: list[OverlaySpec], writable_tmpfs: bool) -> list[OverlaySpec]:
    """Read-only layers in the order given (lowest first), then the one writable layer on top."""
    writable = [spec for spec in specs if not spec.readonly]
    if len(writable) > 1:
        raise SingpyError(f"only one writable overlay can be used: {writable[0].path} is writable already",
                          hint=f"use --overlay {writable[1].path}:ro")
    if writable and writable_tmpfs:
        raise SingpyError(f"--writable-tmpfs can't be used with the writable overlay {writable[0].path}",
                          hint=f"use --overlay {writable[0].path}:ro with --writable-tmpfs")
    return [spec for spec in specs if spec.readonly] + writable


def _strategy(spec: OverlaySpec, *, uid: int, user_namespace: bool, env: Mapping[str, str],
              kernel_extfs: bool) -> OverlaySpec:
    if spec.kind == "dir":
        return spec
    from singpy.image import extfs

    return extfs.choose(spec, uid=uid, user_namespace=user_namespace, env=env, allow_kernel=kernel_extfs)


def _choose_driver(choice: OverlayChoice, image: ImageSpec, *, enable: str, uid: int,
                   env: Mapping[str, str]) -> None:
    """Kernel overlayfs or fuse-overlayfs (`driver`, or a layer where the kernel's fails); reported at -v."""
    from singpy.image.tools import find_tool

    tool = find_tool(FUSE_OVERLAYFS, env)
    usable = uid == 0 or os.access(FUSE_DEVICE, os.R_OK | os.W_OK)
    choice.tool = tool if tool is not None and usable else ""
    why = {"driver": "`enable overlay = driver` in the configuration",
           "avoided": "`avoid kernel features = userns_overlay` in the configuration"}.get(enable)
    if why is None:
        why = _kernel_problem(choice.overlays, image)
        if why is None:
            console.verbose("overlay: the kernel's overlayfs" + (f" ({FUSE_OVERLAYFS} if it refuses)"
                                                                  if choice.tool else ""))
            return
    if not choice.tool:
        missing = (f"{FUSE_OVERLAYFS} is not installed" if tool is None
                   else f"{FUSE_DEVICE} is not readable and writable by you")
        raise ImageError(f"the overlay needs {FUSE_OVERLAYFS} ({why}), but {missing}",
                         hint="install fuse-overlayfs (Debian, Ubuntu, RHEL: package fuse-overlayfs)")
    console.verbose(f"overlay: {FUSE_OVERLAYFS}, {why}")
    choice.driver = "fuse"


def _kernel_problem(overlays: list[OverlaySpec], image: ImageSpec) -> str | None:
    """Why the kernel's overlayfs can't take these layers, from the filesystems they are on, or None."""
    layers = [(spec.path, not spec.readonly) for spec in overlays if spec.kind == "dir"]
    if image.rootfs is not None:
        layers.append((image.rootfs, False))
    types = _mount_types()
    for path, upper in layers:
        try:
            fstype = types.get(os.stat(path).st_dev, "")
        except OSError:
            continue
        family = fstype.split(".", 1)[0]
        name = _BAD_FOR_ANY.get(family) or (_BAD_FOR_UPPER.get(family) if upper else None)
        if name:
            return f"{path} is on {name}, which the kernel's overlayfs can't use as {'upper' if upper else 'a'} layer"
    if any(spec.strategy == "fuse" and not spec.readonly for spec in overlays):
        return "the writable layer is served by fuse2fs (FUSE), which the kernel's overlayfs can't use as upper layer"
    return None


def _mount_types() -> dict[int, str]:
    """Filesystem type of each mounted device, from /proc/self/mountinfo ("maj:min" is field 3)."""
    types: dict[int, str] = {}
    try:
        with open("/proc/self/mountinfo") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return types
    for line in lines:
        fields, _, after = line.partition(" - ")
        parts, fstype = fields.split(), after.split(" ", 1)[0]
        if len(parts) > 2 and ":" in parts[2]:
            major, minor = parts[2].split(":", 1)
            types[os.makedev(int(major), int(minor))] = fstype
    return types

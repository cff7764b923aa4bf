"""Site policy from singpy.conf: which images a user may run, which namespaces they get, the session's size.

Apptainer 1.4's directives, applied as its runtime applies them ([1]
internal/pkg/runtime/engine/apptainer/prepare_linux.go, loadImage and
prepareContainerConfig; [2] container_linux.go, create; [3] e2e/config):

* `limit container paths / owners / groups` and `allow container dir / sif /
  squashfs / extfs` refuse an image, or an --overlay (Apptainer loads each as
  an image too), with one error naming it and the directive. As Apptainer's
  apptainer.conf documents them, they do not apply to root. singpy is never
  setuid, and a user may run a container without singpy (or with a
  `--config` of their own), so they state a site's rule rather than enforce
  it against a determined user, exactly as Apptainer warns for its non-setuid
  mode. `allow container encrypted` needs no check: singpy runs no encrypted
  SIF (singpy.image.detect refuses them). `allow container extfs` covers ext3
  overlay images and Singularity 2.x ext3 images run as the root alike.
* `allow ipc ns = no` / `allow uts ns = no`: Apptainer drops the namespace
  and runs on (its e2e tests expect exit 0 and the host's namespace); singpy
  does the same, with a warning, so a user is not left believing they got
  isolation they did not get.
* `sessiondir max size` and `memory fs type`: the size and type of the
  staging filesystem (singpy.layers.rootfs.enter_staging), which holds the
  `--writable-tmpfs` upper layer, as Apptainer's session directory does. The
  size applies to users other than root, as in Apptainer; ramfs has no size.

Cheap by design: nothing here is read unless the directive is set, and the
user and group databases are opened only then.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from singpy.config.sysconf import SysConfig
from singpy.errors import ImageError
from singpy.host.hostfiles import shown
from singpy.plan import ImageSpec, OverlaySpec

# The directive that allows each kind of image (singpy.image.detect's kinds) or overlay, and what it is called.
_KIND_DIRECTIVES = {"sandbox": ("allow container dir", "sandbox directories"),
                    "sif": ("allow container sif", "SIF images"),
                    "squashfs": ("allow container squashfs", "squashfs images"),
                    "ext3": ("allow container extfs", "ext3 images")}  # Singularity 2.x `.img`, as Apptainer
_OVERLAY_DIRECTIVES = {"dir": ("allow container dir", "overlay directories"),
                       "extfs": ("allow container extfs", "ext3 overlay images"),
                       "sif": ("allow container sif", "SIF images")}


class PolicyError(ImageError):
    """The system administrator's singpy.conf does not allow this image."""


def check_image(image: ImageSpec, config: SysConfig, uid: int) -> None:
    """Refuse an image the site does not allow a user to run (root is not limited, as in Apptainer).

    Checked in Apptainer's order: the path, the group, the owner, then the kind of image.
    """
    if uid == 0:
        return
    _check_limits(image.path, config, "image")
    _check_kind(_KIND_DIRECTIVES.get(image.kind), image.path, config, "run")


def check_overlays(overlays: Iterable[OverlaySpec], image_path: str, config: SysConfig, uid: int) -> None:
    """The same limits for each --overlay, as Apptainer loads an overlay as an image (its loadImage).

    A SIF's own overlay partition (--writable) is the image itself, checked already.
    """
    if uid == 0:
        return
    for spec in overlays:
        if spec.path == image_path:
            continue
        _check_limits(spec.path, config, "overlay")
        kind = "dir" if spec.kind == "dir" else "sif" if spec.offset else "extfs"  # a partition lies in a SIF
        _check_kind(_OVERLAY_DIRECTIVES[kind], spec.path, config, "use")


def _check_limits(path: str, config: SysConfig, what: str) -> None:
    paths, groups, owners = (config.items(f"limit container {name}") for name in ("paths", "groups", "owners"))
    if paths:
        _check_path(path, paths, what)
    if groups or owners:
        info = _stat(path, what)
        if groups:
            _check_owner(path, info.st_gid, groups, "groups", what)
        if owners:
            _check_owner(path, info.st_uid, owners, "owners", what)


def _check_kind(found: tuple[str, str] | None, path: str, config: SysConfig, verb: str) -> None:
    if found is not None and not config.flag(found[0]):
        directive, what = found
        raise PolicyError(f"{what} are not allowed by the system administrator ({directive} = no): "
                          f"can't {verb} {shown(path)}")


def _check_path(path: str, allowed: tuple[str, ...], what: str) -> None:
    """The file, links resolved, is one of the allowed directories or below one (not a mere string prefix)."""
    real = os.path.realpath(path)
    for entry in allowed:
        base = os.path.realpath(entry)
        if real == base or real.startswith(base.rstrip("/") + "/"):
            return
    raise PolicyError(f"{what} {shown(path)} is not under a directory the system administrator allows "
                      f"(limit container paths = {', '.join(allowed)})")


def _stat(path: str, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as error:
        raise ImageError(f"can't read {what} {shown(path)}: {error.strerror}") from None


def _check_owner(path: str, owner_id: int, allowed: tuple[str, ...], which: str, what: str) -> None:
    """The file's owning user (or group) is one of the names listed; a name the host does not know matches none."""
    if owner_id in _ids(allowed, which):
        return
    kind = "user" if which == "owners" else "group"
    raise PolicyError(f"{what} {shown(path)} is owned by {kind} {_name(owner_id, which)}, not one the system "
                      f"administrator allows (limit container {which} = {', '.join(allowed)})")


def _ids(names: tuple[str, ...], which: str) -> set[int]:
    import grp
    import pwd

    ids = set()
    for name in names:
        try:
            ids.add(pwd.getpwnam(name).pw_uid if which == "owners" else grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return ids


def _name(number: int, which: str) -> str:
    import grp
    import pwd

    try:
        return pwd.getpwuid(number).pw_name if which == "owners" else grp.getgrgid(number).gr_name
    except KeyError:
        return str(number)


def grant_namespaces(config: SysConfig, *, pid: bool, ipc: bool, uts: bool,
                     hostname: str | None) -> tuple[bool, bool, bool, str | None, tuple[str, ...]]:
    """(pid, ipc, uts, hostname) less what `allow pid/ipc/uts ns = no` forbid, and a warning for each drop.

    As Apptainer does: the namespace is dropped and the run goes on.
    """
    warnings = []
    if pid and not config.flag("allow pid ns"):  # --pid, or --containall
        warnings.append("no PID namespace: the system administrator does not allow one (allow pid ns = no)")
        pid = False
    if ipc and not config.flag("allow ipc ns"):  # --ipc, or --containall
        warnings.append("no IPC namespace: the system administrator does not allow one (allow ipc ns = no)")
        ipc = False
    if uts and not config.flag("allow uts ns"):
        warnings.append("--hostname ignored: the system administrator does not allow UTS namespaces (allow uts ns = no)"
                        if hostname is not None else
                        "no UTS namespace: the system administrator does not allow one (allow uts ns = no)")
        uts, hostname = False, None
    return pid, ipc, uts, hostname, tuple(warnings)

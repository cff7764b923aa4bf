"""apply_mounts: the one place that carries out a mount plan.

Called in the staging root (see singpy.rootfs), with the host tree at
/oldroot and the container root at /newroot, holding CAP_SYS_ADMIN over the
mount namespace. Every `MountOp` is handled in the single `match` below;
`assert_never` makes a new op fail type-checking until it is handled here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from singpy import console
from singpy.errors import BindSpecError
from singpy.kernel import syscalls as k
from singpy.mounts.rootpath import Resolver, is_under, resolve
from singpy.plan import Missing, MountOp, MountSpec
from singpy.rootfs import HOST, NEWROOT, SCRATCH, host_path, remount

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

_STICKY_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")


def apply_mounts(specs: tuple[MountSpec, ...]) -> None:
    guest, host = Resolver(NEWROOT), Resolver(HOST)  # the host tree never changes under /oldroot
    sealed = _Sealed(spec.dest for spec in specs if spec.op is MountOp.TMPFS and spec.readonly)
    for number, spec in enumerate(specs):
        match spec.op:
            case MountOp.BIND:
                _bind(spec, guest(spec.dest), host, sealed)
            case MountOp.TMPFS:
                mode = "1777" if spec.dest in _STICKY_TMPFS else "0755"
                _fresh(spec, guest(spec.dest), "tmpfs", k.MS_NOSUID | k.MS_NODEV, f"mode={mode}")
            case MountOp.PROC:
                _fresh(spec, guest(spec.dest), "proc", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, None)
            case MountOp.DEVPTS:
                _fresh(spec, guest(spec.dest), "devpts", k.MS_NOSUID | k.MS_NOEXEC,
                       "newinstance,ptmxmode=0666,mode=0620")
            case MountOp.MQUEUE:
                _fresh(spec, guest(spec.dest), "mqueue", k.MS_NOSUID | k.MS_NODEV | k.MS_NOEXEC, None)
            case MountOp.FILE:
                _merged_file(spec, guest(spec.dest), number)
            case MountOp.SYMLINK:
                _symlink(spec, guest(spec.dest))
            case _:
                assert_never(spec.op)
        guest.forget(spec.dest)
    sealed.seal(guest)


class _Sealed:
    """Read-only tmpfs trees (/.singularity.d/libs): sealed once, when all is mounted below them.

    One recursive mount_setattr instead of a read-only remount for each of the
    ~70 libraries --nv binds there; on kernels without it, each bind is
    remounted as any other read-only bind.
    """

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(roots)
        self.pending: list[tuple[str, int]] = []  # (host path, flags) of binds left for `seal`

    def defer(self, guest: str, dest: str, flags: int) -> bool:
        if not any(is_under(guest, root) for root in self.roots):
            return False
        self.pending.append((dest, flags))
        return True

    def seal(self, guest: Resolver) -> None:
        for root in self.roots:
            if not k.seal_tree(guest(root)):
                for dest, flags in self.pending:
                    remount(dest, flags)
                return


def assert_never(value: NoReturn) -> NoReturn:
    """typing.assert_never, without importing typing at start-up."""
    raise AssertionError(f"unhandled mount op {value!r}")


def missing_mount_points(specs: tuple[MountSpec, ...], rootfs: str) -> list[tuple[str, bool]]:
    """Mount points the plan needs that the image lacks, as (path below the root, is_dir).

    Destinations below an earlier tmpfs or bind are left to that mount. `rootfs`
    is the image root as seen from the staging root; image symlinks are followed.
    """
    missing = []
    covering: set[str] = set()
    for spec in specs:
        if spec.op is not MountOp.SYMLINK and not _is_covered(spec.dest, covering):
            path = resolve(rootfs, spec.dest)
            if not os.path.lexists(path):
                missing.append((os.path.relpath(path, rootfs), _wants_directory(spec)))
        if spec.op in (MountOp.TMPFS, MountOp.BIND, MountOp.PROC, MountOp.DEVPTS):
            covering.add(spec.dest)
    return missing


def _is_covered(dest: str, covering: set[str]) -> bool:
    """Whether `dest` or one of its ancestors is mounted on (a walk up, not a scan of every mount)."""
    path = dest
    while path not in covering:
        if path == "/":
            return False
        path = path.rsplit("/", 1)[0] or "/"
    return True


def _wants_directory(spec: MountSpec) -> bool:
    if spec.op is MountOp.FILE:
        return False
    if spec.op is MountOp.BIND:
        assert spec.source is not None
        return os.path.isdir(host_path(spec.source))
    return True


def _bind(spec: MountSpec, dest: str, host: Resolver, sealed: _Sealed) -> None:
    assert spec.source is not None
    source = host(spec.source)
    if not os.path.exists(source):
        if spec.missing is Missing.SKIP:
            console.debug(f"skipping bind of {spec.source}: not on this host")
            return
        raise BindSpecError(f"bind source {spec.source} does not exist")
    _ensure_mount_point(dest, spec.dest, directory=os.path.isdir(source))
    console.verbose(f"binding {spec.source} -> {spec.dest}{' (ro)' if spec.readonly else ''}")
    k.mount(source, dest, None, k.MS_BIND | k.MS_REC)
    flags = k.MS_NOSUID | (0 if spec.dev else k.MS_NODEV) | (k.MS_RDONLY if spec.readonly else 0)
    if not (spec.readonly and sealed.defer(spec.dest, dest, flags)):
        remount(dest, flags)


def _fresh(spec: MountSpec, dest: str, fstype: str, flags: int, data: str | None) -> None:
    _ensure_mount_point(dest, spec.dest, directory=True)
    console.verbose(f"mounting {fstype} on {spec.dest}")
    k.mount(fstype, dest, fstype, flags, data)


def _merged_file(spec: MountSpec, dest: str, number: int) -> None:
    """The container's file (passwd, group) with our entry replacing any of the same name."""
    assert spec.content is not None
    key = spec.content.split(":", 1)[0] + ":"
    try:
        with open(dest) as handle:
            lines = [line for line in handle.read().splitlines() if not line.startswith(key) and spec.merge]
    except OSError:
        lines = []
    staged = f"{SCRATCH}/file{number}"
    with open(staged, "w") as handle:
        handle.write("\n".join([*lines, spec.content]) + "\n")
    os.chmod(staged, 0o644)
    _ensure_mount_point(dest, spec.dest, directory=False)
    console.verbose(f"writing {spec.dest} with an entry for {key[:-1]}" if spec.merge else f"writing {spec.dest}")
    k.mount(staged, dest, None, k.MS_BIND)
    remount(dest, k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV)


def _symlink(spec: MountSpec, dest: str) -> None:
    assert spec.source is not None
    os.symlink(spec.source, dest)


def _ensure_mount_point(path: str, guest: str, *, directory: bool) -> None:
    if os.path.lexists(path):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if directory:
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as error:
        raise BindSpecError(f"can't create mount point {guest} in the container: {error.strerror}") from None

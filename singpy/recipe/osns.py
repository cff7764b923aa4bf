"""Where a bootstrap agent's host tool runs: as root, in a mount namespace of its own.

`python -m singpy.recipe.osns MODE UIDS GIDS ROOTFS FAKE -- PROGRAM [ARGS...]` (argv from `arguments`):

- as real root (MODE `--root`), a new mount namespace, propagation off: debootstrap mounts /proc and
  /sys in the new root, arch-chroot binds /dev; those mounts end with the tool, never reach the host and
  never outlive an interrupted build;
- for a user (MODE `--helper` or `--self`, with the build's id mapping, singpy.recipe.mapped), a user
  namespace too, where the tool is root and the user's subordinate ids are the other users dpkg and rpm
  give files to.

FAKE `--devices` (dnf, zypper, whose scriptlets write to /dev/null in the new root): the host's
/dev/null, /dev/zero, /dev/random and /dev/urandom bound on files in ROOTFS/dev. `--fake`, for a user
(or a build already in its user namespace), what Apptainer's fakeroot builds do ([1]
conveyorPacker_debootstrap.go prepareFakerootEnv): `true` bound over the host's mount, umount and mknod
(a user namespace may not mount proc or make device nodes), /dev/null over /proc/filesystems, and those
/dev nodes. `--real`: nothing.

Then it execs the program, which inherits the namespaces and nothing else.
"""

from __future__ import annotations

import os
import sys

from singpy.plan import IdMap

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import NoReturn

_FAKED = ("mount", "umount", "mknod")
_DEVICES = ("null", "zero", "random", "urandom")


def arguments(idmap: IdMap | None, rootfs: str, *, setup: str = "") -> list[str]:
    """The helper's arguments before `--` (see the module's docstring). `setup`: "fake" (Apptainer's fakeroot
    environment, for a user), "devices" (the /dev nodes alone, as root too), or "" (nothing)."""
    from singpy.recipe.mapped import encode

    if idmap is None:
        return ["--root", "", "", rootfs, f"--{setup or 'real'}"]
    return ["--helper" if idmap.helper else "--self", encode(idmap.uids), encode(idmap.gids), rootfs,
            f"--{setup or 'real'}"]


def _enter(mode: str, uids: str, gids: str) -> None:
    from singpy.kernel import syscalls as k
    from singpy.layers import fakeroot
    from singpy.recipe.mapped import decode

    if mode == "--root":
        k.unshare(k.CLONE_NEWNS)
    else:
        idmap = IdMap(uids=decode(uids), gids=decode(gids), helper=mode == "--helper", note="")
        fakeroot.enter_user_namespace(idmap, k.CLONE_NEWUSER | k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)


def _fake_root(rootfs: str) -> None:
    """Apptainer's fakeroot environment for debootstrap and pacstrap (see the module's docstring)."""
    from singpy.host.hostfiles import which
    from singpy.kernel import syscalls as k

    path = os.environ.get("PATH", "/usr/bin:/bin")
    true = which("true", path) or "/bin/true"
    for name in _FAKED:
        program = which(name, path)
        if program is not None:
            k.mount(true, os.path.realpath(program), None, k.MS_BIND)
    k.mount("/dev/null", "/proc/filesystems", None, k.MS_BIND)
    _bind_devices(rootfs)


def _bind_devices(rootfs: str) -> None:
    """The host's null, zero, random and urandom bound on files in ROOTFS/dev (no mknod needed)."""
    from singpy.kernel import syscalls as k

    os.makedirs(f"{rootfs}/dev", mode=0o755, exist_ok=True)
    for name in _DEVICES:
        node = f"{rootfs}/dev/{name}"
        os.close(os.open(node, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        k.mount(f"/dev/{name}", node, None, k.MS_BIND)


def main(argv: list[str]) -> NoReturn:
    from singpy.recipe.entry import exec_or_report

    if len(argv) < 7 or argv[5] != "--":
        sys.stderr.write("usage: python -m singpy.recipe.osns MODE UIDS GIDS ROOTFS FAKE -- PROGRAM [ARGS...]\n")
        os._exit(2)
    mode, uids, gids, rootfs, fake, _, *program = argv

    def prepare() -> None:
        _enter(mode, uids, gids)
        if fake == "--fake":
            _fake_root(rootfs)
        elif fake == "--devices":
            _bind_devices(rootfs)

    exec_or_report(prepare, program, search_path=False)


if __name__ == "__main__":
    main(sys.argv[1:])

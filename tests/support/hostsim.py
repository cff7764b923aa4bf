"""Host settings that a test needs changed, changed for singpy alone: in a private mount namespace.

Some behaviour depends on host files that belong to everyone: the mode of
/dev/fuse (may a user use FUSE?) and /etc/subuid, /etc/subgid (has a user
subordinate ids?). Changing them for real would break every other program on
the machine, another copy of this suite included. Instead, while a
`simulated(...)` block is active, `Singpy.popen` (tests/conftest.py) starts
singpy through this file as a wrapper:

    python tests/support/hostsim.py [--fuse MODE] [--subuid FILE --subgid FILE] SCRATCH UID GID -- CMD...

which, as root, in a mount namespace of its own whose mounts never propagate
back (slave of the host's):

* mounts a tmpfs on SCRATCH, makes a character device 10:229 there with
  MODE (0666: "open", 0600: "closed") and binds it over /dev/fuse;
* binds FILE over /etc/subuid and /etc/subgid (newuidmap, started by singpy,
  reads them in the same namespace);

then drops to UID:GID and execs CMD, so the process the test holds is singpy
itself (signals and exit status are singpy's). Nothing outside changes, and
the namespace ends with the last process in it. This is tests/gpu/simrun.py's
technique, for the settings every test file may need.

A wrapper is only used where the real host differs from what the test asks:
root opens /dev/fuse whatever its mode, and a host whose /dev/fuse already
is as asked needs nothing. Without root nothing can be simulated: the
fixtures skip, with a reason, what the real host cannot show.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager

FUSE_DEVICE = "/dev/fuse"
FUSE_RDEV = (10, 229)
FUSE_MODES = {"open": 0o666, "closed": 0o600}  # an admin's choice; Debian's default
SUBID_FILES = ("/etc/subuid", "/etc/subgid")

_fuse: str | None = None  # the /dev/fuse state asked for, None: the host's as it is
_subids: tuple[str, str] | None = None  # private files to bind over SUBID_FILES


# --- in the test process ---------------------------------------------------------------------------------------------


def fuse_usable_by(uid: int, gid: int) -> bool:
    """Whether the real /dev/fuse is readable and writable by uid:gid (supplementary groups cleared)."""
    try:
        info = os.stat(FUSE_DEVICE)
    except FileNotFoundError:
        return False
    if uid == 0:
        return True
    shift = 6 if info.st_uid == uid else 3 if info.st_gid == gid else 0
    return (info.st_mode >> shift) & 0o6 == 0o6


def fuse_problem(state: str, uid: int, gid: int) -> str | None:
    """Why the "open"/"closed" state can't be shown to uid:gid here, or None."""
    if not os.path.exists(FUSE_DEVICE):
        return f"{FUSE_DEVICE} does not exist on this host (no fuse module)"
    if fuse_usable_by(uid, gid) == (state == "open") or os.geteuid() == 0:
        return None
    mode = os.stat(FUSE_DEVICE).st_mode & 0o7777
    return f"/dev/fuse {state} to uid {uid}: the host's is not (mode {mode:o}), and simulating it needs root"


@contextmanager
def fuse_state(state: str) -> Iterator[str]:
    """Within the block, singpy runs as if /dev/fuse were "open" to users or "closed" (root only)."""
    global _fuse
    if state not in FUSE_MODES:
        raise ValueError(f"fuse state {state!r}: 'open' or 'closed'")
    saved, _fuse = _fuse, state
    try:
        yield state
    finally:
        _fuse = saved


@contextmanager
def subid_files(subuid: str, subgid: str) -> Iterator[None]:
    """Within the block, singpy (and its newuidmap) read these files as /etc/subuid and /etc/subgid."""
    global _subids
    if os.geteuid() != 0:
        raise PermissionError("binding files over /etc/subuid needs root")
    missing = [path for path in SUBID_FILES if not os.path.exists(path)]
    if missing:
        raise FileNotFoundError(f"{missing[0]} does not exist: nothing to bind over")
    saved, _subids = _subids, (subuid, subgid)
    try:
        yield
    finally:
        _subids = saved


def subid_copies(user: str, uid: int, line: str | None, prefix: str) -> tuple[str, str]:
    """Private copies of /etc/subuid and /etc/subgid (PREFIX-etc-subuid...) with `user`'s lines (by name or by
    uid) replaced by `line` ("user:first:count"), or removed when it is None: for `subid_files`."""
    copies = []
    for public in SUBID_FILES:
        with open(public) as handle:
            kept = [entry for entry in handle if not entry.startswith((f"{user}:", f"{uid}:"))]
        if line is not None:
            kept.append(f"{line}\n")
        copy = f"{prefix}{public.replace('/', '-')}"
        with open(copy, "w") as handle:
            handle.write("".join(kept))
        os.chmod(copy, 0o644)
        copies.append(copy)
    return copies[0], copies[1]


def wrapper(uid: int, gid: int, scratch: str) -> list[str]:
    """The command prefix that runs CMD as uid:gid on the simulated host; [] when the host as it is will do.

    `scratch` is an empty directory that the wrapper mounts its tmpfs on (in its own namespace).
    """
    options: list[str] = []
    if _fuse is not None and uid != 0 and fuse_usable_by(uid, gid) != (_fuse == "open"):  # root opens it anyway
        options += ["--fuse", f"{FUSE_MODES[_fuse]:o}"]
    if _subids is not None:
        options += ["--subuid", _subids[0], "--subgid", _subids[1]]
    if not options:
        return []
    return [sys.executable, "-P", os.path.abspath(__file__), *options, scratch, str(uid), str(gid), "--"]


# --- the wrapper, in its own process ---------------------------------------------------------------------------------


def simulate(scratch: str, fuse_mode: int | None, subids: tuple[str, str] | None) -> None:
    from singpy.kernel import syscalls as k

    k.unshare(k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_SLAVE)  # the host's mounts come in, ours never go out
    if fuse_mode is not None:
        k.mount("singpy-hostsim", scratch, "tmpfs", k.MS_NOSUID, "mode=0755")
        node = os.path.join(scratch, "fuse")
        os.mknod(node, stat.S_IFCHR | fuse_mode, os.makedev(*FUSE_RDEV))
        os.chmod(node, fuse_mode)  # mknod's mode is cut by the umask
        k.mount(node, FUSE_DEVICE, None, k.MS_BIND)
    for private, public in zip(subids or (), SUBID_FILES, strict=False):
        k.mount(private, public, None, k.MS_BIND)


def main(argv: list[str]) -> None:
    fuse_mode: int | None = None
    subuid = subgid = ""
    while argv[0].startswith("--"):
        option, value, *argv = argv
        if option == "--fuse":
            fuse_mode = int(value, 8)
        elif option == "--subuid":
            subuid = value
        elif option == "--subgid":
            subgid = value
        else:
            raise SystemExit(f"hostsim: unknown option {option}")
    scratch, uid, gid, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: hostsim.py [--fuse MODE] [--subuid FILE --subgid FILE] SCRATCH UID GID -- CMD...")
    simulate(scratch, fuse_mode, (subuid, subgid) if subuid else None)
    if int(uid):
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])

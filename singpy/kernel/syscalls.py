"""Thin wrappers for the system calls Python 3.11's `os` lacks.

Each wrapper checks its result where the call is made and turns a failure
into a `KernelError` that reads "can't VERB OBJECT: strerror", so a user sees
which step failed and why ([1] charliecloud bin/ch_misc.h, the Zf() macro).

The calls themselves are made by the C extension singpy.kernel._native, built by
`make setup` (pip's build of setup.py): `import ctypes` alone cost ~1.7 ms of every
`singpy exec` (issue 31). Where it was not built (a plain source tree),
singpy.kernel._libcalls makes the same calls through ctypes; both raise OSError.
"""

from __future__ import annotations

import os

from singpy.errors import KernelError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Callable

try:
    from singpy.kernel import _native as _calls
except ImportError:  # not built: the same interface through ctypes
    from singpy.kernel import _libcalls as _calls  # type: ignore[no-redef]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_SLAVE = 0x80000
MS_RELATIME = 0x200000

MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


# Every wrapper below (and singpy.kernel.caps/netns) calls through `_check` or `_errno_of`, so every failure
# reads the same way.
def _check(what: str, call: Callable[..., None], *args: object) -> None:
    error = _errno_of(call, *args)
    if error:
        raise KernelError(f"can't {what}: {os.strerror(error)}")


def _errno_of(call: Callable[..., None], *args: object) -> int:
    """0 when a call succeeded, else its errno (for callers that treat some errors as answers)."""
    try:
        call(*args)
    except OSError as error:
        return error.errno or _EINVAL
    except ValueError:  # a NUL byte in a path or string: the kernel would have read a shorter one
        return _EINVAL
    return 0


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


# True from a successful unshare(CLONE_NEWUSER) until the next mount(2): where that first mount fails, a host
# policy (Ubuntu's AppArmor restriction) is the likely cause, which `mount` then names (singpy.host.hostcheck).
_fresh_userns = False


_EINVAL = 22  # errno.EINVAL on Linux, without importing errno on the start-up path


def unshare(flags: int) -> None:
    """Move this process into new namespaces (`flags` is CLONE_NEW* ORed).

    A refused user namespace is explained from what the host shows
    (singpy.host.hostcheck: a sysctl, seccomp, a container), not by strerror alone.
    """
    global _fresh_userns
    error = _errno_of(_calls.unshare, flags)
    if error == _EINVAL and flags & CLONE_NEWUSER and wait_single_threaded():
        # The kernel refuses a user namespace to a threaded process: a thread of a pull (a download, a deadline
        # timer) that has returned may still be leaving the kernel; once it has, the same call is accepted.
        error = _errno_of(_calls.unshare, flags)
    if not error:
        _fresh_userns = bool(flags & CLONE_NEWUSER)
        return
    why = _diagnose("unshare_failure", error) if flags & CLONE_NEWUSER else None
    if why is not None:
        raise KernelError(f"can't create a user namespace: {why}", hint=_diagnose("HINT", 0))
    raise KernelError(f"can't create namespaces (unshare): {os.strerror(error)}")


def wait_single_threaded(limit: float = 5.0) -> bool:
    """Wait (at most `limit` s) until this process has one thread again; whether it had others to wait for.

    A thread that was joined may take a moment to leave the kernel (/proc/self/task still lists it).
    """
    import time

    if len(os.listdir("/proc/self/task")) == 1:
        return False
    deadline = time.monotonic() + limit
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    return True


def _diagnose(name: str, error: int) -> str | None:
    """singpy.host.hostcheck's `name`(error), imported only now; None where it can't be (after a pivot_root the
    package is out of reach) or has nothing to add: the caller then says what it says without it."""
    try:
        from singpy.host import hostcheck

        found = getattr(hostcheck, name)
        return found if isinstance(found, str) else found(error)
    except Exception:  # any failure here must leave the original error to be reported
        return None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None, *,
          shown: str | None = None, source_shown: str | None = None) -> None:
    """mount(2); `source` None for pseudo filesystems and flag-only changes.

    `shown` names the target in an error message when `target` is a descriptor's
    path (`fd_path`), which would mean nothing to a user; `source_shown` the
    source, when `source` is where the staging root sees it (/oldroot/...).
    """
    global _fresh_userns
    error = _errno_of(_calls.mount, _b(source), os.fsencode(target), _b(fstype), flags, _b(data))
    fresh, _fresh_userns = _fresh_userns, False
    if not error:
        return
    name = source_shown or source or fstype
    what = f"{f'mount {name} on' if name else 'change the mount flags of'} {shown or target}: {os.strerror(error)}"
    why = _diagnose("in_userns_failure", error) if fresh else None
    if why is not None:
        raise KernelError(f"can't {what}: {why}", hint=_diagnose("HINT", 0))
    raise KernelError(f"can't {what}")


def fd_path(fd: int, proc: str = "/proc") -> str:
    """A path naming exactly the file `fd` refers to (for calls that take no descriptor, as mount(2)).

    The kernel follows /proc/self/fd/N to that very dentry and mount, without a
    second lookup by name, so nothing can swap a symlink in between
    ([1] proc(5), /proc/pid/fd; runc does the same for untrusted mount targets).
    `proc` is where procfs is mounted as seen by the caller (/oldroot/proc in
    the staging root).
    """
    return f"{proc}/self/fd/{fd}"


def setns(fd: int, nstype: int, what: str) -> None:
    """setns(2): join the namespace `fd` refers to."""
    _check(f"enter {what}", _calls.setns, fd, nstype)


def umount(target: str, flags: int = 0) -> None:
    _check(f"unmount {target}", _calls.umount2, os.fsencode(target), flags)


def pivot_root(new_root: str, put_old: str) -> None:
    _check(f"pivot_root into {new_root}", _calls.pivot_root, os.fsencode(new_root), os.fsencode(put_old))


AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4


def clear_nosuid_tree(path: str) -> bool:
    """Clear nosuid on the mount at `path` and every mount below it (--allow-setuid), with mount_setattr(2);
    False where the kernel lacks it (Linux < 5.12), for the caller to remount each."""
    errno = _errno_of(_calls.mount_setattr, AT_FDCWD, os.fsencode(path), AT_RECURSIVE, 0, MOUNT_ATTR_NOSUID, 0, 0)
    if errno in (38, 22):  # ENOSYS, EINVAL: an older kernel
        return False
    if errno:
        raise KernelError(f"can't allow set-uid programs in the container (--allow-setuid): {os.strerror(errno)}")
    return True


def seal_tree(fd: int, what: str) -> bool:
    """Make the mount `fd` is the root of, and every mount below it, read-only, nosuid and nodev.

    mount_setattr(2) with AT_EMPTY_PATH | AT_RECURSIVE (Linux >= 5.12). Returns
    False where the kernel lacks it, so the caller can remount each mount instead.
    """
    errno = _errno_of(_calls.mount_setattr, fd, b"", AT_EMPTY_PATH | AT_RECURSIVE,
                      MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    if errno in (38, 22):  # ENOSYS, EINVAL: an older kernel
        return False
    if errno:
        raise KernelError(f"can't make {what} read-only: {os.strerror(errno)}")
    return True


def sethostname(name: str) -> None:
    _check(f"set hostname {name}", _calls.sethostname, name.encode())


def prctl(option: int, value: int) -> None:
    _check(f"prctl({option})", _calls.prctl, option, value)


def capbset_drop(number: int) -> bool:
    """Drop capability `number` from the bounding set; False past the kernel's last capability (EINVAL)."""
    errno = _errno_of(_calls.prctl, PR_CAPBSET_DROP, number)
    if errno == 22:
        return False
    if errno:
        raise KernelError(f"can't drop capability {number} from the bounding set: {os.strerror(errno)}")
    return True


PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4


def _capabilities() -> list[int]:
    """This thread's capability sets: effective, permitted, inheritable; low halves, then high halves."""
    try:
        return list(_calls.capget())
    except OSError as error:
        raise KernelError(f"can't read the capability sets (capget): {os.strerror(error.errno or 0)}") from None


def _set_capabilities(data: list[int]) -> None:
    _check("set the inheritable capabilities (capset)", _calls.capset, *data)


def raise_ambient(number: int) -> int:
    """Put capability `number` in the inheritable and ambient sets: a program exec'd now keeps it.

    Without that a program run by a user who is not root in the user
    namespace loses every capability at execve (capabilities(7)). Returns
    the inheritable set as it was, for `clear_ambient`.
    """
    data = _capabilities()
    previous = data[2] | data[5] << 32
    data[2 + 3 * (number // 32)] |= 1 << (number % 32)
    _set_capabilities(data)
    _check(f"raise ambient capability {number}", _calls.prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, number)
    return previous


def clear_ambient(inheritable: int) -> None:
    """Empty the ambient set and put the inheritable set back (see raise_ambient)."""
    _check("clear the ambient capabilities", _calls.prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    data = _capabilities()
    data[2], data[5] = inheritable & 0xFFFFFFFF, inheritable >> 32
    _set_capabilities(data)

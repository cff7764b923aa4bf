"""The launch path's system calls through ctypes: the fallback of singpy.kernel._native.

The same functions with the same arguments (paths as bytes, None for NULL), each
raising OSError with the errno on failure, so singpy.kernel.syscalls reads the
same either way. Used where the C extension was not built (a plain source tree,
no compiler); `libc()` is also the handle for seccomp's prctl with a pointer,
which _native leaves out. ctypes is imported with this module, before any
pivot_root: afterwards the host's standard library is out of reach.
"""

from __future__ import annotations

import ctypes
import os

# pivot_root(2) has no glibc wrapper; its number depends on the architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "riscv64": 41, "s390x": 217}
_SYS_MOUNT_SETATTR = 442  # one number on every architecture (the unified table of Linux >= 5.3)
_CAP_VERSION_3 = 0x20080522  # struct __user_cap_header_struct.version: two 32-bit halves per set

_handle: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The process's libc, with errno kept for ctypes.get_errno()."""
    global _handle
    if _handle is None:
        _handle = ctypes.CDLL(None, use_errno=True)
    return _handle


class _MountAttr(ctypes.Structure):
    _fields_ = (("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64))


def _c(value: bytes | None) -> bytes | None:
    """A string for C: ctypes would cut it at a NUL byte, where _native refuses it (as `os` does)."""
    if value is not None and b"\0" in value:
        raise ValueError("embedded null byte")
    return value


def _result(value: int) -> None:
    if value != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def unshare(flags: int) -> None:
    _result(libc().unshare(ctypes.c_int(flags)))


def setns(fd: int, nstype: int) -> None:
    _result(libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)))


def mount(source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    _result(libc().mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data)))


def umount2(target: bytes, flags: int) -> None:
    _result(libc().umount2(_c(target), ctypes.c_int(flags)))


def pivot_root(new_root: bytes, put_old: bytes) -> None:
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(38, f"pivot_root: unsupported architecture {os.uname().machine}")  # ENOSYS
    _result(libc().syscall(ctypes.c_long(number), _c(new_root), _c(put_old)))


def mount_setattr(fd: int, path: bytes, at_flags: int, attr_set: int, attr_clr: int, propagation: int,
                  userns_fd: int) -> None:
    attr = _MountAttr(attr_set=attr_set, attr_clr=attr_clr, propagation=propagation, userns_fd=userns_fd)
    _result(libc().syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_int(fd), _c(path), ctypes.c_uint(at_flags),
                           ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))))


def sethostname(name: bytes) -> None:
    _result(libc().sethostname(name, ctypes.c_size_t(len(name))))


def capget() -> tuple[int, int, int, int, int, int]:
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; low half then high half
    _result(libc().capget(header, data))
    return data[0], data[1], data[2], data[3], data[4], data[5]


def capset(effective: int, permitted: int, inheritable: int, effective_high: int, permitted_high: int,
           inheritable_high: int) -> None:
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(effective, permitted, inheritable, effective_high, permitted_high,
                                 inheritable_high)
    _result(libc().capset(header, data))


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> None:
    _result(0 if libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3),
                              ctypes.c_ulong(arg4), ctypes.c_ulong(arg5)) >= 0 else -1)

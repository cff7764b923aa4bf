"""Seccomp filters: compiled by libseccomp on the host, installed with prctl(2) just before execve.

Why ctypes on libseccomp.so.2 (Debian's libseccomp2, which every Debian has:
systemd and util-linux link it) rather than Debian's python3-seccomp: that
module is built for /usr/bin/python3's own site-packages, which singpy's
virtual environment (and a pipx or pyenv install) does not see, and PyPI has
no wheel of the bindings. ctypes needs nothing installed and costs nothing
unless --security seccomp: is given. libseccomp resolves the system call
names and architectures (its tables follow every kernel release) and writes
the BPF program; singpy keeps the program's bytes and installs it itself
(PR_SET_SECCOMP through the package's one libc handle), because by then the
container is the root and the host's libseccomp is out of reach.
"""

from __future__ import annotations

import ctypes
import os

from singpy.errors import SingpyError
from singpy.kernel._libcalls import libc
from singpy.plan import SeccompFilter

PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_ACTIONS = {"SCMP_ACT_KILL": 0x00000000, "SCMP_ACT_KILL_THREAD": 0x00000000, "SCMP_ACT_KILL_PROCESS": 0x80000000,
            "SCMP_ACT_TRAP": 0x00030000, "SCMP_ACT_ERRNO": 0x00050000, "SCMP_ACT_TRACE": 0x7FF00000,
            "SCMP_ACT_LOG": 0x7FFC0000, "SCMP_ACT_ALLOW": 0x7FFF0000}
_OPERATORS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
              "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
# The OCI names of this machine's architectures (containers-golang's includes.arches use these).
_NATIVE = {"x86_64": ("amd64", "x86_64", "SCMP_ARCH_X86_64"), "aarch64": ("arm64", "aarch64", "SCMP_ARCH_AARCH64"),
           "ppc64le": ("ppc64le", "SCMP_ARCH_PPC64LE"), "s390x": ("s390x", "SCMP_ARCH_S390X"),
           "riscv64": ("riscv64", "SCMP_ARCH_RISCV64")}

_program: bytes | None = None  # the compiled filter (struct sock_filter[]), kept for `install`


class SeccompError(SingpyError):
    """A seccomp profile libseccomp or the kernel refuses."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def native_arch_names() -> set[str]:
    return set(_NATIVE.get(os.uname().machine, (os.uname().machine,)))


def _library() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        raise SeccompError("--security seccomp: needs libseccomp, which this host lacks",
                           hint="install the Debian package libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _action(name: str, errno: int) -> int:
    value = _ACTIONS[name]
    return value | (errno & 0xFFFF) if name == "SCMP_ACT_ERRNO" else value


def compile_filter(spec: SeccompFilter) -> None:
    """Called on the host: the profile compiled to a BPF program for this machine (and its other arches)."""
    global _program
    lib = _library()
    where = f"seccomp profile {spec.profile}"
    default = _action(spec.default_action, spec.default_errno)
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise SeccompError(f"{where}: libseccomp can't make a filter")
    try:
        for arch in spec.architectures:
            token = lib.seccomp_arch_resolve_name(arch.removeprefix("SCMP_ARCH_").lower().encode())
            if token == 0:
                raise SeccompError(f"{where}: invalid architecture {arch!r} specified")
            result = lib.seccomp_arch_add(ctx, token)
            if result not in (0, -17):  # -EEXIST: the native one
                raise SeccompError(f"{where}: can't add architecture {arch}: {os.strerror(-result)}")
        for rule in spec.rules:
            action = _action(rule.action, rule.errno)
            if action == default:  # libseccomp refuses a rule that changes nothing
                continue
            conditions = (_ArgCmp * max(1, len(rule.args)))(
                *[_ArgCmp(index, _OPERATORS[op], value, two) for index, op, value, two in rule.args])
            for name in rule.names:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number == -1:  # unknown on this machine: left out, as Apptainer does
                    continue
                result = lib.seccomp_rule_add_array(ctx, action, number, len(rule.args), conditions)
                if result != 0:
                    raise SeccompError(f"{where}: failed adding seccomp rule for syscall {name}: "
                                       f"{os.strerror(-result)}")
        _program = _export(lib, ctx, where)
    finally:
        lib.seccomp_release(ctx)


def _export(lib: ctypes.CDLL, ctx: int, where: str) -> bytes:
    fd = os.memfd_create("singpy-seccomp", os.MFD_CLOEXEC)
    try:
        result = lib.seccomp_export_bpf(ctx, fd)
        if result != 0:
            raise SeccompError(f"{where}: libseccomp can't write the filter: {os.strerror(-result)}")
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def install() -> None:
    """The last step before execve (no_new_privs is set): the compiled filter on this thread and its execs."""
    if _program is None:
        raise SeccompError("internal error: no seccomp filter was compiled")
    buffer = ctypes.create_string_buffer(_program, len(_program))
    fprog = _SockFprog(len(_program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    result = libc().prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                           ctypes.byref(fprog), 0, 0)
    if result != 0:
        raise SeccompError(f"can't load the seccomp filter: {os.strerror(ctypes.get_errno())}")

"""singpy.kernel._native (the C extension) and singpy.kernel._libcalls (its ctypes fallback): one interface.

Each backend runs the same real sequence in a child process, as root and as the test user: new namespaces
(a user namespace for the user), a tmpfs mounted, sealed read-only with mount_setattr, the hostname set, a
namespace joined with setns, the capability sets read and one inheritable capability added, no_new_privs,
pivot_root into the tmpfs; and the same failing calls, which must
raise OSError with the same errno from both. singpy.kernel.syscalls picks _native where it was built (`make
setup`), so the extension being importable here is checked too: without it every launch pays `import ctypes`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from singpy.kernel import _libcalls
from tests.support.users import ensure_test_user, is_root

CHILD = r"""
import errno, importlib, os, sys, tempfile
calls = importlib.import_module(sys.argv[1])
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWUSER = 0x20000, 0x4000000, 0x10000000
MS_REC, MS_PRIVATE, MNT_DETACH = 0x4000, 0x40000, 2

def failing(name, *args):
    try:
        getattr(calls, name)(*args)
    except OSError as error:
        return errno.errorcode[error.errno]
    return "no error"

# Failures first, in the caller's namespaces.
print("setns-bad-fd", failing("setns", -1, 0))
print("umount-not-mounted", failing("umount2", b"/proc/self", 0))
print("mount-no-target", failing("mount", None, b"/no/such/dir", b"tmpfs", 0, None))
print("seal-bad-fd", failing("mount_setattr", -1, b"", 0x1000 | 0x8000, 1, 0, 0, 0))
print("prctl-bad-option", failing("prctl", -1))
print("pivot-not-dirs", failing("pivot_root", b"/no/such/new", b"/no/such/old"))
try:
    calls.mount(None, b"/tm\0p", None, 0, None)
except ValueError:
    print("null-byte", "ValueError")

uid, gid = os.getuid(), os.getgid()
calls.unshare(CLONE_NEWNS | CLONE_NEWUTS | (CLONE_NEWUSER if uid else 0))
if uid:  # map the user to themselves, as singpy.kernel.idmap does
    with open("/proc/self/setgroups", "w") as out:
        out.write("deny")
    with open("/proc/self/uid_map", "w") as out:
        out.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as out:
        out.write(f"{gid} {gid} 1")
calls.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
root = tempfile.mkdtemp()
calls.mount(b"tmpfs", root.encode(), b"tmpfs", 0, b"mode=0755")
os.mkdir(f"{root}/old")
with open(f"{root}/file", "w") as out:
    out.write("written")
fd = os.open(root, os.O_PATH)
calls.mount_setattr(fd, b"", 0x1000 | 0x8000, 0x1 | 0x2 | 0x4, 0, 0, 0)  # AT_EMPTY_PATH | AT_RECURSIVE; RDONLY...
os.close(fd)
try:
    open(f"{root}/other", "w")
except OSError as error:
    print("sealed", errno.errorcode[error.errno])
calls.sethostname(b"native-test")
print("hostname", os.uname().nodename)
uts = os.open("/proc/self/ns/uts", os.O_RDONLY)
calls.setns(uts, CLONE_NEWUTS)
print("setns", "ok")
caps = list(calls.capget())  # effective, permitted, inheritable; low halves, then high halves
print("capget", len(caps), bool(caps[1] & 1 << 21))  # CAP_SYS_ADMIN permitted (in the namespace, for the user)
caps[2] |= 1 << 21
calls.capset(*caps)
print("capset", calls.capget()[2] >> 21 & 1)
calls.prctl(38, 1)  # PR_SET_NO_NEW_PRIVS
print("no_new_privs", [line.split()[1] for line in open("/proc/self/status") if line.startswith("NoNewPrivs")][0])
os.chdir(root)
calls.pivot_root(b".", b"old")
print("pivoted", open("/file").read())
calls.umount2(b"/old", MNT_DETACH)
print("old root gone", os.listdir("/old"))
"""

# Unprivileged, the kernel refuses these before it looks at the arguments.
FAILURES = {
    "root": "setns-bad-fd EBADF\numount-not-mounted EINVAL\nmount-no-target ENOENT\nseal-bad-fd EBADF\n",
    "user": "setns-bad-fd EBADF\numount-not-mounted EPERM\nmount-no-target ENOENT\nseal-bad-fd EPERM\n",
}
PIVOT = {"root": "pivot-not-dirs ENOENT\n", "user": "pivot-not-dirs EPERM\n"}
SEQUENCE = """null-byte ValueError
sealed EROFS
hostname native-test
setns ok
capget 6 True
capset 1
no_new_privs 1
pivoted written
old root gone []
"""


def run_child(backend: str, profile: str) -> subprocess.CompletedProcess[str]:
    ids: dict[str, object] = {}
    if profile == "user":
        entry = ensure_test_user()
        ids = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    elif not is_root():
        pytest.skip("profile root: the suite is not running as root")
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-c", CHILD, backend], capture_output=True, text=True, timeout=60, check=False,
        cwd="/", env={"PATH": os.defpath}, **ids)
    return done


@pytest.mark.parametrize("profile", ["root", "user"])
@pytest.mark.parametrize("backend", ["singpy.kernel._native", "singpy.kernel._libcalls"])
def test_both_backends_make_the_same_calls(backend: str, profile: str) -> None:
    done = run_child(backend, profile)
    assert done.returncode == 0, done.stderr
    assert done.stdout == FAILURES[profile] + "prctl-bad-option EINVAL\n" + PIVOT[profile] + SEQUENCE


def test_the_extension_is_built_and_used() -> None:
    """`make setup` (pip's build of setup.py) compiles it in place; syscalls then never imports ctypes."""
    done = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path.append(sys.argv[1]); "
                           "from singpy.kernel import syscalls, _native; "
                           "print(syscalls._calls is _native, 'ctypes' in sys.modules)",
                           os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"singpy.kernel._native is not built: run `make setup`\n{done.stderr}"
    assert done.stdout == "True False\n"


def test_the_fallback_is_used_where_the_extension_is_missing() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['singpy.kernel._native'] = None; "
                           "from singpy.kernel import syscalls, _libcalls; "
                           "print(syscalls._calls is _libcalls, 'ctypes' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True\n"


def test_the_fallback_raises_os_error_with_the_errno() -> None:
    with pytest.raises(OSError) as caught:
        _libcalls.setns(-1, 0)
    assert caught.value.errno == 9 and caught.value.strerror == os.strerror(9)  # EBADF


def test_a_nul_byte_is_a_kernel_error_not_a_shorter_path() -> None:
    """ctypes used to pass "/a\\0b" as "/a"; now the call is refused, as one FATAL line (KernelError)."""
    from singpy.errors import KernelError
    from singpy.kernel import syscalls

    with pytest.raises(KernelError, match=r"^can't unmount /no/such\x00dir: Invalid argument$"):
        syscalls.umount("/no/such\0dir")
    with pytest.raises(KernelError, match="Invalid argument$"):
        syscalls.mount(None, "/no/such\0dir", "tmpfs", 0)

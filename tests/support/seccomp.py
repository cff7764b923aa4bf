"""Restricted hosts, emulated for one singpy run: seccomp filters, sysctl values, /dev/fuse's state.

What an HPC login node or a hardened desktop refuses (a user namespace, a
mount) is a host setting that this machine does not have and that no test
may change for real. This file is a wrapper that builds the restriction for
the one command it runs, and for nothing else:

    /usr/bin/python3 tests/support/seccomp.py [--deny CALL:ERRNO]... [--sysctl NAME=VALUE]... \\
        [--fuse MODE|absent] [--bind SRC:DST]... [--nnp] SCRATCH UID GID -- CMD...

* `--sysctl user.max_user_namespaces=0` shows that value in
  /proc/sys/user/max_user_namespaces: in a mount namespace of its own (slave
  of the host's, so nothing propagates back), the wrapper binds a file over
  it, or, for a sysctl this kernel lacks (kernel.unprivileged_userns_clone is
  Debian's patch, kernel.apparmor_restrict_unprivileged_userns Ubuntu's), a
  copy of the whole directory with the file added. singpy reads them where
  an administrator's setting would show (singpy.host.hostcheck.sysctl).
* `--fuse 600|666` binds a node of that mode over /dev/fuse (as
  tests.support.hostsim); `--fuse absent` hides /dev/fuse (a tmpfs /dev with
  only null, zero, full, random, urandom and tty bound in).
* `--bind SRC:DST` binds a file of the test's over a host file (a copy of
  newuidmap without its setuid bit, private /etc/subuid and /etc/subgid);
* `--nnp` sets no_new_privs, as systemd's NoNewPrivileges= or a container
  engine does (setuid programs then gain nothing);
* then drops to UID:GID and, last, loads a seccomp filter (Debian's
  python3-seccomp, for the system Python: hence /usr/bin/python3) that makes
  each `--deny` call fail with that errno: `unshare` only when it asks for a
  user namespace (CLONE_NEWUSER), `mount` always. The filter is inherited by
  singpy and everything it starts, as a container engine's would be.

The process the test holds is CMD itself, as with hostsim.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SYSTEM_PYTHON = "/usr/bin/python3"
CLONE_NEWUSER = 0x10000000
DEV_KEPT = ("null", "zero", "full", "random", "urandom", "tty")


def available() -> str | None:
    """Why the wrapper can't run here, or None (the system Python must have python3-seccomp)."""
    import subprocess

    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} does not exist"
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True, check=False)
    if done.returncode != 0:
        return "python3-seccomp is not installed for the system Python (Debian: apt-get install python3-seccomp)"
    return None


def wrapper(uid: int, gid: int, scratch: str, *, deny: dict[str, str] | None = None,
            sysctls: dict[str, str] | None = None, fuse: str | None = None, binds: dict[str, str] | None = None,
            nnp: bool = False) -> list[str]:
    """The command prefix running CMD as uid:gid with these restrictions; SCRATCH an empty directory of ours.

    Simulating sysctls or /dev/fuse needs root (a mount namespace made as root); a seccomp filter alone does not.
    """
    options: list[str] = []
    for call, name in (deny or {}).items():
        options += ["--deny", f"{call}:{name}"]
    for key, value in (sysctls or {}).items():
        options += ["--sysctl", f"{key}={value}"]
    if fuse is not None:
        options += ["--fuse", fuse]
    for target, source in (binds or {}).items():
        options += ["--bind", f"{source}:{target}"]
    if nnp:
        options.append("--nnp")
    return [SYSTEM_PYTHON, "-P", os.path.abspath(__file__), *options, scratch, str(uid), str(gid), "--"]


# --- the wrapper, in its own process ---------------------------------------------------------------------------------


def _simulate(scratch: str, sysctls: dict[str, str], fuse: str | None, binds: list[tuple[str, str]]) -> None:
    sys.path.insert(0, REPO)
    from singpy.kernel import syscalls as k

    k.unshare(k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_SLAVE)  # the host's mounts come in, ours never go out
    k.mount("singpy-seccomp-sim", scratch, "tmpfs", k.MS_NOSUID, "mode=0755")
    for number, (key, value) in enumerate(sysctls.items()):
        target = "/proc/sys/" + key.replace(".", "/")
        if os.path.exists(target):
            source = os.path.join(scratch, f"sysctl-{number}")
            _write(source, value)
            k.mount(source, target, None, k.MS_BIND)
            continue
        directory = os.path.dirname(target)  # a sysctl this kernel lacks: a copy of its directory, with it
        copy = os.path.join(scratch, f"sysdir-{number}")
        _copy_sysctls(directory, copy)
        _write(os.path.join(copy, os.path.basename(target)), value)
        k.mount(copy, directory, None, k.MS_BIND)
    if fuse == "absent":
        _hide_fuse(scratch)
    elif fuse is not None:
        node = os.path.join(scratch, "fuse")
        os.mknod(node, stat.S_IFCHR | int(fuse, 8), os.makedev(10, 229))
        os.chmod(node, int(fuse, 8))
        k.mount(node, "/dev/fuse", None, k.MS_BIND)
    for source, target in binds:
        k.mount(source, target, None, k.MS_BIND)


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(f"{value}\n")
    os.chmod(path, 0o644)


def _copy_sysctls(directory: str, copy: str) -> None:
    """The readable values of a /proc/sys directory as plain files (others: left out, as unreadable)."""
    os.mkdir(copy, 0o755)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            continue
        try:
            with open(path) as handle:
                text = handle.read()
        except OSError:
            continue
        _write(os.path.join(copy, name), text.rstrip("\n"))


def _hide_fuse(scratch: str) -> None:
    """A /dev without fuse: a tmpfs holding the few devices a program needs, bound from the real /dev."""
    from singpy.kernel import syscalls

    real = os.path.join(scratch, "real-dev")
    os.mkdir(real)
    syscalls.mount("/dev", real, None, syscalls.MS_BIND | syscalls.MS_REC)
    syscalls.mount("singpy-seccomp-dev", "/dev", "tmpfs", syscalls.MS_NOSUID, "mode=0755")
    for name in DEV_KEPT:
        if os.path.exists(os.path.join(real, name)):
            open(os.path.join("/dev", name), "w").close()
            syscalls.mount(os.path.join(real, name), os.path.join("/dev", name), None, syscalls.MS_BIND)
    os.symlink("/proc/self/fd", "/dev/fd")


def _load_filter(deny: dict[str, int], *, privileged: bool) -> None:
    import seccomp  # type: ignore[import-not-found,unused-ignore]

    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    if privileged:  # loaded as root needs no no_new_privs, which would disarm setuid newuidmap
        rules.set_attr(seccomp.Attr.CTL_NNP, 0)
    for call, number in deny.items():
        if call == "unshare":
            rules.add_rule(seccomp.ERRNO(number), call, seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_NEWUSER,
                                                                      CLONE_NEWUSER))
        else:
            rules.add_rule(seccomp.ERRNO(number), call)
    rules.load()


def main(argv: list[str]) -> None:
    deny: dict[str, int] = {}
    sysctls: dict[str, str] = {}
    fuse: str | None = None
    binds: list[tuple[str, str]] = []
    nnp = False
    while argv[0].startswith("--"):
        if argv[0] == "--nnp":
            nnp, argv = True, argv[1:]
            continue
        option, value, *argv = argv
        if option == "--bind":
            source, _, target = value.partition(":")
            binds.append((source, target))
        elif option == "--deny":
            call, _, name = value.partition(":")
            deny[call] = getattr(errno, name)
        elif option == "--sysctl":
            key, _, setting = value.partition("=")
            sysctls[key] = setting
        elif option == "--fuse":
            fuse = value
        else:
            raise SystemExit(f"seccomp.py: unknown option {option}")
    scratch, uid, gid, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: seccomp.py [--deny CALL:ERRNO]... [--sysctl NAME=VALUE]... [--fuse MODE|absent] "
                         "[--bind SRC:DST]... [--nnp] SCRATCH UID GID -- CMD...")
    root = os.geteuid() == 0
    if sysctls or fuse is not None or binds:
        _simulate(scratch, sysctls, fuse, binds)
    if deny and root:
        _load_filter(deny, privileged=True)  # before the ids change: setuid() itself is not filtered
    if int(uid) != os.geteuid():
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    if deny and not root:
        _load_filter(deny, privileged=False)
    if nnp:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise SystemExit(f"seccomp.py: no_new_privs: {os.strerror(ctypes.get_errno())}")
    os.execv(command[0], command)


if __name__ == "__main__":
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]  # this file is not `seccomp`
    main(sys.argv[1:])

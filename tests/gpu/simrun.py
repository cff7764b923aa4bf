"""Run a command on the simulated GPU host: `python -m tests.gpu.simrun SIMROOT UID GID -- CMD...`.

As root, in a private mount namespace of its own, this puts the simulated
host in place of the real one, the way the brief asks for:

* a tmpfs over /dev holding the usual nodes and the simulated GPU nodes
  (all made with mknod: a bind of the simulated files would do as well, but
  the nodes must live in a tmpfs anyway to replace the real /dev);
* the simulated ld.so.cache bound over /etc/ld.so.cache, so `ldconfig -p`
  finds the gcc-built driver libraries (when the host has one);
* the simulated sys/class bound over /sys/class (when the host has one: the
  Intel Gaudi host's RDMA devices, /sys/class/infiniband);

then drops to UID:GID (0:0 stays root) and execs CMD. Nothing outside the
namespace changes, and the namespace ends with CMD.
"""

from __future__ import annotations

import os
import stat
import sys

from singpy.kernel import syscalls as k

BASIC_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9),
               "tty": (5, 0)}


def copy_tree_nodes(source: str, target: str) -> None:
    """Recreate the device nodes and directories of `source` under `target`."""
    for name in os.listdir(source):
        path, dest = os.path.join(source, name), os.path.join(target, name)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(dest, 0o755)
            copy_tree_nodes(path, dest)
        elif stat.S_ISCHR(info.st_mode):
            os.mknod(dest, stat.S_IFCHR | 0o666, info.st_rdev)
            os.chmod(dest, 0o666)


def simulate(sim_root: str) -> None:
    k.unshare(k.CLONE_NEWNS)
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)
    k.mount("simdev", "/dev", "tmpfs", k.MS_NOSUID, "mode=0755")
    for name, (major, minor) in BASIC_NODES.items():
        os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(f"/dev/{name}", 0o666)
    os.mkdir("/dev/pts")
    k.mount("devpts", "/dev/pts", "devpts", k.MS_NOSUID | k.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    os.mkdir("/dev/shm", 0o1777)
    copy_tree_nodes(os.path.join(sim_root, "dev"), "/dev")
    for sim_path, real_path in (("etc/ld.so.cache", "/etc/ld.so.cache"), ("sys/class", "/sys/class")):
        if os.path.exists(os.path.join(sim_root, sim_path)):
            k.mount(os.path.join(sim_root, sim_path), real_path, None, k.MS_BIND)


def main(argv: list[str]) -> None:
    sim_root, uid, gid, separator, *command = argv
    assert separator == "--", "usage: simrun SIMROOT UID GID -- CMD..."
    simulate(sim_root)
    if int(uid):
        os.setgroups([])
        os.setgid(int(gid))
        os.setuid(int(uid))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])

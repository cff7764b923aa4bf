"""A SIF mounted with squashfuse on a host whose /dev has no `fd` link (a minimal /dev, a container's host).

squashfuse is handed the image descriptor singpy checked as /proc/self/fd/N, as Apptainer hands it over:
/dev/fd/N needs the /dev/fd -> /proc/self/fd link, which a host's /dev may lack (singpy 1fc1bf5; before it,
every FUSE run there failed with squashfuse's "/dev/fd/N: No such file or directory").

The host without the link is made for singpy alone: as root, in a private mount namespace, a tmpfs over /dev
with the usual nodes, /dev/fuse, a devpts and /dev/shm (tests/gpu/simrun.py's technique), then the profile's
user runs `singpy exec IMG.sif`. Nothing outside that namespace changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy
from tests.support import sifs

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="a /dev without the fd link is made as root"),
              pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this host")]

# argv: UID GID -- CMD...; CMD runs as UID:GID with a /dev that has no fd link.
WITHOUT_DEV_FD = """
import os, stat, sys
from singpy.kernel import syscalls as k
from tests.gpu.simrun import BASIC_NODES
fuse = os.stat("/dev/fuse").st_rdev
k.unshare(k.CLONE_NEWNS)
k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)
k.mount("nodevfd", "/dev", "tmpfs", k.MS_NOSUID, "mode=0755")
nodes = {name: os.makedev(*numbers) for name, numbers in BASIC_NODES.items()}
for name, rdev in {**nodes, "fuse": fuse}.items():
    os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, rdev)
    os.chmod(f"/dev/{name}", 0o666)
os.mkdir("/dev/pts")
k.mount("devpts", "/dev/pts", "devpts", k.MS_NOSUID | k.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
os.mkdir("/dev/shm")
os.chmod("/dev/shm", 0o1777)
assert not os.path.lexists("/dev/fd")
uid, gid, separator, *command = sys.argv[1:]
if int(uid):
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
os.execv(command[0], command)
"""


def test_a_sif_mounts_with_squashfuse_where_dev_has_no_fd_link(singpy: Singpy, workdir: Path) -> None:
    image = sifs.singpy_sif(workdir)
    global_flags, flags = sifs.split_flags(sifs.strategy_args(singpy, "fuse", workdir))  # FUSE, nothing unpacked
    cache = sifs.new_cache(singpy, workdir, "squashfuse-devfd")
    command = [sys.executable, "-c", WITHOUT_DEV_FD, str(singpy.uid), str(singpy.gid), "--",
               SINGPY, *global_flags, "-v", "exec", *flags, str(image), "sh", "-c", "cat /etc/marker; test -d /proc/1"]
    result = subprocess.run(command, env=singpy.env(SINGPY_CACHEDIR=str(cache), PYTHONPATH=str(REPO)),
                            cwd=singpy.workdir, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{sifs.MARKER}\n"
    assert "mounting it with squashfuse" in result.stderr

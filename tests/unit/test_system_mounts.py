"""Default mount contributors that read host facts: `mount hostfs`."""

from __future__ import annotations

from singpy.mounts.system import hostfs_mounts
from singpy.plan import Missing, MountOp

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 254:16 / /scratch rw,relatime shared:5 - xfs /dev/vdb rw
31 27 0:50 / /home rw,relatime - nfs4 server:/home rw
32 27 0:51 / /tmp rw - tmpfs tmpfs rw
33 27 254:32 / /data\\040set rw - ext4 /dev/vdc rw
34 27 254:33 / /boot/efi rw - vfat /dev/vda1 rw
35 27 254:16 / /scratch rw - xfs /dev/vdb rw
36 27 7:0 / /var/lib/docker/overlay2/x rw - ext4 /dev/loop0 rw
"""


def test_hostfs_binds_real_filesystems_only() -> None:
    specs = hostfs_mounts(MOUNTINFO)
    assert [spec.dest for spec in specs] == ["/scratch", "/home", "/data set"]
    assert all(spec.op == MountOp.BIND and spec.source == spec.dest for spec in specs)
    assert all(spec.missing == Missing.SKIP for spec in specs)


def test_hostfs_on_a_host_without_extra_filesystems() -> None:
    assert hostfs_mounts("27 1 254:0 / / rw - ext4 /dev/vda rw\n") == []


def test_staged_home_skips_a_planned_mount() -> None:
    """A home inside the host's /tmp (bound already) is not staged: a tmpfs on /tmp would hide that bind."""
    from singpy.mounts.system import home_mounts, tmp_mounts

    tmp = tmp_mounts(contain=False, enabled=True)
    specs = home_mounts(source="/tmp/ci/home", dest="/tmp/ci/home", enabled=True, no_layer=True, covered=tmp)
    assert [(spec.op, spec.dest, spec.missing) for spec in specs] == [(MountOp.BIND, "/tmp/ci/home", Missing.SKIP)]
    specs = home_mounts(source="/home/a", dest="/home/a", enabled=True, no_layer=True, covered=tmp)
    assert [(spec.op, spec.dest) for spec in specs] == [(MountOp.TMPFS, "/home"), (MountOp.BIND, "/home/a")]
    asked = home_mounts(source="/home/a", dest="/home/a", enabled=True, asked=True, no_layer=True, covered=tmp)
    assert [(spec.op, spec.missing) for spec in asked] == [(MountOp.BIND, Missing.REQUIRED)]

"""Default mount contributors that read host facts (`mount hostfs`), and the identity files' merge."""

from __future__ import annotations

import pytest

from singpy.errors import SingpyError
from singpy.mounts.system import group_line, hostfs_mounts, merge_group, merge_passwd, passwd_line
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
37 27 254:48 / /data\\011tab\\134back\\012line rw - ext4 /dev/vdd rw
"""


def test_hostfs_binds_real_filesystems_only() -> None:
    specs = hostfs_mounts(MOUNTINFO)
    assert [spec.dest for spec in specs] == ["/scratch", "/home", "/data set", "/data\ttab\\back\nline"]
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


# --- /etc/passwd and /etc/group, merged as Apptainer's passwd.go and group.go -----------------------------------

ALICE = "alice:x:1000:1000:Alice Liddell:/home/alice:/bin/bash"


def test_passwd_entry_of_the_uid_takes_the_host_name_gecos_and_home() -> None:
    image = b"root:x:0:0:root:/root:/bin/ash\r\n\nubuntu:x:1000:4242:Ubuntu:/home/ubuntu:/bin/zsh\nnot an entry\n"
    assert merge_passwd(image, ALICE) == (b"root:x:0:0:root:/root:/bin/ash\n\n"
                                          b"alice:x:1000:4242:Alice Liddell:/home/alice:/bin/zsh\nnot an entry\n")


def test_passwd_root_keeps_the_images_name_gecos_and_shell() -> None:
    image = b"toor:x:0:0:Image Root:/toor:/bin/ash\nroot:x:0:0:second:/:/bin/sh"
    assert merge_passwd(image, "root:x:0:0:root:/root:/bin/bash") == \
        b"toor:x:0:0:Image Root:/root:/bin/ash\nroot:x:0:0:second:/:/bin/sh\n"


def test_passwd_without_the_uid_gets_the_entry_appended() -> None:
    assert merge_passwd(b"root:x:0:0:root:/root:/bin/sh", ALICE) == f"root:x:0:0:root:/root:/bin/sh\n{ALICE}\n".encode()
    assert merge_passwd(b"", ALICE) == f"{ALICE}\n".encode()
    assert merge_passwd(b"bob:x:+1000:7:: /home/bob :/bin/sh\n", ALICE) == \
        b"alice:x:1000:7:Alice Liddell:/home/alice:/bin/sh\n"  # Go's Atoi takes a sign; fields are trimmed


@pytest.mark.parametrize("line", [b"# comment", b"a:x:1 000:1::/:/bin/sh", b"a:x:1_000:1::/:/bin/sh",
                                  b"a:x:0x10:1::/:/bin/sh", b"a:x:1000:-1::/:/bin/sh", b"a:x::1::/:/bin/sh",
                                  b"a:x:99999999999999999999:1::/:/bin/sh"])
def test_passwd_line_apptainer_cant_parse_leaves_the_file(line: bytes) -> None:
    with pytest.raises(ValueError, match="line b'a:|line b'#"):
        merge_passwd(line + b"\n" + ALICE.encode(), ALICE)


def test_group_keeps_every_image_line_and_adds_the_users_once() -> None:
    image = b"users:x:1000:bob,carol"
    assert merge_group(image, "users:x:1000:alice\nwheel:x:10:alice\nusers:x:1000:alice") == \
        b"users:x:1000:bob,carol\nusers:x:1000:alice\nwheel:x:10:alice\n"
    assert merge_group(b"", "users:x:1000:alice") == b"users:x:1000:alice\n"


@pytest.mark.parametrize("home", ["/home/a\nevil::0:0::/:/bin/sh", "/home/a:b", "/home/a\rb"])
def test_a_field_that_would_split_the_entry_is_refused(home: str) -> None:
    with pytest.raises(SingpyError, match="the home .* holds a ':' or a line break"):
        passwd_line(user="alice", uid=1000, gid=1000, gecos="", home=home, shell="/bin/sh")
    with pytest.raises(SingpyError, match="/etc/group: the group"):
        group_line(group="users\nevil", gid=1000, user="alice")

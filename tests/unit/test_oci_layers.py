"""singpy.oci.layers: real layer archives (tarfile, gzip, zstandard) applied to real trees, as root and as a user:
files, links, compression, whiteouts, hard links, escaping the root, replacement, special files and owners,
directory times. Bad, hostile and resource-bomb layers are in test_oci_layers_hostile.py.

Each application runs in a child process, as root ("root": owners, modes and
device nodes for real) or as the unprivileged test user ("user": an
Ownership records them), with a time limit (tests/support/layer_apply.py):
a layer that made the applier hang or die with a traceback fails the test.
Every tree lives in a directory of the test's own, next to a canary directory
that hostile layers aim at and that must stay as it was.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.layer_apply import (
    MTIME,
    Applier,
    applier_for,
    archive,
    assert_owner,
    entry,
    gzipped,
    mode_of,
    zstded,
)


@pytest.fixture(params=["root", "user"])
def applier(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Applier]:
    yield from applier_for(request.param, workdir)


# ---------------------------------------------------------------------------------------------------------
# Files, directories, links, compression


def test_files_directories_and_symlinks(applier: Applier) -> None:
    result = applier.ok(archive(
        entry("usr/", "dir", mode=0o755),
        entry("usr/bin/", "dir", mode=0o755),
        entry("usr/bin/tool", data=b"#!/bin/sh\necho hi\n", mode=0o755, uid=0, gid=0, mtime=1_500_000_000),
        entry("home/", "dir"),
        entry("home/user/", "dir", mode=0o700, uid=1000, gid=1000),
        entry("home/user/notes", data=b"x" * 3_000_000, mode=0o600, uid=1000, gid=1000),
        entry("bin", "symlink", link="usr/bin", uid=0, gid=0),
        entry("home/user/abs", "symlink", link="/etc/shadow", uid=1000, gid=1000),
    ))
    assert result.path("usr/bin/tool").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert result.path("home/user/notes").read_bytes() == b"x" * 3_000_000
    assert os.readlink(result.path("bin")) == "usr/bin"
    assert os.readlink(result.path("home/user/abs")) == "/etc/shadow"  # kept as it is, never followed
    assert result.info("usr/bin/tool").st_mtime == 1_500_000_000
    assert result.info("home/user").st_mtime == MTIME  # set after its files were made
    assert result.info("bin").st_mtime == MTIME
    assert_owner(applier, result, "/usr/bin/tool", 0o755, 0, 0)
    assert_owner(applier, result, "/home/user", 0o700, 1000, 1000)
    assert_owner(applier, result, "/home/user/notes", 0o600, 1000, 1000)
    assert_owner(applier, result, "/home/user/abs", 0o777, 1000, 1000)
    assert mode_of(result, "usr/bin/tool") & 0o755 == 0o755


def test_missing_parent_directories_are_made(applier: Applier) -> None:
    """Parents without an entry of their own are made as umoci and Docker make them: 0755, root's."""
    result = applier.ok(archive(entry("implicit/sub/f", data=b"f", uid=7)))
    assert_owner(applier, result, "/implicit", 0o755, 0, 0)
    assert_owner(applier, result, "/implicit/sub", 0o755, 0, 0)
    assert mode_of(result, "implicit") == 0o755
    assert_owner(applier, result, "/implicit/sub/f", 0o644, 7, 0)


@pytest.mark.parametrize("compress", [lambda data: data, gzipped, zstded], ids=["tar", "gzip", "zstd"])
def test_compressions(applier: Applier, compress: Any) -> None:
    result = applier.ok(compress(archive(entry("etc/", "dir"), entry("etc/os-release", data=b"ID=test\n"))))
    assert result.path("etc/os-release").read_bytes() == b"ID=test\n"


def test_multi_member_gzip_and_multi_frame_zstd(applier: Applier) -> None:
    """A stream of several gzip members or zstd frames is one archive (pigz and zstd -T write such)."""
    data = archive(entry("a", data=b"A" * 100_000), entry("b", data=b"B" * 100_000))
    half = len(data) // 2
    result = applier.ok(gzipped(data[:half]) + gzipped(data[half:]))
    assert result.path("b").read_bytes() == b"B" * 100_000
    result = applier.ok(zstded(data[:half]) + zstded(data[half:]))
    assert result.path("b").read_bytes() == b"B" * 100_000


def test_layers_stack(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("etc/", "dir"), entry("etc/a", data=b"one"), entry("etc/b", data=b"b")),
        archive(entry("etc/a", data=b"two", mode=0o600, uid=5, gid=6)),
    )
    assert result.path("etc/a").read_bytes() == b"two"
    assert result.path("etc/b").read_bytes() == b"b"
    assert_owner(applier, result, "/etc/a", 0o600, 5, 6)


# ---------------------------------------------------------------------------------------------------------
# Whiteouts


def test_whiteouts_remove_lower_files_and_trees(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("a/", "dir"), entry("a/x", data=b"x"), entry("a/y", data=b"y"), entry("a/sub/", "dir"),
                entry("a/sub/deep", data=b"d", uid=9), entry("a/link", "symlink", link="/a/y")),
        archive(entry("a/.wh.x"), entry("a/.wh.sub"), entry("a/.wh.link"), entry("a/.wh.missing")),
    )
    assert sorted(os.listdir(result.path("a"))) == ["y"]
    if applier.profile == "user":
        assert result.definition("/a/sub") is None and result.definition("/a/sub/deep") is None
        assert result.definition("/a/x") is None and result.definition("/a/link") is None
        assert result.definition("/a/y") == "/a/y m 644 0 0"


def test_whiteout_only_hides_lower_layers(applier: Applier) -> None:
    """A whiteout after an entry of its own layer leaves that entry (image-spec: "only lower layers")."""
    result = applier.ok(
        archive(entry("d/", "dir"), entry("d/f", data=b"lower"), entry("d/g", data=b"lower")),
        archive(entry("d/f", data=b"upper"), entry("d/.wh.f"), entry("d/.wh.g")),
    )
    assert result.path("d/f").read_bytes() == b"upper"
    assert not result.exists("d/g")


def test_opaque_directory_keeps_entries_of_its_own_layer(applier: Applier) -> None:
    """The opaque marker may come after siblings of the same layer: those stay; lower ones go."""
    result = applier.ok(
        archive(entry("d/", "dir"), entry("d/old", data=b"old"), entry("d/sub/", "dir"),
                entry("d/sub/old", data=b"old"), entry("d/sub/older", data=b"old"), entry("keep", data=b"k")),
        archive(entry("d/", "dir", mode=0o750), entry("d/new", data=b"new"), entry("d/sub/mine", data=b"mine"),
                entry("d/.wh..wh..opq"), entry("d/later", data=b"later")),
    )
    assert sorted(os.listdir(result.path("d"))) == ["later", "new", "sub"]
    assert os.listdir(result.path("d/sub")) == ["mine"]
    assert result.exists("keep")
    if applier.profile == "user":
        assert result.definition("/d/old") is None and result.definition("/d/sub/old") is None
        assert result.definition("/d/sub/mine") == "/d/sub/mine m 644 0 0"
        assert result.definition("/d") == "/d m 750 0 0"


def test_opaque_directory_drops_recorded_device_nodes(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("dev/", "dir"), entry("dev/null", "char", mode=0o666, major=1, minor=3),
                entry("dev/zero", "char", mode=0o666, major=1, minor=5)),
        archive(entry("dev/.wh..wh..opq"), entry("dev/full", "char", mode=0o666, major=1, minor=7),
                entry("dev/.wh.zero")),
    )
    if applier.profile == "root":
        assert sorted(os.listdir(result.path("dev"))) == ["full"]
    else:
        assert result.definition("/dev/null") is None
        assert result.definition("/dev/zero") is None
        assert result.definition("/dev/full") == f"/dev/full C {MTIME} 666 0 0 1 7"


# ---------------------------------------------------------------------------------------------------------
# Hard links


def test_hard_links(applier: Applier) -> None:
    result = applier.ok(archive(
        entry("bin/", "dir"),
        entry("bin/busybox", data=b"BB", mode=0o4755, uid=0, gid=0),
        entry("bin/sh", "hardlink", link="bin/busybox"),
        entry("bin/ls", "hardlink", link="/bin/../bin/busybox"),
        entry("bin/link", "symlink", link="/nonexistent"),
        entry("bin/link2", "hardlink", link="bin/link"),  # a link to a symlink links the symlink itself
    ))
    inode = result.info("bin/busybox").st_ino
    assert result.info("bin/sh").st_ino == inode and result.info("bin/ls").st_ino == inode
    assert result.info("bin/busybox").st_nlink == 3
    assert stat.S_ISLNK(result.info("bin/link2").st_mode)
    assert result.info("bin/link2").st_ino == result.info("bin/link").st_ino
    assert_owner(applier, result, "/bin/sh", 0o4755, 0, 0)


def test_hard_link_replacement_does_not_write_through(applier: Applier) -> None:
    """A later file at one name of a hard-linked pair is a new file: the other name keeps its data."""
    result = applier.ok(
        archive(entry("a", data=b"shared"), entry("b", "hardlink", link="a")),
        archive(entry("b", data=b"new")),
    )
    assert result.path("a").read_bytes() == b"shared"
    assert result.path("b").read_bytes() == b"new"


@pytest.mark.parametrize("target", ["missing", "../../canary/keep", "/canary/keep", "dir/"])
def test_hard_link_to_nothing_in_the_image_is_refused(applier: Applier, target: str) -> None:
    error = applier.fails(archive(entry("dir/", "dir"), entry("link", "hardlink", link=target)))
    assert "hard link" in error
    assert not applier.base.joinpath("root", "link").exists()


def test_hard_link_to_a_device_node(applier: Applier) -> None:
    result = applier.ok(archive(entry("dev/", "dir"), entry("dev/null", "char", mode=0o666, major=1, minor=3),
                                entry("dev/null2", "hardlink", link="dev/null")))
    if applier.profile == "root":
        assert result.info("dev/null2").st_ino == result.info("dev/null").st_ino
        assert result.info("dev/null2").st_rdev == os.makedev(1, 3)
    else:
        assert result.definition("/dev/null2") == f"/dev/null2 C {MTIME} 666 0 0 1 3"


# ---------------------------------------------------------------------------------------------------------
# Escaping the root


def test_names_stay_inside_the_root(applier: Applier) -> None:
    result = applier.ok(archive(
        entry("../../x", data=b"1"),
        entry("/abs/y", data=b"2"),
        entry("./a/../../../b", data=b"3"),
        entry("c/./d//e", data=b"4"),
        entry("../canary/keep", data=b"overwritten?"),
    ))
    assert result.path("x").read_bytes() == b"1"
    assert result.path("abs/y").read_bytes() == b"2"
    assert result.path("b").read_bytes() == b"3"
    assert result.path("c/d/e").read_bytes() == b"4"
    assert result.path("canary/keep").read_bytes() == b"overwritten?"  # the image's own /canary/keep


def test_links_are_followed_inside_the_root_only(applier: Applier) -> None:
    """A link then a file below it: the file lands where the link leads *inside* the root."""
    host_canary = str(applier.canary)
    result = applier.ok(archive(
        entry("etc", "symlink", link=host_canary),  # absolute: the image's own /tmp/.../canary
        entry("etc/passwd", data=b"root:x:0:0\n"),
        entry("up", "symlink", link="../../../.."),  # climbs above the root: stops at it
        entry("up/z", data=b"z"),
        entry("chain1", "symlink", link="chain2"),
        entry("chain2", "symlink", link="/up/../up/deep"),
        entry("chain1/w", data=b"w"),
    ))
    assert result.path(f"{host_canary}/passwd").read_bytes() == b"root:x:0:0\n"
    assert os.readlink(result.path("etc")) == host_canary
    assert result.path("z").read_bytes() == b"z"
    assert result.path("deep/w").read_bytes() == b"w"
    if applier.profile == "user":  # recorded where they are, as mksquashfs will see them
        assert result.definition(f"{host_canary}/passwd") == f"{host_canary}/passwd m 644 0 0"
        assert result.definition("/z") == "/z m 644 0 0"


def test_last_component_is_replaced_never_written_through(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("target", data=b"original"), entry("l", "symlink", link="target"),
                entry("dl", "symlink", link="/dir"), entry("dir/", "dir"), entry("dir/inside", data=b"i")),
        archive(entry("l", data=b"new"), entry("dl/", "dir", mode=0o700)),
    )
    assert result.path("target").read_bytes() == b"original"
    assert result.path("l").read_bytes() == b"new" and not result.path("l").is_symlink()
    assert stat.S_ISDIR(result.info("dl").st_mode) and os.listdir(result.path("dl")) == []
    assert os.listdir(result.path("dir")) == ["inside"]


def test_a_directory_replaced_by_a_link_within_one_layer(applier: Applier) -> None:
    """The directory cache must not write into a directory the layer has just replaced."""
    result = applier.ok(archive(
        entry("a/", "dir"), entry("a/f1", data=b"1"), entry("b/", "dir"),
        entry("a", "symlink", link="b"), entry("a/f2", data=b"2"),
    ))
    assert os.readlink(result.path("a")) == "b"
    assert sorted(os.listdir(result.path("b"))) == ["f2"]


# ---------------------------------------------------------------------------------------------------------
# Replacement by another kind of file


def test_replacement_by_another_kind(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("d2f/", "dir"), entry("d2f/inner/", "dir"), entry("d2f/inner/x", data=b"x"),
                entry("f2d", data=b"file"), entry("l2d", "symlink", link="/"), entry("keep/", "dir", mode=0o755),
                entry("keep/content", data=b"c"), entry("fifo2f", "fifo")),
        archive(entry("d2f", data=b"now a file"), entry("f2d/", "dir"), entry("f2d/y", data=b"y"),
                entry("l2d/", "dir"), entry("keep/", "dir", mode=0o711, uid=3, gid=4), entry("fifo2f", data=b"f")),
    )
    assert result.path("d2f").read_bytes() == b"now a file"
    assert result.path("f2d/y").read_bytes() == b"y"
    assert stat.S_ISDIR(result.info("l2d").st_mode)
    assert result.path("keep/content").read_bytes() == b"c"  # an existing directory keeps its contents
    assert_owner(applier, result, "/keep", 0o711, 3, 4)
    assert result.path("fifo2f").read_bytes() == b"f"
    if applier.profile == "user":
        assert result.definition("/d2f/inner") is None and result.definition("/d2f/inner/x") is None


def test_root_directory_entry(applier: Applier) -> None:
    result = applier.ok(archive(entry("./", "dir", mode=0o750, uid=0, gid=0), entry("f", data=b"f")))
    if applier.profile == "root":
        assert mode_of(result, "/") == 0o750
    else:
        assert result.root_owner == [0o750, 0, 0]
    assert "root directory" in applier.fails(archive(entry("./", "symlink", link="/etc")))


# ---------------------------------------------------------------------------------------------------------
# Special files, set-id bits, owners


def test_special_files_and_modes(applier: Applier) -> None:
    result = applier.ok(archive(
        entry("usr/bin/", "dir"),
        entry("usr/bin/su", data=b"su", mode=0o4755, uid=0, gid=0),
        entry("usr/bin/wall", data=b"w", mode=0o2755, uid=0, gid=5),
        entry("tmp/", "dir", mode=0o1777),
        entry("srv/", "dir", mode=0o2775, uid=1000, gid=50),
        entry("dev/", "dir"),
        entry("dev/null", "char", mode=0o666, major=1, minor=3),
        entry("dev/sda", "block", mode=0o660, gid=6, major=8, minor=0),
        entry("run/", "dir"),
        entry("run/ctl", "fifo", mode=0o620, uid=1000, gid=1000),
        entry("secret", data=b"s", mode=0o000, uid=0, gid=42),
    ))
    assert_owner(applier, result, "/usr/bin/su", 0o4755, 0, 0)
    assert_owner(applier, result, "/usr/bin/wall", 0o2755, 0, 5)
    assert_owner(applier, result, "/tmp", 0o1777, 0, 0)
    assert_owner(applier, result, "/srv", 0o2775, 1000, 50)
    assert_owner(applier, result, "/run/ctl", 0o620, 1000, 1000)
    assert_owner(applier, result, "/secret", 0o000, 0, 42)
    assert stat.S_ISFIFO(result.info("run/ctl").st_mode)  # made with mkfifo, as root and as a user
    if applier.profile == "root":
        null = result.info("dev/null")
        assert stat.S_ISCHR(null.st_mode) and null.st_rdev == os.makedev(1, 3) and stat.S_IMODE(null.st_mode) == 0o666
        sda = result.info("dev/sda")
        assert stat.S_ISBLK(sda.st_mode) and sda.st_rdev == os.makedev(8, 0) and sda.st_gid == 6
    else:  # no node on disk: the squashfs gets it from the pseudo definition
        assert not result.exists("dev/null") and not result.exists("dev/sda")
        assert result.definition("/dev/null") == f"/dev/null C {MTIME} 666 0 0 1 3"
        assert result.definition("/dev/sda") == f"/dev/sda B {MTIME} 660 0 6 8 0"


def test_file_capabilities_as_root(applier: Applier) -> None:
    """PAX SCHILY.xattr.security.capability is applied as root (ping's cap_net_raw); a user can't."""
    capability = bytes.fromhex("0100000200200000000000000000000000000000")  # v2, cap_net_raw permitted
    pax = {"SCHILY.xattr.security.capability": capability.decode("utf-8", "surrogateescape")}
    result = applier.ok(archive(entry("ping", data=b"p", mode=0o755, pax=pax)))
    if applier.profile == "root":
        try:
            assert os.getxattr(result.path("ping"), "security.capability") == capability
        except OSError as error:  # a filesystem without xattrs: lost, as with umoci
            pytest.skip(f"no xattrs here: {error.strerror}")
    else:
        assert result.definition("/ping") == "/ping m 755 0 0"


def test_names_in_pseudo_definitions(applier: Applier) -> None:
    names = ["with space", 'quo"te', "back\\slash", "tab\there", "ünïcode", "#hash", "new\nline"]
    result = applier.ok(archive(*(entry(name, data=b"n", uid=7) for name in names)))
    for name in names:
        assert result.path(name).read_bytes() == b"n"
    if applier.profile == "user":
        assert result.definition("/with\\ space") == "/with\\ space m 644 7 0"
        assert result.definition('/quo\\"te') == '/quo\\"te m 644 7 0'
        assert result.definition("/back\\\\slash") == "/back\\\\slash m 644 7 0"
        assert result.definition("/tab\\\there") is not None
        assert result.definition("/#hash") is None and result.definition("/\\#hash") is not None
        assert result.unrecordable == ["/new\nline"]


# ---------------------------------------------------------------------------------------------------------
# Directory times


def test_lower_directory_keeps_its_time(applier: Applier) -> None:
    result = applier.ok(
        archive(entry("etc/", "dir", mtime=1_000_000_000), entry("etc/a", data=b"a")),
        archive(entry("etc/b", data=b"b"), entry("etc/.wh.a")),
    )
    assert result.info("etc").st_mtime == 1_000_000_000
    assert sorted(os.listdir(result.path("etc"))) == ["b"]

"""singpy.oci.layers: real layer archives (tarfile, gzip, zstandard) applied to real trees, as root and as a user.

Each application runs in a child process, as root ("root": owners, modes and
device nodes for real) or as the unprivileged test user ("user": an
Ownership records them), with a time limit: a layer that made the applier
hang (a FIFO opened) or die with a traceback fails the test. Every tree lives
in a directory of the test's own, next to a canary directory that hostile
layers aim at and that must stay as it was.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from singpy.errors import ImageError
from singpy.oci import layers, owners, streams
from tests.support.users import ensure_test_user, is_root

MTIME = 1_600_000_000

# The child: applies the layer files given to ROOT, prints what happened as JSON (never a traceback: that
# would be a failure of the applier, shown by the test), with a descriptor limit lower than usual.
_APPLY = """
import json, os, resource, sys
os.umask(0o077)  # modes on disk must be the image's, whatever the umask
# Fewer descriptors than a shell's usual 1024: an applier that keeps one per directory fails here.
resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from singpy.errors import ImageError
from singpy.oci import layers, owners, streams
root, profile, *files = sys.argv[1:]
ownership = owners.Ownership() if profile == "user" else None
try:
    for path in files:
        with open(path, "rb") as stream:
            source = "layer " + path.rsplit("/", 1)[-1]
            layers.apply_layer(root, streams.open_layer(stream, source=source), ownership=ownership, source=source)
except ImageError as error:
    print(json.dumps({"error": error.message}))
    sys.exit(0)
if ownership is None:
    print(json.dumps({"lines": None}))
else:
    print(json.dumps({"lines": list(ownership.pseudo_definitions()), "root": ownership.root,
                      "unrecordable": ownership.unrecordable}))
"""


# ---------------------------------------------------------------------------------------------------------
# Layer archives


def entry(name: str, kind: str = "file", data: bytes = b"", *, mode: int | None = None, uid: int = 0, gid: int = 0,
          link: str = "", major: int = 0, minor: int = 0, mtime: float = MTIME,
          pax: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE,
                 "fifo": tarfile.FIFOTYPE}[kind]
    info.mode = mode if mode is not None else (0o755 if kind == "dir" else 0o644)
    info.uid, info.gid, info.linkname, info.mtime = uid, gid, link, mtime
    info.devmajor, info.devminor = major, minor
    info.size = len(data) if kind == "file" else 0
    info.uname = info.gname = "ignored"
    if pax:
        info.pax_headers = pax
    return info, data


def archive(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def gzipped(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6)


def zstded(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


# ---------------------------------------------------------------------------------------------------------
# Applying them as root or as the test user


class Result:
    def __init__(self, base: Path, answer: dict[str, Any]) -> None:
        self.root = base / "root"
        self.error: str | None = answer.get("error")
        self.lines: list[str] | None = answer.get("lines")
        self.root_owner: list[int] | None = answer.get("root")
        self.unrecordable: list[str] = answer.get("unrecordable", [])

    def path(self, guest: str) -> Path:
        return self.root / guest.lstrip("/")

    def info(self, guest: str) -> os.stat_result:
        return os.lstat(self.path(guest))

    def exists(self, guest: str) -> bool:
        return os.path.lexists(self.path(guest))

    def definition(self, guest: str) -> str | None:
        assert self.lines is not None
        found = [line for line in self.lines if line.startswith(f"{guest} ")]
        assert len(found) <= 1, found
        return found[0] if found else None


class Applier:
    """Applies layers in a child process as `profile`'s user, in a fresh directory of its own."""

    def __init__(self, profile: str, base: Path, uid: int, gid: int) -> None:
        self.profile, self.base, self.uid, self.gid = profile, base, uid, gid
        self.count = 0
        self.canary = base / "canary"
        self.canary.mkdir()
        (self.canary / "keep").write_text("canary\n")
        self.layer_dir = base / "layers"
        self.layer_dir.mkdir()
        (base / "root").mkdir(mode=0o755)
        for path in (base, base / "root"):
            os.chown(path, uid, gid)

    def snapshot_canary(self) -> list[tuple[str, int, int, bytes]]:
        found = []
        for path in sorted(self.canary.rglob("*")):
            info = path.lstat()
            found.append((str(path), info.st_mode, info.st_nlink, path.read_bytes() if path.is_file() else b""))
        return found

    def apply(self, *blobs: bytes) -> Result:
        files = []
        for blob in blobs:
            self.count += 1
            path = self.layer_dir / f"{self.count}.tar"
            path.write_bytes(blob)
            files.append(str(path))
        ids: dict[str, Any] = {} if self.uid == os.geteuid() else {"user": self.uid, "group": self.gid,
                                                                       "extra_groups": []}
        done = subprocess.run([sys.executable, "-c", _APPLY, str(self.base / "root"), self.profile, *files],
                              capture_output=True, text=True, timeout=60, cwd=str(self.base),
                              env={"PATH": os.defpath, "LANG": "C.UTF-8"}, **ids)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return Result(self.base, json.loads(done.stdout))

    def ok(self, *blobs: bytes) -> Result:
        result = self.apply(*blobs)
        assert result.error is None, result.error
        return result

    def fails(self, *blobs: bytes) -> str:
        result = self.apply(*blobs)
        assert result.error is not None, "the layer was applied"
        assert f"layer {self.count}.tar" in result.error, result.error  # names the layer
        assert "\n" not in result.error
        return result.error


@pytest.fixture(params=["root", "user"])
def applier(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Applier]:
    profile = request.param
    if profile == "root":
        if not is_root():
            pytest.skip("profile root: the suite is not running as root")
        uid = gid = 0
    else:
        entry_ = ensure_test_user()
        uid, gid = entry_.pw_uid, entry_.pw_gid
    base = Path(tempfile.mkdtemp(prefix="layers-", dir=workdir))
    base.chmod(0o755)
    made = Applier(profile, base, uid, gid)
    before = made.snapshot_canary()
    yield made
    assert made.snapshot_canary() == before, "a layer changed a file outside its root"
    subprocess.run(["chmod", "-R", "u+rwX", str(base)], capture_output=True, check=False)
    shutil.rmtree(base)


def mode_of(result: Result, guest: str) -> int:
    return stat.S_IMODE(result.info(guest).st_mode)


def assert_owner(applier: Applier, result: Result, guest: str, mode: int, uid: int, gid: int) -> None:
    """The image's mode and owner: on disk as root; recorded (and the disk the user's) as a user."""
    info = result.info(guest)
    if applier.profile == "root":
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, uid, gid), guest
        return
    assert (info.st_uid, info.st_gid) == (applier.uid, applier.gid), guest
    expected_mode = 0o777 if stat.S_ISLNK(info.st_mode) else mode
    assert result.definition(guest) == f"{guest} m {expected_mode:o} {uid} {gid}"
    if stat.S_ISDIR(info.st_mode):
        assert stat.S_IMODE(info.st_mode) & 0o700 == 0o700, guest
    elif not stat.S_ISLNK(info.st_mode):
        assert stat.S_IMODE(info.st_mode) & 0o600 == 0o600, guest
    assert stat.S_IMODE(info.st_mode) & 0o7000 == 0, f"{guest}: set-id bits on a user's file"


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


# ---------------------------------------------------------------------------------------------------------
# Bad and hostile layers: one ImageError naming the layer, nothing written outside


def _header_claiming(size: int, kind: bytes = tarfile.XHDTYPE) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.GNU_FORMAT)


@pytest.mark.parametrize(("blob", "expected"), [
    (b"", "is empty"),
    (b"BZh91AY&SY" + bytes(600), "not a tar archive"),
    (b"\xfd7zXZ\x00" + bytes(600), "not a tar archive"),
    (os.urandom(2048).replace(b"\x1f", b"\x00").replace(b"\x28", b"\x00"), "not a tar archive"),
    (gzipped(archive(entry("a", data=os.urandom(100_000))))[:-5000], "gzip data is corrupt or truncated"),
    (b"\x1f\x8b\x08\x00" + os.urandom(5000), "gzip data is corrupt or truncated"),
    (zstded(archive(entry("a", data=os.urandom(200_000))))[:-4000], "the archive ends inside this file"),
    (archive(entry("a", data=b"x" * 100_000))[:20_000], "the archive ends inside this file"),
    (_header_claiming(1 << 40), "extended header"),
    (_header_claiming(1 << 40, tarfile.GNUTYPE_LONGNAME), "extended header"),
])
def test_corrupt_layers(applier: Applier, blob: bytes, expected: str) -> None:
    assert expected in applier.fails(blob)


def _chained_headers(count: int) -> bytes:
    """`count` PAX extended headers in a row before one file (tarfile reads such a chain recursively)."""
    record = b"13 comment=x\n"
    header = _header_claiming(len(record)) + record + bytes(tarfile.BLOCKSIZE - len(record))
    return header * count + archive(entry("after", data=b"a"))


def test_chained_extended_headers(applier: Applier) -> None:
    assert applier.ok(_chained_headers(3)).path("after").read_bytes() == b"a"
    assert "not a valid tar archive" in applier.fails(_chained_headers(2000))


def test_global_headers_are_bounded(applier: Applier) -> None:
    records = b"".join(b"%d k%06d=%s\n" % (len(b"k000000=") + 3 + 1 + 4000 + 1 + 1, n, b"v" * 4000)
                       for n in range(200))
    blob = _header_claiming(len(records), tarfile.XGLTYPE) + records
    blob += bytes(-len(blob) % tarfile.BLOCKSIZE)
    assert "extended header" in applier.fails(blob * 2 + archive(entry("f", data=b"f")))


def test_huge_size_that_is_not_there(applier: Applier) -> None:
    """A header claiming a terabyte over a short stream ends at the end of the stream, at once."""
    info = tarfile.TarInfo("big")
    info.size = 1 << 40
    blob = info.tobuf(format=tarfile.PAX_FORMAT) + b"data" * 1000
    assert "ends inside this file" in applier.fails(blob)
    whiteout = tarfile.TarInfo(".wh.big")
    whiteout.size = 1 << 40
    assert "ends inside" in applier.fails(whiteout.tobuf(format=tarfile.PAX_FORMAT))


@pytest.mark.parametrize(("bad", "expected"), [
    (entry("nul", data=b"x", pax={"path": "a\x00b"}), "null"),
    (entry("x" * 5000, data=b"x"), "too long"),
    (entry("uid", data=b"x", uid=1 << 33), "uid"),
    (entry("dev", "char", major=1 << 13, minor=1), "out of range"),
    (entry("ab/" + "c" * 300, data=b"x"), "too long"),  # one component over NAME_MAX
])
def test_bad_entries(applier: Applier, bad: tuple[tarfile.TarInfo, bytes], expected: str) -> None:
    assert expected in applier.fails(archive(bad))


def test_unknown_entry_type(applier: Applier) -> None:
    info, data = entry("odd", data=b"")
    info.type = b"Z"
    assert "unknown entry type" in applier.fails(archive((info, data)))


def test_file_below_a_file_is_refused(applier: Applier) -> None:
    assert "not a directory" in applier.fails(archive(entry("f", data=b"f"), entry("f/g", data=b"g")))
    result = applier.ok(archive(entry("f", data=b"f"), entry("f/.wh.g"), entry("f/.wh..wh..opq")))
    assert result.path("f").read_bytes() == b"f"  # whiteouts below a file: nothing to remove


def test_link_loop_on_the_way(applier: Applier) -> None:
    error = applier.fails(archive(entry("a", "symlink", link="b"), entry("b", "symlink", link="/a"),
                                  entry("a/x", data=b"x")))
    assert "a/x" in error and "symbolic links" in error


def test_fifo_is_never_opened(applier: Applier) -> None:
    """A FIFO, then entries that replace it or go below it: mkfifo'd, never opened (that would hang)."""
    result = applier.ok(
        archive(entry("p", "fifo"), entry("q", "fifo")),
        archive(entry("p", data=b"file now"), entry("q/", "dir")),
    )
    assert result.path("p").read_bytes() == b"file now"
    assert stat.S_ISDIR(result.info("q").st_mode)
    assert "not a directory" in applier.fails(archive(entry("r", "fifo"), entry("r/x", data=b"x")))


def test_many_entries(applier: Applier) -> None:
    """Thousands of names: applied in seconds, memory bounded (the archive's member list is not kept)."""
    blob = gzipped(archive(entry("many/", "dir"), *(entry(f"many/{n:04}/d/f", data=b"") for n in range(3_000)),
                           entry("many/2999/d/", "dir", mtime=MTIME - 5)))
    result = applier.ok(blob)
    assert len(os.listdir(result.path("many"))) == 3_000
    assert result.info("many/2999/d").st_mtime == MTIME - 5  # the last of 6,000 directories still gets its time


def test_opaque_directory_with_many_kept_directories(applier: Applier) -> None:
    lower = archive(entry("o/", "dir"), *(entry(f"o/{n:03}/d/old", data=b"") for n in range(600)))
    upper = archive(*(entry(f"o/{n:03}/d/new", data=b"") for n in range(600)), entry("o/.wh..wh..opq"))
    result = applier.ok(lower, upper)
    assert os.listdir(result.path("o/599/d")) == ["new"]


# ---------------------------------------------------------------------------------------------------------
# Streams and mksquashfs options, in this process


def test_verifying_reader() -> None:
    data = os.urandom(300_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    reader = streams.VerifyingReader(io.BytesIO(data), digest)
    assert reader.read(1000) + reader.read() == data
    assert reader.read(10) == b""
    with streams.VerifyingReader(io.BytesIO(data), digest) as reader:
        reader.read(10)  # the rest is read and checked when the block ends
    changed = data[:-1] + bytes([data[-1] ^ 1])  # not `+ b"?"`: random data ends in "?" once in 256 runs
    bad = streams.VerifyingReader(io.BytesIO(changed), digest, source="layer sha256:x of docker://x")
    with pytest.raises(ImageError, match="digest mismatch for layer sha256:x of docker://x"):
        bad.finish()
    with pytest.raises(ImageError, match="digest mismatch"), streams.VerifyingReader(io.BytesIO(b"other"), digest):
        pass
    with pytest.raises(ImageError, match="larger than"):
        streams.VerifyingReader(io.BytesIO(data), digest, size=10).read(100)
    with pytest.raises(ImageError, match="unsupported digest"):
        streams.VerifyingReader(io.BytesIO(data), "md5:abc")


def test_verifying_reader_under_a_layer() -> None:
    """The digest is checked even though the archive ends before the compressed stream does."""
    blob = gzipped(archive(entry("a", data=b"a"))) + bytes(100)  # trailing padding, as some writers leave
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with tempfile.TemporaryDirectory() as root, streams.VerifyingReader(io.BytesIO(blob), digest) as raw:
        layers.apply_layer(root, streams.open_layer(raw), ownership=owners.Ownership(), source="layer t")
        assert Path(root, "a").read_bytes() == b"a"
    tampered = blob[:-1] + b"\x01"
    with pytest.raises(ImageError, match="digest mismatch"), tempfile.TemporaryDirectory() as root, \
            streams.VerifyingReader(io.BytesIO(tampered), digest) as raw:
        layers.apply_layer(root, streams.open_layer(raw), ownership=owners.Ownership(), source="layer t")


def test_squash_options(tmp_path: Path) -> None:
    assert owners.squash_options(None, str(tmp_path / "pseudo")) == []
    assert not (tmp_path / "pseudo").exists()
    root = tmp_path / "root"
    root.mkdir()
    ownership = owners.Ownership()
    layers.apply_layer(str(root), streams.open_layer(io.BytesIO(archive(
        entry("./", "dir", mode=0o700), entry("home/", "dir"), entry("home/u/", "dir", mode=0o700, uid=1000, gid=1000),
    ))), ownership=ownership, source="layer t")
    (root / "added-later").write_text("x")  # as convert writes /.singularity.d after the layers
    (root / "added-later").chmod(0o640)
    options = owners.squash_options(ownership, str(tmp_path / "pseudo"))
    assert options == ["-pf", str(tmp_path / "pseudo"), "-root-mode", "700", "-root-uid", "0", "-root-gid", "0"]
    assert (tmp_path / "pseudo").read_text().splitlines() == [
        "/home m 755 0 0", "/home/u m 700 1000 1000", "/added-later m 640 0 0"]


# ---------------------------------------------------------------------------------------------------------
# Resource bombs: what a small layer claims is not what it costs


SPARSE_CLAIM = 512 << 20  # what the sparse member claims; the old applier wrote all of it


def gnu_sparse_layer(scratch: Path, tar_format: str) -> bytes:
    """A layer GNU tar (`--sparse`) wrote from a file of SPARSE_CLAIM bytes holding two short runs of data."""
    source = Path(tempfile.mkdtemp(prefix="sparse-", dir=scratch))
    with open(source / "big", "wb") as out:
        out.seek(1 << 20)
        out.write(b"middle\n")
        out.truncate(SPARSE_CLAIM - 4)
        out.seek(0, os.SEEK_END)
        out.write(b"end\n")
    done = subprocess.run(["tar", "--sparse", f"--format={tar_format}", "--numeric-owner", "--owner=0", "--group=0",
                           "-C", str(source), "-cf", "-", "big"], capture_output=True, check=True)
    shutil.rmtree(source)
    assert len(done.stdout) < 1 << 20
    return gzipped(done.stdout)


@pytest.mark.parametrize("tar_format", ["gnu", "pax"])
def test_a_sparse_member_takes_only_the_disk_its_data_takes(applier: Applier, tar_format: str) -> None:
    """A sparse member's holes stay holes (as GNU tar extracts it): a small layer claiming gigabytes does not
    fill the disk. The file reads as the one GNU tar archived."""
    result = applier.ok(gnu_sparse_layer(applier.base, tar_format))
    info = result.info("big")
    assert info.st_size == SPARSE_CLAIM
    assert info.st_blocks * 512 < 1 << 20, f"{info.st_blocks * 512} bytes on disk"
    with open(result.path("big"), "rb") as written:
        assert os.pread(written.fileno(), 8, 1 << 20) == b"middle\n\0"
        assert os.pread(written.fileno(), 4, SPARSE_CLAIM - 4) == b"end\n"
        assert os.pread(written.fileno(), 4096, 3 << 20) == bytes(4096)


def test_a_file_of_zeros_takes_no_disk(applier: Applier) -> None:
    """64 MiB of zeros is a few KiB of zstd: the chunks of zeros are left holes, the bytes the same."""
    data = b"head" + bytes(64 << 20) + b"tail"
    result = applier.ok(zstded(archive(entry("zeros", data=data), entry("after", data=b"after\n"))))
    info = result.info("zeros")
    assert info.st_size == len(data) and info.st_blocks * 512 < 8 << 20, f"{info.st_blocks * 512} bytes on disk"
    assert hashlib.sha256(result.path("zeros").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert result.path("after").read_bytes() == b"after\n"


def test_a_sparse_map_out_of_its_file_is_refused(applier: Applier) -> None:
    """A map whose region lies past the size the member claims: one error naming it, nothing written past."""
    info = tarfile.TarInfo("bad")
    info.size = 4
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "bad",
                        "GNU.sparse.realsize": "8"}
    body = b"1\n100\n4\n".ljust(512, b"\0") + b"data"
    info.size = len(body)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(body))
    error = applier.fails(buffer.getvalue())
    assert "bad: its sparse map is invalid (a region of 4 bytes at 100)" in error


def test_the_hosts_own_attributes_are_not_applied(applier: Applier) -> None:
    """As root, an SELinux label and an NFSv4 ACL of a layer are skipped (umoci's specialXattrs), the image's
    other attributes applied."""
    pax = {"SCHILY.xattr.security.selinux": "system_u:object_r:shadow_t:s0",
           "SCHILY.xattr.system.nfs4_acl": "\x00\x00\x00\x00", "SCHILY.xattr.user.kept": "yes"}
    result = applier.ok(archive(entry("labelled", data=b"l", pax=pax), entry("dir", "dir", pax=pax)))
    if applier.profile != "root":
        return  # a user applies no attribute at all
    for guest in ("labelled", "dir"):
        try:
            assert os.getxattr(result.path(guest), "user.kept") == b"yes"
        except OSError as error:  # a filesystem without xattrs: nothing to check
            pytest.skip(f"no xattrs here: {error.strerror}")
        labels = os.listxattr(result.path(guest))  # an SELinux host labels every file: never with the image's
        assert "security.selinux" not in labels or os.getxattr(result.path(guest), "security.selinux") != (
            b"system_u:object_r:shadow_t:s0"), guest


def test_an_opaque_deep_chain_is_pruned_in_one_walk(applier: Applier) -> None:
    """A whiteout over a chain of 1500 directories this layer also writes under: the chain is walked down once,
    by descriptors (it was re-resolved from the root at every level: 20 s here), and only the lower file goes."""
    chain = "/".join(["a"] * 1500)  # its path on the host stays under PATH_MAX
    try:
        applier.ok(archive(entry(f"{chain}/lower", data=b"l")))
        started = time.monotonic()
        result = applier.ok(archive(entry(f"{chain}/upper", data=b"u"), entry(".wh.a")))
        took = time.monotonic() - started
        assert took < 8, f"the whiteout took {took:.0f} s"
        assert result.exists(f"{chain}/upper") and not result.exists(f"{chain}/lower")
    finally:  # shutil.rmtree recurses: rm does not
        subprocess.run(["rm", "-rf", str(applier.base / "root" / "a")], check=True)

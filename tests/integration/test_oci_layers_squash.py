"""Layers applied and squashed as root and as an unprivileged user: the squashfs holds the image's owners.

As a user, extraction can't chown or mknod: singpy.oci.layers records the
image's modes, owners and device nodes, and `squash_options` hands them to
mksquashfs as pseudo definitions. What `unsquashfs -lln` lists must then be
the same as root's extraction gives: root-owned /usr, a uid-1000 home, a
setuid binary, /dev/null 1,3, a FIFO, odd names, whiteouts applied.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from tests.conftest import Singpy

MTIME = 1_600_000_000  # 2020-09-13 12:26:40 UTC
ODD_NAME = 'with space & "quotes" \\ and\ttab'

# The child, as the profile's user: apply the layers, squash the tree with the options singpy would use.
_BUILD = """
import os, subprocess, sys
from singpy.oci import layers, owners, streams
root, squashfs, pseudo, *files = sys.argv[1:]
ownership = None if os.getuid() == 0 else owners.Ownership()
for path in files:
    with open(path, "rb") as stream:
        layers.apply_layer(root, streams.open_layer(stream), ownership=ownership, source="layer " + path)
options = owners.squash_options(ownership, pseudo)
done = subprocess.run(["mksquashfs", root, squashfs, "-noappend", "-no-progress", "-quiet", *options],
                      capture_output=True, text=True)
sys.stderr.write(done.stderr)
sys.exit(done.returncode)
"""

_LISTED = re.compile(r"(\S{10}) (\d+)/(\d+) +(\d+|\d+, *\d+) (\d{4}-\d\d-\d\d \d\d:\d\d) squashfs-root(.*)")


def _entry(name: str, kind: str = "file", data: bytes = b"", *, mode: int = 0o644, uid: int = 0, gid: int = 0,
           link: str = "", major: int = 0, minor: int = 0) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                 "hardlink": tarfile.LNKTYPE, "char": tarfile.CHRTYPE, "block": tarfile.BLKTYPE,
                 "fifo": tarfile.FIFOTYPE}[kind]
    info.mode, info.uid, info.gid, info.linkname, info.mtime = mode, uid, gid, link, MTIME
    info.devmajor, info.devminor, info.size = major, minor, len(data)
    return info, data


def _archive(*entries: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _image_layers(canary: Path) -> list[bytes]:
    base = _archive(
        _entry("./", "dir", mode=0o755),
        _entry("usr/", "dir", mode=0o755),
        _entry("usr/bin/", "dir", mode=0o755),
        _entry("usr/bin/su", data=b"su", mode=0o4755),
        _entry("usr/bin/passwd", "hardlink", link="usr/bin/su"),
        _entry("bin", "symlink", link="usr/bin"),
        _entry("etc/", "dir", mode=0o755),
        _entry("etc/shadow", data=b"root:*:1::::::\n", mode=0o640, gid=42),
        _entry("home/", "dir", mode=0o755),
        _entry("home/user/", "dir", mode=0o700, uid=1000, gid=1000),
        _entry("home/user/.profile", data=b"PS1=x\n", mode=0o644, uid=1000, gid=1000),
        _entry("dev/", "dir", mode=0o755),
        _entry("dev/null", "char", mode=0o666, major=1, minor=3),
        _entry("dev/sda", "block", mode=0o660, gid=6, major=8, minor=0),
        _entry("tmp/", "dir", mode=0o1777),
        _entry("run/", "dir", mode=0o755),
        _entry("run/ctl", "fifo", mode=0o620, uid=1000, gid=1000),
        _entry("opt/", "dir", mode=0o755),
        _entry(f"opt/{ODD_NAME}", data=b"odd", mode=0o600, uid=1000, gid=100),
        _entry("var/", "dir", mode=0o755),
        _entry("var/old/", "dir", mode=0o755),
        _entry("var/old/file", data=b"old", uid=5),
        _entry("escape", "symlink", link=str(canary)),  # the image's own path: the file lands inside the root
        _entry("escape/planted", data=b"inside", uid=1000),
    )
    upper = _archive(
        _entry("var/.wh.old"),
        _entry("home/user/new", data=b"new", mode=0o640, uid=1000, gid=1000),
        _entry("../../etc/motd", data=b"hi", mode=0o444),
    )
    return [gzip.compress(base), zstandard.ZstdCompressor().compress(upper)]


@pytest.fixture
def scratch(singpy: Singpy, workdir: Path) -> Iterator[Path]:
    """A directory of this test's own that the profile's user owns, with a canary beside the root."""
    base = Path(tempfile.mkdtemp(prefix="layers-squash-", dir=workdir))
    base.chmod(0o755)
    (base / "root").mkdir()
    (base / "canary").mkdir()
    (base / "canary" / "keep").write_text("canary\n")
    for path in (base, base / "root"):
        os.chown(path, singpy.uid, singpy.gid)
    yield base
    subprocess.run(["chmod", "-R", "u+rwX", str(base)], capture_output=True, check=False)
    shutil.rmtree(base)


def _listing(squashfs: Path) -> dict[str, tuple[str, int, int, str, str]]:
    """unsquashfs -lln: guest path -> (mode string, uid, gid, size or "major,minor", date)."""
    done = subprocess.run(["unsquashfs", "-lln", str(squashfs)], capture_output=True, check=True,
                          env={"PATH": os.defpath, "TZ": "UTC"})
    listed = {}
    for line in done.stdout.decode("utf-8", "surrogateescape").splitlines():
        match = _LISTED.fullmatch(line)
        assert match, line
        mode, uid, gid, size, date, path = match.groups()
        if mode.startswith("l"):
            path = path.split(" -> ", 1)[0]
        listed[path or "/"] = (mode, int(uid), int(gid), size.replace(" ", ""), date)
    return listed


def test_squashfs_holds_the_image_owners(singpy: Singpy, scratch: Path) -> None:
    files = []
    for number, blob in enumerate(_image_layers(scratch / "canary"), 1):
        layer = scratch / f"layer{number}"
        layer.write_bytes(blob)
        files.append(str(layer))
    squashfs = scratch / "image.squashfs"
    done = subprocess.run(  # type: ignore[call-overload]
        [sys.executable, "-c", _BUILD, str(scratch / "root"), str(squashfs), str(scratch / "pseudo"), *files],
        capture_output=True, text=True, timeout=120, cwd=str(scratch),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}, **singpy.switch())
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Pseudo" not in done.stderr, done.stderr  # every definition taken

    listed = _listing(squashfs)
    day = "2020-09-13 12:26"
    expected = {
        "/": ("drwxr-xr-x", 0, 0),
        "/usr": ("drwxr-xr-x", 0, 0),
        "/usr/bin/su": ("-rwsr-xr-x", 0, 0),
        "/usr/bin/passwd": ("-rwsr-xr-x", 0, 0),
        "/bin": ("lrwxrwxrwx", 0, 0),
        "/etc/shadow": ("-rw-r-----", 0, 42),
        "/etc/motd": ("-r--r--r--", 0, 0),
        "/home/user": ("drwx------", 1000, 1000),
        "/home/user/.profile": ("-rw-r--r--", 1000, 1000),
        "/home/user/new": ("-rw-r-----", 1000, 1000),
        "/dev/null": ("crw-rw-rw-", 0, 0),
        "/dev/sda": ("brw-rw----", 0, 6),
        "/tmp": ("drwxrwxrwt", 0, 0),
        "/run/ctl": ("prw--w----", 1000, 1000),
        f"/opt/{ODD_NAME}": ("-rw-------", 1000, 100),
        f"{scratch}/canary/planted": ("-rw-r--r--", 1000, 0),
    }
    for path, (mode, uid, gid) in expected.items():
        assert path in listed, f"{path} missing: {sorted(listed)}"
        assert listed[path][:3] == (mode, uid, gid), path
    assert listed["/dev/null"][3] == "1,3"
    assert listed["/dev/sda"][3] == "8,0"
    for path in ("/home/user", "/etc/shadow", "/dev/null", "/usr/bin/su", "/run/ctl"):
        assert listed[path][4] == day, path  # times as in the image, directories' too
    assert "/var/old" not in listed and "/var/old/file" not in listed
    assert "/var" in listed
    # Nothing the layers did reached the host: the canary beside the root is as it was.
    assert sorted(os.listdir(scratch / "canary")) == ["keep"]
    assert (scratch / "canary" / "keep").read_text() == "canary\n"

"""Real layer archives applied to real trees in a child process, as root or as the test user (the
tests/unit/test_oci_layers*.py tests).

`entry`, `archive`, `gzipped`, `zstded` make layer blobs; `applier_for(profile, workdir)` gives an `Applier`
whose `ok`/`fails` apply blobs with singpy.oci.layers in a child process ("root": owners, modes and device
nodes for real; "user": the unprivileged test user, an Ownership recording them), with a time limit and
fewer descriptors than usual: a layer that made the applier hang or die with a traceback fails the test.
Each tree lives in a directory of its own next to a canary directory that hostile layers aim at and that
must stay as it was. `mode_of` and `assert_owner` read what a layer left.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

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


def applier_for(profile: str, workdir: Path) -> Iterator[Applier]:
    """An Applier as `profile` ("root", "user") in a fresh directory under `workdir`; afterwards the canary is
    checked (a layer must not change a file outside its root) and the directory removed."""
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

"""singpy.oci.layers against bad and hostile layers (one ImageError naming the layer, nothing written outside
the root), its streams and mksquashfs options, and resource bombs (what a small layer claims is not what it
costs), applied as root and as a user in a child process (tests/support/layer_apply.py), as
test_oci_layers.py does.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.oci import layers, owners, streams
from tests.support.layer_apply import (
    MTIME,
    Applier,
    applier_for,
    archive,
    entry,
    gzipped,
    zstded,
)


@pytest.fixture(params=["root", "user"])
def applier(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Applier]:
    yield from applier_for(request.param, workdir)


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

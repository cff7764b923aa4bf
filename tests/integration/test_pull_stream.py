"""A pull squashed from one merged tar stream (tar2sqfs, no tree) holds what the tree path's SIF holds (issue 31).

Each image here is pulled twice from an OCI layout, as root and as the test user: through the merged
stream (the default when tar2sqfs is installed) and through the tree path (`SINGPY_PULL_TREE=1`: layers
applied to a directory, then mksquashfs). The two SIFs' root filesystems are compared as the reference
tool lists them (`unsquashfs -lls`: type, mode, owner, size, link target and name of every entry) and by
the SHA-256 of every regular file. `-d` shows which path each pull took.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.oci import (
    block_device,
    busybox_image,
    char_device,
    directory,
    fifo,
    file,
    hardlink,
    opaque,
    readable_layout,
    symlink,
    whiteout,
)
from tests.support.sifs import new_cache, owned_dir

STREAMED = "tar2sqfs"  # in the `-d` output: the command run
FELL_BACK = "is converted through a tree"
# "mode uid/gid size date time name[ -> target]"; a device's size is its numbers, "1,  3"
_LINE = re.compile(r"(\S+) (\S+) +(\d+, +\d+|\d+) \S+ \S+ (squashfs-root.*)\Z")
LONG = "a-name-longer-than-the-hundred-bytes-of-a-plain-tar-header-" * 3


def tricky_image() -> oci.Image:
    """Whiteouts, opaque dirs, kinds replacing each other, hard links, odd modes and names, links on the way."""
    lower = oci.Layer([
        directory("data"), file("data/old", "old\n"), file("data/keep", "keep\n"),
        directory("opaque"), file("opaque/gone", "x\n"), directory("opaque/sub"), file("opaque/sub/gone", "y\n"),
        directory("was-dir"), file("was-dir/inside", "inside\n"), file("was-file", "a file\n"),
        file("shared/original", "first content\n"), hardlink("shared/link-same-layer", "shared/original"),
        directory("odd", mode=0o1777), directory("private", mode=0o700, uid=1000, gid=1000),
        directory("empty-odd", mode=0o751, uid=7, gid=9), directory("no-access", mode=0o000),
        file("usr/bin/suid", "#!/bin/sh\n", mode=0o4755), file("usr/bin/sgid", "#!/bin/sh\n", mode=0o2711, gid=42),
        directory("usr/lib/real"), symlink("libdir", "usr/lib/real"), symlink("abs", "/usr/lib"),
        file(f"long/{LONG}/{LONG}", "long path\n"), symlink(f"long/link-{LONG}", f"/{LONG}/{LONG}/target"),
        file("names/caf\udcff-binary", "not utf-8\n"), file("names/with space", "space\n"),
        char_device("dev/null", 1, 3), block_device("dev/loop9", 7, 9), fifo("run/pipe", mode=0o620, uid=5),
        file("etc/keep-me", "kept\n", uid=3, gid=4, mode=0o640), file("etc/hosts", "127.0.0.1 image\n", uid=8),
        file("lower-target", "lower data\n"),
    ])
    middle = oci.Layer([
        whiteout("data/old"), opaque("opaque"), file("opaque/new", "new\n"),
        file("was-dir", "now a file\n"), directory("was-file", mode=0o705), file("was-file/child", "c\n"),
        hardlink("shared/link-lower", "shared/original"), hardlink("linked-lower", "lower-target"),
        file("libdir/through-link", "through a relative link\n"), file("abs/real/through-abs", "absolute\n"),
        directory("private", mode=0o750, uid=1000, gid=1000),
        file("twice", "first\n"), file("twice", "second, same layer\n"),
        file("data/new", "new data\n"), whiteout("data/new"),  # a layer's whiteout spares its own entries
    ], compression="zstd")
    upper = oci.Layer([
        file("lower-target", "replaced above: the link keeps the old data\n"),
        whiteout("shared/original"), file("../../../outside-by-name", "inside\n"),
        symlink("etc/resolv.conf", "../run/resolv/resolv.conf"),
    ])
    return busybox_image(layers=[lower, middle, upper], env=["PATH=/bin"], labels={"org.example": "stream"})


def linked_etc_image() -> oci.Image:
    """/etc a link to a directory elsewhere: Apptainer's /etc files go there, what the image had is kept."""
    layer = oci.Layer([whiteout("etc"), directory("usr/etc"), file("usr/etc/passwd", "root:x:0:0::/root:/bin/sh\n"),
                       file("usr/etc/hosts", "from the image\n", uid=5, mode=0o600), symlink("etc", "/usr/etc"),
                       symlink("tmp", "/nowhere/tmp")])
    return busybox_image(layers=[layer])


def fallback_image() -> oci.Image:
    """A hard link to a symbolic link: the stream can't carry it, the tree path converts the image."""
    layer = oci.Layer([symlink("a-link", "bin/sh"), hardlink("linked-link", "a-link"), file("plain", "plain\n")])
    return busybox_image(layers=[layer])


def escape_image() -> oci.Image:
    """A hard link out of the image: refused by the tree path, with the same line whichever path is tried."""
    return busybox_image(layers=[oci.Layer([hardlink("stolen", "../../../../etc/shadow")])])


def truncated_image() -> oci.Image:
    """A gzip layer cut short, under the digest of what is left: the digest checks pass, inflating fails."""
    whole = oci.Layer([file("big", os.urandom(300_000)), file("after", "after\n")])
    cut = oci.Layer.raw(whole.data[:-20_000], "application/vnd.oci.image.layer.v1.tar+gzip")
    return busybox_image(layers=[cut])


def nul_image() -> oci.Image:
    """A PAX name with a NUL byte in it: tar2sqfs would keep what comes before it (`opt/passwd`), the kernel
    refuses it; the tree path's FATAL line either way."""
    info = tarfile.TarInfo("placeholder")
    info.pax_headers = {"path": "opt/passwd\0.txt"}
    info.size = 5
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(b"data\n"))
    layer = oci.Layer.raw(gzip.compress(tar.getvalue(), mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
    return busybox_image(layers=[oci.Layer([directory("opt")]), layer])


SPARSE_PARTS = ((1 << 20, b"in the middle\n"), (3 << 20, b"near the end\n"))  # (offset, data); holes elsewhere
SPARSE_SIZE = 4 << 20


def sparse_image(scratch: Path, tar_format: str) -> oci.Image:
    """A layer GNU tar wrote from a sparse file (`--sparse`: old GNU sparse headers, or PAX GNU.sparse 1.0),
    between two plain files: its data is not one byte range of the tar, the stream's data pass reads it
    with tarfile."""
    source = Path(tempfile.mkdtemp(prefix=f"sparse-{tar_format}-", dir=scratch))  # the layout is made per profile
    (source / "before").write_text("before\n")
    with open(source / "sparse", "wb") as out:
        for offset, data in SPARSE_PARTS:
            out.seek(offset)
            out.write(data)
        out.truncate(SPARSE_SIZE)
    (source / "after").write_text("after\n")
    tar = subprocess.run(["tar", "--sparse", f"--format={tar_format}", "--numeric-owner", "--owner=0",
                          "--group=0", "--mtime=@0", "-C", str(source), "-cf", "-", "before", "sparse", "after"],
                         capture_output=True, check=True).stdout
    assert (b"GNU.sparse" if tar_format == "pax" else b"S") in tar  # a sparse member, not a plain file
    layer = oci.Layer.__new__(oci.Layer)  # the tar as GNU tar wrote it, gzip-compressed as a registry's layer
    layer.entries, layer.compression, layer.tar = (), "gzip", tar
    layer.data = gzip.compress(tar, mtime=0)
    layer.diff_id, layer.digest = (f"sha256:{hashlib.sha256(blob).hexdigest()}" for blob in (tar, layer.data))
    layer.size, layer._media_type = len(layer.data), None
    return busybox_image(layers=[layer])


def sparse_content() -> bytes:
    data = bytearray(SPARSE_SIZE)
    for offset, part in SPARSE_PARTS:
        data[offset:offset + len(part)] = part
    return bytes(data)


@pytest.fixture(scope="module")
def layout(workdir: Path) -> Path:
    images = {"tricky": tricky_image(), "linked-etc": linked_etc_image(), "fallback": fallback_image(),
              "escape": escape_image(), "truncated": truncated_image(), "nul": nul_image(),
              **{f"sparse-{form}": sparse_image(workdir, form) for form in ("gnu", "pax")}}
    return readable_layout(workdir / "stream-layout", images)


def out_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    return owned_dir(singpy, workdir / "stream-out", name)


def pull(singpy: Singpy, workdir: Path, layout: Path, tag: str, *, tree: bool) -> tuple[Path, str]:
    """The SIF of `tag` pulled through the tree path or the stream, in a cache of its own; and the -d output."""
    how = "tree" if tree else "stream"
    out = out_dir(singpy, workdir, f"{tag}-{how}")
    extra = {"SINGPY_PULL_TREE": "1"} if tree else {}
    cache = new_cache(singpy, workdir, f"stream-{tag}-{how}")
    env = singpy.env(SINGPY_CACHEDIR=str(cache), **extra)
    result = singpy.run("-d", "pull", str(out / "image.sif"), f"oci:{layout}:{tag}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [name for name in converted(cache) if name.endswith(".sif")]  # what the failure tests check is absent
    return out / "image.sif", result.stderr


def content(sif: Path, scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The root filesystem of `sif` as `unsquashfs -lln` lists it (times and directory sizes left out: the
    two tools lay directories out differently) and the SHA-256 of each regular file."""
    info = subprocess.run(["siftool", "info", "4", str(sif)], capture_output=True, text=True, check=True).stdout
    start = re.search(r"Offset:\s+(\d+)", info)
    assert start, info
    listing = subprocess.run(["unsquashfs", "-lln", "-o", start.group(1), str(sif)], capture_output=True,
                             check=True).stdout.decode(errors="surrogateescape")
    entries = []
    for line in listing.splitlines():
        found = _LINE.match(line)
        if found:
            mode, owner, size, name = found.groups()
            entries.append(f"{mode} {owner} {'-' if mode.startswith('d') else re.sub(' +', ' ', size)} {name}")
    target = scratch / f"unsquashed-{sif.parent.name}"
    subprocess.run(["unsquashfs", "-no-xattrs", "-o", start.group(1), "-d", str(target), str(sif)],
                   capture_output=True, check=True)
    sums = {}
    for where, _, files in os.walk(target):
        for name in files:
            path = os.path.join(where, name)
            if os.path.isfile(path) and not os.path.islink(path):
                data = Path(path).read_bytes()
                if name == "labels.json":  # the build's date differs between two pulls: the rest may not
                    data = re.sub(rb'"org.label-schema.build-date": "[^"]*"', b"", data)
                sums[os.path.relpath(path, target)] = hashlib.sha256(data).hexdigest()
    return entries, sums


def same_content(singpy: Singpy, workdir: Path, layout: Path, tag: str, tmp_path: Path) -> tuple[str, list[str]]:
    """Pulls `tag` both ways, checks the content is the same; returns the stream's -d output and listing."""
    streamed, said = pull(singpy, workdir, layout, tag, tree=False)
    tree, said_tree = pull(singpy, workdir, layout, tag, tree=True)
    assert STREAMED not in said_tree
    listing, sums = content(streamed, tmp_path)
    tree_listing, tree_sums = content(tree, tmp_path)
    assert "\n".join(listing) == "\n".join(tree_listing)
    differing = {path: (sums.get(path), tree_sums.get(path)) for path in {*sums, *tree_sums}
                 if sums.get(path) != tree_sums.get(path)}
    assert differing == {}
    return said, listing


def test_the_stream_gives_the_tree_paths_content(singpy: Singpy, workdir: Path, layout: Path, tmp_path: Path) -> None:
    said, listing = same_content(singpy, workdir, layout, "tricky", tmp_path)
    assert STREAMED in said and FELL_BACK not in said
    shown = "\n".join(listing)
    # what the comparison covers is there: each case of the image as the tree path makes it
    for expected in ("drwxrwxrwt 0/0 - squashfs-root/odd", "d--------- 0/0 - squashfs-root/no-access",
                     "-rwsr-xr-x 0/0 10 squashfs-root/usr/bin/suid", "prw--w---- 5/0 0 squashfs-root/run/pipe",
                     "crw-rw-rw- 0/0 1, 3 squashfs-root/dev/null", "-rw-r--r-- 0/0 11 squashfs-root/was-dir",
                     "drwxr-x--- 1000/1000 - squashfs-root/private", "squashfs-root/usr/lib/real/through-link",
                     "squashfs-root/usr/lib/real/through-abs", f"squashfs-root/long/{LONG}/{LONG}",
                     "-rw-r--r-- 0/0 7 squashfs-root/outside-by-name", "-rw-r--r-- 0/0 19 squashfs-root/twice",
                     "-rw-r--r-- 0/0 11 squashfs-root/linked-lower", "squashfs-root/opaque/new",
                     "squashfs-root/run/resolv/resolv.conf", "-rw-r--r-- 0/0 9 squashfs-root/data/new",
                     "-rwxr-xr-x 0/0 0 squashfs-root/.singularity.d/env/94-appsbase.sh"):
        assert expected in shown, expected
    for gone in ("squashfs-root/data/old", "squashfs-root/opaque/gone", "squashfs-root/opaque/sub",
                 "squashfs-root/shared/original", "squashfs-root/was-dir/inside"):
        assert not any(line.endswith(gone) for line in listing), gone


def test_a_linked_etc_gets_apptainers_files_where_the_tree_path_puts_them(singpy: Singpy, workdir: Path,
                                                                          layout: Path, tmp_path: Path) -> None:
    said, listing = same_content(singpy, workdir, layout, "linked-etc", tmp_path)
    assert STREAMED in said and FELL_BACK not in said
    relevant = [line for line in listing if re.search(r"root/(etc|tmp|usr/etc|nowhere)", line)]
    assert "lrwxrwxrwx 0/0 8 squashfs-root/etc -> /usr/etc" in listing, relevant
    assert any(line.startswith("-rw-r--r--") and line.endswith("squashfs-root/usr/etc/hosts") for line in listing)
    assert "lrwxrwxrwx 0/0 12 squashfs-root/tmp -> /nowhere/tmp" in listing


def test_what_the_stream_cant_hold_falls_back_to_the_same_content(singpy: Singpy, workdir: Path, layout: Path,
                                                                   tmp_path: Path) -> None:
    said, listing = same_content(singpy, workdir, layout, "fallback", tmp_path)
    assert FELL_BACK in said and "a hard link to something other than a regular file" in said
    assert any(line.endswith("squashfs-root/linked-link -> bin/sh") for line in listing)


def converted(cache: Path) -> list[str]:
    """The SIFs a cache holds (lock files aside)."""
    return [path.name for path in cache.rglob("*") if path.is_file() and "sif" in path.parent.name
            and not path.name.startswith(".")]


@pytest.mark.parametrize(("tag", "fatal"), [("escape", "which is not in the image"),
                                           ("truncated", "its gzip data is corrupt or truncated"),
                                           ("nul", "embedded null byte")])
def test_a_bad_layer_is_the_same_fatal_line_either_way(singpy: Singpy, workdir: Path, layout: Path, tag: str,
                                                       fatal: str) -> None:
    """A layer refused (a link out of the image, a NUL byte in a name) or cut short (gzip inflated by isal where
    installed, on the stream's headers pass and on the tree path alike): one FATAL, the same both ways, nothing
    left behind."""
    results = []
    for tree in (False, True):
        cache = new_cache(singpy, workdir, f"stream-{tag}-{tree}")
        out = out_dir(singpy, workdir, f"{tag}-{tree}")
        work = out_dir(singpy, workdir, f"{tag}-work-{tree}")
        env = singpy.env(SINGPY_CACHEDIR=str(cache), SINGPY_TMPDIR=str(work),
                         **({"SINGPY_PULL_TREE": "1"} if tree else {}))
        result = singpy.run("-q", "pull", str(out / "image.sif"), f"oci:{layout}:{tag}", env=env)
        assert_one_fatal(result, fatal)
        assert os.listdir(out) == [] and os.listdir(work) == [] and converted(cache) == []
        results.append(result.stderr)
    assert results[0] == results[1]


def test_the_layers_are_inflated_by_isal(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """python-isal (a dependency) is what a pull inflates gzip layers with: Python's own import log says so."""
    out = out_dir(singpy, workdir, "importtime")
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "stream-importtime")),
                     PYTHONPROFILEIMPORTTIME="1")
    result = singpy.run("-q", "pull", str(out / "image.sif"), f"oci:{layout}:linked-etc", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line}
    assert "isal.igzip" in imported and "singpy.oci.streamsquash" in imported


def test_a_failing_tar2sqfs_leaves_nothing(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """The real tar2sqfs, stopped by a file size limit (SIGXFSZ) half way: one FATAL line, no SIF, no work
    directory, no partial squashfs, no tar2sqfs left running."""
    tools = out_dir(singpy, workdir, "limited-tools")
    wrapper = tools / "tar2sqfs"
    wrapper.write_text("#!/bin/sh\nulimit -f 16\nexec /usr/bin/tar2sqfs \"$@\"\n")
    wrapper.chmod(0o755)
    cache = new_cache(singpy, workdir, "stream-limited")
    out = out_dir(singpy, workdir, "limited")
    work = out_dir(singpy, workdir, "limited-work")
    env = singpy.env(SINGPY_CACHEDIR=str(cache), SINGPY_TMPDIR=str(work), PATH=f"{tools}:{os.environ['PATH']}")
    result = singpy.run("-q", "pull", str(out / "image.sif"), f"oci:{layout}:tricky", env=env)
    assert_one_fatal(result, f"can't convert oci:{layout}:tricky to SIF")
    assert os.listdir(out) == [] and os.listdir(work) == [] and converted(cache) == []
    running = subprocess.run(["pgrep", "-f", str(tools)], capture_output=True, text=True, check=False).stdout
    assert running == ""


def test_on_a_terminal_the_stream_shows_the_entries_sent(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """tar2sqfs draws no progress: singpy counts the entries it sends, to the last one."""
    from tests.conftest import SINGPY

    out = out_dir(singpy, workdir, "terminal")
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "stream-terminal")), TERM="xterm",
                     COLUMNS="200")
    command = f"{SINGPY} pull {out}/image.sif oci:{layout}:linked-etc"
    done = subprocess.run(["script", "-q", "-e", "-c", command, "/dev/null"], capture_output=True, text=True,
                          env=env, timeout=120, check=False, **singpy.switch())  # type: ignore[call-overload]
    assert done.returncode == 0, done.stdout + done.stderr
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout)
    counts = re.findall(r"Squashing oci:\S+\s+\S*\s*(\d+)/(\d+)", screen)
    assert counts and counts[-1][0] == counts[-1][1] != "0", screen[-2000:]
    assert (out / "image.sif").is_file()


@pytest.mark.parametrize("form", ["gnu", "pax"])
def test_a_sparse_file_gets_the_tree_paths_content(singpy: Singpy, workdir: Path, layout: Path, tmp_path: Path,
                                                   form: str) -> None:
    """A sparse member (GNU tar's old headers, or PAX GNU.sparse 1.0) streamed whole, holes as zeros: the
    same content as the tree path's, and the bytes of the file GNU tar read."""
    said, listing = same_content(singpy, workdir, layout, f"sparse-{form}", tmp_path)
    assert STREAMED in said and FELL_BACK not in said
    assert f"-rw-r--r-- 0/0 {SPARSE_SIZE} squashfs-root/sparse" in listing
    streamed = workdir / "stream-out" / f"{singpy.profile}-sparse-{form}-stream" / "image.sif"  # pull()'s
    scratch = tmp_path / "again"
    scratch.mkdir()
    _, sums = content(streamed, scratch)
    assert sums["sparse"] == hashlib.sha256(sparse_content()).hexdigest()
    assert sums["after"] == hashlib.sha256(b"after\n").hexdigest()

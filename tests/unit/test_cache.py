"""singpy.image.cache: location, populate once, index lookups, locking, removal."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from singpy import cachefiles
from singpy.errors import ImageError
from singpy.image import cache


@pytest.fixture(scope="module")
def squashfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    (tree / "etc").mkdir()
    (tree / "etc" / "hello").write_text("hello\n")
    (tree / "ro").mkdir()
    (tree / "ro" / "file").write_text("x")
    (tree / "ro").chmod(0o555)
    out = tree.parent / "tree.squashfs"
    subprocess.run(["mksquashfs", str(tree), str(out), "-noappend", "-quiet", "-no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    return out


@pytest.mark.parametrize(("env", "expected"), [
    ({"SINGPY_CACHEDIR": "/c", "XDG_CACHE_HOME": "/x"}, "/c"),
    ({"XDG_CACHE_HOME": "/x"}, "/x/singpy"),
    ({"XDG_CACHE_HOME": ""}, "/home/u/.cache/singpy"),
    ({}, "/home/u/.cache/singpy"),
    ({"APPTAINER_CACHEDIR": "/a", "XDG_CACHE_HOME": "/x"}, "/a/singpy"),
    ({"SINGULARITY_CACHEDIR": "/s", "XDG_CACHE_HOME": "/x"}, "/s/singpy"),
    ({"APPTAINER_CACHEDIR": "/a", "SINGULARITY_CACHEDIR": "/s"}, "/a/singpy"),
    ({"SINGPY_CACHEDIR": "/c", "APPTAINER_CACHEDIR": "/a"}, "/c"),
    ({"APPTAINER_CACHEDIR": "", "SINGULARITY_CACHEDIR": "/s"}, "/s/singpy"),
], ids=["singpy-first", "xdg", "xdg-empty", "home", "apptainer-before-xdg", "singularity",
        "apptainer-before-singularity", "singpy-before-apptainer", "empty-apptainer-skipped"])
def test_cache_dir(env: dict[str, str], expected: str) -> None:
    assert cachefiles.cache_dir(env, "/home/u") == expected


def populate(root: Path, image: Path) -> str:
    return cache.populate(str(root), str(image), 0, image.stat().st_size, unsquashfs="/usr/bin/unsquashfs",
                          root=os.getuid() == 0)


def test_populate_then_lookup(tmp_path: Path, squashfs: Path) -> None:
    root = tmp_path / "cache"
    size = squashfs.stat().st_size
    assert cache.lookup(str(root), str(squashfs), 0, size) is None
    tree = populate(root, squashfs)
    assert Path(tree, "etc", "hello").read_text() == "hello\n"
    assert cache.lookup(str(root), str(squashfs), 0, size) == tree
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    assert sorted(os.listdir(root / "rootfs")) == [os.path.basename(tree), os.path.basename(tree) + ".json"]
    assert list(cache.entries(str(root))) == [os.path.basename(tree)]
    # Rewriting the file (new mtime) invalidates the index entry, not the tree: same content, same digest.
    os.utime(squashfs, ns=(1, 1))
    assert cache.lookup(str(root), str(squashfs), 0, size) is None
    assert populate(root, squashfs) == tree


def test_lookup_of_a_removed_entry(tmp_path: Path, squashfs: Path) -> None:
    root = tmp_path / "cache"
    tree = populate(root, squashfs)
    digest = os.path.basename(tree)
    assert cache.remove_entry(str(root), digest)
    assert cache.lookup(str(root), str(squashfs), 0, squashfs.stat().st_size) is None
    assert os.listdir(root / "rootfs") == [] and os.listdir(root / "index") == []


def test_busy_entry_is_left_alone(tmp_path: Path, squashfs: Path) -> None:
    root = tmp_path / "cache"
    digest = os.path.basename(populate(root, squashfs))
    with open(root / "rootfs" / f".{digest}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert not cache.remove_entry(str(root), digest)
    assert list(cache.entries(str(root))) == [digest]


def test_remove_tree_gets_through_read_only_directories(tmp_path: Path) -> None:
    top = tmp_path / "t"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "a" / "link").symlink_to("/etc")
    (top / "a" / "b").chmod(0o500)
    (top / "a").chmod(0o500)
    cache.remove_tree(str(top))
    assert not top.exists()
    cache.remove_tree(str(top))  # already gone: nothing to do


def test_failed_extraction_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    junk = tmp_path / "junk.squashfs"
    junk.write_bytes(b"hsqs" + bytes(4092))
    with pytest.raises(ImageError, match="can.t unpack"):
        populate(root, junk)
    assert os.listdir(root / "rootfs") == []


@pytest.mark.parametrize("record", [
    "not json", "[1, 2]", '{"created": "yesterday", "source": 5}', '{"created": true}', "[" * 100000, "\xff",
], ids=["not-json", "a-list", "wrong-types", "bool-is-not-a-time", "deep-nesting", "not-utf8"])
def test_entry_info_of_a_damaged_record(tmp_path: Path, record: str) -> None:
    """`singpy cache list` shows "?" for what it can't read, never a traceback."""
    digest = "d" * 64
    (tmp_path / "rootfs" / digest).mkdir(parents=True)
    (tmp_path / "rootfs" / f"{digest}.json").write_bytes(record.encode("latin-1"))
    info = cache.entry_info(str(tmp_path), digest)
    assert set(info) == {"size"}


def test_entry_info_keeps_what_was_recorded(tmp_path: Path) -> None:
    digest = "e" * 64
    (tmp_path / "rootfs" / digest).mkdir(parents=True)
    (tmp_path / "rootfs" / f"{digest}.json").write_text('{"source": "/i.sif", "offset": 4096, "created": 17, "x": 1}')
    assert cache.entry_info(str(tmp_path), digest, size=False) == {"source": "/i.sif", "offset": 4096, "created": 17}


def test_a_fifo_as_the_image_is_refused_while_hashing(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ImageError, match="is a FIFO, not a regular file"):
        cache.populate(str(tmp_path / "cache"), str(fifo), 0, 4096, unsquashfs="/usr/bin/unsquashfs", root=False)


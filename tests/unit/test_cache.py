"""singpy.image.cache: location, populate once, index lookups, locking, removal."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.host import cachefiles
from singpy.image import cache
from singpy.oci import store


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
    assert cache.remove_entry(str(root), digest) == cache.REMOVED
    assert cache.lookup(str(root), str(squashfs), 0, squashfs.stat().st_size) is None
    assert os.listdir(root / "rootfs") == [] and os.listdir(root / "index") == []


def test_busy_entry_is_left_alone(tmp_path: Path, squashfs: Path) -> None:
    root = tmp_path / "cache"
    digest = os.path.basename(populate(root, squashfs))
    with open(root / "rootfs" / f".{digest}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert cache.remove_entry(str(root), digest) == cache.UNPACKING
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



# --- issue 24: nothing in a cache is trusted for what its name claims -------------------------------------------


def private_dir(path: Path, mode: int = 0o700) -> Path:
    path.mkdir(mode=mode)
    path.chmod(mode)  # whatever the umask
    return path


@pytest.mark.parametrize(("mode", "sticky_ok", "refused"), [
    (0o700, False, ""), (0o755, False, ""), (0o770, False, "writable by its group (mode 0770)"),
    (0o777, False, "writable by others (mode 0777)"), (0o1777, False, "writable by others (mode 1777)"),
    (0o1777, True, ""), (0o777, True, "writable by others (mode 0777)"),  # sticky_ok: sticky only
])
def test_check_owned_refuses_a_directory_others_can_write(tmp_path: Path, mode: int, sticky_ok: bool,
                                                          refused: str) -> None:
    directory = private_dir(tmp_path / "c", mode)
    if not refused:
        cachefiles.check_owned(str(directory), sticky_ok=sticky_ok)
        return
    with pytest.raises(ImageError, match=f"refusing the cache directory {directory}: it is {re.escape(refused)}"):
        cachefiles.check_owned(str(directory), sticky_ok=sticky_ok)


def test_check_owned_below_a_parent_and_through_a_link(tmp_path: Path) -> None:
    cache = private_dir(tmp_path / "cache")
    private_dir(cache / "sif", 0o777)
    cachefiles.check_owned(str(cache), below=("refs", "blobs/sha256"))  # missing: nothing to distrust yet
    with pytest.raises(ImageError, match=f"{cache}/sif: it is writable by others"):
        cachefiles.check_owned(str(cache), below=("refs", "sif"))
    shared = private_dir(tmp_path / "shared", 0o777)
    (tmp_path / "link").symlink_to(shared)
    with pytest.raises(ImageError, match=f"{shared}: it is writable by others"):
        cachefiles.check_owned(str(tmp_path / "link" / "cache"))  # a parent through a link: not sticky


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_check_owned_refuses_another_users_directory(tmp_path: Path) -> None:
    directory = private_dir(tmp_path / "theirs")
    os.chown(directory, 4242, 4242)
    with pytest.raises(ImageError, match=f"{directory}: it belongs to uid 4242, not to you or root"):
        cachefiles.make_private_dirs(str(directory / "singpy"))  # makedirs accepted it; the check does not
    assert not (directory / "singpy").exists()


def test_make_private_dirs_makes_every_directory_private(tmp_path: Path) -> None:
    cachefiles.make_private_dirs(str(tmp_path / "a" / "b" / "c"))
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert path.stat().st_mode & 0o777 == 0o700
    cachefiles.make_private_dirs(f"{tmp_path}/new/cache/")  # a trailing slash (a new user's first run)
    assert (tmp_path / "new" / "cache").is_dir()
    deep = str(tmp_path) + "/d" * 1500  # deeper than Python's recursion limit, within PATH_MAX
    cachefiles.make_private_dirs(deep)
    assert os.path.isdir(deep)
    for _ in range(1500):  # bottom up: pytest's own clean-up (shutil.rmtree) recurses
        os.rmdir(deep)
        deep = os.path.dirname(deep)


def test_publish_never_writes_through_a_link_at_its_temporary_name(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("unchanged")
    names = iter([b"\x01" * 8, b"\x02" * 8])
    monkeypatch.setattr(os, "urandom", lambda size: next(names))  # cachefiles calls os.urandom
    target = tmp_path / "record"
    (tmp_path / f".record.{'01' * 8}.tmp").symlink_to(victim)  # the first name it will try
    cachefiles.publish(str(target), b"new")
    assert target.read_bytes() == b"new" and victim.read_text() == "unchanged"
    assert sorted(path.name for path in tmp_path.iterdir()) == [f".record.{'01' * 8}.tmp", "record", "victim"]


def test_a_link_at_a_published_name_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("unchanged")
    (tmp_path / "record").symlink_to(victim)
    cachefiles.publish(str(tmp_path / "record"), b"new")
    assert not (tmp_path / "record").is_symlink() and victim.read_text() == "unchanged"


def test_small_cache_files_are_refused_in_a_directory_others_can_write(tmp_path: Path) -> None:
    """--nv's listing, CDI edits and sonames decide what is mounted: never read from where others can write."""
    good = private_dir(tmp_path / "good")
    cachefiles.write_fields(str(good / "nv-list" / "entry"), ["L", "libcuda.so.1", "/usr/lib/libcuda.so.1"])
    assert cachefiles.read_fields(str(good / "nv-list" / "entry")) == ["L", "libcuda.so.1", "/usr/lib/libcuda.so.1"]
    assert (good / "nv-list").stat().st_mode & 0o777 == 0o700
    (good / "nv-list" / "link").symlink_to(good / "nv-list" / "entry")
    assert cachefiles.read_fields(str(good / "nv-list" / "link")) is None  # not a file singpy wrote
    bad = private_dir(tmp_path / "bad", 0o777)
    private_dir(bad / "nv-list")
    (bad / "nv-list" / "entry").write_bytes(b"L\0libcuda.so.1\0/etc/shadow")
    refused = f"refusing the cache directory {bad}: it is writable by others"
    with pytest.raises(ImageError, match=refused):
        cachefiles.read_fields(str(bad / "nv-list" / "entry"))
    with pytest.raises(ImageError, match=refused):
        cachefiles.write_fields(str(bad / "nv-list" / "other"), ["x"])
    assert not (bad / "nv-list" / "other").exists()


def test_lookup_refuses_a_cache_others_can_write_and_follows_only_its_own_links(tmp_path: Path,
                                                                                squashfs: Path) -> None:
    root = tmp_path / "cache"
    tree = populate(root, squashfs)
    assert cache.lookup(str(root), str(squashfs), 0, squashfs.stat().st_size) == tree
    outside = private_dir(tmp_path / "outside")
    for link in (root / cache.INDEX).iterdir():
        link.unlink()
        link.symlink_to(f"../../outside/{'0' * 64}")  # a link singpy never writes: not followed
    private_dir(outside / ("0" * 64))
    assert cache.lookup(str(root), str(squashfs), 0, squashfs.stat().st_size) is None
    (root / cache.INDEX).chmod(0o777)
    with pytest.raises(ImageError, match=f"{root}/{cache.INDEX}: it is writable by others"):
        cache.lookup(str(root), str(squashfs), 0, squashfs.stat().st_size)


def test_a_link_at_a_lock_name_is_removed_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "created-through-the-link"
    (tmp_path / ".x.lock").symlink_to(target)
    fd = cache.lock_file(str(tmp_path / ".x.lock"), wait=None)
    assert fd is not None
    os.close(fd)
    assert not target.exists() and not (tmp_path / ".x.lock").is_symlink()


def test_a_sif_is_used_only_while_its_seal_matches(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    (tmp_path / "sif").mkdir()
    sif = tmp_path / "sif" / f"{'ab' * 32}.sif"
    sif.write_bytes(b"made by singpy")
    assert store.usable_sif(str(tmp_path), digest) == ""  # no seal: not one singpy made
    store.seal_sif(str(sif), digest, {"source": "docker://x/y:z"})
    assert store.usable_sif(str(tmp_path), digest) == str(sif)
    assert store.pulled_images(str(tmp_path))[0][1]["source"] == "docker://x/y:z"
    replaced = tmp_path / "other"
    replaced.write_bytes(b"made by singpy")  # same size and bytes; another file
    os.replace(replaced, sif)
    assert store.usable_sif(str(tmp_path), digest) == ""
    assert store.usable_sif(str(tmp_path), "sha256:" + "cd" * 32) == ""


def test_a_cached_blob_is_checked_against_its_digest_when_used(tmp_path: Path) -> None:
    data = b"layer bytes"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob = tmp_path / digest[7:]
    assert store.cached_blob(str(blob), digest) is None
    blob.write_bytes(data)
    handle = store.cached_blob(str(blob), digest)
    assert handle is not None and handle.read() == data  # opened at its start, the bytes just checked
    handle.close()
    blob.write_bytes(b"other bytes")
    assert store.cached_blob(str(blob), digest) is None and not blob.exists()  # removed: downloaded again


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o1777, False)])
def test_a_work_directory_parent_others_can_write_must_be_sticky(tmp_path: Path, mode: int, refused: bool) -> None:
    from singpy.recipe import workdir

    parent = private_dir(tmp_path / "tmp", mode)
    env = {"SINGPY_TMPDIR": str(parent)}
    if refused:
        with pytest.raises(ImageError, match=r"refusing the work directory's parent \(SINGPY_TMPDIR\)"):
            workdir.make(str(tmp_path / "out.sif"), env)
        with pytest.raises(ImageError, match=r"refusing the work directory's parent \(SINGPY_TMPDIR\)"):
            store.work_dir(str(tmp_path / "cache"), env, purpose="convert")
        assert os.listdir(parent) == []
    else:
        made = [workdir.make(str(tmp_path / "out.sif"), env), store.work_dir(str(tmp_path / "c"), env, purpose="x")]
        assert all(Path(path).parent == parent and Path(path).stat().st_mode & 0o777 == 0o700 for path in made)

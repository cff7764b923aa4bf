"""singpy.image.trees: removing and walking trees of any depth, without recursion (issue 24, class 3)."""

from __future__ import annotations

import contextlib
import os
import resource
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.image import trees

DEPTH = 1200  # "dddd/" 1,200 times: 6,000 bytes, past PATH_MAX and Python's recursion limit


def deep(top: Path, depth: int = DEPTH, *, read_only_every: int = 0) -> None:
    """A chain of `depth` directories under `top`, a file and a link in some, read-only ones if asked."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for level in range(depth):
        os.mkdir("dddd", dir_fd=fd)
        if level % 500 == 0:
            os.close(os.open("file", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            os.symlink("/", "link", dir_fd=fd)
        below = os.open("dddd", os.O_RDONLY, dir_fd=fd)
        if read_only_every and level % read_only_every == 0:
            os.fchmod(fd, 0o500)
        os.close(fd)
        fd = below
    os.close(fd)


@contextlib.contextmanager
def few_descriptors(count: int = 64) -> Iterator[None]:
    """A walk must not hold a descriptor per level: with 64 at most, a deep one fails if it does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_remove_gets_through_a_tree_past_path_max_with_read_only_directories(tmp_path: Path) -> None:
    deep(tmp_path / "tree", read_only_every=250)
    with few_descriptors():
        trees.remove(str(tmp_path / "tree"))
    assert os.listdir(tmp_path) == []


def test_remove_takes_links_never_what_they_point_to(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "file").write_text("mine\n")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "to-dir").symlink_to(kept)
    (tmp_path / "tree" / "to-file").symlink_to(kept / "file")
    (tmp_path / "link").symlink_to(kept)
    trees.remove(str(tmp_path / "tree"))
    trees.remove(str(tmp_path / "link"))
    assert sorted(os.listdir(tmp_path)) == ["kept"] and (kept / "file").read_text() == "mine\n"


def test_remove_of_nothing_or_a_file(tmp_path: Path) -> None:
    trees.remove(str(tmp_path / "missing"))
    trees.remove(str(tmp_path / "missing-parent" / "x"))
    (tmp_path / "file").write_text("x")
    trees.remove(str(tmp_path / "file"))
    assert os.listdir(tmp_path) == []


def test_remove_of_a_wide_tree_lists_each_directory_once(tmp_path: Path) -> None:
    top = tmp_path / "wide"
    top.mkdir()
    for number in range(1000):
        (top / str(number)).mkdir()
    (top / "7" / "inner").mkdir()
    trees.remove(str(top))
    assert not top.exists()


def test_remove_at_works_on_a_descriptor(tmp_path: Path) -> None:
    deep(tmp_path / "tree", 50)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        trees.remove_at(fd, "tree")
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


def test_walk_sees_every_entry_of_a_deep_tree_once(tmp_path: Path) -> None:
    deep(tmp_path / "tree", read_only_every=300)
    with few_descriptors():
        found = list(trees.walk(str(tmp_path / "tree")))
    directories = [entry for entry in found if stat.S_ISDIR(entry[2].st_mode)]
    assert len(directories) == DEPTH
    assert len([entry for entry in found if entry[1] == "file"]) == len(range(0, DEPTH, 500))
    assert max(len(where) for where, _, _ in found) == len("/".join(["dddd"] * (DEPTH - 1)))
    assert [name for _, name, info in found if stat.S_ISLNK(info.st_mode)] == ["link"] * len(range(0, DEPTH, 500))
    trees.remove(str(tmp_path / "tree"))


def test_walk_names_entries_relative_to_the_top(tmp_path: Path) -> None:
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "a" / "b" / "f").write_text("x")
    (tmp_path / "t" / "g").write_text("y")
    found = sorted((where, name) for where, name, _ in trees.walk(str(tmp_path / "t")))
    assert found == [("", "a"), ("", "g"), ("a", "b"), ("a/b", "f")]


def test_disk_usage_counts_files_and_is_zero_when_gone(tmp_path: Path) -> None:
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "t" / "a" / "f").write_bytes(os.urandom(64 * 1024))
    assert trees.disk_usage(str(tmp_path / "t")) >= 64 * 1024
    assert trees.disk_usage(str(tmp_path / "gone")) == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_walk_skips_directories_it_cannot_open(tmp_path: Path) -> None:
    (tmp_path / "t" / "closed").mkdir(parents=True)
    (tmp_path / "t" / "closed" / "f").write_text("x")
    (tmp_path / "t" / "closed").chmod(0)
    try:
        assert [name for _, name, _ in trees.walk(str(tmp_path / "t"))] == ["closed"]
    finally:
        (tmp_path / "t" / "closed").chmod(0o700)

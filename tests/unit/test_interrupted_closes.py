"""A signal's exception between a descriptor's close and its bookkeeping never closes it twice.

`singpy.image.tools.Interruptible` turns SIGINT, SIGTERM and SIGHUP into an exception at whatever bytecode the main
thread is at. Code that closes a descriptor and only then forgets it can be cut between the two, and its clean-up
closes the number again: EBADF replaced the signal in a pull's FATAL line ("can't convert ...: Bad file
descriptor", seen in a check run), and in a process with other threads the second close can close a file one of
them opened meanwhile under that number. Each walk below is run once to count its closes, then once per close
with the exception raised right after it: what comes out must be that exception, and no close may fail.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from singpy.image import trees
from singpy.image.tools import Interrupted
from singpy.mounts.rootpath import Tree
from singpy.oci import layertree


class _Cut:
    """os.close, raising Interrupted right after close number `at` (0: never); it counts the closes and keeps the
    errors of any that failed. Only this thread's: another's (the test runner's) is passed through."""

    def __init__(self, at: int) -> None:
        self.at, self.count = at, 0
        self.failed: list[int] = []
        self.real = os.close
        self.thread = threading.get_ident()

    def __call__(self, fd: int) -> None:
        if threading.get_ident() != self.thread:
            self.real(fd)
            return
        try:
            self.real(fd)
        except OSError as error:
            self.failed.append(error.errno or 0)
            raise
        self.count += 1
        if self.count == self.at:
            raise Interrupted("interrupted by SIGINT")


def _closes(walk: Callable[[], None], at: int, under: Path) -> _Cut:
    """`walk` with os.close cut at `at`; what a cut left open below `under` is closed after (and only that:
    the test runner's descriptors are not ours)."""
    before = set(os.listdir("/proc/self/fd"))
    cut = _Cut(at)
    os.close = cut
    try:
        walk()
    except Interrupted:
        assert at, "cut without being asked to"
    finally:
        os.close = cut.real
    for name in set(os.listdir("/proc/self/fd")) - before:
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(f"{under}/"):
                os.close(int(name))
        except OSError:  # the listing's own descriptor, gone already
            continue
    return cut


def _every_cut(make: Callable[[], Callable[[], None]], under: Path) -> int:
    """Runs `make()`'s walk whole, then cut after each of its closes; the number of closes."""
    total = _closes(make(), 0, under).count
    assert total > 0
    for at in range(1, total + 1):
        cut = _closes(make(), at, under)
        failed = [errno.errorcode.get(number, str(number)) for number in cut.failed]
        assert failed == [], f"cut after close {at} of {total}: a close failed with {failed}"
        assert cut.count >= at
    return total


def _tree(root: Path) -> Path:
    for path in ("a/b/c/d", "a/e/f", "g"):
        (root / path).mkdir(parents=True, exist_ok=True)
    for path in ("a/one", "a/b/two", "a/b/c/d/three", "g/four"):
        (root / path).write_text("x")
    (root / "a" / "link").symlink_to("b/c")
    (root / "a" / "b" / "c").chmod(0o500)  # read-only, as an image may carry: remove makes it writable
    return root


def test_removing_a_tree(tmp_path: Path) -> None:
    made = iter(range(1000))

    def make() -> Callable[[], None]:
        top = _tree(tmp_path / f"tree{next(made)}")
        return lambda: trees.remove(str(top))

    assert _every_cut(make, tmp_path) >= 6


def test_lookups_inside_a_root(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")

    def make() -> Callable[[], None]:
        def walk() -> None:
            with Tree(str(root)) as tree:
                for guest in ("/a/b/c/d/three", "/a/link/d", "/a/b/../e/f", "/g/four", "/a/missing/x"):
                    found = tree.lookup(guest)
                    if found.fd is not None:
                        os.close(found.fd)
                for guest in ("/a/missing/one", "/a/missing/two", "/a/b/c/d"):
                    found = tree.locate(guest)
                    if found.fd is not None:
                        os.close(found.fd)
        return walk

    assert _every_cut(make, tmp_path) >= 6


def test_a_layers_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layertree, "MAX_CACHED", 2)  # deep paths then hold a spare descriptor on the way
    made = iter(range(1000))

    def make() -> Callable[[], None]:
        root = tmp_path / f"layer{next(made)}"
        root.mkdir()

        def walk() -> None:
            state = layertree.LayerTree(str(root), None, "a test layer")
            try:
                state.directory(["usr", "lib", "x86_64-linux-gnu", "deep"], create=True)
                state.directory(["usr", "share", "doc", "deeper", "still"], create=True)
                state.drop_cache(keep="usr/share/doc")
                state.directory(["usr", "share", "doc", "deeper"], create=False)
            finally:
                state.close()
        return walk

    assert _every_cut(make, tmp_path) >= 6

"""singpy.mounts.rootpath: guest paths resolved inside an image root, on real trees with real symlinks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.errors import PathError
from singpy.mounts.rootpath import Tree, is_under, resolve


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A small image tree: usr-merged /bin and /lib, relative and absolute links, chains and traps."""
    base = tmp_path / "rootfs"
    for directory in ("usr/bin", "usr/lib/x86_64", "etc/alternatives", "opt/app/data", "home/alice", "var"):
        (base / directory).mkdir(parents=True)
    (base / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.symlink("usr/bin", base / "bin")  # relative, at the top
    os.symlink("/usr/lib", base / "lib")  # absolute: must stay inside the root
    os.symlink("/etc/alternatives", base / "opt" / "alt")
    os.symlink("../usr/lib/x86_64", base / "opt" / "arch")  # relative with '..'
    os.symlink("step2", base / "opt" / "step1")  # a chain: step1 -> step2 -> /opt/app/data
    os.symlink("/opt/step3", base / "opt" / "step2")
    os.symlink("app/./data/", base / "opt" / "step3")
    os.symlink("loop-b", base / "opt" / "loop-a")
    os.symlink("loop-a", base / "opt" / "loop-b")
    os.symlink("self", base / "opt" / "self")
    os.symlink("../../..", base / "opt" / "evil")  # climbs above the root: stops at it, as inside
    os.symlink("/../etc", base / "opt" / "abs-evil")
    os.symlink("/", base / "opt" / "to-root")
    os.symlink("/nonexistent/dir", base / "opt" / "dangling")
    os.symlink("/etc/passwd", base / "opt" / "passwd-link")
    os.symlink("/proc/self/root", base / "opt" / "magic")  # a magic link on the host: a plain path inside
    os.symlink("..", base / "var" / "up")  # fine: /var/.. is /
    return str(base)


@pytest.fixture
def tree(root: str) -> Iterator[Tree]:
    with Tree(root) as opened:
        yield opened


@pytest.mark.parametrize(
    ("guest", "expected", "exists"),
    [
        ("/", "/", True),
        ("", "/", True),
        ("/etc/passwd", "/etc/passwd", True),
        ("etc/passwd", "/etc/passwd", True),
        ("//etc///passwd/", "/etc/passwd", True),
        ("/etc/./passwd", "/etc/passwd", True),
        ("/opt/app/../app/data", "/opt/app/data", True),
        ("/bin", "/usr/bin", True),
        ("/bin/sh", "/usr/bin/sh", False),
        ("/lib/x86_64", "/usr/lib/x86_64", True),
        ("/opt/alt/python", "/etc/alternatives/python", False),
        ("/opt/arch/libc.so", "/usr/lib/x86_64/libc.so", False),
        ("/opt/step1", "/opt/app/data", True),
        ("/opt/step1/file", "/opt/app/data/file", False),
        ("/opt/to-root", "/", True),
        ("/opt/to-root/etc/passwd", "/etc/passwd", True),
        ("/opt/dangling", "/nonexistent/dir", False),
        ("/opt/dangling/more/parts", "/nonexistent/dir/more/parts", False),
        ("/opt/passwd-link", "/etc/passwd", True),
        ("/missing/a/b", "/missing/a/b", False),
        ("/var/up/etc", "/etc", True),
        ("/opt/arch/..", "/usr/lib", True),
        ("/home/alice/../alice/./x", "/home/alice/x", False),
        ("/opt/evil", "/", True),
        ("/opt/evil/etc/passwd", "/etc/passwd", True),
        ("/opt/abs-evil", "/etc", True),
        ("/..", "/", True),
        ("/../etc", "/etc", True),
        ("/etc/../../etc", "/etc", True),
        ("/opt/magic/etc", "/proc/self/root/etc", False),
    ],
    ids=["root", "empty", "plain-file", "relative-guest", "extra-slashes", "dot", "dot-dot-inside",
         "relative-link", "through-relative-link", "absolute-link-in-root", "absolute-link-below",
         "relative-link-with-dotdot", "chain", "chain-then-more", "link-to-root", "through-link-to-root",
         "dangling-absolute", "missing-tail-after-dangling", "link-to-file", "missing-tail", "dotdot-link-within-root",
         "dotdot-after-link", "dotdot-plain", "dotdot-link-stops-at-root", "through-dotdot-link",
         "absolute-dotdot-link", "root-dotdot", "root-dotdot-etc", "dotdot-past-root", "magic-link-is-a-plain-path"],
)
def test_lookup(tree: Tree, guest: str, expected: str, exists: bool) -> None:
    found = tree.lookup(guest)
    assert found.path == expected
    assert (found.fd is not None) is exists
    if found.fd is not None:
        assert os.path.samestat(os.fstat(found.fd), os.stat(tree.root + expected))
        os.close(found.fd)
    else:
        assert found.missing and found.path.endswith("/".join(found.missing))
    located = tree.locate(guest)  # the same answer, without a descriptor
    assert (located.path, bool(located.missing), located.fd) == (expected, not exists, None)


@pytest.mark.parametrize("guest", ["/opt/loop-a", "/opt/loop-b/x", "/opt/self"], ids=["loop", "loop-below", "self"])
def test_link_loop_is_an_error(tree: Tree, guest: str) -> None:
    with pytest.raises(PathError, match="too many levels of symbolic links"):
        tree.lookup(guest)


@pytest.mark.parametrize(("guest", "message"), [
    ("/etc/passwd/beyond", "/etc/passwd is not a directory"),
    ("/missing/../etc", "/missing does not exist"),
    ("/" + "x" * 300, "File name too long"),
], ids=["below-a-file", "dotdot-below-missing", "name-too-long"])
def test_paths_that_lead_nowhere(tree: Tree, guest: str, message: str) -> None:
    with pytest.raises(PathError, match=message):
        tree.lookup(guest)


def test_an_absolute_link_to_a_host_path_stays_in_the_root(root: str, tmp_path: Path, tree: Tree) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("host data\n")
    os.symlink(str(tmp_path / "outside"), Path(root) / "opt" / "host-abs")
    found = tree.lookup("/opt/host-abs/secret")
    assert found.fd is None and found.path == f"{tmp_path}/outside/secret"
    assert tree.read("/opt/host-abs/secret", limit=100) is None  # the host file is never reached


def test_lookup_without_follow_returns_the_link(tree: Tree) -> None:
    found = tree.lookup("/opt/dangling", follow=False)
    assert found.fd is not None and found.path == "/opt/dangling"
    assert os.readlink("", dir_fd=found.fd) == "/nonexistent/dir"
    os.close(found.fd)


def test_forty_links_is_the_limit(tmp_path: Path) -> None:
    base = tmp_path / "chain"
    base.mkdir()
    (base / "l0").mkdir()
    for index in range(1, 42):
        os.symlink(f"l{index - 1}", base / f"l{index}")
    with Tree(str(base)) as tree:
        found = tree.lookup("/l40")
        assert found.path == "/l0" and found.fd is not None
        os.close(found.fd)
        with pytest.raises(PathError, match="too many levels"):
            tree.lookup("/l41")


# --- reading: regular files only, bounded -----------------------------------------------------------


def test_read_regular_file_through_links(tree: Tree) -> None:
    assert tree.read("/opt/passwd-link", limit=1000) == b"root:x:0:0::/root:/bin/sh\n"
    assert tree.read("/etc/missing", limit=1000) is None


@pytest.mark.parametrize("kind", ["fifo", "directory", "link-to-fifo", "too-large"])
def test_read_refuses_what_is_not_a_small_regular_file(root: str, tree: Tree, kind: str) -> None:
    base = Path(root)
    if kind == "fifo":
        os.mkfifo(base / "etc" / "group")  # opened for reading, it would block: it is never opened
    elif kind == "directory":
        (base / "etc" / "group").mkdir()
    elif kind == "link-to-fifo":
        os.mkfifo(base / "opt" / "fifo")
        os.symlink("/opt/fifo", base / "etc" / "group")
    else:
        (base / "etc" / "group").write_bytes(b"x" * 2000)
    with pytest.raises(PathError) as caught:
        tree.read("/etc/group", limit=1000)
    expected = {"fifo": "is a FIFO", "directory": "is a directory", "link-to-fifo": "(it leads to /opt/fifo) is a FIFO",
                "too-large": "too large"}[kind]
    assert expected in caught.value.message


# --- creating: below the found parent, never through a link -------------------------------------------------


def test_make_creates_the_missing_components(root: str, tree: Tree) -> None:
    found = tree.lookup("/opt/step1/new/dir/file")
    assert found.missing == ("new", "dir", "file")
    leaf = tree.make(found, directory=False)
    assert os.path.isfile(Path(root) / "opt" / "app" / "data" / "new" / "dir" / "file")
    assert found.name == "file" and not found.missing and found.fd == leaf
    again = tree.reopen(found)  # the leaf, through its own parent
    assert os.path.samestat(os.fstat(again), os.fstat(leaf))
    os.close(again)
    os.close(leaf)


def test_make_refuses_a_name_that_appeared_meanwhile(root: str, tree: Tree, tmp_path: Path) -> None:
    found = tree.lookup("/opt/raced")
    os.symlink(str(tmp_path), Path(root) / "opt" / "raced")  # swapped in between lookup and creation
    with pytest.raises(PathError, match="File exists"):
        tree.make(found, directory=True)
    assert not (tmp_path / "raced").exists()


def test_no_descriptor_leaks(root: str) -> None:
    before = set(os.listdir("/proc/self/fd"))
    with Tree(root) as tree:
        for guest in ["/bin/sh", "/opt/step1/x", "/opt/to-root", "/etc/passwd", "/missing/a", "/opt/arch/.."]:
            found = tree.lookup(guest)
            if found.fd is not None:
                os.close(found.fd)
        with pytest.raises(PathError):
            tree.lookup("/opt/loop-a")
        tree.read("/etc/passwd", limit=100)
    assert set(os.listdir("/proc/self/fd")) == before


def test_locating_many_names_below_a_missing_directory(root: str) -> None:
    """A survey asks about ~64 libraries in a directory the image lacks (remembered after the first walk):
    every answer is the fresh walk's, names of a linked path included, and no descriptor is left open."""
    before = set(os.listdir("/proc/self/fd"))
    guests = [f"{directory}/lib{index}.so" for directory in ("/usr/lib/x86_64-linux-gnu", "/opt/dangling", "/lib/a")
              for index in range(3)] + ["/etc/passwd", "/usr/lib/x86_64-linux-gnu/lib0.so"]
    with Tree(root) as tree:
        located = [tree.locate(guest) for guest in guests]
        answers = [(found.path, found.missing, found.fd) for found in located]
        for guest, answer in zip(guests, answers, strict=True):
            with Tree(root) as fresh:
                found = fresh.locate(guest)
                assert answer == (found.path, found.missing, found.fd)
    assert answers[0] == ("/usr/lib/x86_64-linux-gnu/lib0.so", ("x86_64-linux-gnu", "lib0.so"), None)
    assert answers[3][0] == "/nonexistent/dir/lib0.so"
    assert answers[-2] == ("/etc/passwd", (), None)
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_remembered_directory_is_forgotten_after_a_mount_on_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    with Tree(str(root)) as tree:
        found = tree.lookup("/data/x")
        assert found.fd is None
        (root / "data").rename(root / "old")
        (root / "data").symlink_to("/elsewhere")  # what a mount on /data could do to the path
        tree.forget("/data")
        assert tree.lookup("/data/x").path == "/elsewhere/x"


# --- host paths (bind sources) ------------------------------------------------------------------------------


def test_resolve_re_roots_host_links(root: str) -> None:
    assert resolve(root, "/lib/x86_64") == root + "/usr/lib/x86_64"
    assert resolve(root, "/opt/evil/etc") == root + "/etc"
    assert resolve(root, "/missing/x") == root + "/missing/x"


@pytest.mark.parametrize(
    ("path", "parent", "expected"),
    [
        ("/a", "/a", True),
        ("/a/b", "/a", True),
        ("/a/b/c", "/a", True),
        ("/ab", "/a", False),
        ("/a", "/a/b", False),
        ("/x", "/", True),
        ("/", "/", True),
        ("/a/b", "/a/", True),
        ("/home/alice2", "/home/alice", False),
        ("/home/alice/x", "/home/alice", True),
    ],
    ids=["same", "child", "grandchild", "prefix-not-child", "parent-not-under-child", "under-root", "root-itself",
         "parent-trailing-slash", "sibling-with-prefix", "home-child"],
)
def test_is_under(path: str, parent: str, expected: bool) -> None:
    assert is_under(path, parent) is expected

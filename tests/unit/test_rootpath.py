"""singpy.mounts.rootpath: guest paths resolved inside a container root, on real trees with real symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.errors import BindSpecError
from singpy.mounts.rootpath import Resolver, is_under, resolve


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
    os.symlink("../../..", base / "opt" / "evil")  # climbs above the root
    os.symlink("/../etc", base / "opt" / "abs-evil")
    os.symlink("/", base / "opt" / "to-root")
    os.symlink("/nonexistent/dir", base / "opt" / "dangling")
    os.symlink("/etc/passwd", base / "opt" / "passwd-link")
    os.symlink("..", base / "var" / "up")  # fine: /var/.. is /
    return str(base)


@pytest.mark.parametrize(
    ("guest", "expected"),
    [
        ("/", ""),
        ("", ""),
        ("/etc/passwd", "/etc/passwd"),
        ("etc/passwd", "/etc/passwd"),
        ("//etc///passwd/", "/etc/passwd"),
        ("/etc/./passwd", "/etc/passwd"),
        ("/opt/app/../app/data", "/opt/app/data"),
        ("/bin", "/usr/bin"),
        ("/bin/sh", "/usr/bin/sh"),
        ("/lib/x86_64", "/usr/lib/x86_64"),
        ("/opt/alt/python", "/etc/alternatives/python"),
        ("/opt/arch/libc.so", "/usr/lib/x86_64/libc.so"),
        ("/opt/step1", "/opt/app/data"),
        ("/opt/step1/file", "/opt/app/data/file"),
        ("/opt/to-root", ""),
        ("/opt/to-root/etc/passwd", "/etc/passwd"),
        ("/opt/dangling", "/nonexistent/dir"),
        ("/opt/dangling/more/parts", "/nonexistent/dir/more/parts"),
        ("/opt/passwd-link", "/etc/passwd"),
        ("/missing/a/b", "/missing/a/b"),
        ("/etc/passwd/beyond", "/etc/passwd/beyond"),
        ("/var/up/etc", "/etc"),
        ("/opt/arch/..", "/usr/lib"),
        ("/home/alice/../alice/./x", "/home/alice/x"),
    ],
    ids=["root", "empty", "plain-file", "relative-guest", "extra-slashes", "dot", "dot-dot-inside",
         "relative-link", "through-relative-link", "absolute-link-in-root", "absolute-link-below",
         "relative-link-with-dotdot", "chain", "chain-then-more", "link-to-root", "through-link-to-root",
         "dangling-absolute", "missing-tail-after-dangling", "link-to-file", "missing-tail", "below-a-file",
         "dotdot-link-within-root", "dotdot-after-link", "dotdot-plain"],
)
def test_resolve(root: str, guest: str, expected: str) -> None:
    assert resolve(root, guest) == root + expected


@pytest.mark.parametrize("guest", ["/opt/loop-a", "/opt/loop-b/x", "/opt/self"], ids=["loop", "loop-below", "self"])
def test_resolve_link_loop(root: str, guest: str) -> None:
    with pytest.raises(BindSpecError, match="too many levels of symbolic links"):
        resolve(root, guest)


@pytest.mark.parametrize(
    "guest",
    ["/opt/evil", "/opt/evil/etc/shadow", "/opt/abs-evil", "/..", "/../etc", "/etc/../../etc", "../x"],
    ids=["evil-link", "evil-link-below", "absolute-dotdot-link", "root-dotdot", "root-dotdot-etc",
         "dotdot-past-root", "relative-dotdot"],
)
def test_resolve_escape_is_refused(root: str, guest: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        resolve(root, guest)
    assert "escapes the container root" in caught.value.message
    assert guest in caught.value.message


def test_resolve_never_leaves_the_root(root: str, tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    os.symlink(str(tmp_path / "outside"), Path(root) / "opt" / "host-abs")  # absolute host path: re-rooted
    assert resolve(root, "/opt/host-abs") == root + str(tmp_path / "outside")


def test_resolve_forty_links_is_the_limit(tmp_path: Path) -> None:
    base = tmp_path / "chain"
    base.mkdir()
    (base / "l0").mkdir()
    for index in range(1, 42):
        os.symlink(f"l{index - 1}", base / f"l{index}")
    assert resolve(str(base), "/l40") == str(base / "l0")
    with pytest.raises(BindSpecError, match="too many levels"):
        resolve(str(base), "/l41")


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


# --- Resolver: resolve() with the last parent remembered ------------------------------------------


def test_resolver_agrees_with_resolve_through_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "usr" / "lib" / "libfoo.so.1").write_text("")
    (root / "usr" / "lib" / "libfoo.so").symlink_to("/usr/lib/libfoo.so.1")
    (root / "usr" / "lib" / "loop").symlink_to("../../lib/loop")
    resolver = Resolver(str(root))
    for guest in ["/lib/libfoo.so.1", "/lib/libfoo.so", "/lib/missing", "/usr/lib/libfoo.so.1", "/lib",
                  "/", "/lib/libfoo.so.1", "/new/dir/file"]:
        assert resolver(guest) == resolve(str(root), guest), guest
    with pytest.raises(BindSpecError):
        resolver("/lib/loop")


def test_resolver_forgets_a_parent_changed_by_a_mount(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    resolver = Resolver(str(root))
    assert resolver("/data/x") == str(root / "data" / "x")
    (root / "data").rmdir()
    (root / "data").symlink_to("/elsewhere")  # what a mount on /data could do to the path
    resolver.forget("/data")
    assert resolver("/data/x") == str(root / "elsewhere" / "x")


def test_resolve_after_a_missing_component_and_back(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "link").symlink_to("/target")
    (root / "jump").symlink_to("missing/../real/link")
    assert resolve(str(root), "/jump/x") == str(root / "target" / "x")
    assert resolve(str(root), "/missing/deeper/x") == str(root / "missing" / "deeper" / "x")

"""singpy.oci.tarmerge Index.directory's walk options: `follow` (the last link) and `visited` (every directory
entered), the one walk that singpy.oci.streaminstall also uses to pick the directories its scratch tree needs."""

from __future__ import annotations

import tarfile

import pytest

from singpy.oci.streaminstall import _visit
from singpy.oci.tarmerge import Dir, Index, Unsupported


def index_with(*entries: tuple[str, str, str]) -> Index:
    index = Index(as_root=False, root_mode=0o755)
    for kind, name, target in entries:
        info = tarfile.TarInfo(name)
        info.type = {"dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE, "file": tarfile.REGTYPE}[kind]
        info.mode = 0o755
        info.linkname = target
        index.apply(info)
    index.end_layer()
    return index


def node_at(index: Index, path: str) -> Dir:
    here = index.root
    for name in path.strip("/").split("/"):
        below = here.children[name]
        assert isinstance(below, Dir)
        here = below
    return here


IMAGE = (("dir", "usr/lib/real", ""), ("dir", "etc", ""), ("link", "lib", "usr/lib/real"),
         ("link", "abs", "/usr/lib"), ("link", "up", "../etc"), ("file", "usr/file", ""))


def test_visited_holds_every_directory_entered_by_its_resolved_path() -> None:
    index = index_with(*IMAGE)
    visited: dict[str, Dir] = {}
    found = index.directory(["lib", "..", "..", "..", "etc"], create=False, visited=visited)
    assert found is not None and found[1] == "/etc"
    # lib -> usr/lib/real, then three "..": real, lib and usr are left, but were entered
    assert list(visited) == ["/usr", "/usr/lib", "/usr/lib/real", "/etc"]
    assert all(visited[path] is node_at(index, path) for path in visited)


def test_an_absolute_link_starts_again_at_the_root() -> None:
    index = index_with(*IMAGE)
    visited: dict[str, Dir] = {}
    found = index.directory(["usr", "lib", "real", "..", "..", "..", "abs", "real"], create=False, visited=visited)
    assert found is not None and found[1] == "/usr/lib/real"
    assert sorted(visited) == ["/usr", "/usr/lib", "/usr/lib/real"]


def test_the_last_link_is_followed_only_when_asked() -> None:
    index = index_with(*IMAGE)
    followed = index.directory(["up"], create=False)
    assert followed is not None and followed[1] == "/etc"
    with pytest.raises(Unsupported, match="a link not followed"):
        index.directory(["up"], create=False, follow=False)
    through = index.directory(["lib", "..", "real"], create=False, follow=False)  # a link before the end is
    assert through is not None and through[1] == "/usr/lib/real"                   # followed all the same


def test_directories_made_on_the_way_are_visited_too() -> None:
    index = index_with(*IMAGE)
    visited: dict[str, Dir] = {}
    found = index.directory(["abs", "new", "deeper"], create=True, visited=visited)
    assert found is not None and found[1] == "/usr/lib/new/deeper"
    assert list(visited) == ["/usr", "/usr/lib", "/usr/lib/new", "/usr/lib/new/deeper"]
    assert visited["/usr/lib/new/deeper"] is node_at(index, "/usr/lib/new/deeper")


@pytest.mark.parametrize(("guest", "follow", "expected"), [
    ("/usr/file/below", True, ["/", "/usr"]),  # stops at the file, keeps what it passed
    ("/lib/missing/x", True, ["/", "/usr", "/usr/lib", "/usr/lib/real"]),  # stops at the missing name
    ("/up", False, ["/"]),  # the last link, not followed, leads to no directory
    ("/up", True, ["/", "/etc"]),
])
def test_streaminstall_visit_records_what_the_walk_passes_and_stops_quietly(
        guest: str, follow: bool, expected: list[str]) -> None:
    index = index_with(*IMAGE)
    seen: dict[str, Dir] = {"/": index.root}
    _visit(index, guest, follow, seen)
    assert sorted(seen) == expected


def test_a_loop_of_links_stops_the_visit_without_an_error() -> None:
    index = index_with(("link", "a", "b"), ("link", "b", "a"), ("dir", "d", ""))
    seen: dict[str, Dir] = {"/": index.root}
    _visit(index, "/d/../a/x", True, seen)
    assert sorted(seen) == ["/", "/d"]
    with pytest.raises(Unsupported, match="too many levels"):
        index.directory(["a", "x"], create=False)

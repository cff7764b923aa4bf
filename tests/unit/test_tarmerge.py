"""singpy.oci.tarmerge: the image's final tree from its layers' headers, as the tree path (singpy.oci.layers) makes it.

The cases name what the merged stream must get right; the last test applies random layers both ways, the real
tree path to a directory and the Index in memory, and requires the same tree (kinds, link targets, file data,
hard links, modes) or, where the tree path refuses a layer, that the Index refuses it too (the stream then falls
back to the tree path, which says why).
"""

from __future__ import annotations

import gzip
import io
import os
import random
import stat
import tarfile
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.oci.layers import apply_layer
from singpy.oci.owners import Ownership
from singpy.oci.streamdata import Offsets, header, send_ranges
from singpy.oci.streams import open_layer
from singpy.oci.tarmerge import Dir, File, Index, Link, Node, Special, Unsupported

Entry = tuple[str, str, str]  # (kind, name, link target or file content)


def member(kind: str, name: str, extra: str = "", *, mode: int = 0o644, pax: dict[str, str] | None = None
           ) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "link": tarfile.SYMTYPE,
                 "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
    info.mode = mode
    if kind in ("link", "hard"):
        info.linkname = extra
    elif kind == "file":
        info.size = len(extra.encode())
    if pax:
        info.pax_headers = pax
    return info


def index_of(*layers: list[Entry], as_root: bool = False) -> Index:
    index = Index(as_root=as_root, root_mode=0o755)
    for layer in layers:
        for kind, name, extra in layer:
            index.apply(member(kind, name, extra))
        index.end_layer()
    return index


def listing(index: Index) -> dict[str, str]:
    shown = {}
    for path, node in index.walk():
        shown[path] = node.kind + (f" -> {node.target}" if isinstance(node, Link) else "")
    return shown


def test_parents_resolve_through_relative_and_absolute_links() -> None:
    index = index_of([("dir", "usr/lib/real", ""), ("link", "lib", "usr/lib/real"), ("link", "abs", "/usr/lib")],
                     [("file", "lib/x", "1"), ("file", "abs/real/y", "2"), ("file", "abs/../../../z", "3")])
    assert listing(index) == {"abs": "l -> /usr/lib", "lib": "l -> usr/lib/real", "usr": "d", "usr/lib": "d",
                              "usr/lib/real": "d", "usr/lib/real/x": "f", "usr/lib/real/y": "f", "z": "f"}


def test_a_dangling_link_on_the_way_makes_its_target() -> None:
    index = index_of([("link", "etc", "/nowhere/etc")], [("file", "etc/hosts", "h")])
    assert listing(index)["nowhere/etc/hosts"] == "f"


def test_whiteouts_hide_lower_layers_only() -> None:
    index = index_of([("file", "d/old", "o"), ("file", "d/keep", "k"), ("file", "o/gone", "g")],
                     [("file", "d/new", "n"), ("file", "d/.wh.new", ""), ("file", "d/.wh.old", ""),
                      ("file", "o/.wh..wh..opq", ""), ("file", "o/mine", "m")])
    assert sorted(listing(index)) == ["d", "d/keep", "d/new", "o", "o/mine"]


def test_kinds_replace_each_other_and_a_directory_keeps_its_children() -> None:
    index = index_of([("dir", "a", ""), ("file", "a/in", "x"), ("file", "b", "y"), ("dir", "c", ""),
                      ("file", "c/kept", "z")],
                     [("file", "a", "now a file"), ("dir", "b", ""), ("dir", "c", "")])
    assert listing(index) == {"a": "f", "b": "d", "c": "d", "c/kept": "f"}


def test_a_hard_link_is_one_file_and_keeps_its_data_when_the_name_is_replaced() -> None:
    index = index_of([("file", "t", "old")], [("hard", "h", "t")], [("file", "t", "new")])
    nodes = dict(index.walk())
    assert isinstance(nodes["h"], File) and isinstance(nodes["t"], File)
    assert nodes["h"].source == (0, 0) and nodes["t"].source == (2, 0)


@pytest.mark.parametrize("layer", [
    [("link", "l", "x"), ("hard", "h", "l")],  # a hard link to a symbolic link
    [("hard", "h", "../../etc/shadow")],  # to nothing in the image
    [("file", "f", "x"), ("file", "f/under", "y")],  # a path through a file
    [("link", "a", "b"), ("link", "b", "a"), ("file", "a/x", "")],  # a loop
    [("link", "l", "missing/../x"), ("file", "l/y", "")],  # '..' below a missing directory
    [("file", "d/" + "x" * 256, "")],  # a name over NAME_MAX (255 bytes)
    [("file", "é" * 128 + "/f", "")],  # 128 characters, 256 bytes
    [("file", "\U0001f600" * 64, "")],  # 64 characters, 256 bytes
    [("file", "etc/passwd\0.txt", "")],  # a NUL byte: tar2sqfs would store the name up to it
    [("link", "l", "etc/passwd\0x")],  # in a link's target too
])
def test_what_the_stream_cant_express_is_unsupported(layer: list[Entry]) -> None:
    with pytest.raises(Unsupported):
        index_of(layer)


def test_extended_attributes_are_unsupported_as_root_only() -> None:
    capability = {"SCHILY.xattr.security.capability": "x"}
    Index(as_root=False, root_mode=0o755).apply(member("file", "ping", pax=capability))
    with pytest.raises(Unsupported):
        Index(as_root=True, root_mode=0o755).apply(member("file", "ping", pax=capability))


# -- the tree path and the Index on random layers ----------------------------------------------------------------

_NAMES = ["a", "b", "c", "a/b", "a/c", "b/a", "c/a/b", "a/b/c"]
_TARGETS = ["a", "b", "/c", "../a", "a/b", "/a/b", "nowhere", "."]


def random_layer(rng: random.Random, number: int, files: list[str]) -> list[Entry]:
    """Up to 8 entries on a few names; `files` (names given a file so far) is where hard links point."""
    entries: list[Entry] = []
    for count in range(rng.randint(1, 8)):
        name = rng.choice(_NAMES)
        kind = rng.choice(["file", "file", "dir", "dir", "dir", "link", "hard", "whiteout", "opaque"])
        if kind == "whiteout":
            head, _, base = name.rpartition("/")
            entries.append(("file", f"{head}/.wh.{base}" if head else f".wh.{base}", ""))
        elif kind == "opaque":
            entries.append(("file", f"{name}/.wh..wh..opq", ""))
        elif kind == "link":
            entries.append(("link", name, rng.choice(_TARGETS)))
        elif kind == "hard" and files:
            entries.append(("hard", name, rng.choice(files)))
        else:
            kind = "file" if kind == "hard" else kind
            entries.append((kind, name, f"layer {number} entry {count}" if kind == "file" else ""))
            if kind == "file":
                files.append(name)
    return entries


def tar_of(layer: list[Entry]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for kind, name, extra in layer:
            info = member(kind, name, extra, mode=0o755 if kind == "dir" else 0o640)
            archive.addfile(info, io.BytesIO(extra.encode()) if kind == "file" else None)
    data.seek(0)
    return data


def on_disk(root: Path, ownership: Ownership) -> dict[str, tuple[str, str, int]]:
    """path -> (kind, link target or file data, mode recorded) of the tree, with inode numbers for hard links."""
    found = {}
    for where, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(where, name)
            guest = "/" + os.path.relpath(path, root)
            info = os.lstat(path)
            recorded = ownership.get(guest)
            mode = recorded[1] if recorded else -1
            if stat.S_ISLNK(info.st_mode):
                found[guest[1:]] = ("l", os.readlink(path), 0o777)
            elif stat.S_ISDIR(info.st_mode):
                found[guest[1:]] = ("d", "", mode)
            else:
                found[guest[1:]] = ("f", Path(path).read_text() + f"@{info.st_ino}", mode)
    return found


def in_memory(index: Index, layers: list[list[Entry]]) -> dict[str, tuple[str, str, int]]:
    """As on_disk, from the Index: a File's identity in place of an inode number."""
    return {path: _described(node, layers) for path, node in index.walk()}


def _described(node: Node, layers: list[list[Entry]]) -> tuple[str, str, int]:
    if isinstance(node, Link):
        return ("l", node.target, 0o777)
    if isinstance(node, Dir):
        return ("d", "", node.mode)
    assert isinstance(node, File) and node.source is not None
    layer, ordinal = node.source
    return ("f", layers[layer][ordinal][2] + f"@{id(node)}", node.mode)


def _apply_all(index: Index, layers: list[list[Entry]]) -> None:
    for layer in layers:
        for kind, name, extra in layer:
            index.apply(member(kind, name, extra, mode=0o755 if kind == "dir" else 0o640))
        index.end_layer()


def _without_identity(tree: dict[str, tuple[str, str, int]]) -> dict[str, tuple[str, str, int]]:
    return {path: (kind, data.rsplit("@", 1)[0] if kind == "f" else data, mode) for path, (kind, data, mode) in
            tree.items()}


def _same_file(tree: dict[str, tuple[str, str, int]]) -> dict[str, frozenset[str]]:
    """path -> the paths that are the same file (hard links)."""
    files = {path: data for path, (kind, data, _) in tree.items() if kind == "f"}
    return {path: frozenset(other for other in files if files[other] == data) for path, data in files.items()}


@pytest.mark.parametrize("seed", range(300))
def test_random_layers_give_the_tree_paths_tree(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    files: list[str] = []
    layers = [random_layer(rng, number, files) for number in range(rng.randint(1, 4))]
    root = tmp_path / "root"
    root.mkdir()
    ownership = Ownership()
    index = Index(as_root=False, root_mode=0o755)
    try:
        for number, layer in enumerate(layers):
            apply_layer(str(root), tar_of(layer), ownership=ownership, source=f"layer {number}")
    except ImageError:  # refused: the Index must refuse it too, so that the tree path says why
        with pytest.raises(Unsupported):
            _apply_all(index, layers)
        return
    try:
        _apply_all(index, layers)
    except Unsupported:
        return  # the stream falls back: the tree path converts it
    disk, memory = on_disk(root, ownership), in_memory(index, layers)
    assert _without_identity(memory) == _without_identity(disk), layers
    assert _same_file(memory) == _same_file(disk), layers


# -- the stream's data pass (singpy.oci.streamdata) ------------------------------------------------------------


def tarfile_header(path: str, node: Node, size: int) -> bytes:
    """What tarfile itself writes for `node` (the stream's headers must be these bytes)."""
    info = tarfile.TarInfo(path)
    info.type = {"f": tarfile.REGTYPE, "d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "p": tarfile.FIFOTYPE,
                 "c": tarfile.CHRTYPE, "b": tarfile.BLKTYPE}[node.kind]
    info.mode, info.uid, info.gid, info.mtime, info.size = node.mode, node.uid, node.gid, node.mtime, size
    info.uname = info.gname = ""
    info.linkname = node.target if isinstance(node, Link) else ""
    if isinstance(node, Special):
        info.devmajor, info.devminor = node.major, node.minor
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


@pytest.mark.parametrize("path", ["a", "usr/lib/x.so", "x" * 99, "x" * 100, "y" * 101, "caf\udcff", "é/x",
                                  "with space", "d/" * 49 + "d"])
def test_the_streams_headers_are_the_bytes_tarfile_writes(path: str) -> None:
    nodes: list[tuple[Node, int]] = [
        (File(0o644, 0, 0, 1_700_000_000, source=(0, 1), size=12345), 12345),
        (File(0o4755, 1 << 21, 5, 0, source=None, size=2, content=b"hi"), 2),
        (File(0o600, (1 << 32) - 2, (1 << 21) - 1, (1 << 32) - 1, source=(1, 0), size=1 << 33), 1 << 33),
        (Dir(0o1777, 1000, 1000, 1 << 33), 0), (Dir(0o755, 0, 0, 0), 0),
        (Link("t", 0, 0, 5), 0), (Link("t" * 100, 0, 0, 5), 0), (Link("t" * 101, 0, 0, 5), 0), (Link("é", 1, 1, 1), 0),
        (Special("c", 0o666, 0, 0, 7, 1, 3), 0), (Special("b", 0o600, 0, 0, 7, 4095, (1 << 20) - 1), 0),
        (Special("p", 0o620, 5, 0, 9), 0)]
    for node, size in nodes:
        made = header(path, node, size if isinstance(node, File) and node.source is not None else None)
        assert made == tarfile_header(path, node, size), (path, node.kind)
        read = tarfile.open(fileobj=io.BytesIO(made + bytes(1024)), mode="r:")  # noqa: SIM115
        [entry] = read.getmembers() if not size else [read.next()]
        assert entry is not None and entry.name == path and entry.size == size


def gzip_layer(files: list[tuple[str, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(member("dir", "d"))
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue())


def test_the_data_pass_copies_each_kept_file_from_where_the_headers_pass_found_it() -> None:
    """Files of every size around the tar block, one behind a PAX header (a long name), some not kept: the
    stream holds each kept file's data under its final name, read from the offsets of the first pass."""
    rng = random.Random(3)
    files = [(f"d/{'long-' * 30 if number == 2 else ''}f{number}", rng.randbytes(size))
             for number, size in enumerate((0, 1, 511, 512, 513, 70_000, (1 << 20) + 3, 5))]
    layer = gzip_layer(files)
    with tarfile.open(fileobj=open_layer(io.BytesIO(layer)), mode="r|") as archive:  # type: ignore[call-overload]
        members = list(archive)
    offsets = Offsets()
    offsets.record(0, members)
    kept = {ordinal: (f"final/{member_.name}", File(0o644, 0, 0, 0, source=(0, ordinal), size=member_.size))
            for ordinal, member_ in enumerate(members) if member_.isreg() and ordinal % 3 != 1}
    ranges = offsets.ranges(0, kept)
    assert ranges is not None
    out = io.BytesIO()
    send_ranges(out, ranges, open_layer(io.BytesIO(layer)))
    sent = tarfile.open(fileobj=io.BytesIO(out.getvalue() + bytes(1024)), mode="r:")  # noqa: SIM115
    found = {entry.name: sent.extractfile(entry).read() for entry in sent}  # type: ignore[union-attr]
    expected = {f"final/{name}": data for ordinal, (name, data) in enumerate(files, start=1) if ordinal in kept}
    assert found == expected and len(expected) == 5


def test_a_layer_that_ends_early_in_the_data_pass_is_unsupported() -> None:
    layer = gzip_layer([("d/f", b"data" * 300)])
    with tarfile.open(fileobj=open_layer(io.BytesIO(layer)), mode="r|") as archive:  # type: ignore[call-overload]
        members = list(archive)
    offsets = Offsets()
    offsets.record(0, members)
    ranges = offsets.ranges(0, {1: ("f", File(0o644, 0, 0, 0, source=(0, 1), size=1200))})
    assert ranges is not None
    shorter = gzip.compress(gzip.decompress(layer)[:ranges[0][0] + 100])
    with pytest.raises(Unsupported, match="ends inside a file"):
        send_ranges(io.BytesIO(), ranges, open_layer(io.BytesIO(shorter)))


def test_a_sparse_file_leaves_its_layer_to_tarfile() -> None:
    """A sparse member's data is not one range of the tar: the data pass reads that layer with tarfile again."""
    plain, sparse = member("file", "plain", "x"), member("file", "sparse", "y")
    sparse.sparse = [(0, 1)]  # type: ignore[assignment]  # typeshed says bytes; tarfile stores (offset, size) pairs
    offsets = Offsets()
    offsets.record(0, [plain, sparse])
    file_ = File(0o644, 0, 0, 0, source=(0, 0), size=1)
    assert offsets.ranges(0, {0: ("plain", file_)}) is not None
    assert offsets.ranges(0, {0: ("plain", file_), 1: ("sparse", file_)}) is None


@pytest.mark.parametrize("name", ["x" * 255, "é" * 127 + "x", "\U0001f600" * 63 + "xxx", "caf\udcff" * 63])
def test_a_name_of_255_bytes_is_kept(name: str) -> None:
    assert listing(index_of([("file", f"d/{name}", "data")]))[f"d/{name}"] == "f"

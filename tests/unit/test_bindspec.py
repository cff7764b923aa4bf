"""singpy.mounts.parse: `src[:dest[:ro|rw]]` bind specifications, alone and in comma lists."""

from __future__ import annotations

import pytest

from singpy.errors import BindSpecError
from singpy.mounts.parse import BindSpec, parse_bind, parse_bind_list

CWD = "/work/project"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/data", BindSpec("/data", "/data", False)),
        ("/data:/mnt", BindSpec("/data", "/mnt", False)),
        ("/data:/mnt:ro", BindSpec("/data", "/mnt", True)),
        ("/data:/mnt:rw", BindSpec("/data", "/mnt", False)),
        ("/data::ro", BindSpec("/data", "/data", True)),
        ("/data:", BindSpec("/data", "/data", False)),
        ("data", BindSpec(f"{CWD}/data", f"{CWD}/data", False)),
        ("data:/mnt:ro", BindSpec(f"{CWD}/data", "/mnt", True)),
        ("./a/../b", BindSpec(f"{CWD}/b", f"{CWD}/b", False)),
        ("../shared:/shared", BindSpec("/work/shared", "/shared", False)),
        ("/data/:/mnt/", BindSpec("/data", "/mnt", False)),
        ("/a//b/./c:/x/../y", BindSpec("/a/b/c", "/y", False)),
        ("/with space:/in container", BindSpec("/with space", "/in container", False)),
    ],
    ids=["src-only", "src-dst", "ro", "rw", "empty-dst-ro", "trailing-colon", "relative-src", "relative-src-ro",
         "relative-dot-dot", "relative-parent", "trailing-slashes", "normalised", "spaces"],
)
def test_parse_bind(text: str, expected: BindSpec) -> None:
    assert parse_bind(text, CWD) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("/a:/b:ro:extra", "too many ':'"),
        ("/a:/b:c:d:e", "too many ':'"),
        ("/a:/b:rx", "unknown option 'rx'"),
        ("/a:/b:RO", "unknown option 'RO'"),
        ("/a:/b:", "unknown option ''"),
        ("/a:b", "destination 'b' is not absolute"),
        ("/a:./b:ro", "destination './b' is not absolute"),
        (":/b", "empty source"),
    ],
    ids=["empty", "four-fields", "five-fields", "unknown-option", "uppercase-option", "empty-option",
         "relative-dest", "relative-dest-ro", "empty-source"],
)
def test_parse_bind_errors(text: str, reason: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        parse_bind(text, CWD)
    assert f"bad bind specification {text!r}" in caught.value.message
    assert reason in caught.value.message


@pytest.mark.parametrize(("text", "readonly"), [("data:", False), ("data::ro", True)], ids=["colon", "ro"])
def test_parse_bind_relative_source_empty_dest(text: str, readonly: bool) -> None:
    assert parse_bind(text, CWD) == BindSpec(f"{CWD}/data", f"{CWD}/data", readonly)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], ()),
        (["/a"], (BindSpec("/a", "/a", False),)),
        (["/a,/b:/c:ro"], (BindSpec("/a", "/a", False), BindSpec("/b", "/c", True))),
        (["/a", "/b:/c:ro,d"],
         (BindSpec("/a", "/a", False), BindSpec("/b", "/c", True), BindSpec(f"{CWD}/d", f"{CWD}/d", False))),
        ([" /a , /b:/c "], (BindSpec("/a", "/a", False), BindSpec("/b", "/c", False))),
        (("/x:/y:rw", "/x:/z:ro"), (BindSpec("/x", "/y", False), BindSpec("/x", "/z", True))),
        ([r"/s\,x:/d"], (BindSpec("/s,x", "/d", False),)),
        ([r"/s\,x\,y,/b:/c\,d:ro"], (BindSpec("/s,x,y", "/s,x,y", False), BindSpec("/b", "/c,d", True))),
        ([r"/s\:x:/d:ro"], (BindSpec("/s:x", "/d", True),)),
        ([r"/back\slash:/d"], (BindSpec("/back\\slash", "/d", False),)),
        # As Apptainer's ParseBindPath: empty items skipped, options after options are options.
        ([",/a", "/b,", "/c,,/d", "", " , "], tuple(BindSpec(p, p, False) for p in ("/a", "/b", "/c", "/d"))),
        (["/a:/b:rw,ro", "/c:/d:ro,rw", "/e:/f:rw,rw,/g"],
         (BindSpec("/a", "/b", True), BindSpec("/c", "/d", True), BindSpec("/e", "/f", False),
          BindSpec("/g", "/g", False))),
        (["/a:/b,ro", "/c,rw"],
         (BindSpec("/a", "/b", False), BindSpec(f"{CWD}/ro", f"{CWD}/ro", False), BindSpec("/c", "/c", False),
          BindSpec(f"{CWD}/rw", f"{CWD}/rw", False))),
    ],
    ids=["none", "one", "comma", "repeated-and-comma", "spaces-stripped", "tuple-input-same-source",
         "escaped-comma", "escaped-commas-in-list", "escaped-colon", "other-backslash-kept", "empty-items-skipped",
         "options-continued", "paths-named-like-options"],
)
def test_parse_bind_list(values: list[str], expected: tuple[BindSpec, ...]) -> None:
    assert parse_bind_list(values, CWD) == expected


@pytest.mark.parametrize(
    ("values", "bad"),
    [
        (["/a,/b:c"], "/b:c"),
        (["/a", "/b:/c:xx"], "/b:/c:xx"),
    ],
    ids=["second-item-relative-dest", "second-value-bad-option"],
)
def test_parse_bind_list_errors_name_the_item(values: list[str], bad: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        parse_bind_list(values, CWD)
    assert f"bad bind specification {bad!r}" in caught.value.message


def test_bindspec_is_a_value() -> None:
    spec = parse_bind("/a:/b:ro", CWD)
    assert (spec.source, spec.dest, spec.readonly) == ("/a", "/b", True)
    assert spec == BindSpec(source="/a", dest="/b", readonly=True)
    assert len({spec, BindSpec("/a", "/b", True)}) == 1


@pytest.mark.parametrize("text", ["/tmp:/", "/tmp:/.", "/tmp://", "/tmp:/x/..", "/tmp:///:ro", "/", "//", "/.",
                                  "/tmp:/../.."],
                         ids=["root", "root-dot", "double-slash", "up-to-root", "triple-slash-ro", "src-only-root",
                              "src-only-double", "src-only-dot", "above-root"])
def test_a_bind_onto_the_root_is_refused(text: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        parse_bind(text, CWD)
    assert caught.value.message == f"bad bind specification {text!r}: --bind can't replace the container's root " \
                                   "directory /"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("/tmp:/" + "n" * 256, "destination a component is longer than NAME_MAX (256 bytes, 255 at most)"),
        ("/" + "s" * 256 + ":/x", "source a component is longer than NAME_MAX (256 bytes, 255 at most)"),
        ("/tmp:" + "/d" * 2048, "destination longer than PATH_MAX (4096 bytes, 4095 at most)"),
        ("r" * 255, "source longer than PATH_MAX (4236 bytes, 4095 at most)"),  # fine, but the cwd is long
    ],
    ids=["dest-name-max", "source-name-max", "dest-path-max", "relative-made-too-long"],
)
def test_paths_the_kernel_cannot_use_are_refused(text: str, reason: str) -> None:
    cwd = CWD if not text.startswith("r") else "/c" * 1990
    with pytest.raises(BindSpecError) as caught:
        parse_bind(text, cwd)
    assert reason in caught.value.message
    assert len(caught.value.message) < 300  # the spec is shortened in the message


def test_double_slash_prefix_is_normalised() -> None:
    assert parse_bind("//data//x/:/mnt//y/", CWD) == BindSpec("/data/x", "/mnt/y", False)
    assert parse_bind("//data", CWD) == BindSpec("/data", "/data", False)

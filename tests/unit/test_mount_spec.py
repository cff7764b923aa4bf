"""singpy.mounts.parse --mount (Docker's CSV syntax, read as Go's encoding/csv reads it) and --no-mount names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from singpy.errors import BindSpecError
from singpy.mounts.parse import BindSpec, csv_records, parse_mount_list
from singpy.mounts.system import check_no_mount, kept_bind_paths

CWD = "/work/project"


# The records Go's csv.Reader (FieldsPerRecord -1, no LazyQuotes, no TrimLeadingSpace) gives for these texts.
@pytest.mark.parametrize(("text", "records"), [
    ("a,b,c", [["a", "b", "c"]]),
    ('"a,b",c', [["a,b", "c"]]),
    ('"a""b",c', [['a"b', "c"]]),
    ('""', [[""]]),
    ("a,", [["a", ""]]),
    (",", [["", ""]]),
    ("a\nb,c", [["a"], ["b", "c"]]),
    ("a\r\nb", [["a"], ["b"]]),
    ("\n\na\n\n", [["a"]]),
    ('"multi\nline",x', [["multi\nline", "x"]]),
    ("", []),
    (" a , b ", [[" a ", " b "]]),
], ids=["plain", "quoted-comma", "doubled-quote", "empty-quoted", "trailing-comma", "lone-comma", "two-records",
        "crlf", "blank-lines", "quoted-newline", "empty", "spaces-kept"])
def test_csv_records_as_go_reads_them(text: str, records: list[list[str]]) -> None:
    assert csv_records(text, "bad") == records


@pytest.mark.parametrize(("text", "message"), [
    ('a"b', "not quoted"),
    (' "a"', "not quoted"),  # no TrimLeadingSpace: the quote is a bare one
    ('"a"b', "text after the closing quote"),
    ('"a', "not closed"),
    ('"a""', "not closed"),
], ids=["bare-quote", "space-then-quote", "after-closing", "unclosed", "unclosed-after-doubled"])
def test_csv_errors_as_go_refuses(text: str, message: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        csv_records(text, "bad")
    assert caught.value.message.startswith("bad: ") and message in caught.value.message


@given(st.text(alphabet='ab,"\n\r= ', max_size=30))
def test_csv_never_fails_otherwise(text: str) -> None:
    try:
        records = csv_records(text, "bad")
    except BindSpecError:
        return
    assert all(isinstance(field, str) for record in records for field in record)


@pytest.mark.parametrize(("values", "expected"), [
    (["type=bind,source=/a,destination=/b"], [BindSpec("/a", "/b", False)]),
    (["src=/a,dst=/b,ro"], [BindSpec("/a", "/b", True)]),
    (["src=/a,target=/b,readonly=true"], [BindSpec("/a", "/b", True)]),
    (["src=/a,dst=/b,readonly=false"], [BindSpec("/a", "/b", False)]),
    (["dst=/b,src=data,nonested"], [BindSpec(f"{CWD}/data", "/b", False)]),
    (['"src=/a,b",dst=/c'], [BindSpec("/a,b", "/c", False)]),
    (["src=/a,dst=/b\nsrc=/c,dst=/d", "src=/e,dst=/f"],
     [BindSpec("/a", "/b", False), BindSpec("/c", "/d", False), BindSpec("/e", "/f", False)]),
    (["src=/a//x/,dst=/b/./y"], [BindSpec("/a/x", "/b/y", False)]),
], ids=["long-keys", "ro", "readonly-true", "readonly-false", "relative-source", "quoted", "lines-and-values",
        "normalised"])
def test_mount_specs(values: list[str], expected: list[BindSpec]) -> None:
    assert list(parse_mount_list(values, CWD)) == expected


@pytest.mark.parametrize(("value", "message"), [
    ("type=volume,src=/a,dst=/b", "unsupported mount type 'volume'"),
    ("type,src=/a,dst=/b", "unsupported mount type ''"),
    ("src=/a,dst=/b,bind-propagation=private", "bind-propagation"),
    ("src=/a,dst=/b,id=2", "id= (binding from inside an image file) is not supported"),
    ("src=/a,dst=/b,consistency=cached", "unknown key 'consistency'"),
    ("src=/a,dst=/b,", "unknown key ''"),
    ("src=/a,dst=/b,ro=yes", "ro takes true or false"),
    ("dst=/b", "a mount needs a source and a destination"),
    ("destination=,src=/a", "destination can't be empty"),
    ("src=/a,dst=b", "is not absolute"),
    ("src=/a,dst=/", "can't replace the container's root directory"),
    ("", "empty"),
    ("\n\n", "empty"),
], ids=["volume", "type-without-value", "propagation", "sif-id", "docker-only-key", "trailing-comma", "ro-value",
        "no-source", "empty-destination", "relative-destination", "onto-root", "empty", "blank-lines"])
def test_bad_mount_specs(value: str, message: str) -> None:
    with pytest.raises(BindSpecError) as caught:
        parse_mount_list([value], CWD)
    assert caught.value.message.startswith("bad --mount ") and message in caught.value.message


def test_no_mount_names() -> None:
    assert check_no_mount(["home", " tmp", "/etc//hosts/", "home"]) == ("home", "tmp", "/etc/hosts")
    for bad in ("hmoe", "", "etc/hosts", "HOME"):
        with pytest.raises(BindSpecError, match="--no-mount: unknown mount"):
            check_no_mount([bad])


def test_kept_bind_paths() -> None:
    entries = ("/etc/hosts", "/etc/localtime:/etc/localtime", "/srv/site:/site/", "/a:/b:ro")
    assert kept_bind_paths(entries, {"/etc/hosts", "/site"}) == ("/etc/localtime:/etc/localtime", "/a:/b:ro")
    assert kept_bind_paths(entries, {"/b"}) == entries[:3]
    assert kept_bind_paths(entries, {"bind-paths"}) == ()
    assert kept_bind_paths(entries, set()) == entries

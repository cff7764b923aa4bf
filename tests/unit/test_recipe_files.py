"""singpy.recipe.files: %files copies from the host and from a stage, on real trees, hostile links included."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.recipe.files import _component_regex, copy_from_host, copy_from_stage, run_cp


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "opt").mkdir(parents=True)
    (root / "etc").mkdir()
    return root


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """The build's directory on the host."""
    where = tmp_path / "src"
    (where / "data" / "sub").mkdir(parents=True)
    (where / "data" / "a.txt").write_text("a\n")
    (where / "data" / "b.txt").write_text("b\n")
    (where / "data" / ".hidden").write_text("h\n")
    (where / "data" / "sub" / "deep.txt").write_text("deep\n")
    (where / "data" / "sub" / "other.md").write_text("md\n")
    (where / "top.txt").write_text("top\n")
    (where / "with space.txt").write_text("space\n")
    return where


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Host files outside every rootfs that hostile links point at: they must stay as they are."""
    where = tmp_path / "host"
    (where / "etc").mkdir(parents=True)
    (where / "etc" / "passwd").write_text("host passwd\n")
    return where


def host_untouched(host: Path) -> None:
    assert sorted(os.listdir(host)) == ["etc"]
    assert os.listdir(host / "etc") == ["passwd"]
    assert (host / "etc" / "passwd").read_text() == "host passwd\n"


def from_host(entries: Sequence[tuple[str, str]], rootfs: Path, cwd: Path) -> None:
    copy_from_host(entries, str(rootfs), cwd=str(cwd))


def files_below(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


# From the host

def test_a_file_to_its_own_path(rootfs: Path, src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from_host([("top.txt", "")], rootfs, src)
    assert (rootfs / "top.txt").read_text() == "top\n"
    assert "INFO:    Copying top.txt to top.txt" in capsys.readouterr().err


def test_an_absolute_source_to_its_own_path(rootfs: Path, src: Path) -> None:
    from_host([(str(src / "top.txt"), "")], rootfs, src)
    assert (rootfs / str(src / "top.txt").lstrip("/")).read_text() == "top\n"


def test_a_file_to_a_new_path_with_parents_made(rootfs: Path, src: Path) -> None:
    from_host([("top.txt", "/new/dir/renamed.txt")], rootfs, src)
    assert (rootfs / "new" / "dir" / "renamed.txt").read_text() == "top\n"


def test_a_trailing_slash_makes_a_directory(rootfs: Path, src: Path) -> None:
    from_host([("top.txt", "/made/")], rootfs, src)
    assert (rootfs / "made" / "top.txt").read_text() == "top\n"


def test_directories_made_are_0755_whatever_the_umask(rootfs: Path, src: Path) -> None:
    old = os.umask(0o077)
    try:
        from_host([("top.txt", "/a/b/"), ("top.txt", "/c/d/file")], rootfs, src)
    finally:
        os.umask(old)
    for made in ("a", "a/b", "c", "c/d"):
        assert stat.S_IMODE((rootfs / made).stat().st_mode) == 0o755, made


def test_a_relative_rootfs(rootfs: Path, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(rootfs.parent)
    copy_from_host([("top.txt", "/x/")], "rootfs", cwd=str(src))
    assert (rootfs / "x" / "top.txt").read_text() == "top\n"


def test_into_an_existing_directory_the_name_is_kept(rootfs: Path, src: Path) -> None:
    from_host([("data", "/opt")], rootfs, src)
    assert (rootfs / "opt" / "data" / "sub" / "deep.txt").read_text() == "deep\n"
    assert (rootfs / "opt" / "data" / ".hidden").exists()  # a directory is copied whole


def test_a_quoted_name_with_a_space(rootfs: Path, src: Path) -> None:
    from_host([("with space.txt", "/opt/")], rootfs, src)
    assert (rootfs / "opt" / "with space.txt").read_text() == "space\n"


@pytest.mark.parametrize(("pattern", "expected"), [
    ("data/*.txt", ["a.txt", "b.txt"]),
    ("data/?.txt", ["a.txt", "b.txt"]),
    ("data/[a]*", ["a.txt"]),
    ("data/[!a]*.txt", ["b.txt"]),
    ("data/[^a]*.txt", ["b.txt"]),
    ("data/.h*", [".hidden"]),
    ("data/*", ["a.txt", "b.txt", "sub", "sub/deep.txt", "sub/other.md"]),  # no .hidden, as bash
    ("data/**/*.txt", ["a.txt", "b.txt", "deep.txt"]),
    ("data/{a,b}.txt", ["a.txt", "b.txt"]),
    ("data/[[:alpha:]].txt", ["a.txt", "b.txt"]),
    ("data/[[:alpha:]][![:alnum:]]txt", ["a.txt", "b.txt"]),
    ("d*/sub/*.md", ["other.md"]),
    ("data/\\*.txt", None),  # a quoted star is a star: nothing matches
])
def test_patterns(rootfs: Path, src: Path, pattern: str, expected: list[str] | None) -> None:
    if expected is None:
        with pytest.raises(ImageError, match=r"%files: no file matches data/\\\*\.txt"):
            from_host([(pattern, "/out/")], rootfs, src)
        return
    from_host([(pattern, "/out/")], rootfs, src)
    assert files_below(rootfs / "out") == expected


# bash's bracket expressions, one name each: (pattern, the names of NAMES it matches), as bash matches them
NAMES = ("a", "b", "z", "A", "F", "G", "5", "_", "-", "]", "[", "!", ":", " ", "\t", "~", "x5", "[a")
BRACKETS = [
    ("[[:digit:]]", ["5"]),
    ("[[:alpha:]]", ["a", "b", "z", "A", "F", "G"]),
    ("[[:alnum:]_]", ["a", "b", "z", "A", "F", "G", "5", "_"]),
    ("[[:upper:][:digit:]]", ["A", "F", "G", "5"]),
    ("[[:lower:]]", ["a", "b", "z"]),
    ("[[:xdigit:]]", ["a", "b", "A", "F", "5"]),
    ("[[:space:]]", [" ", "\t"]),
    ("[[:blank:]]", [" ", "\t"]),
    ("[[:punct:]]", ["_", "-", "]", "[", "!", ":", "~"]),
    ("[[:word:]]", ["a", "b", "z", "A", "F", "G", "5", "_"]),
    ("[![:space:]]", ["a", "b", "z", "A", "F", "G", "5", "_", "-", "]", "[", "!", ":", "~"]),
    ("[^[:alnum:]]", ["_", "-", "]", "[", "!", ":", " ", "\t", "~"]),
    ("[]a]", ["a", "]"]),
    ("[!]a[:space:]]", ["b", "z", "A", "F", "G", "5", "_", "-", "[", "!", ":", "~"]),
    ("[a-c-]", ["a", "b", "-"]),
    ("[z-a]", []),  # a backwards range: nothing
    ("[[:nosuch:]]", []),  # an unknown class: nothing, as bash
    ("[[:nosuch:]z]", ["z"]),
    ("[![:nosuch:]]", ["a", "b", "z", "A", "F", "G", "5", "_", "-", "]", "[", "!", ":", " ", "\t", "~"]),
    ("[\\]]", ["]"]),
    ("[[.-.][=a=]]", ["a", "-"]),
    ("[[:alpha:]", ["[a"]),  # no closing `]` for the first `[`: it is itself, then `[:alpha:]` is a set
    ("[[:digit:]]*", ["5"]),
    ("x[[:digit:]]", ["x5"]),
]


@pytest.mark.parametrize(("pattern", "expected"), BRACKETS)
def test_bracket_expressions_match_as_in_bash(pattern: str, expected: list[str]) -> None:
    regex = _component_regex(pattern)
    assert regex is not None
    assert [name for name in NAMES if regex.match(name)] == expected


@pytest.mark.skipif(not os.access("/bin/bash", os.X_OK), reason="no /bin/bash")
def test_bracket_expressions_agree_with_the_real_bash() -> None:
    """The same table, asked of bash itself (C locale: ASCII classes, as Apptainer's Go regexps)."""
    for pattern, expected in BRACKETS:
        script = f'for name in "$@"; do [[ "$name" == {pattern} ]] && printf "%s\\0" "$name"; done; true'
        done = subprocess.run(["/bin/bash", "-c", script, "bash", *NAMES], capture_output=True, check=True,
                              env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
        assert done.stdout.decode().split("\0")[:-1] == expected, pattern


def test_a_pattern_without_a_destination_keeps_each_path(rootfs: Path, src: Path) -> None:
    from_host([("data/*.txt", "")], rootfs, src)
    assert files_below(rootfs / "data") == ["a.txt", "b.txt"]


def test_a_missing_source_is_an_image_error(rootfs: Path, src: Path) -> None:
    with pytest.raises(ImageError, match="%files: no file matches nothere.txt"):
        from_host([("nothere.txt", "")], rootfs, src)
    with pytest.raises(ImageError, match=r"%files: no file matches data/\*\.none"):
        from_host([("data/*.none", "")], rootfs, src)


def test_links_on_the_host_are_followed(rootfs: Path, src: Path) -> None:
    os.symlink("top.txt", src / "link.txt")
    from_host([("link.txt", "/opt/")], rootfs, src)
    copied = rootfs / "opt" / "link.txt"
    assert not copied.is_symlink() and copied.read_text() == "top\n"


def test_a_fifo_source_is_copied_as_a_fifo_without_blocking(rootfs: Path, src: Path) -> None:
    os.mkfifo(src / "data" / "pipe")
    from_host([("data/pipe", "/opt/"), ("data", "/copy")], rootfs, src)
    assert stat.S_ISFIFO((rootfs / "opt" / "pipe").lstat().st_mode)
    assert stat.S_ISFIFO((rootfs / "copy" / "pipe").lstat().st_mode)


def test_a_failing_cp_is_an_image_error_with_its_reason(rootfs: Path, src: Path) -> None:
    (rootfs / "opt" / "data").write_text("a file where a directory would go")
    message = r"%files: can't copy data to /opt/ in the image: cp: cannot overwrite non-directory"
    with pytest.raises(ImageError, match=message):
        from_host([("data", "/opt/")], rootfs, src)


def test_destination_links_to_host_paths_stay_inside(rootfs: Path, src: Path, host: Path) -> None:
    os.symlink(host / "etc", rootfs / "opt" / "to-host-dir")  # absolute: inside, it restarts at the rootfs
    os.symlink(host / "etc" / "passwd", rootfs / "etc" / "passwd")
    os.symlink("../../../../../../..", rootfs / "opt" / "up")
    from_host([("top.txt", "/opt/to-host-dir/"), ("top.txt", "/etc/passwd"), ("data", "/opt/up/climbed")],
              rootfs, src)
    host_untouched(host)
    assert (rootfs / str(host / "etc" / "top.txt").lstrip("/")).read_text() == "top\n"
    assert (rootfs / str(host / "etc" / "passwd").lstrip("/")).read_text() == "top\n"
    assert (rootfs / "climbed" / "a.txt").read_text() == "a\n"


def test_links_met_inside_a_recursive_copy_are_not_written_through(rootfs: Path, src: Path, host: Path) -> None:
    (rootfs / "opt" / "data").mkdir()
    os.symlink(host / "etc" / "passwd", rootfs / "opt" / "data" / "a.txt")  # a file in the way: replaced
    os.symlink(host / "etc", rootfs / "opt" / "data" / "sub")  # a directory in the way: refused by cp
    with pytest.raises(ImageError, match="cannot overwrite non-directory"):
        from_host([("data", "/opt/")], rootfs, src)
    host_untouched(host)
    assert (rootfs / "opt" / "data" / "a.txt").read_text() == "a\n"


# From a stage

@pytest.fixture
def stage(tmp_path: Path, host: Path) -> Path:
    """An earlier stage's rootfs, with links that lead elsewhere inside it and links to host paths."""
    root = tmp_path / "stage"
    (root / "opt" / ".view" / "abc123").mkdir(parents=True)
    (root / "opt" / ".view" / "abc123" / "bin.txt").write_text("view\n")
    os.symlink("/opt/.view/abc123", root / "opt" / "view")  # absolute: resolved inside the stage
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "libx.so").write_text("lib\n")
    (root / "usr" / "lib" / "liby.so").write_text("liby\n")
    os.symlink("libx.so", root / "usr" / "lib" / "libx.so.1")  # kept as a link inside a copied directory
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("stage passwd\n")
    os.symlink(host / "etc" / "passwd", root / "opt" / "host-passwd")  # leads to nothing inside the stage
    os.symlink("/etc/passwd", root / "opt" / "passwd")
    os.symlink("../../../../../../etc", root / "opt" / "up-etc")  # climbs to the stage's own /etc
    os.symlink(host / "etc", root / "opt" / "host-etc")
    os.mkfifo(root / "opt" / "pipe")
    return root


def from_stage(entries: Sequence[tuple[str, str]], stage: Path, rootfs: Path) -> list[list[str]]:
    """Copy with run_cp on the host, recording each argv."""
    argvs: list[list[str]] = []

    def run(argv: list[str]) -> None:
        argvs.append(argv)
        run_cp(argv)

    copy_from_stage(entries, str(stage), str(rootfs), run=run)
    return argvs


def test_stage_file_to_its_own_path(stage: Path, rootfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from_stage([("/usr/lib/libx.so", "")], stage, rootfs)
    assert (rootfs / "usr" / "lib" / "libx.so").read_text() == "lib\n"
    assert "INFO:    Copying /usr/lib/libx.so to /usr/lib/libx.so" in capsys.readouterr().err


def test_stage_directory_keeps_inner_links_as_links(stage: Path, rootfs: Path) -> None:
    from_stage([("/usr/lib", "/copied")], stage, rootfs)
    assert os.readlink(rootfs / "copied" / "libx.so.1") == "libx.so"
    assert (rootfs / "copied" / "liby.so").read_text() == "liby\n"


def test_stage_link_is_followed_inside_the_stage_and_named_as_matched(stage: Path, rootfs: Path) -> None:
    from_stage([("/opt/view", "/opt/")], stage, rootfs)
    assert (rootfs / "opt" / "view" / "bin.txt").read_text() == "view\n"
    assert not (rootfs / "opt" / "view").is_symlink()
    assert not (rootfs / "opt" / "abc123").exists()


def test_stage_copy_into_an_existing_directory_merges(stage: Path, rootfs: Path) -> None:
    (rootfs / "opt" / "view").mkdir()
    (rootfs / "opt" / "view" / "mine.txt").write_text("mine\n")
    from_stage([("/opt/view", "/opt/")], stage, rootfs)
    assert files_below(rootfs / "opt" / "view") == ["bin.txt", "mine.txt"]


def test_stage_links_to_host_paths_never_reach_the_host(stage: Path, rootfs: Path, host: Path) -> None:
    from_stage([("/opt/passwd", "/a"), ("/opt/up-etc/passwd", "/b")], stage, rootfs)
    assert (rootfs / "a").read_text() == "stage passwd\n"
    assert (rootfs / "b").read_text() == "stage passwd\n"
    with pytest.raises(ImageError, match=r"/opt/host-passwd in the stage leads to .*/etc/passwd, which is not there"):
        from_stage([("/opt/host-passwd", "/c")], stage, rootfs)
    with pytest.raises(ImageError, match="no file matches"):  # the pattern is matched inside the stage
        from_stage([("/opt/host-etc/pass*", "/d")], stage, rootfs)
    host_untouched(host)
    assert not (rootfs / "c").exists() and not (rootfs / "d").exists()


def test_stage_patterns_are_matched_inside_the_stage(stage: Path, rootfs: Path) -> None:
    argvs = from_stage([("/usr/lib/lib?.so", "/libs/"), ("/**/*.so", "/so/"), ("usr/lib/liby.*", "")],
                       stage, rootfs)
    assert files_below(rootfs / "libs") == ["libx.so", "liby.so"]
    assert files_below(rootfs / "so") == ["libx.so", "liby.so"]
    assert (rootfs / "usr" / "lib" / "liby.so").exists()
    assert all(argv[1:4] == ["-a", "-T", "--remove-destination"] for argv in argvs)
    assert all(argv[-2].startswith(str(stage)) and argv[-1].startswith(str(rootfs)) for argv in argvs)


def test_stage_destination_links_to_host_paths_stay_inside(stage: Path, rootfs: Path, host: Path) -> None:
    os.symlink(host / "etc" / "passwd", rootfs / "etc" / "passwd")
    os.symlink(host / "etc", rootfs / "opt" / "to-host")
    from_stage([("/etc/passwd", ""), ("/usr/lib/libx.so", "/opt/to-host/")], stage, rootfs)
    host_untouched(host)
    assert (rootfs / str(host / "etc" / "passwd").lstrip("/")).read_text() == "stage passwd\n"
    assert (rootfs / str(host / "etc" / "libx.so").lstrip("/")).read_text() == "lib\n"


def test_stage_fifo_is_copied_as_a_fifo(stage: Path, rootfs: Path) -> None:
    from_stage([("/opt/pipe", "/opt/"), ("/opt", "/whole")], stage, rootfs)
    assert stat.S_ISFIFO((rootfs / "opt" / "pipe").lstat().st_mode)
    assert stat.S_ISFIFO((rootfs / "whole" / "pipe").lstat().st_mode)
    assert (rootfs / "whole" / "host-etc").is_symlink()  # links below a copied directory stay links


def test_stage_missing_source(stage: Path, rootfs: Path) -> None:
    with pytest.raises(ImageError, match="%files: no file matches /nothere in the stage"):
        from_stage([("/nothere", "")], stage, rootfs)
    with pytest.raises(ImageError, match=r"no file matches /opt/\*\*/\*\.txt in the stage"):
        from_stage([("/opt/**/*.txt", "")], stage, rootfs)  # `**` skips the hidden .view, nor enters links


def test_stage_copy_failure_from_run_cp(stage: Path, rootfs: Path) -> None:
    (rootfs / "opt" / "view").write_text("a file")
    with pytest.raises(ImageError, match="cp: cannot overwrite non-directory"):
        from_stage([("/opt/view", "/opt/")], stage, rootfs)

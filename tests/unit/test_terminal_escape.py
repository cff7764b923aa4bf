"""Nothing from an image, a registry or a message reaches the terminal raw (singpy.console.escape).

A newline in a quoted string must not start a forged `FATAL:` line, an ESC must not start an escape
sequence, a bidi override must not reorder what follows. The one boundary (console's lines, cli/main's
FATAL and traceback) and the printers of image data (`inspect`, platform messages) are checked here; the
real command on hostile images in tests/integration/test_terminal_escape.py.
"""

from __future__ import annotations

import json

import pytest

from singpy import console
from singpy.cli import inspect as inspect_cli
from singpy.cli import main as cli_main
from singpy.errors import ImageError, SingpyError
from singpy.oci import platform

FORGED = "s390x\nFATAL:   \x1b[31mFAKE"
# Every kind that must come out escaped: C0, DEL, C1 (CSI), bidi override and isolate, line/paragraph
# separators, zero width, a surrogate (an undecodable byte of a file name), a no-break space.
HOSTILE = ["\n", "\r", "\x1b", "\x00", "\x07", "\x7f", "\x9b", "\u202e", "\u2066", "\u2028", "\u2029", "\u200b",
           "\udcff", "\xa0", "\t"]


def raw_controls(text: str) -> list[str]:
    """The characters a terminal would act on (or a reader misplace), other than the line ends given."""
    return [char for char in text.replace("\n", "") if not char.isprintable()]


@pytest.mark.parametrize("char", HOSTILE)
def test_every_unprintable_character_is_written_as_repr_writes_it(char: str) -> None:
    escaped = console.escape(f"a{char}b")
    assert escaped == f"a{repr(char)[1:-1]}b"
    assert escaped.isprintable()


def test_plain_text_is_returned_as_it_is() -> None:
    text = "can't read /images/été.sif: 'quoted' \\ back"
    assert console.escape(text) is text  # the fast path: no copy
    assert console.escape("") == ""


def test_kept_characters_pass_the_rest_is_escaped() -> None:
    assert console.escape("#!/bin/sh\n\techo \x1b[2J\r\n", "\n\t") == "#!/bin/sh\n\techo \\x1b[2J\\r\n"


@pytest.mark.parametrize("write", [console.fatal, console.warning, console.info, console.hint])
def test_a_console_line_is_one_line_without_controls(write: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(write)
    write(f"no linux/amd64 image: it has linux/{FORGED}\u2028x\u202eevil")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n")
    assert raw_controls(err) == []
    assert "\\x1b[31mFAKE" in err and "\\nFATAL:" in err and "\\u2028" in err and "\\u202e" in err


def test_verbose_and_debug_lines_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    before = console.level()
    console.set_level(console.DEBUG)
    try:
        console.verbose("a\nb")
        console.debug("c\x1bd")
    finally:
        console.set_level(before)
    assert capsys.readouterr().err == "VERBOSE: a\\nb\nDEBUG:   c\\x1bd\n"


def _failing(message: str) -> object:
    def dispatch(args: list[str]) -> int:
        raise ImageError(message, hint="pick \x1b[1mone\nHINT: forged")
    return dispatch


@pytest.mark.parametrize("args", [["inspect", "x"], ["-v", "inspect", "x"]])
def test_the_error_boundary_writes_one_fatal_line(args: list[str], monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_main, "_dispatch", _failing(f"no linux/amd64 image in oci:/x: it has {FORGED}"))
    monkeypatch.setattr(console, "_level", console.NORMAL)
    assert cli_main.main(args) == 255
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if line.startswith("FATAL")] == [
        "FATAL:   no linux/amd64 image in oci:/x: it has s390x\\nFATAL:   \\x1b[31mFAKE"]
    assert all(line.startswith(("FATAL:", "HINT:")) for line in lines)
    assert raw_controls("\n".join(lines)) == []


def test_the_traceback_at_debug_is_escaped(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_main, "_dispatch", _failing(FORGED))
    monkeypatch.setattr(console, "_level", console.NORMAL)
    assert cli_main.main(["-d", "inspect", "x"]) == 255
    err = capsys.readouterr().err
    assert "Traceback" in err and "\x1b" not in err
    assert [line for line in err.splitlines() if line.startswith("FATAL")] == [
        "FATAL:   s390x\\nFATAL:   \\x1b[31mFAKE"]


def test_the_frames_written_without_the_traceback_module_are_escaped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "traceback")  # as inside the container, where nothing can be imported
    try:
        raise SingpyError(FORGED)
    except SingpyError as error:
        cli_main._print_traceback(error)
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith("singpy.errors.SingpyError: s390x\\nFATAL:   \\x1b[31mFAKE\n")


def index(*architectures: str) -> dict[str, object]:
    return {"manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{n:064x}",
                           "size": 1, "platform": {"os": "linux", "architecture": arch}}
                          for n, arch in enumerate(architectures)]}


def test_a_forged_architecture_is_quoted_in_the_platform_message() -> None:
    with pytest.raises(ImageError) as raised:
        platform.choose(index("arm64", FORGED, "riscv64\u202e"), platform.parse_arch("amd64"), source="oci:/x")
    message = raised.value.message
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message
    # (an index's architecture is compared lowercased, as containers/image does)
    assert message.endswith("it has linux/arm64/v8, 'linux/s390x\\nfatal:   \\x1b[31mfake', 'linux/riscv64\\u202e'")


def test_a_huge_index_is_named_in_a_bounded_message() -> None:
    with pytest.raises(ImageError) as raised:
        platform.choose(index(*(f"arch{n}" for n in range(5000)), "x" * 10000), platform.parse_arch("amd64"),
                        source="oci:/x")
    assert len(raised.value.message) < 400 and raised.value.message.endswith("and 4989 more")


LABELS = {"org.evil": "\x1b]0;pwned\x07red\nforged.label: yes", "k\x1b[2J": "v\u2028w", "plain": "ok"}


def test_inspect_shows_each_label_on_one_line() -> None:
    shown = inspect_cli.render("labels", LABELS)
    assert shown.splitlines() == ["k\\x1b[2J: v\\u2028w", "org.evil: \\x1b]0;pwned\\x07red\\nforged.label: yes",
                                  "plain: ok"]


@pytest.mark.parametrize("section", ["runscript", "deffile", "startscript", "test", "helpfile"])
def test_inspect_keeps_a_scripts_lines_and_tabs_and_escapes_the_rest(section: str) -> None:
    script = "#!/bin/sh\n\techo \x1b[31mred\r\nexec \u202etxt.exe\n"
    assert inspect_cli.render(section, script) == "#!/bin/sh\n\techo \\x1b[31mred\\r\nexec \\u202etxt.exe\n"


def test_inspect_escapes_the_environment_paths_and_texts() -> None:
    shown = inspect_cli.render("environment", {"/.singularity.d/env/\x1b[8m.sh": "export A=\x1b[1m\nexport B=2\n"})
    assert shown == "=== /.singularity.d/env/\\x1b[8m.sh ===\nexport A=\\x1b[1m\nexport B=2\n\n"


def test_inspect_json_is_safe_as_json_dumps_writes_it() -> None:
    written = json.dumps({"labels": LABELS}, indent=2, sort_keys=True)  # what `inspect --json` prints
    assert written.isascii() and raw_controls(written) == []
    assert json.loads(written) == {"labels": LABELS}

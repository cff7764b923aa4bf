"""What an image or a registry wrote never reaches the terminal raw: the real `singpy`, as root and as a user.

An index whose platform forges a second FATAL line with an escape sequence, labels and a runscript holding
ESC, a bidi override and newlines: stderr has exactly one FATAL line, and no ESC byte (nor any other
control character but the line ends) is anywhere in stdout or stderr. `oci:DIR` layouts need no registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.oci import Image, Index, Layer, busybox_image, file, write_layout
from tests.support.sifs import new_cache

FORGED = "s390x\nFATAL:   \x1b[31mFAKE"
LABELS = {"org.evil": "\x1b]0;pwned\x07red\nforged.label: yes", "org.bidi": "abc\u202etxt.exe"}
CMD = ["echo \x1b[2Jcleared\u2028"]


def assert_no_controls(*texts: str) -> None:
    """Nothing a terminal would act on: only printable characters and the line ends (tabs in scripts)."""
    for text in texts:
        assert [char for char in text if not (char.isprintable() or char in "\n\t")] == [], text


@pytest.fixture(scope="module")
def layout(workdir: Path) -> Path:
    path = workdir / "escape-layout"
    if not (path / "index.json").exists():
        small = Layer([file("a", "1")])
        forged = Index([Image([small], architecture="s390x", platform={"os": "linux", "architecture": FORGED}),
                        Image([small], architecture="riscv64")])
        write_layout(path, {"forged": forged, "labels": busybox_image(labels=LABELS, cmd=CMD)})
    return path


@pytest.mark.parametrize("command", [["inspect"], ["pull", "--force", "/dev/null/x.sif"], ["exec"]])
def test_a_forged_platform_is_one_fatal_line(singpy: Singpy, workdir: Path, layout: Path,
                                             command: list[str]) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"escape-{command[0]}")))
    args = [*command, f"oci:{layout}:forged", *(["true"] if command == ["exec"] else [])]
    result = singpy.run(*args, env=env)
    assert_one_fatal(result, "no linux/amd64 image in")
    assert "'linux/s390x\\nfatal:   \\x1b[31mfake'" in result.stderr  # quoted, and shown escaped
    assert_no_controls(result.stderr)


def test_labels_and_runscript_are_shown_escaped(singpy: Singpy, workdir: Path, layout: Path) -> None:
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "escape-labels")))
    reference = f"oci:{layout}:labels"
    shown = singpy.run("inspect", "--labels", reference, env=env)
    assert shown.returncode == 0, shown.stderr
    assert_no_controls(shown.stdout, shown.stderr)
    lines = shown.stdout.splitlines()
    assert "org.evil: \\x1b]0;pwned\\x07red\\nforged.label: yes" in lines
    assert "org.bidi: abc\\u202etxt.exe" in lines
    assert not [line for line in lines if line.startswith("forged.label")]
    runscript = singpy.ok("inspect", "--runscript", reference, env=env)
    assert_no_controls(runscript)
    assert "\\x1b[2Jcleared\\u2028" in runscript and runscript.count("\n") > 1  # its lines are kept
    # --json: the values as they are, in JSON that escapes every control character itself.
    document = singpy.ok("inspect", "--json", "--labels", reference, env=env)
    assert document.isascii()
    labels = json.loads(document)["data"]["attributes"]["labels"]
    assert {key: labels[key] for key in LABELS} == LABELS


def test_an_argument_quoted_in_an_error_is_escaped(singpy: Singpy, workdir: Path) -> None:
    result = singpy.run("inspect", str(workdir / "no-such\x1b[31m\nFATAL: image"))
    assert_one_fatal(result, "no-such\\x1b[31m\\nFATAL: image")
    assert_no_controls(result.stderr)

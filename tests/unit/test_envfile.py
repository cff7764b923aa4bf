"""singpy.env.envfile: --env-file read as shell assignments, as Apptainer's embedded interpreter reads it.

The valid cases are also run through real shells (bash, dash, busybox sh) with
`set -a`, as Apptainer runs the file: the results must be the same.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from singpy.env.envfile import evaluate
from singpy.errors import SingpyError

SCOPE = {"HOSTV": "host value", "HOME": "/home/me", "EMPTYV": ""}

VALID = [
    ("", {}),
    ("A=1\nB=two\n", {"A": "1", "B": "two"}),
    ("export A=1\n  export   B=2  \n", {"A": "1", "B": "2"}),
    ("A=\"x y\"\nB='a \"b\"'\n", {"A": "x y", "B": 'a "b"'}),
    ("A=\"\"\nB=''\nC=\n", {"A": "", "B": "", "C": ""}),
    ("# comment\n\n   # indented comment\nA=1 # trailing comment\nB=x#y\n", {"A": "1", "B": "x#y"}),
    ("A=x=y\n", {"A": "x=y"}),
    ("A=1\nA=2\n", {"A": "2"}),
    ("exportA=1\n", {"exportA": "1"}),
    ("A=1; B=$A;C=${A}2 D=\"$A$B\"\n", {"A": "1", "B": "1", "C": "12", "D": "11"}),
    ("A=$HOSTV\nB=\"[$HOSTV]\"\nC='$HOSTV'\nD=$NOT_SET_ANYWHERE\n",
     {"A": "host value", "B": "[host value]", "C": "$HOSTV", "D": ""}),
    ('PATH="\\$PATH:/"\nQ=\\$HOME\n', {"PATH": "$PATH:/", "Q": "$HOME"}),
    ('A="multi\nline"\n', {"A": "multi\nline"}),
    ("A=con\\\ntinued\nB=\"in \\\nquotes\"\n", {"A": "continued", "B": "in quotes"}),
    ('A="a\\\\b \\"c\\" \\$d \\e"\nB=a\\ b\\\\c\n', {"A": 'a\\b "c" $d \\e', "B": "a b\\c"}),
    ("A=~/x:~/y:a~\nB='~'\nC=\"~\"\n", {"A": "/home/me/x:/home/me/y:a~", "B": "~", "C": "~"}),
    ("A=${NOPE:-def ault}\nB=${EMPTYV:-dflt}\nC=${EMPTYV-dflt}\nD=\"${NOPE:-'q'}\"\nE=${NOPE:-'q'}\n",
     {"A": "def ault", "B": "dflt", "C": "", "D": "'q'", "E": "q"}),
    ("A=${HOSTV:+set}\nB=${NOPE:+set}\nC=${EMPTYV+set}\nD=${EMPTYV:+set}\n",
     {"A": "set", "B": "", "C": "set", "D": ""}),
    ("A=${#HOSTV}\nB=${NEW:=7}\n", {"A": "10", "NEW": "7", "B": "7"}),
    ("A=$\nB=\"$\"\nC=$/x\nD=a$\n", {"A": "$", "B": "$", "C": "$/x", "D": "a$"}),
    ("export A=\"x y\" B=~/z\n", {"A": "x y", "B": "/home/me/z"}),
    ("A=1\nunset A\nB=2\n", {"B": "2"}),
    ("A=1 B=2\n", {"A": "1", "B": "2"}),
    ("A=${NOPE:-${HOSTV}}\nB=\"${NOPE:-a \"b\" c}\"\n", {"A": "host value", "B": "a b c"}),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_evaluate(text: str, expected: dict[str, str]) -> None:
    assert evaluate(text, "vars.env", scope=SCOPE) == expected


@pytest.mark.parametrize("shell", [("/bin/bash", "--norc", "--noprofile"), ("/bin/dash",), ("/bin/busybox", "sh")],
                         ids=["bash", "dash", "busybox"])
@pytest.mark.parametrize(("text", "expected"), VALID)
def test_same_as_a_real_shell(shell: tuple[str, ...], text: str, expected: dict[str, str], tmp_path: Path) -> None:
    """What `set -a; . FILE` exports in a real shell, started with SCOPE as its environment."""
    if not os.path.exists(shell[0]):
        pytest.skip(f"{shell[0]} is not installed")
    (tmp_path / "vars.env").write_text(text)
    done = subprocess.run([*shell, "-c", 'set -a; . ./vars.env; for n in "$@"; do eval "printf %s= \\"\\$n\\"; '
                           'printf %s \\"\\${$n-UNSET}\\""; printf "\\0"; done', "sh", *expected, "A", "B"],
                          env=SCOPE, cwd=tmp_path, capture_output=True, text=True, timeout=20, check=True)
    got = dict(entry.split("=", 1) for entry in done.stdout.split("\0")[:-1])
    assert {name: value for name, value in got.items() if value != "UNSET"} == expected


def test_crlf_line_ends_are_line_ends() -> None:
    assert evaluate("A=1\r\nB='x y'\r\n", "f", scope={}) == {"A": "1", "B": "x y"}


def test_export_of_a_host_variable_passes_its_value() -> None:
    """`export NAME` exports what NAME holds, the host's value included (Apptainer's interpreter does)."""
    assert evaluate("export HOSTV NOPE\n", "f", scope=SCOPE) == {"HOSTV": "host value"}


def test_one_file_sees_only_the_scope_it_is_given() -> None:
    assert evaluate("B=$A\n", "f", scope={}) == {"B": ""}


def test_shell_owned_names_are_dropped_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate("UID=5\nPWD=/x\nA=$UID\n", "f.env", scope={}) == {"A": "5"}
    err = capsys.readouterr().err
    assert "WARNING: f.env: ignoring PWD" in err and "WARNING: f.env: ignoring UID" in err


def test_uid_reads_the_callers_uid() -> None:
    assert evaluate("A=$UID:$GID\n", "f", scope={}) == {"A": f"{os.getuid()}:{os.getgid()}"}


SUBST = "command substitution ($(...) or `...`) is not supported in an env file"
ONLY_ASSIGNMENTS = "only variable assignments are allowed in an env file"


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        ("junk\n", 1, "'junk' is a command: an env file may only set variables"),
        ("A=1\n# c\n\n  echo hi\n", 4, "'echo' is a command"),
        ("A=1 B=2 cmd\n", 1, "'cmd' is a command"),
        ("1A=x\n", 1, "'1A=x' is a command"),
        ("A B=x\n", 1, "'A' is a command"),
        ("!!!@@NOTAVAR\n", 1, "'!!!@@NOTAVAR' is a command"),
        ("A=$(date)\n", 1, SUBST),
        ("A=\"x\"\nB=\"`id`\"\n", 2, SUBST),
        ("A=$((1+2))\n", 1, "arithmetic expansion $((...)) is not supported"),
        ("A=1 | tee f\n", 1, f"'|': {ONLY_ASSIGNMENTS}"),
        ("A=1 > f\n", 1, f"'>': {ONLY_ASSIGNMENTS}"),
        ("A=1 &\n", 1, f"'&': {ONLY_ASSIGNMENTS}"),
        ("(A=1)\n", 1, f"'(': {ONLY_ASSIGNMENTS}"),
        ("A=1\nB=\"open\n\n", 2, "unterminated double quote"),
        ("A='open\n", 1, "unterminated single quote"),
        ("A=${B\n", 1, "bad substitution: expected }"),
        ("A=${B:-x\n", 1, "unterminated ${...}"),
        ("A=${B%x}\n", 1, "unsupported substitution ${B%...}"),
        ("A=${1}\n", 1, "the special parameter $1 is not supported"),
        ("A=$1\n", 1, "the special parameter $1 is not supported"),
        ("A=$$\n", 1, "the special parameter $$ is not supported"),
        ("A=${NOPE:?is required}\n", 1, "NOPE: is required"),
        ("A=$'x'\n", 1, "$'...' quoting is not supported"),
        ("export 1A=2\n", 1, "export: '1A=2' is not a valid variable name"),
        ("unset 'A B'\n", 1, "unset: 'A B' is not a valid variable name"),
    ],
    ids=["word", "line-number-counts-all-lines", "command-after-assignments", "bad-name", "space-in-name",
         "apptainer-invalid-case", "command-substitution", "backquotes", "arithmetic", "pipe", "redirection",
         "background", "subshell", "unterminated-double-names-its-line", "unterminated-single", "unclosed-brace",
         "unclosed-brace-word", "unsupported-operator", "positional-braced", "positional", "pid",
         "required-variable", "ansi-c-quotes", "export-bad-name", "unset-bad-name"],
)
def test_errors_name_file_and_line(text: str, line: int, problem: str) -> None:
    """A bad file is an error of the file, not of the command line: exit 255, as for an unreadable one."""
    with pytest.raises(SingpyError) as caught:
        evaluate(text, "/path/vars.env", scope=SCOPE)
    assert caught.value.message.startswith(f"/path/vars.env:{line}: {problem}")
    assert caught.value.exit_code == 255


def test_nothing_is_ever_run(tmp_path: Path) -> None:
    os.chdir(tmp_path)
    for text in ("A=$(touch PWNED)\n", "A=`touch PWNED`\n", "touch PWNED\n", "A=1 > PWNED\n", "A=\"$(touch PWNED\n"):
        with pytest.raises(SingpyError):
            evaluate(text, "f", scope={})
    assert list(tmp_path.iterdir()) == []


@given(st.text(alphabet=st.sampled_from(list("AB=$ {}()`'\"\\#;:~|-+?\n\tx1")), max_size=40))
def test_any_text_gives_variables_or_one_error(text: str) -> None:
    """Never a hang, never another exception: a dict of variables, or an error naming the file and a line."""
    try:
        result = evaluate(text, "f", scope=SCOPE)
    except SingpyError as error:
        assert error.message.startswith("f:")
        line = int(error.message.split(":")[1])
        assert 1 <= line <= text.count("\n") + 1
    else:
        assert all(isinstance(value, str) for value in result.values())

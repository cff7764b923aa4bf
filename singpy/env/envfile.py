"""`--env-file`: a file of shell assignments, read as Apptainer reads it, without running anything.

Apptainer evaluates an env file with the shell interpreter built into it
(mvdan.cc/sh), `set -a` on, external commands and file redirections
disabled, starting from the host's environment (not exported: only what the
file assigns or exports comes out), plus `APPTAINER_IMAGE`. This module
evaluates the part of the shell language such a file is written in, with the
same results:

* statements separated by newlines or `;`, `#` comments, blank lines,
  `\\`-newline continuations;
* `NAME=VALUE` (several per line), `export NAME=VALUE`, `export NAME`,
  `unset NAME`;
* quoting: `'...'` literal, `"..."` with `\\$ \\` \\" \\\\` escapes, `\\x`
  outside quotes; values may span lines inside quotes;
* `$NAME`, `${NAME}`, `${#NAME}`, `${NAME:-word}`,
  `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`, `${NAME:=word}`,
  `${NAME=word}`, `${NAME:?word}`, `${NAME?word}`; a leading `~` (and one
  after `:`) in a value is the host's `$HOME`.

Command substitution (`$(...)`, backquotes) would run a program on the host
before the container exists, and Apptainer itself refuses every program but
its shell's builtins: it is refused here, as is everything else a shell could
do (pipes, redirections, `if`, functions, arithmetic, positional
parameters, which Apptainer fills with its own action script), each with one error
naming the file and line. The values are then injected like `--env` values,
so `\\$PATH` (a dollar sign kept by the file's quoting) is evaluated inside
the container, after the image's env scripts.
"""

from __future__ import annotations

import os

from singpy import console
from singpy.env.environ import is_valid_name
from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record: `collections.abc` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping

# Set by the shell itself; Apptainer drops them from a file's results (sylabs/singularity#1263).
SHELL_OWNED = ("EUID", "GID", "IFS", "OPTIND", "PWD", "UID")
_BLANKS = " \t"
_OPERATORS = "|&<>()"
_WORD_END = _BLANKS + "\n;" + _OPERATORS
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SPECIAL = "$!-?#@*0123456789"  # parameters a file has no use for ($$ is a pid, $? a status, $1 an argument)


class EnvFileError(SingpyError):
    """A file that is not an env file singpy can read: an error of the file, exit 255."""


def evaluate(text: str, origin: str, *, scope: Mapping[str, str]) -> dict[str, str]:
    """The variables the file assigns or exports, as NAME -> value, in the order they were first set.

    `scope` is what `$NAME` sees before the file assigns it (the host's
    environment); `origin` names the file in errors.
    """
    try:
        return _Reader(text.replace("\r\n", "\n"), origin, scope).run()
    except RecursionError:  # `${X:-${X:-...}}` nested thousands deep: the reader descends once per level
        raise EnvFileError(f"{origin}: expansions nested too deeply") from None


class _Reader:
    def __init__(self, text: str, origin: str, scope: Mapping[str, str]) -> None:
        self.text, self.origin = text, origin
        self.scope = dict(scope)
        self.scope.update({"UID": str(os.getuid()), "EUID": str(os.geteuid()), "GID": str(os.getgid())})
        self.exported: dict[str, None] = {}  # an ordered set
        self.pos = 0
        self.line = 1

    # --- errors and positions ---------------------------------------------------------------------------------

    def fail(self, problem: str, line: int | None = None) -> EnvFileError:
        return EnvFileError(f"{self.origin}:{line or self.line}: {problem}")

    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < len(self.text) else ""

    def advance(self, count: int = 1) -> str:
        taken = self.text[self.pos:self.pos + count]
        self.line += taken.count("\n")
        self.pos += count
        return taken

    # --- statements -------------------------------------------------------------------------------------------

    def run(self) -> dict[str, str]:
        while self.pos < len(self.text):
            self.statement()
        for name in SHELL_OWNED:
            if name in self.exported:
                console.warning(f"{self.origin}: ignoring {name}: a shell sets it itself (as Apptainer ignores it)")
        return {name: self.scope[name] for name in self.exported if name in self.scope and name not in SHELL_OWNED}

    def skip_blanks(self) -> None:
        while True:
            char = self.peek()
            if char and char in _BLANKS:
                self.advance()
            elif char == "\\" and self.peek(1) == "\n":
                self.advance(2)
            elif char == "#":  # a comment: only where a word would start
                while self.peek() not in ("", "\n"):
                    self.advance()
            else:
                return

    def at_statement_end(self) -> bool:
        self.skip_blanks()
        char = self.peek()
        if char in _OPERATORS and char:
            raise self.fail(f"{char!r}: only variable assignments are allowed in an env file "
                            "(no pipes, redirections or subshells)")
        return char in ("", "\n", ";")

    def statement(self) -> None:
        command: str | None = None
        while not self.at_statement_end():
            if command in (None, "export") and (name := self.assignment_name()) is not None:
                self.assign(name, self.word(assignment=True))
                continue
            start = self.line
            word = self.word(assignment=False)
            if command is None:
                command = word
                if word not in ("export", "unset"):
                    raise self.fail(f"{word!r} is a command: an env file may only set variables (NAME=VALUE, "
                                    "export NAME=VALUE); singpy does not run commands from it", start)
            elif command == "export":
                self.export(word, start)
            else:
                self.unset(word, start)
        if self.peek():
            self.advance()  # the newline or `;`

    def assignment_name(self) -> str | None:
        """The NAME of a `NAME=` starting here (consumed with the `=`), else None (nothing consumed)."""
        end = self.pos
        while end < len(self.text) and self.text[end] in _NAME_CHARS:
            end += 1
        name = self.text[self.pos:end]
        if end < len(self.text) and self.text[end] == "=" and is_valid_name(name):
            self.advance(end + 1 - self.pos)
            return name
        return None

    def assign(self, name: str, value: str) -> None:
        self.scope[name] = value
        self.exported[name] = None  # `set -a`: every assignment is exported

    def export(self, word: str, line: int) -> None:
        name, sep, value = word.partition("=")
        if not is_valid_name(name):
            raise self.fail(f"export: {word!r} is not a valid variable name", line)
        if sep:
            self.assign(name, value)
        elif name in self.scope:  # `export NAME`: its value so far, the file's or the host's
            self.exported[name] = None

    def unset(self, name: str, line: int) -> None:
        if not is_valid_name(name):
            raise self.fail(f"unset: {name!r} is not a valid variable name", line)
        self.scope.pop(name, None)
        self.exported.pop(name, None)

    # --- words ------------------------------------------------------------------------------------------------

    def word(self, *, assignment: bool, until: str = "", opened: int = 0) -> str:
        """One word (or, with `until`, the text of a `${NAME-word}` up to `}`), expanded.

        An export's `NAME=VALUE` is expanded like an assignment, as bash and
        Apptainer's interpreter do: no field splitting, no globbing.
        """
        out: list[str] = []
        tilde_ok = assignment
        while True:
            char = self.peek()
            if until:
                if char == until:
                    return "".join(out)
                if not char:
                    raise self.fail("unterminated ${...}", opened)
            elif not char or char in _WORD_END:
                return "".join(out)
            if tilde_ok and char == "~" and self.peek(1) in ("", "/", ":", "\n", " ", "\t", ";", until or "\n"):
                self.advance()
                out.append(self.scope.get("HOME", "~"))
                tilde_ok = False
                continue
            tilde_ok = assignment and char == ":"
            if char == "\\":
                self.advance()
                following = self.advance() if self.peek() else "\\"
                out.append("" if following == "\n" else following)
            elif char == "'":
                out.append(self.single_quoted())
            elif char == '"':
                out.append(self.double_quoted())
            elif char == "$":
                out.append(self.expansion())
            elif char == "`":
                raise self.command_substitution()
            else:
                out.append(self.advance())

    def single_quoted(self) -> str:
        start = self.line
        self.advance()
        end = self.text.find("'", self.pos)
        if end < 0:
            raise self.fail("unterminated single quote", start)
        body = self.advance(end - self.pos)
        self.advance()
        return body

    def double_quoted(self) -> str:
        start = self.line
        self.advance()
        out: list[str] = []
        while True:
            char = self.peek()
            if not char:
                raise self.fail("unterminated double quote", start)
            if char == '"':
                self.advance()
                return "".join(out)
            if char == "\\" and self.peek(1) in ("$", "`", '"', "\\", "\n"):
                self.advance()
                following = self.advance()
                out.append("" if following == "\n" else following)
            elif char == "$":
                out.append(self.expansion(quoted=True))
            elif char == "`":
                raise self.command_substitution()
            else:
                out.append(self.advance())

    def command_substitution(self) -> EnvFileError:
        return self.fail("command substitution ($(...) or `...`) is not supported in an env file: singpy does "
                         "not run commands on the host (write the value, or --env 'NAME=$(cmd)' to run it in "
                         "the container)")

    # --- expansions -------------------------------------------------------------------------------------------

    def expansion(self, *, quoted: bool = False) -> str:
        """After a `$`: a parameter, or the `$` itself when nothing that names one follows."""
        following = self.peek(1)
        if following == "(":
            if self.peek(2) == "(":
                raise self.fail("arithmetic expansion $((...)) is not supported in an env file")
            raise self.command_substitution()
        if following == "{":
            self.advance(2)
            return self.braced(quoted)
        if following in ("'", '"') and not quoted and following:
            raise self.fail(f"${following}...{following} quoting is not supported in an env file")
        if following and following in _SPECIAL:
            raise self.special(following)
        end = self.pos + 1
        while end < len(self.text) and self.text[end] in _NAME_CHARS:
            end += 1
        name = self.text[self.pos + 1:end]
        if not is_valid_name(name):
            return self.advance()  # `$` before a space, a `/`, the end: itself
        self.advance(end - self.pos)
        return self.scope.get(name, "")

    def special(self, char: str) -> EnvFileError:
        return self.fail(f"the special parameter ${char} is not supported in an env file")

    def braced(self, quoted: bool) -> str:
        """After `${`: NAME, #NAME, or NAME followed by one of the operators the module lists."""
        start = self.line
        length = self.peek() == "#"
        if length:
            self.advance()
        end = self.pos
        while end < len(self.text) and self.text[end] in _NAME_CHARS:
            end += 1
        name = self.text[self.pos:end]
        if not is_valid_name(name):
            if self.peek() and self.peek() in _SPECIAL:
                raise self.special(self.peek())
            raise self.fail("bad substitution: ${ must be followed by a variable name", start)
        self.advance(len(name))
        value = self.scope.get(name)
        if length:
            self.expect_close(start)
            return str(len(value or ""))
        if self.peek() == "}":
            self.advance()
            return value or ""
        colon = self.peek() == ":"
        operator = self.peek(1) if colon else self.peek()
        if not colon and (not operator or operator not in "-=+?%#/^,@"):
            raise self.fail("bad substitution: expected }", start)
        if not operator or operator not in "-=+?":
            raise self.fail(f"unsupported substitution ${{{name}{':' if colon else ''}{operator}...}} "
                            "(an env file may use ${NAME}, ${#NAME}, ${NAME:-word}, ${NAME:+word}, "
                            "${NAME:=word}, ${NAME:?word})", start)
        self.advance(2 if colon else 1)
        word = self.braced_word(quoted)
        self.expect_close(start)
        unset = value is None or (colon and value == "")
        if operator == "+":
            return "" if unset else word
        if not unset:
            return value or ""
        if operator == "=":
            self.assign(name, word)
        elif operator == "?":
            raise self.fail(f"{name}: {word or 'parameter null or not set'}", start)
        return word

    def braced_word(self, quoted: bool) -> str:
        """The word of ${NAME-word}: expansions and quotes work, blanks are kept; inside "..." a ' is itself."""
        start = self.line
        if not quoted:
            return self.word(assignment=False, until="}", opened=start)
        out: list[str] = []
        while self.peek() != "}":
            char = self.peek()
            if not char:
                raise self.fail("unterminated ${...}", start)
            if char == "\\" and self.peek(1) in ("$", "`", '"', "\\", "}"):
                self.advance()
                out.append(self.advance())
            elif char == '"':
                out.append(self.double_quoted())
            elif char == "$":
                out.append(self.expansion(quoted=True))
            elif char == "`":
                raise self.command_substitution()
            else:
                out.append(self.advance())
        return "".join(out)

    def expect_close(self, start: int) -> None:
        if self.peek() != "}":
            raise self.fail("bad substitution: expected }", start)
        self.advance()

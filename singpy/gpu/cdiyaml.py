"""A strict reader for the YAML that `nvidia-ctk cdi generate` writes, so that PyYAML is not needed.

CDI specs are JSON or YAML (singpy.gpu.cdi). The YAML that NVIDIA's tools
(Go's yaml.v2/yaml.v3 through sigs.k8s.io/yaml) and hand-written specs use is
a small subset: block mappings and sequences by indentation (a sequence may
sit at its key's indentation), `- ` items that open a mapping, plain and
quoted scalars, `[]`/`{}` for empty collections, comments and one `---`.
Anything else (anchors, tags, block scalars, flow collections with content,
multi-line scalars, tabs in indentation, duplicate keys) is refused with a
`YamlError` naming the line, never guessed at: a spec misread here would
expose the wrong devices.

Scalars are typed the way a CDI spec needs: integers (major/minor, uid/gid,
fileMode), true/false, null/~, else strings; quoted scalars are always strings.
"""

from __future__ import annotations

import re

Value = None | bool | int | str | list["Value"] | dict[str, "Value"]

_INT = re.compile(r"[-+]?(0|[1-9][0-9]*|0o[0-7]+|0x[0-9a-fA-F]+)")
_CONSTANTS: dict[str, Value] = {"true": True, "True": True, "TRUE": True, "false": False, "False": False,
                                "FALSE": False, "null": None, "Null": None, "NULL": None, "~": None}
_REFUSED_START = "&*!|>%@`{["  # anchors, aliases, tags, block scalars, directives, reserved, flow
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "/": "/", " ": " ", "e": "\x1b"}


class YamlError(Exception):
    """The text is not in the subset: `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


class _Line:
    __slots__ = ("number", "indent", "text")

    def __init__(self, number: int, indent: int, text: str) -> None:
        self.number, self.indent, self.text = number, indent, text

    def is_item(self) -> bool:
        return self.text == "-" or self.text.startswith("- ")


def loads(text: str) -> Value:
    """The document in `text` (an empty one is None)."""
    lines = _lines(text)
    if not lines:
        return None
    parser = _Parser(lines)
    value = parser.block(0, lines[0].indent)
    if parser.pos < len(lines):
        line = lines[parser.pos]
        raise YamlError(line.number, f"unexpected indentation or content: {line.text!r}")
    return value


def _lines(text: str) -> list[_Line]:
    """Significant lines: comments and blank lines dropped, one leading `---` (and a final `...`) allowed."""
    found: list[_Line] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.rstrip("\r")
        body = raw.lstrip(" ")
        if body.startswith("\t") or ("\t" in raw[:len(raw) - len(body)]):
            raise YamlError(number, "a tab in the indentation")
        body = _strip_comment(body, number).rstrip()
        if not body:
            continue
        if body in ("---", "..."):
            if body == "---" and not found:
                continue
            if body == "...":
                break
            raise YamlError(number, "a second document (---): one spec per file")
        if body.startswith("%"):
            raise YamlError(number, "YAML directives are not supported")
        found.append(_Line(number, len(raw) - len(raw.lstrip(" ")), body))
    return found


def _strip_comment(body: str, number: int) -> str:
    """`body` without a trailing `# comment` (a # that starts the text or follows a space, outside quotes)."""
    quote = ""
    index = 0
    while index < len(body):
        char = body[index]
        if quote:
            if char == "\\" and quote == '"':
                index += 1
            elif char == quote:
                quote = ""
        elif char in "'\"" and (index == 0 or body[index - 1] in " :-[{,"):
            quote = char
        elif char == "#" and (index == 0 or body[index - 1] == " "):
            return body[:index]
        index += 1
    return body


class _Parser:
    def __init__(self, lines: list[_Line]) -> None:
        self.lines = lines
        self.pos = 0

    def block(self, pos: int, indent: int) -> Value:
        self.pos = pos
        line = self.lines[pos]
        if line.indent != indent:
            raise YamlError(line.number, "unexpected indentation")
        if line.is_item():
            return self.sequence(indent)
        if _split_key(line) is not None:
            return self.mapping(indent)
        value = _scalar(line.text, line.number)
        self.pos += 1
        return value

    def mapping(self, indent: int) -> dict[str, Value]:
        result: dict[str, Value] = {}
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.indent < indent or (line.indent == indent and line.is_item()):
                break
            if line.indent > indent:
                raise YamlError(line.number, "unexpected indentation")
            pair = _split_key(line)
            if pair is None:
                raise YamlError(line.number, f"expected `key: value`, found {line.text!r}")
            key, rest = pair
            if key in result:
                raise YamlError(line.number, f"duplicate key {key!r}")
            self.pos += 1
            result[key] = self._value_after(rest, indent, line.number, in_mapping=True)
        return result

    def sequence(self, indent: int) -> list[Value]:
        result: list[Value] = []
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            if line.indent < indent or (line.indent == indent and not line.is_item()):
                break
            if line.indent > indent:
                raise YamlError(line.number, "unexpected indentation")
            rest = line.text[1:].lstrip(" ")
            if not rest:  # "-" alone: the item is the block below
                self.pos += 1
                result.append(self._value_after("", indent, line.number, in_mapping=False))
                continue
            inner = _Line(line.number, indent + len(line.text) - len(rest), rest)
            if inner.is_item() or _split_key(inner) is not None:
                self.lines[self.pos] = inner  # the item's content is a block at the column it starts in
                result.append(self.block(self.pos, inner.indent))
            else:
                result.append(_scalar(rest, line.number))
                self.pos += 1
        return result

    def _value_after(self, rest: str, indent: int, number: int, *, in_mapping: bool) -> Value:
        """The value of a key (or a bare `-`): inline, or the block on the following lines."""
        if rest:
            return _scalar(rest, number)
        if self.pos >= len(self.lines):
            return None
        following = self.lines[self.pos]
        if following.indent > indent:
            return self.block(self.pos, following.indent)
        if in_mapping and following.indent == indent and following.is_item():
            return self.sequence(indent)  # `key:` then `- item` at the key's column, as Go's yaml writes it
        return None


def _split_key(line: _Line) -> tuple[str, str] | None:
    """(key, rest) when the line is `key: rest` or `key:`; None when it is a scalar."""
    text = line.text
    if text[0] in "'\"":
        end = _quote_end(text, line.number)
        after = text[end:]
        if not (after == ":" or after.startswith(": ")):
            return None
        key = _scalar(text[:end], line.number)
        assert isinstance(key, str)
        return key, after[1:].strip()
    match = re.search(r":( |$)", text)
    if match is None:
        return None
    key = text[:match.start()].rstrip()
    if not key or key[0] in _REFUSED_START or key.startswith(("? ", "- ")):
        raise YamlError(line.number, f"unsupported mapping key {key!r}")
    return key, text[match.end():].strip()


def _quote_end(text: str, number: int) -> int:
    """Index just past the closing quote of the quoted scalar that starts `text`."""
    quote = text[0]
    index = 1
    while index < len(text):
        if quote == '"' and text[index] == "\\":
            index += 2
            continue
        if text[index] == quote:
            if quote == "'" and text[index + 1:index + 2] == "'":
                index += 2
                continue
            return index + 1
        index += 1
    raise YamlError(number, "a quoted scalar that does not end on its line")


def _scalar(text: str, number: int) -> Value:
    if text in ("[]", "{}"):
        return [] if text == "[]" else {}
    if text[0] in "'\"":
        end = _quote_end(text, number)
        if text[end:].strip():
            raise YamlError(number, f"unexpected text after a quoted scalar: {text[end:]!r}")
        return _unquote(text[:end], number)
    if text[0] in _REFUSED_START:
        raise YamlError(number, f"unsupported YAML (anchor, alias, tag, block scalar or flow collection): {text!r}")
    if text.startswith("- ") or text == "-" or re.search(r":( |$)", text) or " #" in text:
        raise YamlError(number, f"unsupported plain scalar {text!r}")
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    if _INT.fullmatch(text):
        return int(text.replace("0o", ""), 8) if "0o" in text else int(text, 0)
    return text


def _unquote(text: str, number: int) -> str:
    body = text[1:-1]
    if text[0] == "'":
        return body.replace("''", "'")
    out: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\":
            out.append(char)
            index += 1
            continue
        code = body[index + 1:index + 2]
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
            index += 2
        elif code in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[code]
            digits = body[index + 2:index + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise YamlError(number, f"bad escape \\{code}{digits}")
            out.append(chr(int(digits, 16)))
            index += 2 + width
        else:
            raise YamlError(number, f"unsupported escape \\{code}")
    return "".join(out)

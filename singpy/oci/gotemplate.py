"""The part of Go's text/template that Apptainer's `ociRunscript` uses, rendered as Go renders it."""

from __future__ import annotations

import re
from collections.abc import Mapping


def render_template(template: str, data: Mapping[str, str]) -> str:
    """Go's text/template for what `ociRunscript` uses: {{ .Field }}, if / else if / else / end on string
    fields (true when not empty), and the `{{-` / `-}}` markers that trim the white space next to them."""
    items = _lex(template)
    output, position = _render(items, 0, data, emit=True)
    if position != len(items):
        raise ValueError("unbalanced template")
    return output


_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.DOTALL)
_GO_SPACE = " \t\r\n"


def _lex(template: str) -> list[tuple[str, str]]:
    """[("text", ...), ("action", "if .X"), ...], with Go's trimming applied to the texts around actions."""
    items: list[tuple[str, str]] = []
    position, trim_next = 0, False
    for match in _ACTION.finditer(template):
        text = template[position:match.start()]
        if trim_next:
            text = text.lstrip(_GO_SPACE)
        if match.group(1):
            text = text.rstrip(_GO_SPACE)
        items.append(("text", text))
        items.append(("action", match.group(2)))
        position, trim_next = match.end(), bool(match.group(3))
    tail = template[position:]
    items.append(("text", tail.lstrip(_GO_SPACE) if trim_next else tail))
    return items


def _render(items: list[tuple[str, str]], position: int, data: Mapping[str, str], *, emit: bool) -> tuple[str, int]:
    """Output from `position` up to the else/end that closes the current block (its index returned)."""
    output: list[str] = []
    while position < len(items):
        kind, value = items[position]
        if kind == "text":
            output.append(value if emit else "")
            position += 1
        elif value.startswith("if "):
            text, position = _render_if(items, position, data, emit=emit)
            output.append(text)
        elif value == "end" or value == "else" or value.startswith("else if "):
            break
        elif value.startswith("."):
            output.append(data[value[1:]] if emit else "")
            position += 1
        else:
            raise ValueError(f"unsupported template action {value!r}")
    return "".join(output), position


def _render_if(items: list[tuple[str, str]], position: int, data: Mapping[str, str],
               *, emit: bool) -> tuple[str, int]:
    """An if/else if/else/end chain starting at `position`; returns its output and the index after `end`."""
    chosen = ""
    taken = False
    condition: str | None = items[position][1][len("if "):]
    position += 1
    while True:
        active = emit and not taken and (condition is None or bool(data[condition.lstrip(".")]))
        text, position = _render(items, position, data, emit=active)
        if active:
            chosen, taken = text, True
        action = items[position][1]
        position += 1
        if action == "end":
            return chosen, position
        condition = action[len("else if "):] if action.startswith("else if ") else None

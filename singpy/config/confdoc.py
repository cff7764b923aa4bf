"""docs/configuration.md's directive table, generated from `sysconf.DIRECTIVES`.

`python -m singpy.config.confdoc` prints the table; a unit test checks that
the document carries exactly this table, so docs and parser cannot drift.
"""

from __future__ import annotations

from singpy.config.sysconf import BOOL, CHOICE, DIRECTIVES, LIST, Directive


def _default(directive: Directive) -> str:
    if directive.kind == BOOL:
        return "yes" if directive.default else "no"
    if directive.kind == LIST:
        return "(none)"
    return f"`{directive.default}`" if directive.default != "" else "(empty)"


def _values(directive: Directive) -> str:
    if directive.kind == CHOICE:
        return " \\| ".join(directive.allowed)
    return {BOOL: "yes \\| no", LIST: "path, repeatable"}.get(directive.kind, directive.kind)


def render_table() -> str:
    rows = ["| directive | values | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{d.name}` | {_values(d)} | {_default(d)} | {d.doc} |" for d in DIRECTIVES]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")

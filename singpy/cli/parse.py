"""The fast command-line parser for `run`, `exec` and `shell`.

These commands are started thousands of times per job array, and importing
typer costs 45-60 ms here, 110-120 ms for the releases that load rich eagerly
(benchmarks/README.md measures every release from 0.9 to 0.29), several times
Python's own start-up. So this parser,
generated from the declarative table in `singpy.cli.options`, handles them
with nothing but the standard library; typer serves the other commands.

Parsing follows Apptainer (cobra with interspersed arguments off): options
come before the image, and everything after the image belongs to the payload.
"""

from __future__ import annotations

from collections.abc import Mapping

from singpy.cli.options import ACTION_OPTIONS, ACTIONS, ENV_PREFIXES, GLOBAL_OPTIONS, Option
from singpy.errors import UsageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import Any

_TRUE = ("1", "true", "yes", "on")


def _index(options: tuple[Option, ...]) -> dict[str, Option]:
    table = {}
    for option in options:
        table[option.long] = option
        if option.short:
            table[option.short] = option
    return table


_ACTION_INDEX = _index(ACTION_OPTIONS)
_GLOBAL_INDEX = _index(GLOBAL_OPTIONS)


def split_global(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Consume the global flags before the command; return them and the rest."""
    values: dict[str, Any] = {}
    rest = list(argv)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        _take(rest, _GLOBAL_INDEX, values, "")
    return values, rest


def parse_action(action: str, argv: list[str], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Parse `singpy ACTION [options] IMAGE [args]`; return options and positionals."""
    values: dict[str, Any] = {}
    rest = list(argv)
    while rest and rest[0].startswith("-") and rest[0] != "-":
        if rest[0] == "--":
            rest.pop(0)
            break
        _take(rest, _ACTION_INDEX, values, action)
    if values.get("help"):
        return values, rest
    _apply_env(values, env)
    return values, rest


def _take(rest: list[str], index: dict[str, Option], values: dict[str, Any], command: str) -> None:
    """Consume one option (and its value) from the front of `rest`."""
    word = rest.pop(0)
    name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
    if not word.startswith("--") and len(word) > 2:
        name, inline = word[:2], word[2:]
        if inline.startswith("=") and index.get(name) is not None and index[name].value:
            inline = inline[1:]  # -B=/data means /data, as with Apptainer's flag parser
    option = index.get(name)
    if option is None:
        raise UsageError(f"unknown flag: {name}", hint=f"Run '{_command_line(command)} --help' for usage.")
    if not option.value:
        if eq:
            raise UsageError(f"flag {name} takes no value")
        if inline:  # a bundle of short flags, as -ce
            rest.insert(0, "-" + inline)
        values[option.dest] = True
        return
    if eq or inline:
        value = inline
    elif rest:
        value = rest.pop(0)
    else:
        raise UsageError(f"flag needs an argument: {name}",
                         hint=f"Run '{_command_line(command)} --help' for usage.")
    _store(values, option, value)


def _command_line(command: str) -> str:
    return f"singpy {command}" if command else "singpy"


def _store(values: dict[str, Any], option: Option, value: str) -> None:
    if option.repeat:
        values.setdefault(option.dest, []).append(value)
    else:
        values[option.dest] = value


def _apply_env(values: dict[str, Any], env: Mapping[str, str]) -> None:
    """Options not given on the command line may come from the environment.

    As in Apptainer, `SINGULARITY_BIND` adds to the --bind values rather than
    being overridden by them, and so does `SINGULARITY_BINDPATH` (each suffix
    of an option is read, the first one set wins for an option that is not
    repeated: `--pwd` reads `*_PWD` then `*_TARGET_PWD`).
    """
    for option in ACTION_OPTIONS:
        for suffix in (option.env, *option.env_also) if option.env else ():
            if option.dest in values and not option.env_appends:
                break
            _apply_variable(values, option, env, suffix)


def _apply_variable(values: dict[str, Any], option: Option, env: Mapping[str, str], suffix: str) -> None:
    for prefix in reversed(ENV_PREFIXES):  # SINGPY_ beats APPTAINER_ beats SINGULARITY_
        raw = env.get(prefix + suffix)
        if raw is None or raw == "":
            continue
        if option.value:
            _store(values, option, raw)
        elif raw.lower() in _TRUE:
            values[option.dest] = True
        return


def action_help(action: str) -> str:
    usage, summary = ACTIONS[action]
    lines = [f"Usage: singpy {action} [options] {usage}", "", summary.capitalize() + "."]
    groups: dict[str, list[Option]] = {}
    for option in ACTION_OPTIONS:
        groups.setdefault(option.group, []).append(option)
    for group, options in groups.items():
        lines += ["", f"{group}:"]
        for option in options:
            names = ", ".join(n for n in (option.short, option.long) if n)
            if option.value:
                names += f" {option.value}"
            env = f" [${ENV_PREFIXES[1]}{option.env}]" if option.env else ""
            lines.append(f"  {names:<28} {option.help}{env}")
    return "\n".join(lines) + "\n"

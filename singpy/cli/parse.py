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

from singpy.cli.options import ACTION_OPTIONS, ACTIONS, ENV_PREFIXES, EXAMPLES, GLOBAL_OPTIONS, NOT_SUPPORTED, Option
from singpy.errors import UsageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:  # collections.abc (with collections, operator, keyword...) costs ~1.5 ms of every exec
    from collections.abc import Iterable, Mapping
    from typing import Any

# A switch's variable, as Go's strconv.ParseBool reads it for Apptainer (1 t true, 0 f false, any case), and
# y/yes/on, n/no/off as the other commands' (click's words); anything else is an error, as Apptainer's
# "unable to set flag": never a silent "off"
_TRUE = ("1", "t", "true", "y", "yes", "on")
_FALSE = ("0", "f", "false", "n", "no", "off")


def _index(options: tuple[Option, ...]) -> dict[str, Option]:
    table = {}
    for option in options:
        table[option.long] = option
        if option.short:
            table[option.short] = option
    return table


_ACTION_INDEX = _index(ACTION_OPTIONS)
_GLOBAL_INDEX = _index(GLOBAL_OPTIONS)


def split_global(argv: list[str], env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Consume the global flags before the command; return them and the rest.

    With `env`, the flags not given are read from Apptainer's variables of the
    global flags (APPTAINER_DEBUG, ..._CONFIG_FILE: GLOBAL_OPTIONS' env), as
    Apptainer reads them for every command.
    """
    values: dict[str, Any] = {}
    rest = list(argv)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        _take(rest, _GLOBAL_INDEX, values, "")
    if env is not None and not values.get("help") and not values.get("version"):
        _apply_env(values, env, GLOBAL_OPTIONS)
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
    _apply_env(values, env, command=action)
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
    if option is None and index is _ACTION_INDEX and command in NOT_SUPPORTED.get(name, ((), ""))[0]:
        raise UsageError(f"{name} is not supported: {NOT_SUPPORTED[name][1]}")
    if option is None or (option.commands and command not in option.commands):
        known = [word for word, known_option in index.items() if command in known_option.commands or
                 not known_option.commands]
        raise UsageError(unknown("flag", name, known), hint=f"Run '{_command_line(command)} --help' for usage.")
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


def unknown(kind: str, name: str, known: Iterable[str]) -> str:
    """The one wording of every "unknown" mistake: `unknown flag: --bnd (did you mean --bind?)`.

    The suggestion is made only here, on the error path, so difflib is never
    imported by a command line that parses (start-up time).
    """
    return f"unknown {kind}: {name}{suggestion(name, known)}"


def suggestion(name: str, known: Iterable[str]) -> str:
    """` (did you mean --bind?)` for the known word nearest to `name`, "" when none is near."""
    import difflib

    # compared without their dashes, which every flag shares; 0.75 keeps `--bogus` from suggesting `--uts`
    words = {word.lstrip("-"): word for word in known if word.startswith("--") == name.startswith("--")}
    close = difflib.get_close_matches(name.lstrip("-"), list(words), n=1, cutoff=0.75)
    return f" (did you mean {words[close[0]]}?)" if close else ""


def _command_line(command: str) -> str:
    return f"singpy {command}" if command else "singpy"


def _store(values: dict[str, Any], option: Option, value: str) -> None:
    if option.repeat:
        values.setdefault(option.dest, []).append(value)
    else:
        values[option.dest] = value


def _apply_env(values: dict[str, Any], env: Mapping[str, str], options: tuple[Option, ...] = ACTION_OPTIONS,
               command: str = "") -> None:
    """Options not given on the command line may come from the environment.

    As in Apptainer, `SINGULARITY_BIND` adds to the --bind values rather than
    being overridden by them, and so does `SINGULARITY_BINDPATH` (each suffix
    of an option is read, the first one set wins for an option that is not
    repeated: `--pwd` reads `*_PWD` then `*_TARGET_PWD`). The variables of an option that `command` does
    not take are not read (APPTAINER_RUNSCRIPT_TIMEOUT is harmless to exec).
    """
    for option in options:
        if option.commands and command not in option.commands:
            continue
        for suffix in (option.env, *option.env_also) if option.env else ():
            if option.dest in values and not option.env_appends:
                break
            _apply_variable(values, option, env, suffix)


def _apply_variable(values: dict[str, Any], option: Option, env: Mapping[str, str], suffix: str) -> None:
    for prefix in reversed(ENV_PREFIXES):  # SINGPY_ beats APPTAINER_ beats SINGULARITY_
        raw = env.get(prefix + suffix)
        if raw is None or raw.strip() == "":
            continue
        if option.value:
            _store(values, option, raw)
        elif raw.strip().lower() in _TRUE:
            values[option.dest] = True
        elif raw.strip().lower() not in _FALSE:
            raise UsageError(f"{prefix}{suffix}={raw[:40]!r}: not a boolean (1, t, true, y, yes, on; 0, f, false, n, "
                             "no, off)")
        return


def action_help(action: str, *, command: str = "", usage: str = "", summary: str = "") -> str:
    """The help of run/exec/shell, or (`command`, `usage`, `summary`) of a command taking their options."""
    action_usage, action_summary = ACTIONS[action]
    command = command or action
    return help_text(f"singpy {command} [options] {usage or action_usage}",
                     summary or action_summary.capitalize() + ".",
                     [(option.group, help_row(option.short, option.long, option.value, option.help,
                                              option.env and ENV_PREFIXES[1] + option.env))
                      for option in ACTION_OPTIONS
                      if not option.hidden and (not option.commands or command in option.commands)],
                     EXAMPLES.get(command, ()))


def help_row(short: str, long: str, value: str, text: str, variable: str = "") -> str:
    """One option of a help text, the same for every command: `  -B, --bind SPEC   text [$APPTAINER_BIND]`."""
    names = ", ".join(name for name in (short, long) if name) if short else f"    {long}"
    if value:
        names += f" {value}"
    return f"  {names:<28} {text}" + (f" [${variable}]" if variable else "")


def help_text(usage: str, summary: str, rows: list[tuple[str, str]], examples: Iterable[str] = (),
              sections: Iterable[tuple[str, list[str]]] = ()) -> str:
    """Every help of singpy, in one plain-text layout: usage, summary, grouped options, examples.

    `rows` are (group, help_row) pairs, shown by group in first-seen order;
    `sections` are further (title, lines) blocks (a group's commands).
    """
    lines = [f"Usage: {usage}", "", summary]
    for title, block in sections:
        lines += ["", f"{title}:", *block]
    groups: dict[str, list[str]] = {}
    for group, row in rows:
        groups.setdefault(group, []).append(row)
    for group, block in groups.items():
        lines += ["", f"{group}:", *block]
    examples = list(examples)
    if examples:
        lines += ["", "Examples:", *(f"  $ {example}" for example in examples)]
    return "\n".join(lines) + "\n"

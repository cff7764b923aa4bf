"""`singpy completion bash|zsh|fish`: shell completion, made from what the parsers themselves know.

run, exec and shell are parsed by the fast parser from the option table
(singpy.cli.options); every other command by typer. Both are read here, so a
flag added to either is completed without touching this module. Completion
offers commands, then the command's flags when the word starts with `-`, and
file names otherwise (images, binds, output files).

    source <(singpy completion bash)             # ~/.bashrc
    singpy completion zsh > ~/.zfunc/_singpy     # or: source <(singpy completion zsh)
    singpy completion fish > ~/.config/fish/completions/singpy.fish
"""

from __future__ import annotations

from singpy.cli.options import ACTION_OPTIONS, ACTIONS, GLOBAL_OPTIONS, Option

SHELLS = ("bash", "zsh", "fish")


def _names(options: tuple[Option, ...]) -> list[str]:
    return [name for option in options for name in (option.long, option.short) if name]


def table(group: object) -> tuple[dict[str, list[str]], list[str]]:
    """Each command (`cache clean` too) -> its flags; and the global flags.

    `group` is the typer app's click group (singpy.cli.app passes it: this
    module is below the app and never imports it).
    """
    commands: dict[str, list[str]] = {action: _names(tuple(option for option in ACTION_OPTIONS if not option.hidden
                                                          and (not option.commands or action in option.commands)))
                                      for action in ACTIONS}
    for name, command in getattr(group, "commands", {}).items():
        if name in ACTIONS:
            continue
        commands[name] = _offered(command)
        for sub, subcommand in getattr(command, "commands", {}).items():
            commands[f"{name} {sub}"] = _offered(subcommand)
    return commands, _names(GLOBAL_OPTIONS)


def _offered(command: object) -> list[str]:
    """The flags of a typer command, less those it hides (as its help does)."""
    return [opt for param in getattr(command, "params", ()) if not getattr(param, "hidden", False)
            for opt in param.opts if opt.startswith("-")]


def script(shell: str, group: object) -> str:
    """The completion script for `shell`, from the fast parser's table and `group` (see `table`)."""
    commands, global_flags = table(group)
    valued = [name for option in GLOBAL_OPTIONS if option.value for name in (option.long, option.short) if name]
    if shell == "fish":
        return _fish(commands, global_flags)
    bash = _bash(commands, global_flags, valued)
    if shell == "zsh":  # zsh runs bash completion functions through bashcompinit
        return "#compdef singpy\nautoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash


def _bash(commands: dict[str, list[str]], global_flags: list[str], valued: list[str]) -> str:
    tops = sorted({name.split()[0] for name in commands})
    cases = "".join(f'        "{name}") flags="{" ".join(flags)}" ;;\n' for name, flags in sorted(commands.items()))
    subcommands = "".join(
        f'        "{top}") subs="{" ".join(sorted(n.split()[1] for n in commands if n.startswith(top + " ")))}" ;;\n'
        for top in tops if any(name.startswith(top + " ") for name in commands))
    return f"""# bash completion for singpy (singpy completion bash)
_singpy() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} command="" sub="" subs="" flags="" i word
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        case $word in
            {"|".join(valued)}) [ -z "$command" ] && i=$((i + 1)) ;;
            -*) ;;
            *) if [ -z "$command" ]; then command=$word
               elif [ -z "$sub" ]; then sub=$word; break; fi ;;
        esac
    done
    if [ -z "$command" ]; then
        COMPREPLY=($(compgen -W "{" ".join(tops)} {" ".join(global_flags)}" -- "$cur"))
        return 0
    fi
    case $command in
{subcommands}    esac
    if [ -n "$subs" ] && [ -z "$sub" ] && [[ $cur != -* ]]; then
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
        return 0
    fi
    [ -n "$subs" ] && command="$command $sub"
    case $command in
{cases}    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return 0
    fi
    return 1  # file names (complete -o default)
}}
complete -o default -F _singpy singpy
"""


def _fish(commands: dict[str, list[str]], global_flags: list[str]) -> str:
    tops = sorted({name.split()[0] for name in commands})
    lines = ["# fish completion for singpy (singpy completion fish)",
             f"complete -c singpy -n __fish_use_subcommand -a '{' '.join(tops)}'"]
    lines += [f"complete -c singpy -n __fish_use_subcommand {_fish_flag(flag)}" for flag in global_flags]
    for name, flags in sorted(commands.items()):
        words = name.split()
        if len(words) == 2:
            lines.append(f"complete -c singpy -n '__fish_seen_subcommand_from {words[0]}' -a {words[1]}")
        condition = " && ".join(f"__fish_seen_subcommand_from {word}" for word in words)
        lines += [f"complete -c singpy -n '{condition}' {_fish_flag(flag)}" for flag in flags]
    return "\n".join(lines) + "\n"


def _fish_flag(flag: str) -> str:
    return f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"

"""singpy.cli.parse: the fast parser of `run`, `exec` and `shell` (Apptainer's flags and environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from singpy.cli.options import ACTION_OPTIONS, ACTIONS, ENV_PREFIXES, GLOBAL_OPTIONS, NOT_SUPPORTED, Option
from singpy.cli.parse import action_help, parse_action, split_global
from singpy.errors import ExitCode, UsageError


@pytest.mark.parametrize(
    ("argv", "values", "rest"),
    [
        ([], {}, []),
        (["img"], {}, ["img"]),
        (["--contain", "img", "ls"], {"contain": True}, ["img", "ls"]),
        (["-c", "img"], {"contain": True}, ["img"]),
        (["-ce", "img"], {"contain": True, "cleanenv": True}, ["img"]),
        (["-cep", "img"], {"contain": True, "cleanenv": True, "pid": True}, ["img"]),
        (["-C", "img"], {"containall": True}, ["img"]),
        (["--bind", "/a", "img"], {"bind": ["/a"]}, ["img"]),
        (["--bind=/a:/b", "img"], {"bind": ["/a:/b"]}, ["img"]),
        (["-B", "/a", "img"], {"bind": ["/a"]}, ["img"]),
        (["-B/a:/b:ro", "img"], {"bind": ["/a:/b:ro"]}, ["img"]),
        (["-B", "/a", "--bind", "/b,/c", "-B/d", "--bind=/e", "img"], {"bind": ["/a", "/b,/c", "/d", "/e"]},
         ["img"]),
        (["-cB/a", "img"], {"contain": True, "bind": ["/a"]}, ["img"]),
        (["-cB", "/a", "img"], {"contain": True, "bind": ["/a"]}, ["img"]),
        (["--bind=", "img"], {"bind": [""]}, ["img"]),
        (["--bind", "--contain", "img"], {"bind": ["--contain"]}, ["img"]),
        (["--bind=a=b", "img"], {"bind": ["a=b"]}, ["img"]),
        (["--env", "A=1", "--env=B=2,C=3", "img"], {"env": ["A=1", "B=2,C=3"]}, ["img"]),
        (["--env-file", "f1", "--env-file=f2", "img"], {"env_file": ["f1", "f2"]}, ["img"]),
        (["-H", "/h:/home/u", "img"], {"home": "/h:/home/u"}, ["img"]),
        (["--home", "/a", "--home", "/b", "img"], {"home": "/b"}, ["img"]),
        (["--hostname", "box", "--pwd=/w", "img"], {"hostname": "box", "pwd": "/w"}, ["img"]),
        (["-s", "/bin/bash", "img"], {"shell": "/bin/bash"}, ["img"]),
        (["--no-home", "--writable-tmpfs", "--uts", "--ipc", "-i", "img"],
         {"no_home": True, "writable_tmpfs": True, "uts": True, "ipc": True}, ["img"]),
        (["--nv", "--rocm", "--dry-run", "-q", "-v", "-d", "img"],
         {"nv": True, "rocm": True, "dry_run": True, "quiet": True, "verbose": True, "debug": True}, ["img"]),
        (["-c", "img", "ls", "-la", "--bind", "/x", "-c", "--"], {"contain": True},
         ["img", "ls", "-la", "--bind", "/x", "-c", "--"]),
        (["img", "--contain"], {}, ["img", "--contain"]),
        (["-c", "--", "-image-with-dash", "-x"], {"contain": True}, ["-image-with-dash", "-x"]),
        (["--", "--contain"], {}, ["--contain"]),
        (["-c", "-", "x"], {"contain": True}, ["-", "x"]),
    ],
    ids=["empty", "image-only", "long-flag", "short-flag", "bundled", "bundled-three", "containall", "long-value",
         "long-equals", "short-value", "short-inline", "repeatable", "bundle-then-value", "bundle-then-separate",
         "empty-inline-value", "value-looks-like-flag", "equals-in-value", "env-repeat", "env-file-repeat",
         "home-short", "single-value-last-wins", "hostname-pwd", "shell", "isolation-flags", "gpu-output-flags",
         "payload-flags-untouched", "options-stop-at-image", "double-dash-ends-options", "double-dash-first",
         "single-dash-is-positional"],
)
def test_parse_action(argv: list[str], values: dict[str, Any], rest: list[str]) -> None:
    assert parse_action("exec", argv, {}) == (values, rest)


def test_parse_action_does_not_modify_argv() -> None:
    argv = ["-ce", "--bind", "/a", "img", "ls"]
    parse_action("run", argv, {})
    assert argv == ["-ce", "--bind", "/a", "img", "ls"]


@pytest.mark.parametrize(
    ("action", "argv", "message", "hint"),
    [
        ("exec", ["--bogus", "img"], "unknown flag: --bogus", "Run 'singpy exec --help' for usage."),
        ("run", ["--bogus=1", "img"], "unknown flag: --bogus", "Run 'singpy run --help' for usage."),
        ("shell", ["-x", "img"], "unknown flag: -x", "Run 'singpy shell --help' for usage."),
        ("exec", ["-cx", "img"], "unknown flag: -x", "Run 'singpy exec --help' for usage."),
        ("exec", ["--config", "f", "img"], "unknown flag: --config", "Run 'singpy exec --help' for usage."),
        ("exec", ["-bind", "/a", "img"], "unknown flag: -b", "Run 'singpy exec --help' for usage."),
        ("exec", ["--bind"], "flag needs an argument: --bind", "Run 'singpy exec --help' for usage."),
        ("run", ["-c", "-B"], "flag needs an argument: -B", "Run 'singpy run --help' for usage."),
        ("exec", ["-cB"], "flag needs an argument: -B", "Run 'singpy exec --help' for usage."),
        ("exec", ["--contain=yes", "img"], "flag --contain takes no value", None),
    ],
    ids=["unknown-long", "unknown-long-equals", "unknown-short", "unknown-in-bundle", "global-only-flag",
         "single-dash-long", "missing-value-long", "missing-value-short", "missing-value-bundle",
         "boolean-with-value"],
)
def test_parse_action_errors(action: str, argv: list[str], message: str, hint: str | None) -> None:
    with pytest.raises(UsageError) as caught:
        parse_action(action, argv, {})
    assert caught.value.message == message
    assert caught.value.hint == hint
    assert caught.value.exit_code == ExitCode.USAGE and int(ExitCode.USAGE) == 1


def test_short_option_with_equals() -> None:
    assert parse_action("exec", ["-B=/data", "img"], {}) == ({"bind": ["/data"]}, ["img"])


# --- options from the environment ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "values"),
    [
        ([], {"SINGULARITY_BIND": "/a,/b"}, {"bind": ["/a,/b"]}),
        ([], {"APPTAINER_BIND": "/a"}, {"bind": ["/a"]}),
        ([], {"SINGPY_BIND": "/a"}, {"bind": ["/a"]}),
        ([], {"SINGULARITY_BIND": "/s", "APPTAINER_BIND": "/a"}, {"bind": ["/a"]}),
        ([], {"SINGULARITY_BIND": "/s", "APPTAINER_BIND": "/a", "SINGPY_BIND": "/p"}, {"bind": ["/p"]}),
        ([], {"SINGPY_BIND": "", "SINGULARITY_BIND": "/s"}, {"bind": ["/s"]}),
        (["--bind", "/cli"], {"SINGULARITY_BIND": "/s", "SINGPY_BIND": "/p"}, {"bind": ["/cli", "/p"]}),
        (["-B", "/c1", "-B/c2"], {"APPTAINER_BIND": "/a,/b"}, {"bind": ["/c1", "/c2", "/a,/b"]}),
        (["--env-file", "/cli"], {"APPTAINER_ENV_FILE": "/env"}, {"env_file": ["/cli"]}),
        ([], {"APPTAINER_CONTAIN": "1"}, {"contain": True}),
        ([], {"APPTAINER_CONTAIN": "true"}, {"contain": True}),
        ([], {"SINGULARITY_CONTAIN": "YES"}, {"contain": True}),
        ([], {"SINGPY_CONTAIN": "on"}, {"contain": True}),
        ([], {"APPTAINER_CONTAIN": " T "}, {"contain": True}),
        ([], {"APPTAINER_CONTAIN": "F"}, {}),
        ([], {"APPTAINER_CONTAIN": "0"}, {}),
        ([], {"APPTAINER_CONTAIN": "false"}, {}),
        ([], {"APPTAINER_CONTAIN": ""}, {}),
        ([], {"SINGPY_CONTAIN": "0", "APPTAINER_CONTAIN": "1"}, {}),
        ([], {"SINGPY_CONTAIN": "", "APPTAINER_CONTAIN": "1"}, {"contain": True}),
        (["-c"], {"SINGPY_CONTAIN": "0"}, {"contain": True}),
        ([], {"SINGULARITY_CLEANENV": "1", "APPTAINER_CONTAINALL": "1", "SINGPY_NV": "1", "SINGULARITY_ROCM": "1",
              "APPTAINER_PID": "1", "APPTAINER_IPC": "1", "APPTAINER_UTS": "1", "APPTAINER_NO_HOME": "1",
              "APPTAINER_WRITABLE_TMPFS": "1"},
         {"cleanenv": True, "containall": True, "nv": True, "rocm": True, "pid": True, "ipc": True, "uts": True,
          "no_home": True, "writable_tmpfs": True}),
        ([], {"SINGULARITY_HOME": "/h", "APPTAINER_PWD": "/w", "SINGPY_HOSTNAME": "box", "APPTAINER_SHELL": "/bin/sh",
              "APPTAINER_ENV_FILE": "/f"},
         {"home": "/h", "pwd": "/w", "hostname": "box", "shell": "/bin/sh", "env_file": ["/f"]}),
        (["--home", "/cli"], {"APPTAINER_HOME": "/env"}, {"home": "/cli"}),
        ([], {"SINGULARITY_ENV": "A=1", "APPTAINER_DRY_RUN": "1", "APPTAINER_DEBUG": "1", "SINGPY_QUIET": "1",
              "APPTAINER_VERBOSE": "1", "SINGULARITY_HELP": "1"}, {}),
        ([], {"BIND": "/a", "CONTAIN": "1", "SINGULARITYENV_CONTAIN": "1"}, {}),
        ([], {"APPTAINER_BINDPATH": "/a,/b"}, {"bind": ["/a,/b"]}),
        (["-B", "/c"], {"SINGULARITY_BINDPATH": "/p", "APPTAINER_BIND": "/a"}, {"bind": ["/c", "/a", "/p"]}),
        ([], {"SINGULARITY_CWD": "/c"}, {"pwd": "/c"}),
        ([], {"APPTAINER_TARGET_PWD": "/t", "APPTAINER_PWD": "/p"}, {"pwd": "/p"}),
        (["--cwd", "/cli"], {"APPTAINER_PWD": "/p"}, {"pwd": "/cli"}),
    ],
    ids=["singularity-bind", "apptainer-bind", "singpy-bind", "apptainer-beats-singularity", "singpy-beats-all",
         "empty-falls-through", "env-bind-adds-to-command-line", "env-bind-after-all-cli-binds",
         "command-line-beats-env", "apptainer-contain", "true", "yes-any-case", "on", "go-t-spaced", "go-f",
         "zero-is-false", "false", "empty-is-unset", "singpy-false-decides", "empty-singpy-falls-through",
         "flag-beats-env-false", "boolean-flags", "value-options", "cli-value-beats-env", "no-env-for-these",
         "unprefixed-ignored", "bindpath", "bind-then-bindpath", "cwd-variable", "pwd-beats-target-pwd",
         "cwd-flag-beats-env"],
)
def test_options_from_environment(argv: list[str], env: dict[str, str], values: dict[str, Any]) -> None:
    assert parse_action("exec", [*argv, "img"], env) == (values, ["img"])


@pytest.mark.parametrize("value", ["bogus", "2", "yes please", "\u00b9"])
def test_a_switch_variable_that_is_no_boolean_is_an_error(value: str) -> None:
    """Apptainer: "unable to set flag" (strconv.ParseBool); it was read as false, an isolation flag silently off."""
    with pytest.raises(UsageError, match="APPTAINER_CLEANENV=.*: not a boolean"):
        parse_action("exec", ["img"], {"APPTAINER_CLEANENV": value})


def test_help_skips_the_environment() -> None:
    assert parse_action("run", ["--help", "img"], {"SINGULARITY_CONTAIN": "1"}) == ({"help": True}, ["img"])
    assert parse_action("run", ["-h"], {"SINGULARITY_BIND": "/a"}) == ({"help": True}, [])


def _a_command_of(option: Option) -> str:
    """exec, or a command that takes the option where exec does not (--runscript-timeout: run)."""
    return option.commands[0] if option.commands else "exec"


def test_every_option_with_env_is_read_from_every_prefix() -> None:
    for option in ACTION_OPTIONS:
        for suffix in (option.env, *option.env_also) if option.env else ():
            for prefix in ENV_PREFIXES:
                values, _ = parse_action(_a_command_of(option), ["img"], {prefix + suffix: "1"})
                expected: object = (["1"] if option.repeat else "1") if option.value else True
                assert values == {option.dest: expected}, (prefix, suffix)


def test_command_line_beats_env_unless_the_option_appends() -> None:
    for option in ACTION_OPTIONS:
        if not option.env or not option.value:
            continue
        values, _ = parse_action(_a_command_of(option), [f"{option.long}=cli", "img"], {f"SINGPY_{option.env}": "env"})
        if option.env_appends:
            assert values == {option.dest: ["cli", "env"]}, option.long
        else:
            assert values == {option.dest: ["cli"] if option.repeat else "cli"}, option.long


# --- split_global -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "values", "rest"),
    [
        ([], {}, []),
        (["exec", "img"], {}, ["exec", "img"]),
        (["-v", "exec", "-c", "img"], {"verbose": True}, ["exec", "-c", "img"]),
        (["-q", "-d", "run", "img"], {"quiet": True, "debug": True}, ["run", "img"]),
        (["-qd", "run"], {"quiet": True, "debug": True}, ["run"]),
        (["--config", "/x.conf", "exec"], {"config": "/x.conf"}, ["exec"]),
        (["--config=/x.conf", "--verbose", "shell", "img"], {"config": "/x.conf", "verbose": True},
         ["shell", "img"]),
        (["--version"], {"version": True}, []),
        (["--help"], {"help": True}, []),
        (["-h", "exec"], {"help": True}, ["exec"]),
        (["--", "exec"], {}, ["--", "exec"]),
    ],
    ids=["empty", "command-first", "verbose", "two-short", "bundled", "config", "config-equals", "version",
         "help", "short-help", "double-dash-kept"],
)
def test_split_global(argv: list[str], values: dict[str, Any], rest: list[str]) -> None:
    assert split_global(argv) == (values, rest)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bind", "/a", "exec"], "unknown flag: --bind"),
        (["-x", "exec"], "unknown flag: -x"),
        (["--config"], "flag needs an argument: --config"),
        (["--version=2"], "flag --version takes no value"),
    ],
    ids=["action-flag-before-command", "unknown-short-flag", "config-missing-value", "boolean-with-value"],
)
def test_split_global_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        split_global(argv)
    assert caught.value.message == message
    assert caught.value.exit_code == 1


def test_split_global_hint() -> None:
    with pytest.raises(UsageError) as caught:
        split_global(["--bogus", "exec"])
    assert caught.value.hint == "Run 'singpy --help' for usage."


# --- action_help --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", list(ACTIONS))
def test_action_help_lists_every_option(action: str) -> None:
    text = action_help(action)
    usage, summary = ACTIONS[action]
    lines = text.splitlines()
    assert lines[0] == f"Usage: singpy {action} [options] {usage}"
    assert summary.capitalize() + "." in lines
    assert text.endswith("\n")
    for option in ACTION_OPTIONS:
        matching = [line for line in lines if option.help in line]
        if option.hidden or (option.commands and action not in option.commands):  # not offered here
            assert matching == [], option.long
            continue
        assert len(matching) == 1, option.long
        line = matching[0]
        assert f"{option.long}" in line
        if option.short:
            assert f"{option.short}, {option.long}" in line
        if option.value:
            assert f"{option.long} {option.value}" in line
        if option.env:
            assert f"[$APPTAINER_{option.env}]" in line
        else:
            assert "[$" not in line
        assert f"{option.group}:" in lines


def test_action_help_groups_in_table_order() -> None:
    lines = action_help("exec").splitlines()
    groups = list(dict.fromkeys(option.group for option in ACTION_OPTIONS))
    headings = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert headings == [*groups, "Examples"]  # Examples last, as in Apptainer's help


def test_option_tables_have_unique_names() -> None:
    for table in (ACTION_OPTIONS, GLOBAL_OPTIONS):
        names = [name for option in table for name in (option.long, option.short) if name]
        assert len(names) == len(set(names))
        main = [option for option in table if not option.help.startswith("synonym for ")]
        assert len({option.dest for option in main}) == len(main)
        assert {option.dest for option in table} == {option.dest for option in main}  # a synonym has its option


# --- the typer side: the same global flags, click errors by type -------------------------------------------------


def test_typer_global_flags_come_from_the_table() -> None:
    import typer

    from singpy.cli.app import app

    command = typer.main.get_command(app)
    declared = {tuple(sorted(param.opts)): param.name for param in command.params}
    expected = {tuple(sorted(name for name in (option.long, option.short) if name)): option.dest
                for option in GLOBAL_OPTIONS if option.dest != "help"}
    assert {opts: name for opts, name in declared.items() if "--help" not in opts} == expected
    assert sorted(command.get_help_option_names(command.make_context("singpy", ["version"]))) == ["--help", "-h"]


@pytest.mark.parametrize(
    ("argv", "status", "fatal"),
    [
        (["version"], 0, None),
        (["-v", "--config", "/x.conf", "version"], 0, None),
        (["inspect"], 1, "FATAL:   Missing argument 'image'.\nHINT:    Run 'singpy inspect --help' for usage."),
        (["inspect", "--bogus", "img"], 1, "FATAL:   unknown flag: --bogus\n"
         "HINT:    Run 'singpy inspect --help' for usage."),
        (["cache", "clean", "--days", "x"], 1, "FATAL:   Invalid value for '--days': 'x' is not a valid int.\n"
         "HINT:    Run 'singpy cache clean --help' for usage."),
        (["frobnicate"], 1, "FATAL:   unknown command: frobnicate\n"
         "HINT:    Run 'singpy --help' for the list of commands."),
    ],
    ids=["version", "global-flags-accepted", "missing-argument", "unknown-option", "bad-value", "unknown-command"],
)
def test_run_app_errors_are_one_line(argv: list[str], status: int, fatal: str | None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from singpy.cli.app import run_app

    assert run_app(argv) == status
    err = capsys.readouterr().err
    assert err == ("" if fatal is None else fatal + "\n")


# --- issue 26: one wording for mistakes, global -c and --nocolor, the global flags' variables -----------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["exec", "--bnd", "/a", "img"], "unknown flag: --bnd (did you mean --bind?)"),
        (["run", "--writeable", "img"], "unknown flag: --writeable (did you mean --writable?)"),
        (["exec", "--bogus", "img"], "unknown flag: --bogus"),  # nothing near: no suggestion
        (["--verbos", "exec"], "unknown flag: --verbos (did you mean --verbose?)"),
    ],
    ids=["action-flag", "action-flag-2", "nothing-near", "global-flag"],
)
def test_unknown_flag_suggests_the_near_one(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        rest = split_global(argv)[1]
        parse_action(rest[0], rest[1:], {})
    assert caught.value.message == message


@pytest.mark.parametrize(
    ("argv", "fatal"),
    [
        (["pul"], "FATAL:   unknown command: pul (did you mean pull?)\nHINT:    Run 'singpy --help' for the list of "
         "commands."),
        (["pull", "--forc", "x"], "FATAL:   unknown flag: --forc (did you mean --force?)\nHINT:    Run 'singpy pull "
         "--help' for usage."),
        (["cache", "clen"], "FATAL:   unknown command: clen (did you mean clean?)\nHINT:    Run 'singpy cache --help' "
         "for usage."),
        (["help", "exce"], "FATAL:   unknown command: exce (did you mean exec?)\nHINT:    Run 'singpy --help' for the "
         "list of commands."),
    ],
    ids=["command", "typer-flag", "subcommand", "help-command"],
)
def test_typer_mistakes_have_the_same_wording(argv: list[str], fatal: str, capsys: pytest.CaptureFixture[str]) -> None:
    from singpy.cli.main import main

    assert main(argv) == 1
    assert capsys.readouterr().err == fatal + "\n"


def test_global_short_config_and_nocolor() -> None:
    """Apptainer's `-c` is --config before the command (after run/exec/shell it is --contain)."""
    assert split_global(["-c", "/x.conf", "--nocolor", "exec", "-c", "img"]) == (
        {"config": "/x.conf", "nocolor": True}, ["exec", "-c", "img"])


def test_global_variables_fill_in_flags_not_given() -> None:
    env = {"APPTAINER_DEBUG": "1", "SINGULARITY_CONFIG_FILE": "/s.conf", "APPTAINER_CONFIG_FILE": "/a.conf",
           "APPTAINER_QUIET": "0"}
    assert split_global(["exec"], env) == ({"debug": True, "config": "/a.conf"}, ["exec"])
    assert split_global(["-c", "/mine.conf", "exec"], env)[0]["config"] == "/mine.conf"


def test_debug_wins_over_quiet_whoever_set_them() -> None:
    """Apptainer's precedence: debug, verbose, quiet, silent (APPTAINER_DEBUG=1 with -q is debug)."""
    from singpy import console
    from singpy.cli.actions import verbosity

    assert verbosity({"quiet": True}, console.DEBUG) == console.DEBUG
    assert verbosity({"silent": True}, console.QUIET) == console.QUIET
    assert verbosity({"quiet": True}, console.SILENT) == console.QUIET
    assert verbosity({"silent": True}) == console.SILENT


def test_every_help_has_one_layout_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    """No typer/rich panels: the typer commands' help is laid out as run/exec/shell's, Examples included."""
    from singpy.cli.main import main

    for command in (["pull"], ["build"], ["inspect"], ["cache", "clean"], ["overlay", "create"], ["instance", "stop"],
                    ["exec"], []):
        if command == ["exec"]:  # main would leave the process at once (os._exit) after the fast path
            out = action_help("exec")
        else:
            assert main([*command, "--help"]) == 0
            out = capsys.readouterr().out
        assert out.startswith(f"Usage: singpy {' '.join(command)}".rstrip()), (command, out[:200])
        assert "\nExamples:\n  $ singpy " in out, command
        assert not any(box in out for box in "╭│╰─") and "<str>" not in out and "\x1b" not in out, command


def test_bare_singpy_prints_a_short_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """As Apptainer: the usage and the commands on stderr, exit 1 (not the whole help)."""
    from singpy.cli.main import main

    assert main([]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("Usage: singpy [global options] <command>\n\nCommands:\n  exec ")
    assert "Global options" not in captured.err and captured.err.endswith(
        "Run 'singpy --help' for more detailed usage information.\n")


def test_completion_without_a_shell_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    from singpy.cli.main import main

    assert main(["completion"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["bash", "zsh", "fish"]


_FLAG_COMMANDS = [(action, flag) for action in ("exec", "run", "shell", "test", "instance start", "instance run")
                  for flag in sorted(NOT_SUPPORTED)]


@pytest.mark.parametrize(("action", "flag"), _FLAG_COMMANDS, ids=[f"{a}:{f}" for a, f in _FLAG_COMMANDS])
def test_apptainer_flags_singpy_lacks_are_refused_as_such(action: str, flag: str) -> None:
    """Not "unknown flag", which reads as a typing mistake, where Apptainer has the flag for the command (its
    table of flags with variables, extracted from its source); "unknown flag" where it has not, as Apptainer."""
    table = (Path(__file__).parents[1] / "data/apptainer_envkeys.tsv").read_text()
    assert flag not in {option.long for option in ACTION_OPTIONS}
    with pytest.raises(UsageError) as caught:
        parse_action(action, [flag, "img"], {})
    if f"\n{action}\t{flag}\t" in table:
        assert caught.value.message == f"{flag} is not supported: {NOT_SUPPORTED[flag][1]}" and not caught.value.hint
    else:
        assert caught.value.message.startswith(f"unknown flag: {flag}")

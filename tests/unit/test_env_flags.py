"""Every variable Apptainer reads for a flag singpy has sets that flag in singpy too (issue 26).

The cases are generated from tests/data/apptainer_envkeys.tsv: every
`cmdline.Flag` with `EnvKeys` in Apptainer's cmd/internal/cli/*.go, one row
per command it is registered for. A row is a case here when singpy has that
command and that flag (read from singpy's own parsers: the option table of
run/exec/shell and `instance start`, the global flags, the typer commands),
so a flag singpy adds later is checked without touching this file. Each case
sets `PREFIX + KEY` for each of SINGULARITY_, APPTAINER_ and SINGPY_ and
asserts the command parses as it does with the flag given, and differently
from without it.

The table was extracted with (Apptainer's files in /tmp/app):

    for each `NAME = cmdline.Flag{...}` with EnvKeys: Name, ShortHand, EnvKeys;
    for each `RegisterFlagForCmd(&NAME, CMD...)`: the commands (groups expanded)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from singpy.cli.options import ACTION_OPTIONS, ENV_PREFIXES, GLOBAL_OPTIONS
from tests.support.envkeys import PENDING, READ_WHERE_THEY_ACT, SAMPLES, table_rows

ACTIONS = ("exec", "run", "shell", "instance start")  # instance start parses with run's table (less run's own flags)
TYPER = ("pull", "build", "overlay create", "instance list", "instance stop", "inspect", "cache clean")
# Arguments a typer command needs before it parses at all.
REQUIRED = {"pull": ["docker://alpine"], "build": ["out.sif", "in.def"], "overlay create": ["o.img"],
            "inspect": ["img"]}


def _typer_command(name: str) -> Any:
    import typer.main

    from singpy.cli.app import app

    command = typer.main.get_command(app)
    for word in name.split():
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


def singpy_flags(command: str) -> set[str]:
    if command in ACTIONS:
        return {option.long for option in ACTION_OPTIONS if not option.commands or command in option.commands}
    if command == "(global)":
        return {option.long for option in GLOBAL_OPTIONS}
    if command in TYPER:
        return {name for param in _typer_command(command).params for name in param.opts}
    return set()


def _cases() -> Iterator[Any]:
    for command, flag, keys in table_rows():
        if flag not in singpy_flags(command) or flag in READ_WHERE_THEY_ACT:
            continue
        marks = [pytest.mark.xfail(strict=True, reason="singpy/cli/instance.py: envvar= not declared yet")] \
            if (command, flag) in PENDING else []
        for key in keys:
            for prefix in ENV_PREFIXES:
                yield pytest.param(command, flag, prefix + key, id=f"{command}:{flag}:{prefix}{key}", marks=marks)


CASES = list(_cases())


def parsed(command: str, argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What singpy makes of `command argv` with `env` as the only singpy variables."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if command in ACTIONS:
        from singpy.cli.parse import parse_action

        return parse_action(command, [*argv, "img"], dict(os.environ))
    if command == "(global)":
        from singpy.cli.parse import split_global

        return split_global([*argv, "exec"], dict(os.environ))
    ctx = _typer_command(command).make_context(command.split()[-1], [*argv, *REQUIRED.get(command, [])])
    values = dict(ctx.params)
    if "docker_login" in values:  # --docker-login, --authfile, --no-https: read with their variables here
        from singpy.cli.pull import pull_options

        values["pulling"] = pull_options(values.get("arch", ""), values["docker_login"], values["authfile"],
                                         values["no_https"])
    return values


@pytest.mark.parametrize(("command", "flag", "variable"), CASES)
def test_variable_sets_the_flag(command: str, flag: str, variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = SAMPLES.get(flag)
    given = [flag, value] if value is not None else [flag]
    with_flag = parsed(command, given, {}, monkeypatch)
    assert with_flag != parsed(command, [], {}, monkeypatch), "the flag itself changes nothing here"
    assert parsed(command, [], {variable: value or "1"}, monkeypatch) == with_flag


def test_the_table_has_the_variables_of_issue_26() -> None:
    """The issue's list, as cases: a table that lost them (a bad re-extraction) fails here."""
    ids = {param.id for param in CASES}
    for case in ("exec:--pid:APPTAINER_UNSHARE_PID", "exec:--ipc:APPTAINER_UNSHARE_IPC",
                 "exec:--net:APPTAINER_UNSHARE_NET", "exec:--uts:APPTAINER_UNSHARE_UTS",
                 "exec:--userns:APPTAINER_UNSHARE_USERNS", "exec:--authfile:APPTAINER_AUTH_FILE",
                 "exec:--no-https:APPTAINER_NO_HTTPS", "exec:--docker-login:APPTAINER_DOCKER_LOGIN",
                 "(global):--debug:APPTAINER_DEBUG", "(global):--verbose:SINGULARITY_VERBOSE",
                 "(global):--quiet:APPTAINER_QUIET", "(global):--silent:APPTAINER_SILENT",
                 "(global):--config:APPTAINER_CONFIG_FILE", "(global):--nocolor:APPTAINER_NOCOLOR",
                 "build:--sandbox:APPTAINER_SANDBOX", "build:--force:APPTAINER_FORCE",
                 "build:--notest:APPTAINER_NOTEST", "build:--arch:APPTAINER_BUILD_ARCH",
                 "pull:--force:SINGPY_FORCE", "pull:--dir:APPTAINER_PULLDIR", "pull:--arch:APPTAINER_PULL_ARCH",
                 "overlay create:--sparse:APPTAINER_SPARSE", "overlay create:--fakeroot:APPTAINER_FAKEROOT",
                 "instance stop:--all:APPTAINER_ALL", "instance start:--ipc:APPTAINER_UNSHARE_IPC"):
        assert case in ids, case


def test_a_later_prefix_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    """SINGPY_ over APPTAINER_ over SINGULARITY_, for the typer commands as for run/exec/shell."""
    env = {"SINGULARITY_PULL_ARCH": "s390x", "APPTAINER_PULL_ARCH": "arm64", "SINGPY_PULL_ARCH": "ppc64le"}
    assert parsed("pull", [], env, monkeypatch)["arch"] == "ppc64le"
    del env["SINGPY_PULL_ARCH"]
    assert parsed("pull", [], env, monkeypatch)["arch"] == "arm64"
    assert parsed("exec", [], {"SINGULARITY_HOSTNAME": "a", "APPTAINER_HOSTNAME": "b"},
                  monkeypatch)[0]["hostname"] == "b"


def test_the_command_line_wins_over_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parsed("(global)", ["--config", "/mine.conf"], {"APPTAINER_CONFIG_FILE": "/theirs.conf"},
                  monkeypatch)[0]["config"] == "/mine.conf"
    assert parsed("pull", ["--arch", "amd64"], {"APPTAINER_PULL_ARCH": "arm64"}, monkeypatch)["arch"] == "amd64"


def test_false_values_leave_a_flag_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "pid" not in parsed("exec", [], {"APPTAINER_UNSHARE_PID": "0"}, monkeypatch)[0]
    assert parsed("build", [], {"APPTAINER_SANDBOX": "false"}, monkeypatch)["sandbox"] is False
    assert "debug" not in parsed("(global)", [], {"APPTAINER_DEBUG": "no"}, monkeypatch)[0]

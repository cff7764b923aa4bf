"""A flag Apptainer registers for some commands only (`--runscript-timeout`: run and instance run) is an unknown
flag elsewhere, and its variable is not read there (singpy.cli.options' `commands`)."""

from __future__ import annotations

import pytest

from singpy.cli.parse import action_help, parse_action
from singpy.errors import UsageError


@pytest.mark.parametrize("command", ["run", "instance run"])
def test_runscript_timeout_taken_by_run_and_instance_run(command: str) -> None:
    values, rest = parse_action(command, ["--runscript-timeout", "2s", "img.sif"], {})
    assert (values["runscript_timeout"], rest) == ("2s", ["img.sif"])
    values, _ = parse_action(command, ["img.sif"], {"APPTAINER_RUNSCRIPT_TIMEOUT": "3s"})
    assert values["runscript_timeout"] == "3s"
    assert "--runscript-timeout" in action_help("run", command=command)


@pytest.mark.parametrize("command", ["exec", "shell", "test", "instance start"])
def test_runscript_timeout_unknown_elsewhere(command: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_action(command, ["--runscript-timeout=2s", "img.sif"], {})
    assert str(raised.value) == "unknown flag: --runscript-timeout"  # no "did you mean" itself
    assert f"singpy {command} --help" in (raised.value.hint or "")
    assert "--runscript-timeout" not in action_help("run", command=command)


@pytest.mark.parametrize("command", ["exec", "shell", "test", "instance start"])
def test_runscript_timeout_variable_harmless_elsewhere(command: str) -> None:
    values, rest = parse_action(command, ["img.sif"], {"APPTAINER_RUNSCRIPT_TIMEOUT": "3s",
                                                       "SINGULARITY_RUNSCRIPT_TIMEOUT": "bogus"})
    assert "runscript_timeout" not in values and rest == ["img.sif"]

"""--runscript-timeout is a flag of `run` and `instance run` alone, as Apptainer registers it
(cmd/internal/cli/action_flags.go: actionsRunscriptCmd): `exec`, `shell`, `test` and `instance start`
refuse it as an unknown flag (exit 1, one FATAL line, nothing started), while APPTAINER_RUNSCRIPT_TIMEOUT
stays harmless to them. As root and as the test user."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal

NAME = f"rt{os.getpid()}-{uuid.uuid4().hex[:6]}"


@pytest.mark.parametrize("command", [["exec"], ["shell"], ["test"], ["instance", "start"]])
def test_the_flag_is_refused_where_apptainer_refuses_it(singpy: Singpy, image: Path, command: list[str]) -> None:
    args = ["true"] if command == ["exec"] else []
    name = [NAME] if command[0] == "instance" else []
    result = singpy.run(*command, "--runscript-timeout", "5s", str(image), *name, *args)
    assert_one_fatal(result, "unknown flag: --runscript-timeout", code=1)
    assert f"Run 'singpy {' '.join(command)} --help' for usage." in result.stderr
    assert "--runscript-timeout" not in singpy.ok(*command, "--help")
    if name:
        assert json.loads(singpy.ok("instance", "list", "--json", NAME))["instances"] == []


@pytest.mark.parametrize("command", [["exec"], ["shell"], ["test"]])
def test_the_variable_is_harmless_there(singpy: Singpy, image: Path, command: list[str]) -> None:
    env = singpy.env(APPTAINER_RUNSCRIPT_TIMEOUT="not-a-duration")  # read by run, it would be a usage error
    args = ["echo", "ran"] if command == ["exec"] else []
    result = singpy.run(*command, str(image), *args, env=env, input="echo ran\n")
    assert result.returncode == 0, result.stderr
    assert "runscript" not in result.stderr.lower()
    assert_one_fatal(singpy.run("run", str(image), env=env), "runscript-timeout", code=1)


def test_instance_run_takes_the_flag(singpy: Singpy, image: Path) -> None:
    name = f"{NAME}-run"
    try:
        singpy.ok("instance", "run", "--runscript-timeout", "30s", str(image), name)
        assert "--runscript-timeout" in singpy.ok("instance", "run", "--help")
    finally:
        singpy.run("instance", "stop", "--force", name)
        logs = Path(singpy.home, ".singpy", "instances", "logs", os.uname().nodename, singpy.user)
        for suffix in ("out", "err"):
            (logs / f"{name}.{suffix}").unlink(missing_ok=True)

"""Apptainer's variables of the flags, seen where a user sees them (issue 26).

tests/unit/test_env_flags.py checks every variable of tests/data/apptainer_envkeys.tsv
against the parsers. Here the same table drives the real command, as root and as a user:
for each flag of `exec` whose effect shows in the `--dry-run` plan, `APPTAINER_KEY=value`
must print the plan the flag prints (and not the plan without it). The global flags'
variables are checked by what they do (a traceback, a FATAL naming the conf file, no
warning), and a typer command's (`pull`) by its answer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support.envkeys import PENDING, SAMPLES, table_rows

# Effects a sandbox image's dry run cannot show (unit-tested): these act while pulling a docker:// image, or
# extract a SIF.
NOT_IN_THE_PLAN = {"--docker-login", "--authfile", "--no-https", "--unsquash", "--docker-username", "--docker-password",
                   "--tmpdir",
                   "--ignore-fakeroot-command",  # no effect anywhere: singpy never runs the fakeroot command
                   # checked by effect, flag and variable, in tests/integration/test_workdir_noenv_nocache_flags.py:
                   # they cancel a singpy.conf directive (`always use nv|rocm`), or act while pulling
                   "--no-nv", "--no-rocm", "--disable-cache"}
# Flags whose effect shows only beside others: the plan of `exec OTHERS FLAG` against that of `exec OTHERS`.
# (The user's /etc/subuid range decides whether they show at all; tests/integration/test_fakeroot_switches.py
# simulates one.)
ALONGSIDE = {"--ignore-subuid": ["--fakeroot"], "--ignore-userns": ["--fakeroot", "--ignore-subuid"],
             "--no-pid": ["--pid"]}
# Flags whose effect shows only where the host has something for them: host variables every plan of the case sees.
HOST_VARIABLES = {"--no-env": {"FOO": "from-the-host"}}  # SAMPLES' `--no-env FOO` keeps it out of the container


def _exec_cases() -> list[tuple[str, str]]:
    from singpy.cli.options import ACTION_OPTIONS

    have = {option.long for option in ACTION_OPTIONS}
    return [(flag, key) for command, flag, keys in table_rows() if command == "exec" and flag in have
            and flag not in NOT_IN_THE_PLAN and (command, flag) not in PENDING for key in keys]


def _plan(singpy: Singpy, image: Path, flags: list[str], host: dict[str, str],
          **variables: str) -> tuple[int, str, str]:
    result = singpy.run("exec", "--dry-run", *flags, str(image), "true", env=singpy.env(**host, **variables))
    # a container's cgroup has a name of its own each run (singpy.cgroups.hierarchy): the same plan otherwise
    return result.returncode, re.sub(r"singpy-\d+-[0-9a-f]+", "singpy-PID-RANDOM", result.stdout), result.stderr


@pytest.mark.parametrize(("flag", "key"), _exec_cases(), ids=[f"{flag}:{key}" for flag, key in _exec_cases()])
def test_variable_gives_the_flags_plan(singpy: Singpy, image: Path, flag: str, key: str) -> None:
    value = SAMPLES.get(flag)
    if flag == "--env-file":  # a file that exists, read by both runs
        env_file = singpy.workdir / "env-flags.env"
        env_file.write_text("FROM_FILE=1\n")
        env_file.chmod(0o644)
        value = str(env_file)
    others, host = ALONGSIDE.get(flag, []), HOST_VARIABLES.get(flag, {})
    flagged = _plan(singpy, image, [*others, flag, value] if value is not None else [*others, flag], host)
    if flagged == _plan(singpy, image, others, host):  # root has every capability, a user always a user namespace
        pytest.skip(f"{flag} changes nothing in {singpy.profile}'s plan: checked for the other profile")
    assert _plan(singpy, image, others, host, **{f"APPTAINER_{key}": value or "1"}) == flagged


def test_debug_variable_shows_a_traceback(singpy: Singpy, workdir: Path) -> None:
    result = singpy.run("exec", str(workdir / "nope"), "true", env=singpy.env(APPTAINER_DEBUG="1"))
    assert result.returncode == 255 and "Traceback" in result.stderr, result.stderr


def test_config_file_variable_is_read(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = workdir / "env-flags-bad.conf"
    conf.write_text("mount tmp = maybe\n")
    conf.chmod(0o644)
    for command in (["exec", str(image), "true"], ["-c", str(conf), "exec", str(image), "true"]):
        env = singpy.env() if command[0] == "-c" else singpy.env(SINGULARITY_CONFIG_FILE=str(conf))
        result = singpy.run(*command, env=env)
        assert result.returncode == 255 and f"{conf}:1: mount tmp must be yes or no" in result.stderr, command


def test_silent_variable_drops_the_warning(singpy: Singpy, image: Path) -> None:
    """`shell IMAGE ARGS` warns that ARGS are ignored; APPTAINER_SILENT=1 is --silent: no warning."""
    loud = singpy.run("shell", str(image), "extra", input="exit 0\n")
    assert loud.returncode == 0 and "WARNING: parameters to shell command are ignored" in loud.stderr
    quiet = singpy.run("shell", str(image), "extra", input="exit 0\n", env=singpy.env(APPTAINER_SILENT="1"))
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_nocolor_is_accepted(singpy: Singpy, image: Path) -> None:
    """singpy has no colour to turn off; Apptainer's --nocolor and APPTAINER_NOCOLOR must not break a script."""
    assert singpy.ok("--nocolor", "exec", str(image), "echo", "ok") == "ok\n"
    assert singpy.ok("exec", str(image), "echo", "ok", env=singpy.env(APPTAINER_NOCOLOR="1")) == "ok\n"


def test_pull_force_variable(singpy: Singpy, tmp_path: Path) -> None:
    """APPTAINER_FORCE=1 is `pull --force`: an existing file no longer stops the pull before it starts."""
    target = singpy.workdir / f"env-flags-{singpy.profile}.sif"
    target.write_text("old")
    reference = "oci:" + str(tmp_path / "no-such-layout")
    plain = singpy.run("pull", str(target), reference)
    forced = singpy.run("pull", str(target), reference, env=singpy.env(APPTAINER_FORCE="1"))
    assert plain.returncode == 255 and "exists" in plain.stderr, plain.stderr
    assert forced.returncode == 255 and "exists" not in forced.stderr, forced.stderr
    assert forced.stderr == singpy.run("pull", "--force", str(target), reference).stderr

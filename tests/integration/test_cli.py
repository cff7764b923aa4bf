"""The command line itself: version, help, configuration settings."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import Singpy, assert_one_fatal


def test_version(as_root: Singpy) -> None:
    assert as_root.ok("--version").startswith("singpy version ")


def test_version_under_apptainers_names(singpy: Singpy, workdir: Path) -> None:
    """cwltool, Snakemake and spython parse `apptainer version X.Y.Z`; `version` alone prints the number."""
    from singpy import APPTAINER_VERSION, __version__
    from tests.conftest import SINGPY

    links = workdir / "drop-in-names"
    if not links.exists():
        links.mkdir()
        for name in ("apptainer", "singularity"):
            (links / name).symlink_to(SINGPY)
    env = singpy.env(PATH=f"{links}:/usr/bin:/bin")
    for name in ("apptainer", "singularity"):
        ids = singpy.switch()
        shown = subprocess.run([str(links / name), "--version"], env=env, capture_output=True, text=True,
                               timeout=60, check=False, **ids)  # type: ignore[call-overload]
        assert shown.stdout == f"apptainer version {APPTAINER_VERSION}\n", shown.stderr
        number = subprocess.run([str(links / name), "-v", "version"], env=env, capture_output=True, text=True,
                                timeout=60, check=False, **ids)  # type: ignore[call-overload]
        assert number.stdout == f"{APPTAINER_VERSION}\n", number.stderr
        assert f"singpy {__version__}, answering as Apptainer {APPTAINER_VERSION}" in number.stderr
    assert singpy.ok("version") == f"singpy version {__version__}\n"


def test_top_level_help_lists_commands(as_root: Singpy) -> None:
    out = as_root.ok("--help")
    for command in ("exec", "run", "shell", "version"):
        assert command in out


def test_action_help_lists_flags(as_root: Singpy) -> None:
    out = as_root.ok("exec", "--help")
    for flag in ("--bind", "--contain", "--containall", "--cleanenv", "--env-file", "--writable-tmpfs",
                 "--hostname", "--pid", "--ipc", "--uts", "--no-home", "--pwd", "$APPTAINER_BIND"):
        assert flag in out


def test_instance_start_help_has_the_one_layout(as_root: Singpy) -> None:
    """Usage, summary, the options of run with their variables, Examples: as every other command's help."""
    out = as_root.ok("instance", "start", "--help")
    assert out.startswith("Usage: singpy instance start [options] IMAGE NAME [ARGS...]\n")
    assert "  -B, --bind SPEC" in out and "[$APPTAINER_BIND]" in out
    assert "\nExamples:\n  $ singpy instance start image.sif web\n" in out


def test_unknown_command_is_a_usage_error(as_root: Singpy) -> None:
    result = as_root.run("frobnicate")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr


def test_apptainers_commands_singpy_lacks_say_so(as_user: Singpy) -> None:
    """oci, checkpoint and plugin: Apptainer's commands, refused as such rather than as a typing mistake."""
    from singpy.cli.app import NOT_SUPPORTED_COMMANDS

    for command, why in NOT_SUPPORTED_COMMANDS.items():
        assert_one_fatal(as_user.run(command, "list"), f"{command} is not supported: {why}", code=1)
    assert_one_fatal(as_user.run("ocii"), "unknown command: ocii", code=1)
    from singpy.cli.app import NOT_SUPPORTED_FLAGS

    for (command, flag), why in NOT_SUPPORTED_FLAGS.items():  # and their flags singpy lacks
        words = [flag] if flag in ("--no-cleanup", "--reproducible", "--json", "--data") else [flag, "value"]
        assert_one_fatal(as_user.run(command, *words, "one", "docker://two"), f"{flag} is not supported: {why}",
                         code=1)


def test_help_command_matches_dash_dash_help(singpy: Singpy) -> None:
    for command in (["exec"], ["run"], ["shell"], ["pull"], ["build"], ["cache", "clean"], []):
        assert singpy.ok("help", *command) == singpy.ok(*command, "--help"), command
    assert_one_fatal(singpy.run("help", "nonsense"), "unknown command: nonsense", code=1)


def test_conf_mount_settings(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = workdir / f"nohome-{singpy.profile}.conf"
    conf.write_text("mount home = no\nmount tmp = no\nmount dev = minimal\nconfig passwd = no\n")
    out = singpy.ok("--config", str(conf), "exec", str(image), "sh", "-c",
                    f"ls -A /tmp | wc -l; ls /dev | grep -c vda; grep -c {singpy.user} /etc/passwd; true", cwd="/")
    tmp_entries, vda, passwd = out.split()
    assert tmp_entries == "0"
    assert vda == "0"
    assert passwd == ("1" if singpy.uid == 0 else "0")


def test_conf_bind_path(singpy: Singpy, image: Path, workdir: Path) -> None:
    shared = workdir / "site-data"
    shared.mkdir(exist_ok=True)
    (shared / "readme").write_text("site\n")
    conf = workdir / "bindpath.conf"
    conf.write_text(f"bind path = {shared}:/site\nbind path = /does/not/exist\nbind path = /not/here:/data/ref\n")
    # A source this host lacks is skipped, and leaves no mount point behind (an empty file /does/not/exist would
    # make a job's `mkdir -p /does/not/exist/x` fail)
    out = singpy.ok("--config", str(conf), "exec", str(image), "sh", "-c",
                    "cat /site/readme; for p in /does /data; do test -e $p && echo $p; done; true")
    assert out == "site\n"


def test_conf_from_environment_variable(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = workdir / "nopid.conf"
    conf.write_text("allow pid ns = no\n")
    # As in Apptainer, a namespace the admin does not allow is left out (with a warning), not an error.
    result = singpy.run("exec", "--pid", str(image), "sh", "-c", "echo $$", env=singpy.env(SINGPY_CONFIG=str(conf)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() != "1"
    assert "WARNING: no PID namespace: the system administrator does not allow one (allow pid ns = no)" \
        in result.stderr

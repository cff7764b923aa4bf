"""The container environment, Apptainer's precedence table, seen from inside."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Singpy


def env_inside(singpy: Singpy, image: Path, *flags: str, **host: str) -> dict[str, str]:
    out = singpy.ok("exec", *flags, str(image), "env", env=singpy.env(**host))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(params=["plain", "with-env-scripts"])
def any_image(request: pytest.FixtureRequest, image: Path, env_image: Path) -> Path:
    """Both code paths: environment built in Python, and by the action shell."""
    return image if request.param == "plain" else env_image


def test_host_variables_pass_but_not_path(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, HOSTVAR="from host", LD_LIBRARY_PATH="/host/lib")
    assert env["HOSTVAR"] == "from host"
    assert env["HOME"] == singpy.home
    assert env["LD_LIBRARY_PATH"] == "/.singularity.d/libs"
    assert env["PATH"].endswith("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def test_launcher_variables_do_not_pass(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, SINGULARITY_FOO="x", APPTAINER_BAR="y", SINGPY_BAZ="z")
    assert not {"SINGULARITY_FOO", "APPTAINER_BAR", "SINGPY_BAZ"} & set(env)
    assert env["SINGULARITY_CONTAINER"] == str(any_image)
    assert env["APPTAINER_NAME"] == any_image.name


def test_prefixed_variables_are_injected_in_order(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, SINGULARITYENV_A="s", SINGULARITYENV_B="s", APPTAINERENV_B="a",
                     APPTAINERENV_C="a", SINGPYENV_C="p")
    assert (env["A"], env["B"], env["C"]) == ("s", "a", "p")


def test_env_file_and_env_flag_precedence(singpy: Singpy, any_image: Path, workdir: Path) -> None:
    env_file = workdir / f"envfile-{singpy.profile}"
    env_file.write_text("# comment\nX=file\nexport Y='file y'\nZ=file\n")
    env = env_inside(singpy, any_image, "--env-file", str(env_file), "--env", "Z=flag,W=a,b",
                     APPTAINERENV_X="prefixed", APPTAINERENV_V="prefixed")
    assert (env["X"], env["Y"], env["Z"], env["W"], env["V"]) == ("file", "file y", "flag", "a,b", "prefixed")


def test_values_are_evaluated_once_inside_as_apptainer_does(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, "--env", "A=$HOME/x", "--env", "B=$(echo evaluated)",
                     "--env", 'C=say "hi"', "--env", "D=\\$HOME", SINGULARITYENV_E="`echo e`")
    assert (env["A"], env["B"], env["C"], env["D"], env["E"]) == (f"{singpy.home}/x", "evaluated", 'say "hi"',
                                                                  "$HOME", "e")


def test_no_eval_takes_values_literally(singpy: Singpy, any_image: Path) -> None:
    tricky = "a b $HOME `id` \"q\" 'q' \\ $(echo no)"
    env = env_inside(singpy, any_image, "--no-eval", "--env", f"T={tricky}", SINGULARITYENV_U=tricky)
    assert env["T"] == tricky and env["U"] == tricky


def test_home_cannot_be_overridden(singpy: Singpy, any_image: Path) -> None:
    result = singpy.run("exec", str(any_image), "sh", "-c", "echo $HOME",
                        env=singpy.env(SINGULARITYENV_HOME="/elsewhere"))
    assert result.stdout.strip() == singpy.home
    assert "HOME" in result.stderr and "not permitted" in result.stderr


def test_path_rules(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, SINGULARITYENV_PREPEND_PATH="/first", APPTAINERENV_APPEND_PATH="/last")
    assert env["PATH"].startswith("/first:") and env["PATH"].endswith(":/last")
    env = env_inside(singpy, any_image, SINGULARITYENV_PATH="/only/this:/bin")
    assert env["PATH"] == "/only/this:/bin"


def test_ld_library_path_keeps_gpu_libs_dir(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, SINGULARITYENV_LD_LIBRARY_PATH="/opt/lib")
    assert env["LD_LIBRARY_PATH"] == "/opt/lib:/.singularity.d/libs"


def test_cleanenv(singpy: Singpy, any_image: Path) -> None:
    env = env_inside(singpy, any_image, "--cleanenv", HOSTVAR="x", http_proxy="http://proxy:3128",
                     SINGULARITYENV_KEPT="yes")
    assert "HOSTVAR" not in env
    assert env["http_proxy"] == "http://proxy:3128"
    assert env["TERM"] == "dumb"
    assert env["LANG"] == "C"
    assert env["KEPT"] == "yes"


def test_image_env_scripts_beat_host_and_lose_to_injection(singpy: Singpy, env_image: Path) -> None:
    env = env_inside(singpy, env_image, FROM_IMAGE="host", SHARED="host", SINGULARITYENV_SHARED="injected")
    assert env["FROM_IMAGE"] == "image90"
    assert env["FROM_DOCKER"] == "docker"  # ${FROM_DOCKER:-docker}: the host's value is not seen by the image
    assert env["SHARED"] == "injected"
    assert env["PATH"].startswith("/opt/bin:")


def test_env_flag_from_environment_variable_options(singpy: Singpy, image: Path) -> None:
    env = env_inside(singpy, image, APPTAINER_CLEANENV="1", HOSTVAR="x")
    assert "HOSTVAR" not in env


def test_run_uses_runscript_with_arguments(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("run", str(image), "one", "two")
    assert "Hello from a singpy container" in out
    assert "args:     one two" in out


def test_run_without_runscript_runs_sh(singpy: Singpy, workdir: Path) -> None:
    from tests.support.images import build_busybox_rootfs

    root = workdir / f"no-runscript-{singpy.profile}"
    if not root.exists():
        build_busybox_rootfs(root, runscript=None)
    assert singpy.ok("run", str(root), "-c", "echo from sh") == "from sh\n"


def test_shell_reads_commands_from_stdin(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("shell", str(image), input="echo in shell $HOME\n") == f"in shell {singpy.home}\n"


def test_shell_flag_chooses_the_shell(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("shell", "--shell", "/bin/ash", str(image), input="echo $0\n")  # arguments are ignored
    assert out == "/bin/ash\n"


def test_home_is_the_container_home_on_both_paths(singpy: Singpy, any_image: Path, workdir: Path) -> None:
    custom = workdir / f"envhome-{singpy.profile}"
    custom.mkdir(exist_ok=True)
    custom.chmod(0o777)
    env = env_inside(singpy, any_image, "-H", f"{custom}:/home/elsewhere")
    assert env["HOME"] == "/home/elsewhere"

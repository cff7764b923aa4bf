"""The container environment, Apptainer's precedence table, seen from inside."""

from __future__ import annotations

import os
import shutil
import subprocess
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


# --- IFS: the image's or the user's, never the action script's undoing ---------------------------------------------


@pytest.fixture(scope="module")
def ifs_images(workdir: Path) -> dict[str, Path]:
    """Images whose env script leaves IFS=: behind, unexported (the shell's alone) or exported."""
    from tests.support.images import build_busybox_rootfs

    return {export: build_busybox_rootfs(workdir / f"busybox-ifs-{export or 'kept'}", env_scripts={
        "90-environment.sh": f"export FROMIMG=1\n{export}IFS=:\n"}) for export in ("", "export ")}


def test_ifs_left_by_an_env_script(singpy: Singpy, ifs_images: dict[str, Path]) -> None:
    """Splitting the script's own lists at ':' made them one word, and the shell died (exit 2, no FATAL)."""
    env = env_inside(singpy, ifs_images[""], "--env", "A=1,B=2", HOSTVAR="from host")
    assert (env["FROMIMG"], env["A"], env["B"], env["HOSTVAR"]) == ("1", "1", "2", "from host")
    assert "IFS" not in env  # the image's shell variable, not exported by it: as the image says
    env = env_inside(singpy, ifs_images["export "], "--env", "A=1,B=2", HOSTVAR="from host")
    assert (env["IFS"], env["FROMIMG"], env["A"], env["B"], env["HOSTVAR"]) == (":", "1", "1", "2", "from host")


def test_ifs_injected(singpy: Singpy, any_image: Path) -> None:
    """`--env IFS=:` with host variables passing: the script's lists split at ':' (and at '_': names) no more."""
    for ifs in (":", "_"):
        env = env_inside(singpy, any_image, "--env", f"IFS={ifs},MY_VAR=v", HOST_VAR="from host")
        assert (env["IFS"], env["MY_VAR"], env["HOST_VAR"]) == (ifs, "v", "from host")


# --- Apptainer 1.5's PREPEND_LD_LIBRARY_PATH / APPEND_LD_LIBRARY_PATH and ldconfig's directories ---------------

LIBS = "/.singularity.d/libs"


def test_prepend_and_append_ld_library_path(singpy: Singpy, any_image: Path) -> None:
    """busybox has no ldconfig: nothing goes before /.singularity.d/libs (Apptainer: "only glibc's ldconfig")."""
    env = env_inside(singpy, any_image, "--env", "PREPEND_LD_LIBRARY_PATH=/foo",
                     "--env", "APPEND_LD_LIBRARY_PATH=/bar")
    assert env["LD_LIBRARY_PATH"] == f"/foo:{LIBS}:/bar"
    assert (env["PREPEND_LD_LIBRARY_PATH"], env["APPEND_LD_LIBRARY_PATH"]) == ("/foo", "/bar")  # still set, as there
    env = env_inside(singpy, any_image, APPTAINERENV_PREPEND_LD_LIBRARY_PATH="/foo",
                     SINGULARITYENV_LD_LIBRARY_PATH="/x")
    assert env["LD_LIBRARY_PATH"] == f"/foo:/x:{LIBS}"


@pytest.fixture(scope="module", params=["plain", "with-env-scripts"])
def glibc_image(request: pytest.FixtureRequest, workdir: Path) -> Path:
    """busybox plus the host's glibc ldconfig (static) and an ld.so.conf naming /opt/lib and /opt/lib64."""
    from tests.support.images import build_busybox_rootfs

    if not os.access("/sbin/ldconfig", os.X_OK):
        pytest.skip("no glibc ldconfig on this host")
    scripts = {"90-environment.sh": "export FROMIMG=1\n"} if request.param != "plain" else None
    root = build_busybox_rootfs(workdir / f"busybox-ldconfig-{request.param}", env_scripts=scripts)
    shutil.copy2("/sbin/ldconfig", root / "sbin" / "ldconfig")
    (root / "etc" / "ld.so.conf").write_text("/opt/lib\n/opt/lib64\n")
    for name in ("lib", "lib64"):
        (root / "opt" / name).mkdir(exist_ok=True)
    return root


def test_ldconfig_directories_go_before_the_gpu_libraries(singpy: Singpy, glibc_image: Path, workdir: Path) -> None:
    """Apptainer 1.5: LD_LIBRARY_PATH only /.singularity.d/libs, and that directory has entries (--nv's libraries;
    here a bind) or a PREPEND/APPEND rule is set: the container's own library directories are searched first."""
    library = workdir / "libfake.so.1"
    library.write_text("not really a library\n")
    library.chmod(0o644)
    assert env_inside(singpy, glibc_image)["LD_LIBRARY_PATH"] == LIBS
    env = env_inside(singpy, glibc_image, "-B", f"{library}:{LIBS}/libfake.so.1")
    assert env["LD_LIBRARY_PATH"] == f"/opt/lib:/opt/lib64:{LIBS}"
    env = env_inside(singpy, glibc_image, "--env", "PREPEND_LD_LIBRARY_PATH=/foo",
                     "--env", "APPEND_LD_LIBRARY_PATH=/bar")
    assert env["LD_LIBRARY_PATH"] == f"/foo:/opt/lib:/opt/lib64:{LIBS}:/bar"
    env = env_inside(singpy, glibc_image, "-B", f"{library}:{LIBS}/libfake.so.1", "--env", "LD_LIBRARY_PATH=/x")
    assert env["LD_LIBRARY_PATH"] == f"/x:{LIBS}"  # a path of the user's own: left as it is


def test_ldconfig_runs_whatever_the_hosts_environment_holds(singpy: Singpy, glibc_image: Path, workdir: Path) -> None:
    """An entry without a name in the host's environment ("=x", which `env` can make) is no variable of the
    container's, and no reason for ldconfig's run to fail: it runs with no environment (a traceback before)."""
    library = workdir / "libfake.so.1"
    library.write_text("not really a library\n")
    library.chmod(0o644)
    argv, ids = singpy.command(["exec", "-B", f"{library}:{LIBS}/libfake.so.1", str(glibc_image), "sh", "-c",
                                'echo "$LD_LIBRARY_PATH"'])
    done = subprocess.run(["/usr/bin/env", "=x", *argv], env=singpy.env(), cwd=str(singpy.workdir),
                          capture_output=True, text=True, timeout=60, check=False, **ids)  # type: ignore[call-overload]
    assert (done.returncode, done.stdout, done.stderr) == (0, f"/opt/lib:/opt/lib64:{LIBS}\n", "")


# --- --env / --env-file: the names injection may not set ----------------------------------------------------------


def test_env_flags_cannot_set_protected_names(singpy: Singpy, any_image: Path, workdir: Path) -> None:
    env_file = workdir / f"envfile-protected-{singpy.profile}"
    env_file.write_text("SINGULARITY_SHELL=/bin/evil\nKEPT=yes\n")
    result = singpy.run("exec", "--env", "APPTAINER_APPNAME=evil", "--env-file", str(env_file), str(any_image), "env")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "WARNING: overriding SINGULARITY_SHELL environment variable with --env-file is not permitted",
        "WARNING: overriding APPTAINER_APPNAME environment variable with --env is not permitted"]
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "APPTAINER_APPNAME" not in env and "SINGULARITY_SHELL" not in env
    assert env["KEPT"] == "yes"

"""Environment rules as Apptainer 1.4 applies them (its e2e/env cases), seen from inside the container.

--env-file read as shell assignments, later files winning and --env beating
them; `$PATH` in --env / env-file / *ENV_PATH values meaning the container's
PATH; SINGULARITYENV_ vs APPTAINERENV_ conflicts; `singpy shell` and SHELL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.images import build_busybox_rootfs

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBS = "/.singularity.d/libs"


@pytest.fixture(params=["plain", "with-env-scripts"])
def any_image(request: pytest.FixtureRequest, image: Path, env_image: Path) -> Path:
    """Both code paths: environment built in Python, and by the action shell (env_image: PATH=/opt/bin:...)."""
    return image if request.param == "plain" else env_image


def image_path(image: Path, env_image: Path) -> str:
    """The PATH the image's env scripts leave (tests/conftest.py's env_image prepends /opt/bin)."""
    return f"/opt/bin:{DEFAULT_PATH}" if image == env_image else DEFAULT_PATH


def env_files(singpy: Singpy, name: str, *texts: str) -> list[str]:
    """--env-file flags for files holding `texts`, readable by the profile's user (the session workdir)."""
    flags = []
    for index, text in enumerate(texts):
        path = singpy.workdir / f"env-rules-{singpy.profile}-{name}-{index}.env"
        path.write_text(text)
        flags += ["--env-file", str(path)]
    return flags


def echo(singpy: Singpy, image: Path, *flags: str, name: str, **host: str) -> str:
    """The value of `name` inside, as Apptainer's e2e tests print it (`echo "$NAME"`)."""
    out = singpy.ok("exec", *flags, str(image), "/bin/sh", "-c", f'echo "${{{name}}}"', env=singpy.env(**host))
    return out.removesuffix("\n")


# --- --env-file as shell ------------------------------------------------------------------------------------------

ENV_FILE = """\
# a job's settings
export OMP_NUM_THREADS=8   # trailing comment
DATA='/scratch/run 1'; LABEL="it's \\"quoted\\""
BASE=/opt/tool
BIN=$BASE/bin:${BASE}/sbin
FROM_HOST=$HOST_VALUE
MULTI="line one
line two"
LONG=a\\
b
LITERAL='$HOME and $(not run)'
IMAGE=$APPTAINER_IMAGE
"""


def test_env_file_is_read_as_shell(singpy: Singpy, any_image: Path) -> None:
    flags = env_files(singpy, "shell", ENV_FILE)
    script = 'printf "%s|" "$OMP_NUM_THREADS" "$DATA" "$LABEL" "$BIN" "$FROM_HOST" "$MULTI" "$LONG" "$IMAGE"'
    out = singpy.ok("exec", *flags, str(any_image), "/bin/sh", "-c", script, env=singpy.env(HOST_VALUE="from host"))
    assert out.split("|")[:-1] == ["8", "/scratch/run 1", "it's \"quoted\"", "/opt/tool/bin:/opt/tool/sbin",
                                   "from host", "line one\nline two", "ab", str(any_image)]


def test_env_file_values_are_evaluated_again_inside_unless_no_eval(singpy: Singpy, any_image: Path) -> None:
    """Like Apptainer: the file's value `$HOME and $(not run)` is injected, then evaluated in the container."""
    flags = env_files(singpy, "literal", "LITERAL='$HOME and $(echo ran inside)'\n")
    assert echo(singpy, any_image, *flags, name="LITERAL") == f"{singpy.home} and ran inside"
    assert echo(singpy, any_image, "--no-eval", *flags, name="LITERAL") == "$HOME and $(echo ran inside)"


def test_later_env_files_win_and_env_beats_them(singpy: Singpy, any_image: Path) -> None:
    flags = env_files(singpy, "order", "A=first\nB=first\nC=first\n", "B=second\nC=second\n")
    result = singpy.run("exec", *flags, "--env", "C=flag", str(any_image), "/bin/sh", "-c", 'echo "$A $B $C"')
    assert (result.returncode, result.stdout) == (0, "first second flag\n"), result.stderr
    assert result.stderr.count("WARNING:") == 1
    assert "WARNING: ignored environment file variable C: override from --env" in result.stderr


def test_env_equal_to_the_file_is_no_warning(singpy: Singpy, image: Path) -> None:
    flags = env_files(singpy, "same", "C=same\n")
    result = singpy.run("exec", *flags, "--env", "C=same", str(image), "/bin/sh", "-c", 'echo "$C"')
    assert (result.returncode, result.stdout, result.stderr) == (0, "same\n", "")


def test_one_env_file_does_not_see_the_previous_one(singpy: Singpy, image: Path) -> None:
    """Apptainer evaluates each file on its own, from the host's environment."""
    flags = env_files(singpy, "separate", "A=one\n", "B=[$A]\n")
    assert echo(singpy, image, *flags, name="B") == "[]"


@pytest.mark.parametrize(
    ("texts", "flags", "name", "expected"),
    [
        (["PATH=/"], [], "PATH", "/"),
        (["PATH=/"], ["--env", "PATH=/etc"], "PATH", "/etc"),
        (["PATH=/", "PATH=/etc"], [], "PATH", "/etc"),
        (["PATH=/", "PATH=/foo"], ["--env", "PATH=/etc"], "PATH", "/etc"),
        (["APPEND_PATH=/"], [], "PATH", "{image_path}:/"),
        (['PATH="\\$PATH:/"'], [], "PATH", "{image_path}:/"),
        (['PATH="/:\\$PATH"'], [], "PATH", "/:{image_path}"),
        (["PREPEND_PATH=/"], [], "PATH", "/:{image_path}"),
        ([], [], "LD_LIBRARY_PATH", LIBS),
        (["LD_LIBRARY_PATH=/foo"], [], "LD_LIBRARY_PATH", f"/foo:{LIBS}"),
        (["LD_LIBRARY_PATH=/foo,"], [], "LD_LIBRARY_PATH", f"/foo,:{LIBS}"),
    ],
    ids=["DefaultPathOverride", "DefaultPathOverrideEnvOptionPrecedence", "DefaultPathOverrideEnvFileOptionPrecedence",
         "DefaultPathOverrideEnvAndEnvFileOptionPrecedence", "AppendDefaultPath", "AppendLiteralDefaultPath",
         "PrependLiteralDefaultPath", "PrependDefaultPath", "DefaultLdLibraryPath", "CustomLdLibraryPath",
         "CustomTrailingCommaPath"],
)
def test_apptainer_env_file_cases(singpy: Singpy, any_image: Path, env_image: Path, texts: list[str],
                                  flags: list[str], name: str, expected: str) -> None:
    """Apptainer's e2e/env/env.go apptainerEnvFile table, on both code paths."""
    files = env_files(singpy, "e2e", *texts)
    # `echo $NAME` by absolute path: PATH=/ leaves no `sh` to find.
    got = echo(singpy, any_image, *flags, *files, name=name)
    assert got == expected.format(image_path=image_path(any_image, env_image))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A=1\nB=$(id -u)\n", "{file}:2: command substitution ($(...) or `...`) is not supported in an env file"),
        ("A=`touch {marker}`\n", "{file}:1: command substitution"),
        ("A=1\n\nB='open\nC=2\n", "{file}:3: unterminated single quote"),
        ("touch {marker}\n", "{file}:1: 'touch' is a command: an env file may only set variables"),
        ("A=1 > {marker}\n", "{file}:1: '>': only variable assignments are allowed in an env file"),
        ("A=${{B%x}}\n", "{file}:1: unsupported substitution ${{B%...}}"),
    ],
    ids=["command-substitution", "backquotes", "unterminated-quote", "command", "redirection", "unsupported-operator"],
)
def test_bad_env_file_is_one_fatal_line_and_runs_nothing(singpy: Singpy, image: Path, text: str,
                                                         message: str) -> None:
    marker = singpy.workdir / f"env-rules-{singpy.profile}-marker"
    path = singpy.workdir / f"env-rules-{singpy.profile}-bad.env"
    path.write_text(text.format(marker=marker))
    result = singpy.run("exec", "--env-file", str(path), str(image), "/bin/echo", "payload ran")
    assert_one_fatal(result, message.format(file=path))
    assert not marker.exists()


# --- $PATH in --env and *ENV_PATH: the container's PATH -----------------------------------------------------------

@pytest.mark.parametrize(
    ("flags", "host", "expected"),
    [
        (["--env", "PATH=$PATH:/foo"], {}, "{image_path}:/foo"),
        (["--env", "PATH=/foo:$PATH"], {}, "/foo:{image_path}"),
        (["--env", "PATH=/foo:${PATH}:/bar"], {}, "/foo:{image_path}:/bar"),
        ([], {"SINGULARITYENV_PATH": "$PATH:/foo"}, "{image_path}:/foo"),
        ([], {"APPTAINERENV_PATH": "/foo:$PATH"}, "/foo:{image_path}"),
        ([], {"APPTAINERENV_PREPEND_PATH": "$HOME/bin"}, "{home}/bin:{image_path}"),
        (["--env", "PATH=\\$PATH:/foo"], {}, "$PATH:/foo"),
        (["--no-eval", "--env", "PATH=$PATH:/foo"], {}, "$PATH:/foo"),
        (["--no-eval"], {"APPTAINERENV_PATH": "/foo:$PATH"}, "/foo:$PATH"),
    ],
    ids=["AppendLiteralDefaultPath", "PrependLiteralDefaultPath", "both-sides", "SINGULARITYENV_PATH",
         "APPTAINERENV_PATH", "prepend-evaluated", "escaped-dollar-literal", "no-eval-literal",
         "no-eval-prefixed-literal"],
)
def test_path_refers_to_the_container_path(singpy: Singpy, any_image: Path, env_image: Path, flags: list[str],
                                           host: dict[str, str], expected: str) -> None:
    """Apptainer's e2e environment option cases: `$PATH` is the image's PATH, after its env scripts."""
    got = echo(singpy, any_image, *flags, name="PATH", PATH="/host/only/bin:/usr/bin:/bin", **host)
    assert got == expected.format(image_path=image_path(any_image, env_image), home=singpy.home)


# --- SINGULARITYENV_ / APPTAINERENV_ --------------------------------------------------------------------------------

def test_apptainerenv_wins_over_singularityenv_with_one_warning(singpy: Singpy, any_image: Path) -> None:
    result = singpy.run("exec", str(any_image), "/bin/sh", "-c", 'echo "$FOO"',
                        env=singpy.env(SINGULARITYENV_FOO="old", APPTAINERENV_FOO="new"))
    assert (result.returncode, result.stdout) == (0, "new\n"), result.stderr
    assert result.stderr == "WARNING: SINGULARITYENV_FOO and APPTAINERENV_FOO have different values, using the latter\n"


def test_same_value_under_both_prefixes_is_no_warning(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", str(image), "/bin/sh", "-c", 'echo "$FOO"',
                        env=singpy.env(SINGULARITYENV_FOO="same", APPTAINERENV_FOO="same"))
    assert (result.returncode, result.stdout, result.stderr) == (0, "same\n", "")


def test_singpyenv_wins_over_both(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", str(image), "/bin/sh", "-c", 'echo "$FOO"',
                        env=singpy.env(SINGULARITYENV_FOO="s", APPTAINERENV_FOO="s", SINGPYENV_FOO="p"))
    assert (result.returncode, result.stdout) == (0, "p\n"), result.stderr
    assert result.stderr == "WARNING: APPTAINERENV_FOO and SINGPYENV_FOO have different values, using the latter\n"


# --- singpy shell ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bash_image(workdir: Path) -> Path:
    """A busybox image with a /bin/bash (a wrapper around busybox sh that takes bash's --norc)."""
    root = workdir / "busybox-bash"
    if not root.exists():
        build_busybox_rootfs(root)
        bash = root / "bin" / "bash"
        bash.write_text('#!/bin/sh\n[ "$1" = --norc ] && shift\nexec /bin/sh "$@"\n')
        bash.chmod(0o755)
    return root


SHOW_SHELL = 'echo "SHELL=$SHELL SINGULARITY_SHELL=$SINGULARITY_SHELL APPTAINER_SHELL=$APPTAINER_SHELL"\n'


@pytest.mark.parametrize("host", [{}, {"SHELL": "/bin/host-zsh", "APPTAINERENV_SHELL": "/injected"}],
                         ids=["plain-host", "host-and-injected-SHELL"])
def test_shell_exports_the_shell_it_starts(singpy: Singpy, any_image: Path, bash_image: Path,
                                           host: dict[str, str]) -> None:
    env = singpy.env(**host)
    assert singpy.ok("shell", str(any_image), env=env, input=SHOW_SHELL) == (
        "SHELL=/bin/sh SINGULARITY_SHELL= APPTAINER_SHELL=\n")
    assert singpy.ok("shell", str(bash_image), env=env, input=SHOW_SHELL) == (
        "SHELL=/bin/bash SINGULARITY_SHELL= APPTAINER_SHELL=\n")
    assert singpy.ok("shell", "--shell", "/bin/ash", str(any_image), env=env, input=SHOW_SHELL) == (
        "SHELL=/bin/ash SINGULARITY_SHELL=/bin/ash APPTAINER_SHELL=/bin/ash\n")


def test_exec_does_not_change_shell(singpy: Singpy, image: Path) -> None:
    assert echo(singpy, image, name="SHELL", SHELL="/bin/host-zsh") == "/bin/host-zsh"


def test_shell_ignores_arguments_with_a_warning(singpy: Singpy, any_image: Path) -> None:
    """Apptainer: "Parameters to shell command are ignored"; the shell reads its input as without them."""
    result = singpy.run("shell", str(any_image), "-c", "echo from-arguments", input="echo from-stdin\n")
    assert (result.returncode, result.stdout) == (0, "from-stdin\n"), result.stderr
    assert result.stderr == "WARNING: parameters to shell command are ignored\n"

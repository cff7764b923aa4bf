"""singpy.env.environ: Apptainer's environment precedence, in Python (the same in the container's /bin/sh, with
evaluation, redaction and PATH rules: test_environ_shell.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from singpy.constants import DEFAULT_PATH, LIBS_DIR
from singpy.env.environ import (
    EnvPlan,
    final_env,
    host_passthrough,
    injected_from_host,
    ldconfig_dirs,
    parse_env_option,
    split_path_rules,
)
from singpy.errors import UsageError

# --- injected_from_host -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ({}, {}),
        ({"SINGULARITYENV_FOO": "s"}, {"FOO": "s"}),
        ({"APPTAINERENV_FOO": "a"}, {"FOO": "a"}),
        ({"SINGPYENV_FOO": "p"}, {"FOO": "p"}),
        ({"SINGULARITYENV_FOO": "same", "APPTAINERENV_FOO": "same", "SINGPYENV_FOO": "same"}, {"FOO": "same"}),
        ({"SINGULARITYENV_A": "1", "APPTAINERENV_B": "2", "SINGPYENV_C": "3"}, {"A": "1", "B": "2", "C": "3"}),
        ({"SINGULARITYENV_PATH": "/p", "APPTAINERENV_PREPEND_PATH": "/pre"}, {"PATH": "/p", "PREPEND_PATH": "/pre"}),
        ({"SINGULARITYENV_": "x", "SINGULARITYENV_1X": "x", "APPTAINERENV_A-B": "x", "SINGPYENV_A B": "x",
          "SINGPYENV_É": "x"}, {}),
        ({"SINGULARITYENV_EMPTY": ""}, {"EMPTY": ""}),
        ({"FOO": "host", "SINGULARITY_BIND": "/x", "XSINGULARITYENV_Y": "z"}, {}),
        ({"SINGULARITYENV_V": "a b $(x) 'q' \"d\"\n\\"}, {"V": "a b $(x) 'q' \"d\"\n\\"}),
    ],
    ids=["empty", "singularity", "apptainer", "singpy", "same-value-everywhere", "distinct-names", "path-rules-kept",
         "invalid-names-dropped", "empty-value",
         "not-prefixed", "value-verbatim"],
)
def test_injected_from_host(host: dict[str, str], expected: dict[str, str]) -> None:
    found, warnings = injected_from_host(host)
    assert found == expected
    assert warnings == []


@pytest.mark.parametrize(
    ("host", "value", "warnings"),
    [
        ({"SINGULARITYENV_FOO": "s", "APPTAINERENV_FOO": "a"}, "a",
         ["SINGULARITYENV_FOO and APPTAINERENV_FOO have different values, using the latter"]),
        ({"APPTAINERENV_FOO": "a", "SINGULARITYENV_FOO": "s"}, "a",
         ["SINGULARITYENV_FOO and APPTAINERENV_FOO have different values, using the latter"]),
        ({"SINGPYENV_FOO": "p", "APPTAINERENV_FOO": "a", "SINGULARITYENV_FOO": "s"}, "p",
         ["SINGULARITYENV_FOO and APPTAINERENV_FOO have different values, using the latter",
          "APPTAINERENV_FOO and SINGPYENV_FOO have different values, using the latter"]),
        ({"SINGULARITYENV_FOO": "s", "APPTAINERENV_FOO": "s", "SINGPYENV_FOO": "p"}, "p",
         ["APPTAINERENV_FOO and SINGPYENV_FOO have different values, using the latter"]),
        ({"SINGULARITYENV_FOO": "s", "SINGPYENV_FOO": "p"}, "p",
         ["SINGULARITYENV_FOO and SINGPYENV_FOO have different values, using the latter"]),
        ({"SINGULARITYENV_FOO": "", "APPTAINERENV_FOO": "a"}, "a",
         ["SINGULARITYENV_FOO and APPTAINERENV_FOO have different values, using the latter"]),
    ],
    ids=["apptainer-beats-singularity", "order-independent", "singpy-beats-all", "same-then-different",
         "singpy-over-singularity", "empty-differs"],
)
def test_injected_conflicts_warn_and_later_prefix_wins(host: dict[str, str], value: str,
                                                       warnings: list[str]) -> None:
    """Apptainer: APPTAINERENV_ wins over SINGULARITYENV_, with a warning only when the values differ."""
    assert injected_from_host(host) == ({"FOO": value}, warnings)


@pytest.mark.parametrize("key", ["SINGULARITYENV_HOME", "APPTAINERENV_HOME", "SINGPYENV_HOME"])
def test_injected_home_is_protected(key: str) -> None:
    found, warnings = injected_from_host({key: "/evil", "SINGULARITYENV_OK": "1"})
    assert found == {"OK": "1"}
    assert warnings == [f"overriding HOME environment variable with {key} is not permitted"]


def test_injected_protected_names_each_warn() -> None:
    host = {"SINGULARITYENV_SINGULARITY_SHELL": "/bin/zsh", "APPTAINERENV_APPTAINER_APPNAME": "x",
            "SINGPYENV_HOME": "/h"}
    found, warnings = injected_from_host(host)
    assert found == {}
    assert len(warnings) == 3
    assert all("is not permitted" in warning for warning in warnings)


# --- host_passthrough ---------------------------------------------------------------------------------------------

HOST = {
    "TERM": "xterm", "http_proxy": "http://p:3128", "NO_PROXY": "localhost", "FOO": "bar", "LANG": "en_US.UTF-8",
    "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "SINGULARITY_BIND": "/a", "APPTAINER_CONTAIN": "1",
    "SINGPY_CONFIG": "/c", "SINGULARITYENV_X": "1", "APPTAINERENV_Y": "2", "SINGPYENV_Z": "3",
    "BASH_FUNC_f%%": "() { :; }", "1BAD": "x", "A-B": "x", "": "x",
}


@pytest.mark.parametrize(
    ("cleanenv", "keep", "expected"),
    [
        (False, (), {"TERM": "xterm", "http_proxy": "http://p:3128", "NO_PROXY": "localhost", "FOO": "bar",
                     "LANG": "en_US.UTF-8"}),
        (True, (), {"TERM": "xterm", "http_proxy": "http://p:3128", "NO_PROXY": "localhost"}),
        (True, ("FOO", "MISSING"), {"TERM": "xterm", "http_proxy": "http://p:3128", "NO_PROXY": "localhost",
                                    "FOO": "bar"}),
        (False, ("FOO",), {"TERM": "xterm", "http_proxy": "http://p:3128", "NO_PROXY": "localhost", "FOO": "bar",
                           "LANG": "en_US.UTF-8"}),
    ],
    ids=["default", "cleanenv", "cleanenv-keep", "keep-without-cleanenv"],
)
def test_host_passthrough(cleanenv: bool, keep: tuple[str, ...], expected: dict[str, str]) -> None:
    assert host_passthrough(HOST, cleanenv=cleanenv, keep=keep) == expected


def test_host_passthrough_all_proxy_names_survive_cleanenv() -> None:
    names = ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
             "ALL_PROXY", "ftp_proxy", "FTP_PROXY", "TERM"]
    host = {name: f"v-{name}" for name in names} | {"OTHER": "x"}
    assert host_passthrough(host, cleanenv=True) == {name: f"v-{name}" for name in names}


# --- split_path_rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("injected", "rest", "rules"),
    [
        ({}, {}, {}),
        ({"A": "1"}, {"A": "1"}, {}),
        ({"A": "1", "PREPEND_PATH": "/p", "APPEND_PATH": "/a", "PATH": "/x"}, {"A": "1"},
         {"PREPEND_PATH": "/p", "APPEND_PATH": "/a", "PATH": "/x"}),
        ({"PATH": "/x", "MYPATH": "/m", "LD_LIBRARY_PATH": "/l"}, {"MYPATH": "/m", "LD_LIBRARY_PATH": "/l"},
         {"PATH": "/x"}),
    ],
    ids=["empty", "no-rules", "all-rules", "only-exact-names"],
)
def test_split_path_rules(injected: dict[str, str], rest: dict[str, str], rules: dict[str, str]) -> None:
    got_rest, got_rules = split_path_rules(dict(injected))
    assert got_rest == rest
    assert got_rules == rules


# --- final_env ----------------------------------------------------------------------------------------------------

BASE = (("HOME", "/home/u"), ("PATH", DEFAULT_PATH), ("PS1", "Singpy> "))


@pytest.mark.parametrize(
    ("plan", "image_env", "expected"),
    [
        (EnvPlan(base=BASE, injected=()), None,
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "Singpy> ", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=(("HOME", "/h"),), injected=()), {},
         {"HOME": "/h", "PATH": DEFAULT_PATH, "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=BASE, injected=()), {"PATH": "/opt/bin:/bin", "PS1": "img> ", "X": "img"},
         {"HOME": "/home/u", "PATH": "/opt/bin:/bin", "PS1": "img> ", "X": "img", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=BASE, injected=(("X", "inj"), ("PS1", "me> "))), {"X": "img"},
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "me> ", "X": "inj", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=BASE, injected=(), prepend_path="/pre", append_path="/app"), {"PATH": "/img"},
         {"HOME": "/home/u", "PATH": "/pre:/img:/app", "PS1": "Singpy> ", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=BASE, injected=(), prepend_path="/pre", append_path="/app", path="/only"), {"PATH": "/img"},
         {"HOME": "/home/u", "PATH": "/only", "PS1": "Singpy> ", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=(("HOME", "/h"),), injected=(), prepend_path="/pre"), None,
         {"HOME": "/h", "PATH": f"/pre:{DEFAULT_PATH}", "LD_LIBRARY_PATH": LIBS_DIR}),
        (EnvPlan(base=BASE, injected=(("LD_LIBRARY_PATH", "/a:/b"),)), {"LD_LIBRARY_PATH": "/img"},
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "Singpy> ", "LD_LIBRARY_PATH": f"/a:/b:{LIBS_DIR}"}),
        (EnvPlan(base=BASE, injected=(("LD_LIBRARY_PATH", f"/a:{LIBS_DIR}:/b"),)), None,
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "Singpy> ", "LD_LIBRARY_PATH": f"/a:{LIBS_DIR}:/b"}),
        (EnvPlan(base=BASE, injected=(("LD_LIBRARY_PATH", f"{LIBS_DIR}-old:/x"),)), None,
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "Singpy> ",
          "LD_LIBRARY_PATH": f"{LIBS_DIR}-old:/x:{LIBS_DIR}"}),
        (EnvPlan(base=BASE, injected=(("X", "inj"),), host=(("X", "host"), ("HOME", "/hosthome"), ("Y", "host"),
                                                             ("PS1", "$ "), ("Z", "host"))),
         {"Z": "img"},
         {"HOME": "/home/u", "PATH": DEFAULT_PATH, "PS1": "Singpy> ", "X": "inj", "Y": "host", "Z": "img",
          "LD_LIBRARY_PATH": LIBS_DIR}),
    ],
    ids=["base-only", "no-path-in-base", "image-overrides-base", "injected-overrides-image", "prepend-append",
         "path-replaces", "prepend-default-path", "ld-library-path-appended", "libs-dir-once",
         "libs-dir-prefix-is-not-it", "host-only-where-unset"],
)
def test_final_env(plan: EnvPlan, image_env: dict[str, str] | None, expected: dict[str, str],
                   tmp_path: Path) -> None:
    """In a container whose /.singularity.d/libs is empty, as an image's is (the host has none: ldconfig's rule)."""
    assert final_env(plan, image_env, libs=str(tmp_path)) == expected


def test_final_env_libs_dir_exactly_once_when_image_has_it(tmp_path: Path) -> None:
    env = final_env(EnvPlan(base=BASE, injected=()), {"LD_LIBRARY_PATH": f"{LIBS_DIR}:/img/lib"}, libs=str(tmp_path))
    assert env["LD_LIBRARY_PATH"] == f"{LIBS_DIR}:/img/lib"
    assert env["LD_LIBRARY_PATH"].split(":").count(LIBS_DIR) == 1


def apptainers_ldconfig_dirs() -> str:
    """What Apptainer's action script prepends, by its own shell code (action_script.sh, set_default_ld_library_path),
    run here: the host's directories."""
    code = """__dirs__="$( (/sbin/ldconfig -Nv | /bin/sed '/^\\t/d;s/:.*//') 2>/dev/null )"
__dirs__="$(echo $__dirs__)"
printf %s "${__dirs__// /:}" """
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not os.access("/sbin/ldconfig", os.X_OK), reason="no glibc ldconfig on this host")
def test_ldconfig_dirs_as_apptainers_pipeline() -> None:
    assert ldconfig_dirs() == apptainers_ldconfig_dirs() != ""


@pytest.mark.skipif(not os.access("/sbin/ldconfig", os.X_OK), reason="no glibc ldconfig on this host")
@pytest.mark.parametrize(
    ("injected", "image_env", "libs_entry", "expected"),
    [
        ((), {}, False, LIBS_DIR),
        ((), {}, True, "{dirs}:" + LIBS_DIR),
        ((("PREPEND_LD_LIBRARY_PATH", "/foo"), ("APPEND_LD_LIBRARY_PATH", "/bar")), {}, False,
         "/foo:{dirs}:" + LIBS_DIR + ":/bar"),
        ((("APPEND_LD_LIBRARY_PATH", "/bar"),), {"PREPEND_LD_LIBRARY_PATH": "/img"}, False,
         "/img:{dirs}:" + LIBS_DIR + ":/bar"),
        ((("LD_LIBRARY_PATH", "/x"), ("PREPEND_LD_LIBRARY_PATH", "/foo")), {}, True, "/foo:/x:" + LIBS_DIR),
        ((), {"LD_LIBRARY_PATH": "/img/lib"}, True, "/img/lib:" + LIBS_DIR),
    ],
    ids=["empty-libs", "libs-with-entries", "prepend-append", "prepend-from-image", "ld-path-set", "image-ld-path"],
)
def test_final_env_ld_library_path_rules(injected: tuple[tuple[str, str], ...], image_env: dict[str, str],
                                         libs_entry: bool, expected: str, tmp_path: Path) -> None:
    """Apptainer 1.5: ldconfig's directories before a bare /.singularity.d/libs that has entries (or with either
    rule), then PREPEND_LD_LIBRARY_PATH / APPEND_LD_LIBRARY_PATH at the ends; the variables stay set."""
    if libs_entry:
        (tmp_path / "libcuda.so.1").touch()
    env = final_env(EnvPlan(base=BASE, injected=injected), image_env, libs=str(tmp_path))
    assert env["LD_LIBRARY_PATH"] == expected.format(dirs=apptainers_ldconfig_dirs())
    assert {name: env[name] for name in ("PREPEND_LD_LIBRARY_PATH", "APPEND_LD_LIBRARY_PATH") if name in env} == {
        name: value for name, value in [*image_env.items(), *injected] if name.endswith("END_LD_LIBRARY_PATH")}


def test_final_env_missing_libs_dir_counts_as_not_empty(tmp_path: Path) -> None:
    """Apptainer's test is `[ "$(cd DIR 2>/dev/null && echo *)" = "*" ]`: a missing directory prints nothing."""
    env = final_env(EnvPlan(base=BASE, injected=()), libs=str(tmp_path / "missing"))
    assert env["LD_LIBRARY_PATH"] == (f"{ldconfig_dirs()}:{LIBS_DIR}" if ldconfig_dirs() else LIBS_DIR)


def test_final_env_runs_no_ldconfig_under_a_security_filter(tmp_path: Path) -> None:
    """With --security the filter is applied at the exec: the image's ldconfig would run before it, unconfined."""
    (tmp_path / "libcuda.so.1").touch()
    plan = EnvPlan(base=BASE, injected=(("PREPEND_LD_LIBRARY_PATH", "/p"),))
    env = final_env(plan, libs=str(tmp_path), run_ldconfig=False)
    assert env["LD_LIBRARY_PATH"] == f"/p:{LIBS_DIR}"


# --- parse_env_option ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], {}),
        (["A=1"], {"A": "1"}),
        (["A=1,B=2"], {"A": "1", "B": "2"}),
        (["A=1", "B=2"], {"A": "1", "B": "2"}),
        (["A=x,y"], {"A": "x,y"}),
        (["A=x,y,z,B=2"], {"A": "x,y,z", "B": "2"}),
        (["A="], {"A": ""}),
        (["A=a=b"], {"A": "a=b"}),
        (["A=1", "A=2"], {"A": "2"}),
        (["A=$X 'q' \\"], {"A": "$X 'q' \\"}),
        (["A=x,1=y"], {"A": "x,1=y"}),
    ],
    ids=["none", "one", "comma-list", "repeated", "comma-in-value", "commas-then-name", "empty-value",
         "equals-in-value", "last-wins", "verbatim", "comma-then-invalid-name"],
)
def test_parse_env_option(values: list[str], expected: dict[str, str]) -> None:
    assert parse_env_option(values) == expected


@pytest.mark.parametrize("values", [["junk"], ["=x"], [",A=1"], ["1A=x"]], ids=["no-equals", "empty-name",
                                                                              "leading-comma", "bad-name"])
def test_parse_env_option_errors(values: list[str]) -> None:
    with pytest.raises(UsageError, match="expected NAME=VALUE"):
        parse_env_option(values)


def test_parse_env_option_continuation_does_not_cross_values() -> None:
    with pytest.raises(UsageError):
        parse_env_option(["A=1", "junk"])

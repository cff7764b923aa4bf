"""singpy.env.environ where it follows Apptainer 1.5's action script: the env scripts split at 99-base.sh, an
LD_LIBRARY_PATH injected empty, the action script's own `__SINGPY_` names refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from singpy.constants import DEFAULT_PATH, LIBS_DIR
from singpy.env.environ import (
    EnvPlan,
    final_env,
    host_passthrough,
    injected_from_host,
    is_protected,
    shell_env,
    split_scripts,
)

ENV = "/.singularity.d/env"


@pytest.mark.parametrize(
    ("scripts", "early", "late"),
    [
        ((), (), ()),
        ((f"{ENV}/01-base.sh", f"{ENV}/90-environment.sh"), (f"{ENV}/01-base.sh", f"{ENV}/90-environment.sh"), ()),
        ((f"{ENV}/90-environment.sh", f"{ENV}/99-base.sh", f"{ENV}/99-runtimevars.sh", f"{ENV}/99-zz.sh"),
         (f"{ENV}/90-environment.sh", f"{ENV}/99-base.sh"), (f"{ENV}/99-runtimevars.sh", f"{ENV}/99-zz.sh")),
        ((f"{ENV}/99-zz.sh",), (), (f"{ENV}/99-zz.sh",)),  # no 99-base.sh: still split where it would be
        ((f"{ENV}/50-x.sh", "/opt/zz-linked.sh", f"{ENV}/99-zz.sh"),  # a link counts by its place in the list
         (f"{ENV}/50-x.sh", "/opt/zz-linked.sh"), (f"{ENV}/99-zz.sh",)),
    ],
    ids=["none", "all-early", "apptainer-image", "late-only", "link-elsewhere"],
)
def test_split_scripts(scripts: tuple[str, ...], early: tuple[str, ...], late: tuple[str, ...]) -> None:
    assert split_scripts(scripts) == (early, late)


def test_shell_env_hands_both_lists_and_the_empty_library_path() -> None:
    plan = EnvPlan(base=(("HOME", "/h"),), injected=(("LD_LIBRARY_PATH", ""),))
    env = shell_env(plan, (f"{ENV}/99-base.sh", f"{ENV}/99-zz.sh"))
    assert (env["__SINGPY_ENV_SCRIPTS"], env["__SINGPY_LATE_SCRIPTS"]) == (f"{ENV}/99-base.sh", f"{ENV}/99-zz.sh")
    assert env["__SINGPY_NOLIBS"] == "1"
    assert "__SINGPY_NOLIBS" not in shell_env(EnvPlan(base=(), injected=(("LD_LIBRARY_PATH", "/x"),)))


@pytest.mark.parametrize(
    ("injected", "expected"),
    [
        ((("LD_LIBRARY_PATH", ""),), ""),
        ((("LD_LIBRARY_PATH", ""), ("PREPEND_LD_LIBRARY_PATH", "/p"), ("APPEND_LD_LIBRARY_PATH", "/a")), ""),
        ((("LD_LIBRARY_PATH", "/x"),), f"/x:{LIBS_DIR}"),
        ((), LIBS_DIR),
    ],
    ids=["empty", "empty-no-prepend-append", "value", "unset"],
)
def test_final_env_empty_library_path(injected: tuple[tuple[str, str], ...], expected: str, tmp_path: Path) -> None:
    """Apptainer appends /.singularity.d/libs only to a value that is not empty, and adds PREPEND_/APPEND_
    only to one that is not empty."""
    env = final_env(EnvPlan(base=(("HOME", "/h"), ("PATH", DEFAULT_PATH)), injected=injected),
                    libs=f"{tmp_path}/none", run_ldconfig=False)
    assert env["LD_LIBRARY_PATH"] == expected


@pytest.mark.parametrize(("name", "protected"), [
    ("HOME", True), ("APPTAINER_SHELL", True), ("__SINGPY_PATH", True), ("__SINGPY_", True),
    ("__SINGPY_I_X", True), ("_SINGPY_PATH", False), ("SINGPY_X", False), ("X__SINGPY_", False), ("PATH", False),
])
def test_is_protected(name: str, protected: bool) -> None:
    assert is_protected(name) is protected


def test_injected_internal_names_are_refused_with_a_warning() -> None:
    found, warnings = injected_from_host({"APPTAINERENV___SINGPY_PATH": "/nowhere", "SINGPYENV___SINGPY_INJECT": "X",
                                          "APPTAINERENV_OK": "1"})
    assert found == {"OK": "1"}
    assert warnings == [
        "overriding __SINGPY_PATH environment variable with APPTAINERENV___SINGPY_PATH is not permitted",
        "overriding __SINGPY_INJECT environment variable with SINGPYENV___SINGPY_INJECT is not permitted"]


def test_host_internal_names_do_not_pass() -> None:
    host = {"__SINGPY_INJECT": "PATH", "__SINGPY_I_PATH": "/x", "_SINGPY": "ok", "KEPT": "k"}
    assert host_passthrough(host, cleanenv=False) == {"_SINGPY": "ok", "KEPT": "k"}

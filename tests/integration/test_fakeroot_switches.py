"""Apptainer's hidden switches of its fakeroot modes: --ignore-subuid, --ignore-userns, --ignore-fakeroot-command
(and build's --ignore-proot), which its own tests and some scripts pass to force one mode.

A user's --fakeroot maps a subordinate range from /etc/subuid when there is one, else the user alone (the
single mapping, a root-mapped namespace the user makes unaided). As Apptainer: --ignore-subuid takes the
single mapping whatever /etc/subuid says; --ignore-userns takes the single mapping away, which leaves a launch
only its range and a build nothing (singpy has no fakeroot-command mode to fall back on); root is not affected.
The ranges are simulated with private copies bound over /etc/subuid and /etc/subgid, which needs root.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.recipes import SUBUID_COUNT, SUBUID_START, base_sandbox, out_dir, subordinate_ranges, write_recipe
from tests.support.users import is_root

RANGE_MAP = [["0", "{uid}", "1"], ["1", str(SUBUID_START), str(SUBUID_COUNT)]]


@pytest.fixture
def with_range(as_user: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    """The test user has a subordinate range for the test's singpy runs."""
    if not is_root():
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)
    with subordinate_ranges(as_user, workdir, f"switch-{name}", present=True):
        yield


def uid_map(singpy: Singpy, *flags: str, image: Path, env: dict[str, str] | None = None) -> list[list[str]]:
    out = singpy.ok("exec", "--fakeroot", *flags, str(image), "cat", "/proc/self/uid_map", env=env)
    return [line.split() for line in out.splitlines()]


def expected_range(singpy: Singpy) -> list[list[str]]:
    return [[field.format(uid=singpy.uid) for field in line] for line in RANGE_MAP]


# --- run, exec, instance ------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["flag", "APPTAINER_IGNORE_SUBUID", "SINGULARITY_IGNORE_SUBUID"])
def test_ignore_subuid_takes_the_single_mapping(as_user: Singpy, image: Path, with_range: None, how: str) -> None:
    assert uid_map(as_user, image=image) == expected_range(as_user)  # the range, without the switch
    flags, env = (["--ignore-subuid"], None) if how == "flag" else ([], as_user.env(**{how: "1"}))
    assert uid_map(as_user, *flags, image=image, env=env) == [["0", str(as_user.uid), "1"]]


def test_the_note_says_why_the_mapping_is_single(as_user: Singpy, image: Path, with_range: None) -> None:
    result = as_user.run("-v", "exec", "--fakeroot", "--ignore-subuid", str(image), "id", "-u")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0\n"
    assert "fakeroot: --ignore-subuid: single mapping" in result.stderr


def test_ignore_userns_leaves_a_range_alone(as_user: Singpy, image: Path, with_range: None) -> None:
    """Apptainer's launcher looks at --ignore-userns only for a user without a range."""
    assert uid_map(as_user, "--ignore-userns", image=image) == expected_range(as_user)


def test_ignore_userns_without_a_range_is_refused(as_user: Singpy, image: Path, with_range: None) -> None:
    result = as_user.run("exec", "--fakeroot", "--ignore-subuid", "--ignore-userns", str(image), "true")
    assert_one_fatal(result, "--fakeroot requires either being in /etc/subuid, unprivileged user namespaces or the "
                             "fakeroot command")


def test_ignore_fakeroot_command_changes_nothing(as_user: Singpy, image: Path, with_range: None) -> None:
    """singpy never runs the fakeroot command: the launch is the one without the switch."""
    assert uid_map(as_user, "--ignore-fakeroot-command", image=image) == expected_range(as_user)


def test_the_switches_do_nothing_without_fakeroot(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", "--ignore-subuid", "--ignore-userns", "--ignore-fakeroot-command", str(image), "id", "-u")
    assert out == f"{singpy.uid}\n"


def test_root_is_not_affected(as_root: Singpy, image: Path) -> None:
    """As Apptainer's, which looks at them for users only: root's --fakeroot is root of a new namespace."""
    out = as_root.ok("exec", "--fakeroot", "--ignore-subuid", "--ignore-userns", str(image), "cat",
                     "/proc/self/uid_map")
    assert out.split()[:2] == ["0", "0"]


def test_the_switches_are_hidden(as_user: Singpy) -> None:
    out = as_user.ok("exec", "--help")
    assert "--fakeroot" in out
    assert not {"--ignore-subuid", "--ignore-userns", "--ignore-fakeroot-command"} & set(out.split())


def test_instance_start_takes_them(as_user: Singpy, image: Path, with_range: None) -> None:
    name = "switches"
    as_user.ok("instance", "start", "--fakeroot", "--ignore-subuid", str(image), name)
    try:
        out = as_user.ok("exec", f"instance://{name}", "cat", "/proc/self/uid_map")
    finally:
        as_user.run("instance", "stop", name)
    assert out.split() == ["0", str(as_user.uid), "1"]


# --- build ----------------------------------------------------------------------------------------------------


CHOWN_POST = """
    Bootstrap: localimage
    From: {base}

    %post
        touch /owned
        chown 4242:4343 /owned
    """


def test_build_with_ignore_subuid_runs_post_with_the_single_mapping(as_user: Singpy, workdir: Path,
                                                                    with_range: None) -> None:
    out = out_dir(as_user, workdir, "ignore-subuid")
    recipe = write_recipe(out, CHOWN_POST.format(base=base_sandbox(workdir)))
    result = as_user.run("build", "--ignore-subuid", "--sandbox", str(out / "tree"), str(recipe), timeout=120)
    assert result.returncode == 255, result.stderr
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and "single id mapping (--ignore-subuid)" in fatal[0] and "drop --ignore-subuid" in fatal[0]
    assert sorted(path.name for path in out.iterdir()) == ["recipe.def"]
    plain = as_user.run("build", "--sandbox", str(out / "tree"), str(recipe), timeout=120)  # the range: chown works
    assert plain.returncode == 0, plain.stderr
    assert (out / "tree" / "owned").stat().st_uid == SUBUID_START + 4242 - 1


@pytest.mark.parametrize(("flags", "message"), [
    (["--ignore-userns"], "/etc/subuid mapping found but no user namespace available for fakeroot"),
    (["--ignore-userns", "--ignore-subuid"], "building from a definition file unprivileged requires either being "
                                             "in /etc/subuid, unprivileged user namespaces or the fakeroot command"),
])
def test_build_with_ignore_userns_is_refused(as_user: Singpy, workdir: Path, with_range: None, flags: list[str],
                                             message: str) -> None:
    out = out_dir(as_user, workdir, f"ignore-userns-{len(flags)}")
    recipe = write_recipe(out, CHOWN_POST.format(base=base_sandbox(workdir)))
    result = as_user.run("build", *flags, str(out / "image.sif"), str(recipe), timeout=120)
    assert_one_fatal(result, message)
    assert sorted(path.name for path in out.iterdir()) == ["recipe.def"]


def test_build_takes_what_it_never_runs(singpy: Singpy, workdir: Path) -> None:
    """--ignore-fakeroot-command and --ignore-proot: singpy runs neither the fakeroot command nor proot."""
    out = out_dir(singpy, workdir, "ignore-never-run")
    recipe = write_recipe(out, CHOWN_POST.format(base=base_sandbox(workdir)).replace("chown 4242:4343", "chmod 600"))
    result = singpy.run("-v", "build", "--ignore-fakeroot-command", "--ignore-proot", "--sandbox", str(out / "tree"),
                        str(recipe), timeout=120)
    assert result.returncode == 0, result.stderr
    assert (out / "tree" / "owned").exists()
    assert "singpy runs neither the fakeroot command nor proot" in result.stderr

"""`singpy test` (the image's %test), `singpy run-help` (its %help) and `inspect --list-apps`, as Apptainer 1.5."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.app_images import fixture_built_sif as fixture_built_sif  # noqa: F401
from tests.support.app_images import fixture_tested as fixture_tested  # noqa: F401
from tests.support.app_images import fixture_tested_images as fixture_tested_images  # noqa: F401
from tests.support.app_images import write_file
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces


def _own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    import os

    path = workdir / f"{name}-{singpy.profile}"
    path.mkdir(exist_ok=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def test_test_runs_the_test_script_and_exits_with_its_status(singpy: Singpy, tested: Path) -> None:
    result = singpy.run("test", str(tested), "one", "two")
    assert result.returncode == 3, result.stderr
    assert result.stdout == "testing one two\n"


def test_test_takes_the_action_flags(singpy: Singpy, tested: Path, workdir: Path) -> None:
    source = _own_dir(singpy, workdir, "test-bind")
    (source / "mark").write_text("bound\n")
    result = singpy.run("test", "--contain", "-B", f"{source}:/mnt", str(tested))
    assert result.returncode == 3, result.stderr
    assert result.stdout == "testing \nbound\n"


@pytest.mark.parametrize("isolation", [[], ["--containall"]])
def test_test_without_a_test_script_succeeds_saying_so(singpy: Singpy, image: Path, isolation: list[str]) -> None:
    result = singpy.run("test", *isolation, str(image))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "No test script found in container, exiting" in result.stderr
    assert singpy.run("-q", "test", *isolation, str(image)).stderr == ""  # an INFO line: -q hides it


def test_test_of_an_app(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("test", "--app", "foo", str(tested)) == "foo tested\n"
    assert_one_fatal(singpy.run("test", "--app", "bar", str(tested)), "No tests for contained app: bar")


def test_test_needs_an_image(singpy: Singpy) -> None:
    assert_one_fatal(singpy.run("test"), "singpy test needs an IMAGE", code=1)


def test_run_help_shows_the_help_escaped(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("run-help", str(tested)) == "Usage: run me\n\twith a tab\\x1b[31m\n\n"


def test_run_help_of_an_app(singpy: Singpy, tested: Path) -> None:
    assert singpy.ok("run-help", "--app", "foo", str(tested)) == "Help of foo.\n\n"
    assert singpy.ok("run-help", "--app", "bar", str(tested)) == "No help sections were defined for this image\n"


def test_run_help_without_help(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("run-help", str(image)) == "No help sections were defined for this image\n"


@pytest.mark.parametrize("app", ["../foo", "foo/../../etc"])
def test_run_help_refuses_an_app_name_that_is_a_path(singpy: Singpy, tested: Path, app: str) -> None:
    assert_one_fatal(singpy.run("run-help", "--app", app, str(tested)), "invalid app name", code=1)


def test_inspect_list_apps(singpy: Singpy, tested: Path, image: Path) -> None:
    before = traces(tested)
    assert singpy.ok("inspect", "--list-apps", str(tested)) == "bar\nfoo\n"
    assert singpy.ok("inspect", "--list-apps", str(image)) == ""
    assert settled(before, tested) == before  # the unpacked apps of a SIF are gone from TMPDIR


def test_test_run_help_and_list_apps_leave_nothing(singpy: Singpy, tested: Path) -> None:
    before = traces(tested)
    singpy.run("test", str(tested))
    singpy.ok("run-help", "--app", "foo", str(tested))
    singpy.run("run-help", "--app", "../x", str(tested))
    assert settled(before, tested) == before


def test_a_test_script_leading_out_of_the_image_is_refused(singpy: Singpy, workdir: Path) -> None:
    """A link to a host file (which exists outside, not inside) never runs the host's file."""
    host_script = workdir / "host-test-script"
    write_file(host_script, "#!/bin/sh\necho host script ran\n", 0o755)
    root = workdir / f"linked-test-{singpy.profile}"
    if not root.exists():
        build_busybox_rootfs(root)
        (root / ".singularity.d" / "test").symlink_to(host_script)
        readable_by_all(root)
    result = singpy.run("test", str(root))
    assert_one_fatal(result, "can't run the image's /.singularity.d/test: it is a link to")
    assert "host script ran" not in result.stdout


def test_a_built_image_sections(singpy: Singpy, built_sif: Path) -> None:
    result = singpy.run("test", str(built_sif), "a", "b")
    assert (result.returncode, result.stdout) == (7, "recipe test a b\n"), result.stderr
    assert singpy.ok("test", "--app", "tool", str(built_sif)) == "tool tested\n"
    assert_one_fatal(singpy.run("test", "--app", "other", str(built_sif)), "No tests for contained app: other")
    assert singpy.ok("inspect", "--list-apps", str(built_sif)) == "other\ntool\n"
    assert "Built with a help section." in singpy.ok("run-help", str(built_sif))
    assert "Help of the tool app." in singpy.ok("run-help", "--app", "tool", str(built_sif))


def test_an_app_without_the_script_falls_back_to_the_test_of_an_app_named_singularity(
        singpy: Singpy, workdir: Path) -> None:
    """Apptainer's action script: `run --app` and `test --app` of an app without that script run
    /scif/apps/singularity/scif/test if it is executable (else the error of the tests above)."""
    root = workdir / "scif-fallback"
    if not root.exists():
        build_busybox_rootfs(root / "tree")
        write_file(root / "tree" / "scif" / "apps" / "singularity" / "scif" / "test", '#!/bin/sh\necho "fallback $*"\n',
                   0o755)
        (root / "tree" / "scif" / "apps" / "plain" / "scif").mkdir(parents=True)
        readable_by_all(root)
    for action in ("run", "test"):
        result = singpy.run(action, "--app", "plain", str(root / "tree"), "x")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "fallback x\n"

"""`singpy build OUT RECIPE.def` when something goes wrong, and where its work directory lives (issue 12).

A bad definition file is one FATAL line naming the file and line; a failing %post or %test shows its output
and its exit status; an interrupted build (SIGTERM, SIGINT, SIGHUP) ends promptly. Whatever happens, nothing
is left: no output image, no `.singpy-build-*` work directory (next to OUT, or in $SINGPY_TMPDIR /
$APPTAINER_TMPDIR / $SINGULARITY_TMPDIR), no process. Run as root and as the unprivileged test user.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import descendants, settled, traces, wait_for_descendants, wait_until_gone
from tests.support.recipes import (
    base_sandbox,
    base_sif,
    build_dirs,
    out_dir,
    read_until,
    subordinate_ranges,
    write_recipe,
)
from tests.support.users import is_root

PROMPT = 10.0  # seconds a build may take to end after a signal


@pytest.fixture(scope="module")
def base(workdir: Path) -> Path:
    return base_sandbox(workdir)


@pytest.fixture(params=["sandbox", "sif"])
def post_base(request: pytest.FixtureRequest, workdir: Path) -> Path:
    """The base of a failing or interrupted %post: a sandbox (copied), or a SIF, which a build puts under an
    overlay in its own mount namespace (singpy.recipe.layered)."""
    return base_sandbox(workdir) if request.param == "sandbox" else base_sif(workdir)


def owned_dir(singpy: Singpy, path: Path) -> Path:
    path.mkdir()
    os.chown(path, singpy.uid, singpy.gid)
    return path


def fatal_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]


def assert_nothing_built(out: Path, *work_dirs: Path) -> None:
    assert not (out / "image.sif").exists() and not (out / "sandbox").exists(), sorted(os.listdir(out))
    for directory in (out, *work_dirs):
        assert build_dirs(directory) == [], directory


# --- bad definition files: one FATAL line naming file:line, nothing built ---------------------------------------------


BAD = {
    # case: (recipe, the line the FATAL line names as recipe.def:LINE (None: not checked), what else it holds)
    "unknown section": ("Bootstrap: localimage\nFrom: {base}\n\n%post\n    true\n%postt\n    true\n", 6, "postt"),
    "header without value": ("Bootstrap: localimage\nFrom\n", 2, "From"),
    "unknown bootstrap": ("Bootstrap: nosuch\nFrom: {base}\n", 1, "nosuch"),
    "missing From": ("Bootstrap: localimage\n\n%post\n    true\n", 1, "From"),
    "undefined build arg": ("Bootstrap: localimage\nFrom: {{{{ NOPE }}}}\n", 2, "NOPE"),
    "missing base image": ("Bootstrap: localimage\nFrom: /nonexistent/base-image\n", None, "/nonexistent/base-image"),
    "missing files source": ("Bootstrap: localimage\nFrom: {base}\n\n%files\n    /nonexistent/source.txt /x\n",
                             None, "/nonexistent/source.txt"),
    "pattern matching nothing": ("Bootstrap: localimage\nFrom: {base}\n\n%files\n    /nonexistent/*.csv /opt/\n",
                                 None, "/nonexistent/*.csv"),
    "reversed bracket range": ("Bootstrap: localimage\nFrom: {base}\n\n%files\n    /etc/host[z-a]ame /x\n", None,
                               "/etc/host[z-a]ame"),  # bash: a bracket matching nothing
    "files from unknown stage": ("Bootstrap: localimage\nFrom: {base}\n\n%files from nowhere\n    /x /y\n", 4,
                                 "nowhere"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_recipe_is_one_fatal_line(singpy: Singpy, workdir: Path, base: Path, case: str) -> None:
    text, line, message = BAD[case]
    out = out_dir(singpy, workdir, f"bad-{case}")
    recipe = out / "recipe.def"
    recipe.write_text(text.format(base=base))
    before = traces(out)
    result = singpy.run("-q", "build", str(out / "image.sif"), str(recipe))
    assert_one_fatal(result, message)
    if line is not None:
        assert f"recipe.def:{line}" in fatal_lines(result)[0], result.stderr
    assert_nothing_built(out)
    assert settled(before, out) == before


def test_existing_output_needs_force(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "force")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {base}

        %post
            echo new > /made-by-recipe
        """)
    sif = out / "image.sif"
    sif.write_text("old\n")
    os.chown(sif, singpy.uid, singpy.gid)
    result = singpy.run("-q", "build", str(sif), str(recipe))
    assert_one_fatal(result, str(sif))
    assert "--force" in result.stderr
    assert sif.read_text() == "old\n"
    singpy.ok("build", "--force", str(sif), str(recipe), timeout=120)
    assert singpy.ok("exec", str(sif), "cat", "/made-by-recipe") == "new\n"

    sandbox = owned_dir(singpy, out / "sandbox")
    (sandbox / "old-file").write_text("old\n")
    result = singpy.run("-q", "build", "--sandbox", str(sandbox), str(recipe))
    assert_one_fatal(result, str(sandbox))
    assert os.listdir(sandbox) == ["old-file"]
    singpy.ok("build", "--force", "--sandbox", str(sandbox), str(recipe), timeout=120)
    assert (sandbox / "made-by-recipe").read_text() == "new\n" and not (sandbox / "old-file").exists()
    assert build_dirs(out) == []


# --- failing %post and %test ----------------------------------------------------------------------------------------


FAILING_POST = """
    Bootstrap: localimage
    From: {base}

    %post
        echo before-failure
        sh -c 'exit 7'
        echo after-failure
    """


@pytest.mark.parametrize("tmpdir_set", [False, True], ids=["next-to-out", "singpy-tmpdir"])
def test_failing_post_shows_output_and_status_and_leaves_nothing(singpy: Singpy, workdir: Path, post_base: Path,
                                                                 tmpdir_set: bool) -> None:
    out = out_dir(singpy, workdir, f"failing-post-{tmpdir_set}-{post_base.name}")
    work = owned_dir(singpy, out / "work")
    recipe = write_recipe(out, FAILING_POST.format(base=post_base))
    env = singpy.env(SINGPY_TMPDIR=str(work)) if tmpdir_set else singpy.env()
    before = traces(out)
    result = singpy.run("build", str(out / "image.sif"), str(recipe), env=env, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 255, output
    assert "before-failure" in output and "\nafter-failure" not in output
    fatal = fatal_lines(result)
    assert len(fatal) == 1 and re.search(r"\b7\b", fatal[0]), result.stderr  # the exit status of %post
    assert "Traceback" not in output
    assert_nothing_built(out, work)
    assert settled(before, out) == before


def test_failed_forced_build_keeps_the_old_output(singpy: Singpy, workdir: Path, base: Path) -> None:
    """OUT is replaced only by a complete image: with --force, a failed build leaves the old one as it was."""
    out = out_dir(singpy, workdir, "failing-force")
    recipe = write_recipe(out, FAILING_POST.format(base=base))
    old = out / "old.sif"
    old.write_text("the old image\n")
    os.chown(old, singpy.uid, singpy.gid)
    result = singpy.run("-q", "build", "--force", str(old), str(recipe), timeout=120)
    assert result.returncode == 255, result.stderr
    assert "INFO:" not in result.stderr and "before-failure" in result.stdout + result.stderr  # -q: the script shows
    assert old.read_text() == "the old image\n"
    assert sorted(os.listdir(out)) == ["old.sif", "recipe.def"]


def test_failing_test_section_fails_the_build_unless_notest(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "failing-test")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {base}

        %test
            echo failing-test-ran
            exit 3
        """)
    result = singpy.run("build", str(out / "image.sif"), str(recipe), timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 255, output
    assert "failing-test-ran" in output
    fatal = fatal_lines(result)
    assert len(fatal) == 1 and re.search(r"\b3\b", fatal[0]), result.stderr
    assert_nothing_built(out)
    result = singpy.run("build", "--notest", str(out / "image.sif"), str(recipe), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "failing-test-ran" not in result.stdout + result.stderr
    assert build_dirs(out) == []


def test_user_build_without_a_range_says_why_chown_fails(as_user: Singpy, workdir: Path, base: Path) -> None:
    """With a single mapping (no /etc/subuid range) only root and the user exist inside: chown to 4242 fails."""
    if not is_root():
        pytest.skip("a host without subordinate ranges is simulated with files bound over /etc/subuid: needs root")
    out = out_dir(as_user, workdir, "owned-single")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {base}

        %post
            touch /owned
            chown 4242:4343 /owned
        """)
    with subordinate_ranges(as_user, workdir, "owned-single", present=False):
        result = as_user.run("build", "--sandbox", str(out / "sandbox"), str(recipe), timeout=120)
    assert result.returncode == 255, result.stderr
    assert len(fatal_lines(result)) == 1, result.stderr
    assert re.search(r"single mapping|subordinate", result.stderr, re.IGNORECASE), result.stderr
    assert_nothing_built(out)


# --- the work directory ----------------------------------------------------------------------------------------------


WAITING_POST = """
    Bootstrap: localimage
    From: {base}

    %post
        echo post-is-waiting
        i=0
        while [ ! -e /mnt/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
        echo post-is-done
    """

VARIABLES = ("SINGPY_TMPDIR", "APPTAINER_TMPDIR", "SINGULARITY_TMPDIR")


@pytest.mark.parametrize("chosen", ["none", *VARIABLES, "all"])
def test_work_directory_is_where_the_variables_say(singpy: Singpy, workdir: Path, base: Path, chosen: str) -> None:
    """Without a variable: next to OUT (never TMPDIR or /tmp). SINGPY_TMPDIR first, then Apptainer's two."""
    out = out_dir(singpy, workdir, f"workdir-{chosen}")
    control = owned_dir(singpy, out / "control")
    dirs = {name: owned_dir(singpy, out / name.lower()) for name in VARIABLES}
    set_now = {name: str(dirs[name]) for name in (VARIABLES if chosen == "all" else (chosen,)) if name in dirs}
    expected = dirs["SINGPY_TMPDIR"] if chosen == "all" else dirs.get(chosen, out)
    recipe = write_recipe(out, WAITING_POST.format(base=base))
    process = singpy.popen(["build", "--bind", f"{control}:/mnt", str(out / "image.sif"), str(recipe)],
                           env=singpy.env(**set_now), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(process, "\npost-is-waiting")
        made = build_dirs(expected)
        elsewhere = {str(place): build_dirs(place) for place in (out, singpy.tmpdir, *dirs.values())
                     if place != expected}
    finally:
        (control / "go").touch()
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 0, seen + rest
    assert len(made) == 1, (expected, made)
    assert all(found == [] for found in elsewhere.values()), elsewhere
    assert (out / "image.sif").exists()
    for place in (out, singpy.tmpdir, *dirs.values()):
        assert build_dirs(place) == [], place


def test_work_directory_is_private(singpy: Singpy, workdir: Path, base: Path) -> None:
    """Other users can't look into a build (a shared $SINGPY_TMPDIR): mode 0700, as Apptainer's build-temp-*."""
    out = out_dir(singpy, workdir, "workdir-private")
    control = owned_dir(singpy, out / "control")
    recipe = write_recipe(out, WAITING_POST.format(base=base))
    process = singpy.popen(["build", "--bind", f"{control}:/mnt", str(out / "image.sif"), str(recipe)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = read_until(process, "\npost-is-waiting")
        modes = {name: stat.S_IMODE((out / name).lstat().st_mode) for name in build_dirs(out)}
    finally:
        (control / "go").touch()
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == 0, seen + rest
    assert len(modes) == 1 and all(mode & 0o077 == 0 for mode in modes.values()), \
        {name: oct(mode) for name, mode in modes.items()}


def test_unusable_work_places_are_one_fatal_line(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "work-places")
    recipe = write_recipe(out, f"Bootstrap: localimage\nFrom: {base}\n")
    missing = out / "no-such-dir"
    result = singpy.run("-q", "build", str(out / "image.sif"), str(recipe), env=singpy.env(SINGPY_TMPDIR=str(missing)))
    assert_one_fatal(result, "SINGPY_TMPDIR")
    assert not missing.exists()
    assert_nothing_built(out)
    if singpy.uid != 0 and os.geteuid() == 0:  # a directory the user may not write to (root's)
        closed = out / "closed"
        closed.mkdir(mode=0o755)
        os.chown(closed, 0, 0)
        result = singpy.run("-q", "build", str(closed / "image.sif"), str(recipe))
        assert_one_fatal(result, str(closed))
        assert os.listdir(closed) == []


# --- signals ---------------------------------------------------------------------------------------------------------


SLEEPY_POST = """
    Bootstrap: localimage
    From: {base}

    %post
        echo post-is-sleeping
        sleep 30
        echo post-woke-up
    """


# signal, and whether it goes to singpy alone (`kill`) or to its whole process group (Ctrl-C on a terminal)
SIGNALS = {"SIGTERM": (signal.SIGTERM, False), "SIGINT": (signal.SIGINT, False), "SIGHUP": (signal.SIGHUP, False),
           "ctrl-c": (signal.SIGINT, True)}


@pytest.mark.parametrize("case", list(SIGNALS))
def test_signal_during_post_ends_the_build_and_leaves_nothing(singpy: Singpy, workdir: Path, post_base: Path,
                                                              case: str) -> None:
    signum, to_group = SIGNALS[case]
    out = out_dir(singpy, workdir, f"signal-{case}-{post_base.name}")
    work = owned_dir(singpy, out / "work")
    recipe = write_recipe(out, SLEEPY_POST.format(base=post_base))
    before = traces(out)
    process = singpy.popen(["build", str(out / "image.sif"), str(recipe)], env=singpy.env(SINGPY_TMPDIR=str(work)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=to_group)
    seen = read_until(process, "\npost-is-sleeping")
    assert len(build_dirs(work)) == 1
    assert wait_for_descendants(process.pid, "sleep 30"), descendants(process.pid)  # %post is in its sleep
    started = descendants(process.pid)
    if to_group:
        os.killpg(process.pid, signum)  # its own session: the group holds singpy and what it started, not us
    else:
        process.send_signal(signum)
    try:
        rest, _ = process.communicate(timeout=PROMPT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"singpy build still running {PROMPT} s after {case}; output:\n{seen}")
    output = seen + rest
    assert process.returncode == 255, output
    assert "post-woke-up" not in output and "Traceback" not in output, output
    fatal = [line for line in output.splitlines() if line.startswith("FATAL:")]
    assert len(fatal) == 1 and f"interrupted by {signum.name}" in fatal[0], output
    left = {pid: command for pid, command in started.items() if wait_until_gone([pid], command, timeout=5)}
    assert left == {}, left  # %post's shell and its sleep included
    assert_nothing_built(out, work)
    assert settled(before, out) == before


def test_a_killed_build_takes_post_with_it(singpy: Singpy, workdir: Path, post_base: Path) -> None:
    """SIGKILL (the OOM killer, a job's end) leaves the build no time to clean up: %post, its container and the
    build's mounts (a SIF base's loop device) must still end with it."""
    out = out_dir(singpy, workdir, f"sigkill-{post_base.name}")
    recipe = write_recipe(out, SLEEPY_POST.format(base=post_base))
    process = singpy.popen(["build", "--sandbox", str(out / "sandbox"), str(recipe)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = read_until(process, "\npost-is-sleeping")
    assert wait_for_descendants(process.pid, "sleep 30"), seen
    started = descendants(process.pid)
    process.kill()
    process.communicate(timeout=PROMPT)
    left = {pid: command for pid, command in started.items() if wait_until_gone([pid], command, timeout=5)}
    assert left == {}, left


@pytest.fixture(scope="module")
def big_base(workdir: Path) -> Path:
    """A sandbox with 96 MiB that does not compress: squashing it takes seconds, time to be interrupted."""
    root = workdir / "recipe-big-base"
    if not (root / "opt" / "big").exists():
        build_busybox_rootfs(root)
        with open(root / "opt" / "big", "wb") as handle:
            for _ in range(96):
                handle.write(os.urandom(1 << 20))
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
    return root


def test_signal_while_squashing_leaves_nothing(singpy: Singpy, workdir: Path, big_base: Path) -> None:
    out = out_dir(singpy, workdir, "signal-squash")
    recipe = write_recipe(out, f"Bootstrap: localimage\nFrom: {big_base}\n")
    before = traces(out)
    process = singpy.popen(["build", str(out / "image.sif"), str(recipe)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    seen = read_until(process, "Creating SIF file", timeout=60)
    deadline = time.monotonic() + 10
    while not [line for line in descendants(process.pid).values() if "mksquashfs" in line]:
        assert time.monotonic() < deadline, f"no mksquashfs under singpy; output:\n{seen}"
        time.sleep(0.02)
    started = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        rest, _ = process.communicate(timeout=PROMPT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"singpy build still running {PROMPT} s after SIGTERM while squashing; output:\n{seen}")
    assert process.returncode == 255, seen + rest
    assert "interrupted by SIGTERM" in rest, seen + rest
    assert {pid: command for pid, command in started.items() if wait_until_gone([pid], command, timeout=5)} == {}
    assert_nothing_built(out)
    assert settled(before, out) == before


def test_a_daemon_started_by_post_ends_with_the_build(singpy: Singpy, workdir: Path, base: Path) -> None:
    """%post runs in a PID namespace of its own (docs/build.md): what it leaves running ends with it."""
    out = out_dir(singpy, workdir, "daemon")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {base}

        %post
            sh -c 'sleep 300; :' daemon-of-{out} >/dev/null 2>&1 &
            echo post-left-a-daemon
        """)
    before = traces(out)
    result = singpy.run("build", str(out / "image.sif"), str(recipe), timeout=60)
    assert result.returncode == 0, result.stderr
    assert settled(before, out) == before  # no process naming our directory: the daemon is gone
    assert (out / "image.sif").exists() and build_dirs(out) == []


def test_a_missing_source_is_named_as_what_it_may_be(singpy: Singpy, workdir: Path) -> None:
    """`build out.sif nosuch.def`: not "image nosuch.def does not exist" (it names a definition file as well)."""
    result = singpy.run("build", str(workdir / f"never-{singpy.profile}.sif"), "nosuch.def", cwd=workdir)
    assert_one_fatal(result, "nosuch.def does not exist (the definition file or image to build from)")
    assert not (workdir / f"never-{singpy.profile}.sif").exists()


def test_pre_warning_names_the_pre_line(singpy: Singpy, workdir: Path) -> None:
    recipe = workdir / f"with-pre-{singpy.profile}.def"
    recipe.write_text("Bootstrap: scratch\n\n%files\n/etc/hostname /hostname\n\n%pre\n  echo before\n")
    result = singpy.run("build", "--sandbox", str(workdir / f"with-pre-{singpy.profile}"), str(recipe), timeout=120)
    assert f"{recipe}:6: %pre is not supported" in result.stderr  # the %pre line, not the stage's first

"""`singpy build OUT RECIPE.def`: the scripts of a build (issue 12): SCIF apps, %setup on the host, other
shells, build arguments, a base mounted under an overlay while %post runs, a C program compiled in %post.

As test_build_recipe.py: real bases and the real `singpy` command, as root and as the test user; what is
checked is what a user sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.leftovers import settled, traces
from tests.support.recipes import (
    BUILD_TIMEOUT,
    base_sandbox,
    build,
    build_dirs,
    oci_base,
    out_dir,
    sif_owners,
    subordinate_ranges,
    write_recipe,
)
from tests.support.users import is_root


@pytest.fixture(scope="module")
def base(workdir: Path) -> Path:
    return base_sandbox(workdir)


# --- SCIF apps -------------------------------------------------------------------------------------------------------


APPS = """
    Bootstrap: localimage
    From: {base}

    %appinstall solver
        mkdir -p bin
        printf '#!/bin/sh\\necho "solver got $*"\\n' > bin/solver
        chmod 755 bin/solver
        pwd > /appinstall-cwd

    %apprun solver
        exec solver "$@"

    %appenv solver
        export SOLVER_THREADS=4

    %applabels solver
        Version 2.1

    %apphelp solver
        The solver, for the recipe tests.

    %appfiles solver
        {src}/solver.conf solver.conf

    %appinstall other
        true
    """


def test_scif_apps(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "apps")
    (out / "solver.conf").write_text("threads=4\n")
    recipe = write_recipe(out, APPS.format(base=base, src=out))
    sif = out / "image.sif"
    build(singpy, str(sif), str(recipe))
    assert singpy.ok("run", "--app", "solver", str(sif), "a", "b c") == "solver got a b c\n"
    shown = singpy.ok("exec", "--app", "solver", str(sif), "sh", "-c",
                      "echo $SOLVER_THREADS; command -v solver; cat /scif/apps/solver/solver.conf /appinstall-cwd; "
                      "ls /scif/data/solver")
    assert shown == "4\n/scif/apps/solver/bin/solver\nthreads=4\n/scif/apps/solver\ninput\noutput\n", shown
    helpfile = singpy.ok("exec", str(sif), "cat", "/scif/apps/solver/scif/runscript.help")
    assert helpfile.strip() == "The solver, for the recipe tests.", helpfile
    env = singpy.ok("exec", str(sif), "env").splitlines()
    assert "SCIF_APPROOT_solver=/scif/apps/solver" in env and "SCIF_APPROOT_other=/scif/apps/other" in env, env
    labels = json.loads(singpy.ok("exec", str(sif), "cat", "/scif/apps/solver/scif/labels.json"))
    assert labels.get("Version") == "2.1" and labels.get("SCIF_APP_NAME") == "solver", labels


# --- %setup ----------------------------------------------------------------------------------------------------------


SETUP = """
    Bootstrap: localimage
    From: {base}

    %setup
        touch "$APPTAINER_ROOTFS/setup-made"
        [ "$SINGULARITY_ROOTFS" = "$APPTAINER_ROOTFS" ] && id -u > "$SINGULARITY_ROOTFS/setup-uid"
        if touch {host}/root-only/written-by-setup; then echo written; else echo refused; fi > "$APPTAINER_ROOTFS/host"

    %post
        test -e /setup-made && echo yes > /post-saw-setup
    """


def test_setup_runs_on_the_host_with_the_rootfs_variables(singpy: Singpy, workdir: Path, base: Path) -> None:
    """On the host, as root: real root, or for a user root of the build's user namespace (docs/build.md)."""
    out = out_dir(singpy, workdir, "setup")
    (out / "root-only").mkdir(mode=0o755)  # root's, on the host: the test user's %setup may not write there
    recipe = write_recipe(out, SETUP.format(base=base, host=out))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "setup-uid").read_text() == "0\n"
    writable = singpy.uid in (0, (out / "root-only").stat().st_uid)  # root's unless the suite runs as a user
    assert (out / "sandbox" / "host").read_text() == ("written\n" if writable else "refused\n")
    assert (out / "sandbox" / "post-saw-setup").read_text() == "yes\n"  # %setup ran before %post
    build(singpy, str(out / "image.sif"), str(recipe))
    assert singpy.ok("exec", str(out / "image.sif"), "cat", "/setup-uid") == "0\n"


POST_SHELL = """
    Bootstrap: localimage
    From: {base}

    %files
        {src}/myshell /opt/myshell

    %post -c /opt/myshell
        echo "script ran" > /script-ran
    """

MY_SHELL = '#!/bin/sh\necho "myshell ran $*" > /myshell-ran\nexec /bin/sh "$@"\n'


def test_post_with_another_shell(singpy: Singpy, workdir: Path, base: Path) -> None:
    """`%post -c SHELL` runs the script with SHELL (`/bin/sh -ex -c "SHELL /.post.script"`, as Apptainer)."""
    out = out_dir(singpy, workdir, "post-shell")
    (out / "myshell").write_text(MY_SHELL)
    (out / "myshell").chmod(0o755)
    recipe = write_recipe(out, POST_SHELL.format(base=base, src=out))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "myshell-ran").read_text().startswith("myshell ran /")  # given the script's path
    assert (out / "sandbox" / "script-ran").read_text() == "script ran\n"


SETUP_TWICE = """
    Bootstrap: localimage
    From: {base}

    %setup
        greeting="set by the first %setup"

    %post
        true

    %setup
        echo "$greeting" > "$APPTAINER_ROOTFS/greeting"
    """


def test_repeated_setup_sections_are_one_script(singpy: Singpy, workdir: Path, base: Path) -> None:
    """As Apptainer's parser joins them: a variable of the first %setup is still set in the second."""
    out = out_dir(singpy, workdir, "setup-twice")
    recipe = write_recipe(out, SETUP_TWICE.format(base=base))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "greeting").read_text() == "set by the first %setup\n"


SECTION_ARGS = """
    Bootstrap: localimage
    From: {base}

    %files
        {src}/myshell /opt/myshell

    %setup
        names=(first second)

    %post
        echo "first post" > /post-one

    %setup -c /bin/bash
        echo "${{names[1]}}" > "$APPTAINER_ROOTFS/from-setup"

    %post -c /opt/myshell
        echo "second post" > /post-two
    """


def test_the_last_section_line_with_args_gives_the_shell(singpy: Singpy, workdir: Path, base: Path) -> None:
    """Repeated %setup and %post: the joined script runs with the args of the last line that has some (as
    Apptainer): the bash array of the first %setup works, %post's shell is the second's."""
    if not os.access("/bin/bash", os.X_OK):
        pytest.skip("no /bin/bash on this host")
    out = out_dir(singpy, workdir, "section-args")
    (out / "myshell").write_text(MY_SHELL)
    (out / "myshell").chmod(0o755)
    recipe = write_recipe(out, SECTION_ARGS.format(base=base, src=out))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "from-setup").read_text() == "second\n"
    assert (out / "sandbox" / "myshell-ran").read_text() == "myshell ran /.post.script\n"
    assert (out / "sandbox" / "post-one").read_text() == "first post\n"
    assert (out / "sandbox" / "post-two").read_text() == "second post\n"


# --- build arguments -------------------------------------------------------------------------------------------------


ARGS = """
    Bootstrap: localimage
    From: {{{{ BASE }}}}

    %arguments
        GREETING=hello-default
        OTHER=other-default
        BASE={base}

    %post
        echo "{{{{ GREETING }}}} {{{{ OTHER }}}}" > /args
    """


def test_build_args_from_defaults_command_line_and_file(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "args")
    recipe = write_recipe(out, ARGS.format(base=base))
    arg_file = out / "args.txt"
    arg_file.write_text("GREETING=from-file\nOTHER=other-from-file\n")
    cases = {
        "defaults": ([], "hello-default other-default"),
        "command-line": (["--build-arg", "GREETING=from-cli"], "from-cli other-default"),
        "file": (["--build-arg-file", str(arg_file)], "from-file other-from-file"),
        "both": (["--build-arg-file", str(arg_file), "--build-arg", "OTHER=cli-wins"], "from-file cli-wins"),
    }
    for name, (flags, expected) in cases.items():
        build(singpy, "--sandbox", *flags, str(out / name), str(recipe))
        assert (out / name / "args").read_text() == f"{expected}\n", name


def test_unused_build_arg_is_an_error_unless_warn_unused(singpy: Singpy, workdir: Path, base: Path) -> None:
    """As in Apptainer 1.4: a --build-arg no stage uses is fatal (exit 255 there), a warning when asked."""
    out = out_dir(singpy, workdir, "unused-args")
    recipe = write_recipe(out, ARGS.format(base=base))
    result = build(singpy, "--sandbox", "--warn-unused-build-args", "--build-arg", "UNUSED=1", str(out / "warned"),
                   str(recipe))
    assert "WARNING:" in result.stderr and "nused build args: UNUSED" in result.stderr, result.stderr
    assert (out / "warned" / "args").read_text() == "hello-default other-default\n"
    result = singpy.run("-q", "build", "--sandbox", "--build-arg", "UNUSED=1", str(out / "refused"), str(recipe))
    assert not (out / "refused").exists() and build_dirs(out) == []
    assert_one_fatal(result, "unused build args: UNUSED")


# --- a base mounted under an overlay, not unpacked (singpy.recipe.layered) ----------------------------------------


def layered_base(workdir: Path) -> Path:
    """An OCI layout whose image has a file of another user, a file and a directory for %post to remove."""
    return oci_base(workdir, "layered", [
        oci.directory("home"), oci.directory("home/user", uid=1000, gid=1000),
        oci.file("home/user/notes", "mine\n", uid=1000, gid=1000, mode=0o600),
        oci.file("etc/base-marker", "layered base\n"), oci.file("etc/appended", "first\n"),
        oci.directory("opt"), oci.directory("opt/gone"), oci.file("opt/gone/file", "x\n")])


OVERLAID = """
    Bootstrap: oci
    From: {layout}:latest

    %files
        {src}/added.txt /opt/added.txt

    %post
        rm /etc/base-marker
        rm -r /opt/gone
        echo second >> /etc/appended
        mkdir -p /var/new
        touch /var/new/owned
        chown 4242:4343 /var/new/owned
    """


def test_build_on_a_base_under_an_overlay_keeps_what_post_did(singpy: Singpy, workdir: Path) -> None:
    """A SIF built on a squashfs base: the stage is an overlay on the base (as root the image itself; for a user
    with a subordinate range the base unpacked once into the cache, with its owners); removals, appends, new
    owners and the base's owners reach the SIF, a second build reuses the cached base, nothing is left mounted
    or running, and `singpy cache clean` removes the cached base although its files are subordinate ids'."""
    if not is_root():
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    out = out_dir(singpy, workdir, "layered")
    cache = out / "cache"
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    (out / "added.txt").write_text("added by %files\n")
    recipe = write_recipe(out, OVERLAID.format(layout=layered_base(workdir), src=out))
    image = str(out / "image.sif")
    before = traces(out)
    ranges = subordinate_ranges(singpy, workdir, "layered", present=True) if singpy.profile == "user" \
        else contextlib.nullcontext()
    with ranges:
        first = singpy.run("-v", "build", image, str(recipe), env=env, timeout=BUILD_TIMEOUT)
        assert first.returncode == 0, first.stderr
        second = singpy.run("-v", "build", "--force", image, str(recipe), env=env, timeout=BUILD_TIMEOUT)
        assert second.returncode == 0, second.stderr
        assert "not unpacked in the work directory" in first.stderr, first.stderr
        if singpy.profile == "user":
            assert "unpacking" in first.stderr and "using the base unpacked in the cache" in second.stderr
            assert "1 base image(s) unpacked for builds" in singpy.ok("cache", "list", env=env)
            singpy.ok("cache", "clean", "--force", env=env)
            assert os.listdir(cache / "build-rootfs") == []
    listed = sif_owners(out / "image.sif")
    assert "/etc/base-marker" not in listed and "/opt/gone" not in listed, sorted(listed)
    assert listed["/home/user/notes"] == "-rw------- 1000/1000"
    assert listed["/var/new/owned"].endswith(" 4242/4343")
    assert listed["/bin/busybox"].endswith(" 0/0")
    assert singpy.ok("exec", image, "cat", "/etc/appended", "/opt/added.txt") == "first\nsecond\nadded by %files\n"
    assert build_dirs(out) == []
    assert settled(before, out) == before


# --- a C program compiled in %post -----------------------------------------------------------------------------------


HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from a compiled recipe"); return 0; }\n'

COMPILE = """
    Bootstrap: localimage
    From: {base}

    %files
        {src}/hello.c /opt/hello.c

    %post
        # the host's /usr is bound in (busybox lives in /bin): its gcc needs /lib and /lib64 as on the host
        ln -s usr/lib /lib
        ln -s usr/lib64 /lib64
        export PATH=/usr/bin:/bin
        gcc -static -O1 -o /opt/hello /opt/hello.c
        /opt/hello
    """


def test_post_compiles_a_c_program_with_the_bound_host_compiler(singpy: Singpy, workdir: Path, base: Path) -> None:
    if shutil.which("gcc", path="/usr/bin") is None:
        pytest.skip("no gcc in /usr/bin on this host")
    if not list(Path("/usr/lib").glob("*/libc.a")) and not Path("/usr/lib/libc.a").exists():
        pytest.skip("no static C library (libc.a, from libc6-dev) on this host")
    if not Path("/usr/lib64").is_dir():
        pytest.skip("this host has no /usr/lib64 (the dynamic loader's usual place)")
    out = out_dir(singpy, workdir, "compile")
    (out / "hello.c").write_text(HELLO_C)
    recipe = write_recipe(out, COMPILE.format(base=base, src=out))
    result = build(singpy, "--bind", "/usr:/usr", str(out / "image.sif"), str(recipe))
    assert "hello from a compiled recipe" in result.stdout + result.stderr  # %post's output is shown
    assert singpy.ok("exec", str(out / "image.sif"), "/opt/hello") == "hello from a compiled recipe\n"
    assert singpy.ok("exec", str(out / "image.sif"), "ls", "-A", "/usr/bin") == ""  # the bind is not in the image

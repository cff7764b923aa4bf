"""`singpy build OUT RECIPE.def`: images built from definition files, end to end (issue 12).

Real things only: base images from the local docker-registry (tests.support.registry), OCI layouts and
archives written by tests.support.oci, busybox sandboxes and a SIF made by `singpy build`; the real `singpy`
command as root and as the unprivileged test user (whose %post runs under --fakeroot). What is checked is
what a user sees: the built image runs (`singpy exec/run`), `singpy inspect` shows its metadata, the files
and owners in it (read back with `unsquashfs -lln`, the reference tool), the build's own output.

Errors, clean-up and signals are in test_build_recipe_errors.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces
from tests.support.recipes import (
    SUBUID_START,
    base_oci_image,
    base_sandbox,
    base_sif,
    build_dirs,
    out_dir,
    sif_owners,
    subordinate_ranges,
    write_recipe,
)
from tests.support.registry import RegistryServer
from tests.support.users import is_root

BUILD_TIMEOUT = 120


class Source(NamedTuple):
    bootstrap: str
    source: str  # the From: header
    marker: str  # /etc/base-marker of the base image


# Every bootstrap agent that starts from an image; each base holds /etc/base-marker.
SOURCE_KINDS = ("docker", "docker-uri", "oci", "oci-archive", "docker-archive", "localimage-sandbox",
                "localimage-sif")


@pytest.fixture(scope="module")
def sources(registry_plain: RegistryServer, workdir: Path) -> dict[str, Source]:
    image = base_oci_image()
    registry_plain.upload(image, "recipe/base")
    where = workdir / "recipe-sources"
    where.mkdir(mode=0o755, exist_ok=True)
    layout = oci.write_layout(where / "layout", {"latest": image})
    archive = oci.write_oci_archive(where / "base-oci.tar", {"latest": image})
    saved = oci.write_docker_archive(where / "base-docker.tar", image, repo_tags=["recipe/base:latest"])
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return {
        "docker": Source("docker", f"{registry_plain.host}/recipe/base:latest", "oci base"),
        "docker-uri": Source("docker", registry_plain.ref("recipe/base"), "oci base"),
        "oci": Source("oci", f"{layout}:latest", "oci base"),
        "oci-archive": Source("oci-archive", str(archive), "oci base"),
        "docker-archive": Source("docker-archive", str(saved), "oci base"),
        "localimage-sandbox": Source("localimage", str(base_sandbox(workdir)), "sandbox base"),
        "localimage-sif": Source("localimage", str(base_sif(workdir)), "sandbox base"),
    }


@pytest.fixture(scope="module")
def base(workdir: Path) -> Path:
    return base_sandbox(workdir)


def build(singpy: Singpy, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`singpy build ARGS`, which must succeed; the result (its output) for further checks."""
    result = singpy.run("build", *args, env=env, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


# --- bootstrap agents ------------------------------------------------------------------------------------------------


POST_ONLY = """
    Bootstrap: {bootstrap}
    From: {source}

    %post
        echo "post ran as $(id -u)" > /post-made
    """


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_every_bootstrap_agent_gives_a_sif_and_a_sandbox(singpy: Singpy, sources: dict[str, Source],
                                                         workdir: Path, kind: str) -> None:
    source = sources[kind]
    out = out_dir(singpy, workdir, f"agent-{kind}")
    recipe = write_recipe(out, POST_ONLY.format(bootstrap=source.bootstrap, source=source.source))
    flags = ["--no-https"] if source.bootstrap == "docker" else []
    sif, sandbox = out / "image.sif", out / "sandbox"
    result = build(singpy, *flags, str(sif), str(recipe))
    assert f"Build complete: {sif}" in result.stderr
    assert singpy.ok("exec", str(sif), "cat", "/etc/base-marker", "/post-made") == \
        f"{source.marker}\npost ran as 0\n"
    build(singpy, *flags, "--sandbox", str(sandbox), str(recipe))
    assert (sandbox / "etc" / "base-marker").read_text() == f"{source.marker}\n"
    assert (sandbox / "post-made").read_text() == "post ran as 0\n"
    assert singpy.ok("exec", str(sandbox), "cat", "/post-made") == "post ran as 0\n"
    assert sorted(os.listdir(out)) == ["image.sif", "recipe.def", "sandbox"]  # no work directory left


def test_scratch_with_files_only(singpy: Singpy, workdir: Path) -> None:
    busybox = shutil.which("busybox") or "/bin/busybox"
    out = out_dir(singpy, workdir, "scratch")
    (out / "hello.txt").write_text("hello from scratch\n")
    recipe = write_recipe(out, f"""
        Bootstrap: scratch

        %files
            {busybox} /bin/busybox
            {out}/hello.txt /etc/hello.txt
        """)
    build(singpy, str(out / "image.sif"), str(recipe))
    assert singpy.ok("exec", str(out / "image.sif"), "/bin/busybox", "cat", "/etc/hello.txt") == \
        "hello from scratch\n"
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    sandbox = out / "sandbox"
    assert os.access(sandbox / "bin" / "busybox", os.X_OK)
    assert not (sandbox / "bin" / "sh").exists()  # nothing but what %files put there
    assert (sandbox / "etc" / "hello.txt").read_text() == "hello from scratch\n"


# --- every section, in one image per profile -------------------------------------------------------------------------


FULL = """
    Bootstrap: localimage
    From: {base}

    %arguments
        GREETING=hello-default

    %files
        {data}/*.txt /opt/texts/
        {data}/c.log /opt/renamed.log
        {data}/single.conf
        {data}/sub /opt/sub
        {data}/c.log /opt/texts
        {data}/link.lnk /opt/link.lnk

    %environment
        export RECIPE_VAR="from environment section"
        export GREETING_ENV={{{{ GREETING }}}}

    %post
        id -u > /post-made
        cat /opt/texts/a.txt > /post-saw-files
        echo 'export FROM_POST=1' >> $SINGULARITY_ENVIRONMENT
        echo 'postlabel yes' >> $APPTAINER_LABELS
        echo "{{{{ GREETING }}}}" > /greeting

    %runscript
        echo "runscript args: $*"

    %startscript
        echo "startscript body marker"

    %test
        echo "test section ran as $(id -u)"
        test -e /post-made

    %labels
        Author recipe tester
        Version v1.2

    %help
        This image is for the recipe tests.
    """


class Built(NamedTuple):
    out: Path
    recipe: Path
    data: Path
    sif: Path
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def full(singpy: Singpy, workdir: Path) -> Built:
    """The FULL recipe built into a SIF once per profile, on a SIF base: every section runs on an overlay over
    the base (singpy.recipe.layered)."""
    base = base_sif(workdir)
    out = out_dir(singpy, workdir, "full")
    data = out / "data"
    data.mkdir()
    for name, text in {"a.txt": "text a\n", "b.txt": "text b\n", "c.log": "log c\n", "single.conf": "conf\n"}.items():
        (data / name).write_text(text)
    (data / "sub").mkdir()
    (data / "sub" / "deep.txt").write_text("deep\n")
    (data / "link.lnk").symlink_to("a.txt")
    recipe = write_recipe(out, FULL.format(base=base, data=data))
    sif = out / "full.sif"
    return Built(out, recipe, data, sif, build(singpy, str(sif), str(recipe)))


def test_build_reports_its_steps_and_runs_the_test_section(full: Built) -> None:
    output = full.result.stdout + full.result.stderr
    for step in ("Starting build", "Copying", "Running post scriptlet", "Running testscript", "Creating SIF file",
                 f"Build complete: {full.sif}"):  # as docs/build.md lists them
        assert f"INFO:    {step}" in full.result.stderr, step
    assert "test section ran as 0" in output  # %test runs as root (--fakeroot for the user)
    assert "Traceback" not in output
    assert build_dirs(full.out) == []


def test_build_says_it_adds_labels(full: Built) -> None:
    """The progress line of Apptainer's that the design of issue 12 names (docs/build.md leaves it out)."""
    assert "INFO:    Adding labels" in full.result.stderr


def test_files_section_globs_destinations_and_same_path(singpy: Singpy, full: Built) -> None:
    """`SRC DEST`, a glob into `DIR/`, `SRC` alone (the same path inside), a directory, into an existing directory
    (as cp does), a link (followed: as `cp -L`)."""
    shown = singpy.ok("exec", str(full.sif), "sh", "-c",
                      f"ls /opt/texts; cat /opt/texts/b.txt /opt/renamed.log {full.data}/single.conf /opt/sub/deep.txt "
                      "/opt/link.lnk /post-saw-files")
    assert shown == "a.txt\nb.txt\nc.log\ntext b\nlog c\nconf\ndeep\ntext a\ntext a\n"  # %files ran before %post


def test_environment_section_and_post_environment(singpy: Singpy, full: Built) -> None:
    env = singpy.ok("exec", str(full.sif), "env").splitlines()
    assert "RECIPE_VAR=from environment section" in env
    assert "GREETING_ENV=hello-default" in env
    assert "FROM_POST=1" in env
    shown = singpy.ok("inspect", "--environment", str(full.sif))
    assert "90-environment.sh" in shown and 'export RECIPE_VAR="from environment section"' in shown


def test_post_ran_inside_as_root_with_build_args(singpy: Singpy, full: Built) -> None:
    assert singpy.ok("exec", str(full.sif), "cat", "/post-made", "/greeting") == "0\nhello-default\n"


def test_runscript_and_startscript(singpy: Singpy, full: Built) -> None:
    assert singpy.ok("run", str(full.sif), "a", "b c") == "runscript args: a b c\n"
    runscript = singpy.ok("inspect", "--runscript", str(full.sif))
    assert runscript.startswith("#!/bin/sh") and 'echo "runscript args: $*"' in runscript
    assert 'echo "startscript body marker"' in singpy.ok("inspect", "--startscript", str(full.sif))
    assert "test -e /post-made" in singpy.ok("inspect", "--test", str(full.sif))


def test_labels_help_and_build_labels(singpy: Singpy, full: Built, workdir: Path) -> None:
    labels = singpy.ok("inspect", "--labels", str(full.sif)).splitlines()
    for line in ("Author: recipe tester", "Version: v1.2", "postlabel: yes",
                 "org.label-schema.schema-version: 1.0",
                 "org.label-schema.usage.singularity.deffile.bootstrap: localimage",
                 f"org.label-schema.usage.singularity.deffile.from: {base_sif(workdir)}",
                 "org.label-schema.usage: /.singularity.d/runscript.help"):
        assert line in labels, (line, labels)
    assert any(line.startswith("org.label-schema.build-date: ") for line in labels), labels
    assert any(line.startswith("org.label-schema.build-arch: ") for line in labels), labels
    assert singpy.ok("inspect", "--helpfile", str(full.sif)).strip() == "This image is for the recipe tests."


def test_inspect_deffile_shows_the_definition_file(singpy: Singpy, full: Built) -> None:
    shown = singpy.ok("inspect", "--deffile", str(full.sif))
    # Lines with {{ ARG }} may be stored substituted (as Apptainer does): the others exactly as written.
    written = [line for line in full.recipe.read_text().splitlines() if "{{" not in line]
    assert [line for line in shown.splitlines() if line in written] == written, shown
    # The SIF's Def.FILE object, read by the reference tool, holds the same text.
    listing = subprocess.run(["siftool", "list", str(full.sif)], capture_output=True, text=True, check=True).stdout
    ids = [line.split("|")[0].strip() for line in listing.splitlines() if line.rstrip().endswith("|Def.FILE")]
    assert len(ids) == 1, listing
    dumped = subprocess.run(["siftool", "dump", ids[0], str(full.sif)], capture_output=True, text=True, check=True)
    assert dumped.stdout.rstrip("\n") == shown.rstrip("\n")


def test_sandbox_holds_the_metadata_files(singpy: Singpy, full: Built) -> None:
    sandbox = full.out / "sandbox"
    build(singpy, "--sandbox", str(sandbox), str(full.recipe))
    meta = sandbox / ".singularity.d"
    assert (meta / "runscript").read_text().startswith("#!/bin/sh")
    assert 'echo "startscript body marker"' in (meta / "startscript").read_text()
    assert "test -e /post-made" in (meta / "test").read_text()
    assert "This image is for the recipe tests." in (meta / "runscript.help").read_text()
    assert 'export RECIPE_VAR="from environment section"' in (meta / "env" / "90-environment.sh").read_text()
    assert "export FROM_POST=1" in (meta / "env" / "91-environment.sh").read_text()
    labels = json.loads((meta / "labels.json").read_text())
    assert labels["Author"] == "recipe tester" and labels["postlabel"] == "yes"
    assert "%runscript" in (meta / "Singularity").read_text()
    assert not (sandbox / "opt" / "link.lnk").is_symlink() and (sandbox / "opt" / "link.lnk").read_text() == "text a\n"
    assert singpy.ok("run", str(sandbox), "x") == "runscript args: x\n"
    assert "Author: recipe tester" in singpy.ok("inspect", str(sandbox))


LAYERED = """
    Bootstrap: localimage
    From: {base}

    %labels
        Layer second
        Author someone else
    """


def test_localimage_of_a_built_sif_keeps_its_metadata_and_history(singpy: Singpy, full: Built) -> None:
    sandbox = full.out / "layered"
    recipe = write_recipe(full.out, LAYERED.format(base=full.sif), name="layered.def")
    build(singpy, "--sandbox", str(sandbox), str(recipe))
    assert singpy.ok("run", str(sandbox), "kept") == "runscript args: kept\n"  # no %runscript: the base's
    labels = singpy.ok("inspect", "--labels", str(sandbox)).splitlines()
    assert "Version: v1.2" in labels and "Layer: second" in labels, labels
    assert f"org.label-schema.usage.singularity.deffile.from: {full.sif}" in labels
    assert "RECIPE_VAR=from environment section" in singpy.ok("exec", str(sandbox), "env").splitlines()
    assert "Layer second" in singpy.ok("inspect", "--deffile", str(sandbox))
    history = sandbox / ".singularity.d" / "bootstrap_history" / "Apptainer0"
    assert "This image is for the recipe tests." in history.read_text()  # the base's definition file


def test_labels_of_the_base_win_unless_force(singpy: Singpy, full: Built) -> None:
    """As Apptainer: a %labels name the base already has is kept, with a warning, unless --force."""
    recipe = write_recipe(full.out, LAYERED.format(base=full.sif), name="relabel.def")
    result = build(singpy, "--sandbox", str(full.out / "kept"), str(recipe))
    assert "Author: recipe tester" in singpy.ok("inspect", "--labels", str(full.out / "kept")).splitlines()
    assert "WARNING:" in result.stderr and "Author already exists" in result.stderr, result.stderr
    build(singpy, "--sandbox", "--force", str(full.out / "forced"), str(recipe))
    assert "Author: someone else" in singpy.ok("inspect", "--labels", str(full.out / "forced")).splitlines()


def test_notest_skips_the_test_section(singpy: Singpy, full: Built) -> None:
    result = build(singpy, "--notest", str(full.out / "notest.sif"), str(full.recipe))
    assert "test section ran" not in result.stdout + result.stderr


CLEAN = """
    Bootstrap: localimage
    From: {base}

    %post
        env > /post-env
        pwd > /post-pwd
        wget -q -O /registry-answer http://{registry}/v2/
    """


def test_post_sees_a_clean_environment_and_the_host_network(singpy: Singpy, workdir: Path, base: Path,
                                                             registry_plain: RegistryServer) -> None:
    out = out_dir(singpy, workdir, "clean-env")
    recipe = write_recipe(out, CLEAN.format(base=base, registry=registry_plain.host))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe), env=singpy.env(HOST_ONLY="must not leak"))
    env = (out / "sandbox" / "post-env").read_text().splitlines()
    assert not [line for line in env if line.startswith("HOST_ONLY=")], env
    for line in ("HOME=/root", "APPTAINER_ENVIRONMENT=/.singularity.d/env/91-environment.sh",
                 "SINGULARITY_ENVIRONMENT=/.singularity.d/env/91-environment.sh",
                 "APPTAINER_LABELS=/.build.labels", "SINGULARITY_LABELS=/.build.labels"):
        assert line in env, (line, env)
    assert (out / "sandbox" / "post-pwd").read_text() == "/\n"
    assert (out / "sandbox" / "registry-answer").read_text().strip() == "{}"  # 127.0.0.1 of the host


RELATIVE = """
    Bootstrap: localimage
    From: recipe-base

    %files
        {relative}/data.txt /opt/relative.txt
    """


def test_relative_paths_are_relative_to_the_working_directory(singpy: Singpy, workdir: Path, base: Path) -> None:
    """`From:` and `%files` sources relative to where `singpy build` runs, not to the definition file."""
    out = out_dir(singpy, workdir, "relative")
    (out / "data.txt").write_text("relative data\n")
    recipe = write_recipe(out, RELATIVE.format(relative=out.relative_to(workdir)))
    assert base == workdir / "recipe-base"
    result = singpy.run("build", "--sandbox", str(out / "sandbox"), str(recipe), cwd=workdir, timeout=BUILD_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert (out / "sandbox" / "opt" / "relative.txt").read_text() == "relative data\n"
    assert (out / "sandbox" / "etc" / "base-marker").read_text() == "sandbox base\n"


# --- the image is untrusted: copies stay inside it ------------------------------------------------------------------


def test_files_through_a_link_of_the_image_stay_inside(singpy: Singpy, workdir: Path) -> None:
    """A base whose /escape links to a host directory: `%files x /escape/x` lands under the image's own root."""
    out = out_dir(singpy, workdir, "escape")
    target = out / "host-target"
    target.mkdir(mode=0o777)
    target.chmod(0o777)
    evil = build_busybox_rootfs(out / "evil-base")
    (evil / "escape").symlink_to(target)
    (evil / "escape-relative").symlink_to("../../../../../../../../.." + str(target))
    (out / "payload.txt").write_text("payload\n")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {evil}

        %files
            {out}/payload.txt /escape/payload.txt
            {out}/payload.txt /escape-relative/payload2.txt
        """)
    result = singpy.run("build", "--sandbox", str(out / "sandbox"), str(recipe), timeout=BUILD_TIMEOUT)
    assert os.listdir(target) == [], result.stderr  # nothing written on the host through the image's links
    if result.returncode == 0:
        inside = out / "sandbox" / str(target).lstrip("/")
        assert sorted(os.listdir(inside)) == ["payload.txt", "payload2.txt"]
    else:
        assert len([line for line in result.stderr.splitlines() if line.startswith("FATAL:")]) == 1, result.stderr


def test_files_from_a_stage_resolve_links_in_that_stage(singpy: Singpy, workdir: Path, base: Path) -> None:
    """A link made by an earlier stage to a host path never copies the host's file into the image."""
    out = out_dir(singpy, workdir, "stage-link")
    secret = out / "host-secret.txt"
    secret.write_text("host secret\n")
    recipe = write_recipe(out, f"""
        Bootstrap: localimage
        From: {base}
        Stage: one

        %post
            ln -s {secret} /opt/secret-link

        Bootstrap: localimage
        From: {base}

        %files from one
            /opt/secret-link /opt/copied
        """)
    result = singpy.run("build", "--sandbox", str(out / "sandbox"), str(recipe), timeout=BUILD_TIMEOUT)
    copied = out / "sandbox" / "opt" / "copied"
    if result.returncode == 0:  # copied as a link, or as what it leads to inside stage one: never the host's file
        assert not copied.exists() or copied.is_symlink() or "host secret" not in copied.read_text()
    else:  # or refused: it leads to nothing in the stage
        assert len([line for line in result.stderr.splitlines() if line.startswith("FATAL:")]) == 1, result.stderr
    assert "host secret" not in result.stdout + result.stderr


SPELLING = """
    # a comment before the header
    BootStrap: localimage
    FROM: {base}

    %runscript
        #!/bin/ash
        echo "runscript shell: $0"

    %post
        echo first > /post-one
    %post
        echo second > /post-two
    """


def test_header_keys_any_case_own_shebang_and_repeated_sections(singpy: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(singpy, workdir, "spelling")
    recipe = write_recipe(out, SPELLING.format(base=base))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    runscript = (out / "sandbox" / ".singularity.d" / "runscript").read_text()
    assert runscript.splitlines()[0] == "#!/bin/ash", runscript  # its own #! line, kept
    assert singpy.ok("run", str(out / "sandbox")) == "runscript shell: /.singularity.d/runscript\n"
    assert (out / "sandbox" / "post-one").read_text() == "first\n"  # a section given twice is joined
    assert (out / "sandbox" / "post-two").read_text() == "second\n"


BRACKET_CLASS = """
    Bootstrap: localimage
    From: {base}

    %files
        {src}/part[[:digit:]].txt /opt/parts/
        {src}/part[![:digit:]].txt /opt/others/
    """


def test_files_patterns_with_posix_bracket_classes(singpy: Singpy, workdir: Path, base: Path) -> None:
    """`[[:digit:]]` and `[![:digit:]]` in a %files source match as bash's glob matches them."""
    out = out_dir(singpy, workdir, "bracket-class")
    for name in ("part1.txt", "part2.txt", "partA.txt", "part10.txt"):
        (out / name).write_text(f"{name}\n")
    recipe = write_recipe(out, BRACKET_CLASS.format(base=base, src=out))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert sorted(os.listdir(out / "sandbox" / "opt" / "parts")) == ["part1.txt", "part2.txt"]
    assert os.listdir(out / "sandbox" / "opt" / "others") == ["partA.txt"]


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


# --- multi-stage -----------------------------------------------------------------------------------------------------


STAGES = """
    Bootstrap: localimage
    From: {base}
    Stage: one

    %post
        mkdir -p /opt/built
        echo "artifact of stage one" > /opt/built/artifact
        touch /stage-one-only

    Bootstrap: localimage
    From: {base}
    Stage: two

    %files from one
        /opt/built/artifact /opt/artifact

    %post
        cp /opt/artifact /opt/seen-by-post-two
    """


@pytest.mark.parametrize("kind", ["sandbox", "sif"])
def test_multi_stage_copies_only_what_files_from_names(singpy: Singpy, workdir: Path, base: Path, kind: str) -> None:
    """From a sandbox base (copied) and a SIF base (each stage an overlay on it, `%files from` reading the first
    stage's overlay)."""
    out = out_dir(singpy, workdir, f"stages-{kind}")
    recipe = write_recipe(out, STAGES.format(base=base if kind == "sandbox" else base_sif(workdir)))
    build(singpy, str(out / "image.sif"), str(recipe))
    shown = singpy.ok("exec", str(out / "image.sif"), "sh", "-c",
                      "cat /opt/artifact /opt/seen-by-post-two; ls / /opt")
    assert shown.startswith("artifact of stage one\nartifact of stage one\n"), shown
    assert "stage-one-only" not in shown and "built" not in shown.split()
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "opt" / "artifact").read_text() == "artifact of stage one\n"
    assert not (out / "sandbox" / "stage-one-only").exists()
    assert build_dirs(out) == []


SAME_NAME = """
    Bootstrap: localimage
    From: {base}
    Stage: build

    %post
        echo "first stage named build" > /which

    Bootstrap: localimage
    From: {base}
    Stage: build

    %post
        echo "second stage named build" > /which

    Bootstrap: localimage
    From: {base}

    %files from build
        /which /opt/which
    """


def test_files_from_a_repeated_stage_name_reads_the_first(singpy: Singpy, workdir: Path, base: Path) -> None:
    """Two stages of one name: `%files from` it copies from the first (Apptainer's findStageIndex)."""
    out = out_dir(singpy, workdir, "same-stage-name")
    recipe = write_recipe(out, SAME_NAME.format(base=base))
    build(singpy, "--sandbox", str(out / "sandbox"), str(recipe))
    assert (out / "sandbox" / "opt" / "which").read_text() == "first stage named build\n"
    assert not (out / "sandbox" / "which").exists()


# --- owners: the fakeroot id range -----------------------------------------------------------------------------------


OWNED = """
    Bootstrap: localimage
    From: {base}

    %post
        touch /owned
        chown 4242:4343 /owned
    """


def test_root_build_keeps_the_owner_it_was_given(as_root: Singpy, workdir: Path, base: Path) -> None:
    out = out_dir(as_root, workdir, "owned-root")
    recipe = write_recipe(out, OWNED.format(base=base))
    build(as_root, "--sandbox", str(out / "sandbox"), str(recipe))
    info = (out / "sandbox" / "owned").stat()
    assert (info.st_uid, info.st_gid) == (4242, 4343)
    build(as_root, "--fakeroot", str(out / "image.sif"), str(recipe))  # accepted and ignored as root
    assert sif_owners(out / "image.sif")["/owned"].endswith(" 4242/4343")


def test_user_build_with_a_subordinate_range_can_chown(as_user: Singpy, workdir: Path, base: Path) -> None:
    """As Apptainer's --fakeroot: id N inside is the range's start + N - 1 on the host, N again in the SIF."""
    if not is_root():
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    out = out_dir(as_user, workdir, "owned-range")
    recipe = write_recipe(out, OWNED.format(base=base))
    with subordinate_ranges(as_user, workdir, "owned-range", present=True):
        build(as_user, "--sandbox", str(out / "sandbox"), str(recipe))
        build(as_user, str(out / "image.sif"), str(recipe))
        inside = as_user.ok("exec", "--fakeroot", str(out / "sandbox"), "stat", "-c", "%u:%g", "/owned")
    info = (out / "sandbox" / "owned").stat()
    assert (info.st_uid, info.st_gid) == (SUBUID_START + 4241, SUBUID_START + 4342)
    assert inside == "4242:4343\n"
    assert sif_owners(out / "image.sif")["/owned"].endswith(" 4242/4343")
    assert sif_owners(out / "image.sif")["/bin/busybox"].endswith(" 0/0")  # the user's own files are root's inside


def oci_base(workdir: Path, name: str, extra: list[oci.Entry]) -> Path:
    """An OCI layout of busybox plus a layer of `extra`, made once per session under `name`."""
    layout = workdir / f"recipe-{name}-layout"
    if not layout.exists():
        oci.write_layout(layout, {"latest": oci.busybox_image(extra=extra)})
        subprocess.run(["chmod", "-R", "a+rX", str(layout)], check=True)
    return layout


def owners_base(workdir: Path) -> Path:
    """An OCI layout whose image has files of another user and a setuid file."""
    return oci_base(workdir, "owners", [oci.directory("home"), oci.directory("home/user", uid=1000, gid=1000),
                                        oci.file("home/user/notes", "mine\n", uid=1000, gid=1000, mode=0o600),
                                        oci.file("usr/bin/suid-tool", "#!/bin/sh\n", mode=0o4755)])


OWNERS = """
    Bootstrap: oci
    From: {layout}:latest

    %post
        stat -c '%u:%g %a' /home/user/notes /usr/bin/suid-tool > /owners-seen-by-post
    """


def test_owners_and_modes_of_the_base_survive_the_build(as_root: Singpy, as_user: Singpy, workdir: Path) -> None:
    """Root, and a user with a subordinate range: the base image's owners and setuid bits reach the SIF."""
    layout = owners_base(workdir)
    for runner in (as_root, as_user):
        out = out_dir(runner, workdir, "base-owners")
        recipe = write_recipe(out, OWNERS.format(layout=layout))
        with subordinate_ranges(as_user, workdir, "base-owners", present=True):
            build(runner, str(out / "image.sif"), str(recipe))
        listed = sif_owners(out / "image.sif")
        assert listed["/home/user/notes"] == "-rw------- 1000/1000", (runner.profile, listed)
        assert listed["/usr/bin/suid-tool"] == "-rwsr-xr-x 0/0", (runner.profile, listed)
        assert runner.ok("exec", str(out / "image.sif"), "cat", "/owners-seen-by-post") == \
            "1000:1000 600\n0:0 4755\n", runner.profile


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

"""`singpy build OUT RECIPE.def`: images built from definition files, end to end (issue 12).

Real things only: base images from the local docker-registry (tests.support.registry), OCI layouts and
archives written by tests.support.oci, busybox sandboxes and a SIF made by `singpy build`; the real `singpy`
command as root and as the unprivileged test user (whose %post runs under --fakeroot). What is checked is
what a user sees: the built image runs (`singpy exec/run`), `singpy inspect` shows its metadata, the files
and owners in it (read back with `unsquashfs -lln`, the reference tool), the build's own output.

Errors, clean-up and signals are in test_build_recipe_errors.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import Singpy
from tests.support import oci
from tests.support.recipes import (
    BUILD_TIMEOUT,
    base_oci_image,
    base_sandbox,
    base_sif,
    build,
    build_dirs,
    out_dir,
    write_recipe,
)
from tests.support.registry import RegistryServer


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

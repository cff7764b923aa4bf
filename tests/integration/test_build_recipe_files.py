"""`singpy build OUT RECIPE.def`: what goes into the image from outside it (issue 12): %files copies that stay
inside an untrusted image (through its links, from a stage's links), multi-stage builds copying only what
%files from names, and the owners of files (root's build, a user's subordinate range, the base's owners).

As test_build_recipe.py: real bases and the real `singpy` command, as root and as the test user; what is
checked is what a user sees.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import oci
from tests.support.images import build_busybox_rootfs
from tests.support.recipes import (
    BUILD_TIMEOUT,
    SUBUID_START,
    base_sandbox,
    base_sif,
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

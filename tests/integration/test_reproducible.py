"""Reproducible SIFs, as Apptainer 1.5 makes them: `pull`/`build --reproducible` (APPTAINER_REPRODUCIBLE) date the
SIF by the OCI image's creation, SOURCE_DATE_EPOCH by its own value; two runs then give the same bytes.

What a user checks: `cmp` of two SIFs made apart (their header's UUID is the nil one, the build labels say the
image's date, every file of the squashfs has it as its time), their cache left as it was (a reproducible SIF is
made in a temporary one), and one FATAL line where no date can be had. The image is busybox written by
tests.support.oci, created 2023-11-14T22:13:20Z; a local registry serves it for docker://. Root and the test
user (whose build runs in a user namespace, with the base under an overlay).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.oci import busybox_image, file, write_layout
from tests.support.pulling import cache_env, user_dir
from tests.support.recipes import write_recipe
from tests.support.registry import RegistryServer

CREATED = "Tuesday_14_November_2023_22:13:20_UTC"  # busybox_image's config: "created": "2023-11-14T22:13:20Z"
CREATED_EPOCH = 1700000000
NIL_UUID = bytes(16)
_UUID_AT = 32 + 10 + 3 + 3  # the SIF header: launch script, magic, version, arch (singpy/image/sif.py)


@pytest.fixture(scope="module")
def layout(workdir: Path) -> Path:
    path = workdir / "reproducible-layout"
    if not path.exists():
        write_layout(path, {"latest": busybox_image(extra=[file("etc/marker", "reproducible\n")])})
        subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return path


def made_twice(singpy: Singpy, out: Path, *words: str, env: dict[str, str], name: str = "image") -> tuple[Path, Path]:
    """`singpy WORDS OUT/NAME-N.sif...` twice, a second apart (a date taken from the clock would differ)."""
    made = []
    for number in (1, 2):
        target = out / f"{name}-{number}.sif"
        result = singpy.run(*[str(target) if word == "OUT" else word for word in words], env=env, timeout=180)
        assert result.returncode == 0, result.stderr
        made.append(target)
        time.sleep(1.1)
    return made[0], made[1]


def labels(singpy: Singpy, sif: Path) -> str:
    return singpy.ok("inspect", "--labels", str(sif))


def latest_time(sif: Path) -> str:
    """The latest time of a file in the SIF's squashfs, to the minute (a reproducible SIF's are clamped to its
    date, as mksquashfs clamps them; what singpy lays over a streamed image is dated 1970 anyway)."""
    listing = subprocess.run(["unsquashfs", "-lln", "-o", str(sifs.primary_offset(sif)), str(sif)],
                             capture_output=True, text=True, check=True).stdout
    return max(" ".join(line.split()[3:5]) for line in listing.splitlines() if line.strip())


@pytest.mark.parametrize("how", ["flag", "variable", "tree"])
def test_a_reproducible_pull_is_the_same_bytes_dated_by_the_image(singpy: Singpy, workdir: Path, layout: Path,
                                                                  how: str) -> None:
    out = user_dir(singpy, workdir, f"pull-{how}", folder="reproducible")
    env = cache_env(singpy, workdir, f"reproducible-pull-{how}")
    flags = ["--reproducible"]
    if how == "variable":
        flags, env = [], {**env, "APPTAINER_REPRODUCIBLE": "1", "SOURCE_DATE_EPOCH": "5"}  # the image's date wins
    if how == "tree":
        env["SINGPY_PULL_TREE"] = "1"  # the image through a tree and mksquashfs, not the merged stream
    first, second = made_twice(singpy, out, "pull", *flags, "OUT", f"oci:{layout}:latest", env=env)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes()[_UUID_AT:_UUID_AT + 16] == NIL_UUID
    assert f"org.label-schema.build-date: {CREATED}\n" in labels(singpy, first)
    assert latest_time(first) == "2023-11-14 22:13"
    assert os.listdir(env["SINGPY_CACHEDIR"]) == []  # made apart, in a temporary cache
    assert singpy.ok("exec", str(first), "cat", "/etc/marker") == "reproducible\n"


def test_without_a_date_two_pulls_differ(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """The control of the test above: two SIFs made apart differ (the UUID, the build date)."""
    out = user_dir(singpy, workdir, "pull-control", folder="reproducible")
    env = {key: value for key, value in cache_env(singpy, workdir, "reproducible-control").items()
           if key != "SOURCE_DATE_EPOCH"}
    first, second = made_twice(singpy, out, "pull", "--disable-cache", "OUT", f"oci:{layout}:latest", env=env)
    assert first.read_bytes() != second.read_bytes()
    assert first.read_bytes()[_UUID_AT:_UUID_AT + 16] != NIL_UUID


def test_a_reproducible_pull_asks_the_registry_for_the_config_once(singpy: Singpy, workdir: Path,
                                                                     registry_plain: RegistryServer) -> None:
    """The image config dates the SIF and goes into it: one request for it, as a plain pull makes."""
    image = busybox_image(extra=[file("etc/marker", f"once as {singpy.profile}\n")])
    name = f"reproducible/once-{singpy.profile}"
    registry_plain.upload(image, name)
    out = user_dir(singpy, workdir, "pull-once", folder="reproducible")
    env = cache_env(singpy, workdir, "reproducible-once")
    singpy.ok("pull", "--reproducible", "--no-https", str(out / "once.sif"), registry_plain.ref(name), env=env)
    assert f"org.label-schema.build-date: {CREATED}\n" in labels(singpy, out / "once.sif")
    asked = [line for line in registry_plain.log.read_text(errors="replace").splitlines()
             if f"GET /v2/{name}/blobs/{image.config_digest}" in line]
    assert len(asked) == 1, asked


def test_source_date_epoch_dates_a_pull_from_a_registry(singpy: Singpy, workdir: Path,
                                                         registry_plain: RegistryServer) -> None:
    registry_plain.upload(busybox_image(), "reproducible/epoch")
    out = user_dir(singpy, workdir, "pull-epoch", folder="reproducible")
    env = cache_env(singpy, workdir, "reproducible-epoch", SOURCE_DATE_EPOCH="1234567890")
    first, second = made_twice(singpy, out, "pull", "--no-https", "OUT",
                               f"docker://{registry_plain.host}/reproducible/epoch:latest", env=env)
    assert first.read_bytes() == second.read_bytes()
    assert "org.label-schema.build-date: Friday_13_February_2009_23:31:30_UTC\n" in labels(singpy, first)
    assert latest_time(first) == "2009-02-13 23:31"


def test_a_reproducible_build_of_a_definition_file(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """Apptainer's e2e case: a definition file on an OCI base, built twice with --reproducible (then with
    APPTAINER_REPRODUCIBLE), gives one SIF; %post's files get the image's date too."""
    out = user_dir(singpy, workdir, "build", folder="reproducible")
    recipe = write_recipe(out, f"""
        Bootstrap: oci
        From: {layout}:latest

        %post
            echo made > /made-in-post
        """)
    env = cache_env(singpy, workdir, "reproducible-build")
    first, second = made_twice(singpy, out, "build", "--reproducible", "OUT", str(recipe), env=env)
    assert first.read_bytes() == second.read_bytes()
    shown = labels(singpy, first)
    assert f"org.label-schema.build-date: {CREATED}\n" in shown
    assert "org.opencontainers.image.created: 2023-11-14T22:13:20Z\n" in shown
    assert latest_time(first) == "2023-11-14 22:13"
    third, _ = made_twice(singpy, out, "build", "OUT", str(recipe), env={**env, "APPTAINER_REPRODUCIBLE": "yes"},
                          name="variable")
    assert third.read_bytes() == first.read_bytes()


def test_a_reproducible_build_of_an_oci_image(singpy: Singpy, workdir: Path, layout: Path) -> None:
    out = user_dir(singpy, workdir, "build-image", folder="reproducible")
    env = cache_env(singpy, workdir, "reproducible-build-image")
    first, second = made_twice(singpy, out, "build", "--reproducible", "OUT", f"oci:{layout}:latest", env=env)
    assert first.read_bytes() == second.read_bytes()
    assert os.listdir(env["SINGPY_CACHEDIR"]) == []


def test_a_local_base_takes_source_date_epoch(singpy: Singpy, workdir: Path, layout: Path) -> None:
    """A base that is no OCI image has no creation date: --reproducible alone is one FATAL line before anything
    runs; SOURCE_DATE_EPOCH gives the date."""
    out = user_dir(singpy, workdir, "build-local", folder="reproducible")
    base = out / "base.sif"
    singpy.ok("pull", str(base), f"oci:{layout}:latest", env=cache_env(singpy, workdir, "reproducible-base"))
    recipe = write_recipe(out, f"Bootstrap: localimage\nFrom: {base}\n\n%post\n    echo post-ran\n")
    env = cache_env(singpy, workdir, "reproducible-local")
    result = singpy.run("build", "--reproducible", str(out / "refused.sif"), str(recipe), env=env, timeout=120)
    fatal = [line for line in result.stderr.splitlines() if line.startswith("FATAL:")]
    assert result.returncode == 255 and fatal == [
        f"FATAL:   --reproducible takes the creation date of an OCI image, and the last stage's base ({base}) has "
        "none: set SOURCE_DATE_EPOCH to the date to give the image"], result.stderr
    assert "post-ran" not in result.stdout + result.stderr and not (out / "refused.sif").exists()
    first, second = made_twice(singpy, out, "build", "--reproducible", "OUT", str(recipe),
                               env={**env, "SOURCE_DATE_EPOCH": str(CREATED_EPOCH + 60)})
    assert first.read_bytes() == second.read_bytes()
    assert latest_time(first) == "2023-11-14 22:14"  # %post's files, clamped


@pytest.mark.parametrize(("words", "message"), [
    (["pull", "OUT", "oci:LAYOUT:latest"], "SOURCE_DATE_EPOCH=soon is not a date"),
    (["build", "OUT", "oci:LAYOUT:latest"], "SOURCE_DATE_EPOCH=soon is not a date"),
    (["build", "--reproducible", "OUT", "LAYOUT"], "--reproducible builds from a definition file or an OCI image"),
], ids=["pull", "build", "build-from-a-sandbox"])
def test_what_gives_no_date_is_one_fatal_line(singpy: Singpy, workdir: Path, layout: Path, words: list[str],
                                              message: str) -> None:
    out = user_dir(singpy, workdir, f"refused-{words[0]}-{len(words)}", folder="reproducible")
    env = cache_env(singpy, workdir, f"reproducible-refused-{words[0]}-{len(words)}", SOURCE_DATE_EPOCH="soon")
    argv = [str(out / "out.sif") if word == "OUT" else word.replace("LAYOUT", str(layout)) for word in words]
    result = singpy.run(*argv, env=env, timeout=120)
    assert_one_fatal(result, message, code=1 if message.startswith("--") else 255)
    assert os.listdir(out) == []

"""A sandbox root builds keeps the image's set-uid files and device nodes, and only root can reach them
(issue 24, class 2).

On the host's filesystem no nosuid or nodev applies: a set-uid root program
of an untrusted image in a sandbox other users can enter gives them root, a
device node the host's disks. Root's sandbox is therefore mode 0700 at its
top, whatever the source (an OCI layout or archive, a docker archive, a SIF,
a definition file), and a note says why when it holds such files. A user's
sandbox holds only the user's own files: it keeps the image's mode.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import oci
from tests.support.oci import (
    block_device,
    busybox_image,
    char_device,
    file,
    write_docker_archive,
    write_layout,
    write_oci_archive,
)
from tests.support.recipes import out_dir, write_recipe
from tests.support.users import run_as

TIMEOUT = 120
NOTE = "is private to root (mode 0700)"


def hostile_image() -> oci.Image:
    """A set-uid root program, a set-gid one, and the host's first disk open to everyone."""
    return busybox_image(extra=[
        file("usr/bin/rootshell", "#!/bin/sh\nid -u\n", mode=0o4755),
        file("usr/bin/groupshell", "#!/bin/sh\nid -g\n", mode=0o2755),
        block_device("dev/hostdisk", 8, 0, mode=0o666),
        char_device("dev/hostmem", 1, 1, mode=0o666),
        file("etc/marker", "hostile\n"),
    ])


@pytest.fixture(scope="module")
def sources(workdir: Path) -> dict[str, Path]:
    where = workdir / "root-sandbox-sources"
    where.mkdir(mode=0o755)
    image = hostile_image()
    found = {
        "oci": write_layout(where / "layout", {"latest": image}),
        "oci-archive": write_oci_archive(where / "image.tar", {"latest": image}),
        "docker-archive": write_docker_archive(where / "saved.tar", image, repo_tags=["test/hostile:latest"]),
        "plain": write_oci_archive(where / "plain.tar", {"latest": busybox_image(
            extra=[file("etc/marker", "plain\n")])}),
    }
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return found


def build(singpy: Singpy, *args: str) -> subprocess.CompletedProcess[str]:
    result = singpy.run("build", *args, timeout=TIMEOUT)
    assert result.returncode == 0, f"exit {result.returncode}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def sandbox_from(singpy: Singpy, kind: str, sources: dict[str, Path], out: Path) -> subprocess.CompletedProcess[str]:
    """`singpy build --sandbox OUT/sandbox` from the hostile image, reached through source `kind`."""
    target = str(out / "sandbox")
    if kind in ("oci", "oci-archive", "docker-archive"):
        reference = f"oci:{sources['oci']}:latest" if kind == "oci" else f"{kind}:{sources[kind]}"
        return build(singpy, "--sandbox", target, reference)
    if kind == "sif":
        build(singpy, str(out / "image.sif"), f"oci-archive:{sources['oci-archive']}")
        return build(singpy, "--sandbox", target, str(out / "image.sif"))
    recipe = write_recipe(out, f"""
        Bootstrap: oci-archive
        From: {sources['oci-archive']}

        %post
            echo built > /built
        """)
    return build(singpy, "--sandbox", target, str(recipe))


@pytest.mark.parametrize("kind", ["oci", "oci-archive", "docker-archive", "sif", "definition"])
def test_root_sandbox_keeps_set_id_files_and_devices_out_of_other_users_reach(
        as_root: Singpy, other_user: object, workdir: Path, sources: dict[str, Path], kind: str) -> None:
    out = out_dir(as_root, workdir, f"root-sandbox-{kind}")
    out.chmod(0o755)  # the directory above is open: only the sandbox's own mode stands in the way
    result = sandbox_from(as_root, kind, sources, out)
    sandbox = out / "sandbox"
    assert stat.S_IMODE(sandbox.stat().st_mode) == 0o700
    notes = [line for line in result.stderr.splitlines() if NOTE in line]
    assert len(notes) == 1 and notes[0].startswith("INFO:"), result.stderr
    assert "2 set-uid/set-gid file(s)" in notes[0] and "device node(s)" in notes[0], notes[0]
    # A faithful image: the bits and the nodes are there, for root.
    assert (sandbox / "usr/bin/rootshell").stat().st_mode & stat.S_ISUID
    assert stat.S_ISBLK((sandbox / "dev/hostdisk").lstat().st_mode)
    # Another user of the host reaches none of it.
    for path in ("usr/bin/rootshell", "dev/hostdisk", "etc/marker"):
        denied = run_as(other_user, ["stat", str(sandbox / path)])  # type: ignore[arg-type]
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    denied = run_as(other_user, ["sh", "-c", '"$0"', str(sandbox / "usr/bin/rootshell")])  # type: ignore[arg-type]
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    # Root runs it as always.
    assert as_root.ok("exec", str(sandbox), "cat", "/etc/marker") == "hostile\n"


def test_root_sandbox_without_set_id_files_is_private_without_a_note(as_root: Singpy, workdir: Path,
                                                                     sources: dict[str, Path]) -> None:
    out = out_dir(as_root, workdir, "root-sandbox-plain")
    result = build(as_root, "--sandbox", str(out / "sandbox"), f"oci-archive:{sources['plain']}")
    assert stat.S_IMODE((out / "sandbox").stat().st_mode) == 0o700
    assert NOTE not in result.stderr


def test_sif_squashed_from_root_sandbox_opens_its_root_to_users(as_root: Singpy, as_user: Singpy, workdir: Path,
                                                                sources: dict[str, Path]) -> None:
    """The 0700 is the sandbox's on the host, not the image's "/": a SIF made of it runs for users."""
    out = out_dir(as_root, workdir, "root-sandbox-to-sif")
    out.chmod(0o755)
    build(as_root, "--sandbox", str(out / "sandbox"), f"oci-archive:{sources['plain']}")
    build(as_root, str(out / "image.sif"), str(out / "sandbox"))
    recipe = write_recipe(out, f"Bootstrap: localimage\nFrom: {out / 'sandbox'}\n")
    build(as_root, str(out / "recipe.sif"), str(recipe))
    for sif in ("image.sif", "recipe.sif"):
        os.chmod(out / sif, 0o644)
        assert as_user.ok("exec", str(out / sif), "cat", "/etc/marker") == "plain\n", sif
        assert as_user.ok("exec", str(out / sif), "stat", "-c", "%a", "/") == "755\n", sif


def test_sandbox_shared_with_chmod_is_usable_by_users(as_root: Singpy, as_user: Singpy, workdir: Path,
                                                      sources: dict[str, Path]) -> None:
    """What docs/build.md says to do to share a sandbox works."""
    out = out_dir(as_root, workdir, "root-sandbox-shared")
    out.chmod(0o755)
    build(as_root, "--sandbox", str(out / "sandbox"), f"oci-archive:{sources['plain']}")
    os.chmod(out / "sandbox", 0o755)
    assert as_user.ok("exec", str(out / "sandbox"), "cat", "/etc/marker") == "plain\n"


def test_user_sandbox_keeps_the_image_mode_and_holds_only_the_user_files(as_user: Singpy, workdir: Path,
                                                                         sources: dict[str, Path]) -> None:
    out = out_dir(as_user, workdir, "user-sandbox")
    result = build(as_user, "--sandbox", str(out / "sandbox"), f"oci-archive:{sources['oci-archive']}")
    sandbox = out / "sandbox"
    assert stat.S_IMODE(sandbox.stat().st_mode) == 0o755
    assert NOTE not in result.stderr
    shell = (sandbox / "usr/bin/rootshell").stat()
    assert shell.st_uid == as_user.uid and not shell.st_mode & stat.S_ISUID  # never a set-uid root file
    assert not (sandbox / "dev/hostdisk").exists()

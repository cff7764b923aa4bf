"""Launches without a layer of mount points (issue 26): --writable on a sandbox, `enable overlay = no` with
`enable underlay = no`.

As Apptainer 1.5: the default home is staged (a tmpfs of the launch on /home, the home made and bound there,
the image untouched); the other default mounts (tmp, cwd, `bind path`) the image has no place for are left
out with a warning and the container starts; a bind the user asked for stays one FATAL line naming its
destination.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import Singpy, assert_one_fatal
from tests.support.configs import readable_config
from tests.support.images import build_busybox_rootfs, tree_digest
from tests.support.leftovers import settled, traces

LEFT_OUT = "left out"


def homeless_sandbox(singpy: Singpy, workdir: Path, name: str, *, drop: tuple[str, ...] = (),
                     staged_only: bool = False) -> Path:
    """A busybox sandbox owned by the profile's user, without their home directory (nor the paths in `drop`).

    `staged_only`: root's /root is kept (a home that can't be staged is left out with a warning).
    """
    root = workdir / f"{name}-{singpy.profile}"
    subprocess.run(["rm", "-rf", str(root)], check=True)
    build_busybox_rootfs(root)
    for path in ((singpy.home,) if singpy.home.count("/") > 1 or not staged_only else ()) + drop:
        subprocess.run(["rm", "-rf", str(root / path.lstrip("/"))], check=True)
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(root)], check=True)
    return root


def host_home_inode(singpy: Singpy) -> int | None:
    try:
        return os.stat(singpy.home).st_ino
    except FileNotFoundError:
        return None


def test_writable_without_the_home_in_the_image_runs(singpy: Singpy, workdir: Path) -> None:
    """The home is staged in a tmpfs on /home (a user's), or left out with a warning (root's /root)."""
    image = homeless_sandbox(singpy, workdir, "nolayer-home")
    before, digest = traces(image), tree_digest(image)
    result = singpy.run("exec", "--writable", str(image), "sh", "-c", 'stat -c %i "$HOME" || echo none')
    assert result.returncode == 0, result.stderr
    assert "FATAL" not in result.stderr and "Traceback" not in result.stderr
    if singpy.home.count("/") > 1:  # /home/NAME: staged, the host's home is there, no warning
        assert result.stdout.strip() == str(host_home_inode(singpy)), result.stderr
        assert LEFT_OUT not in result.stderr
    else:  # /root, which the image lacks: no directory to stage it in
        assert result.stdout.strip() == "none"
        assert f"{LEFT_OUT}: {singpy.home} does not exist in the image (with --writable" in result.stderr
    assert tree_digest(image) == digest  # the image has no mount point made in it
    assert settled(before, image) == before


def test_default_mounts_without_a_place_are_left_out_with_a_warning(singpy: Singpy, workdir: Path) -> None:
    """tmp, cwd and `bind path`: a warning each, as Apptainer's "Skipping mount ...", and the payload runs."""
    image = homeless_sandbox(singpy, workdir, "nolayer-defaults", drop=("/tmp", "/var/tmp"))
    source = workdir / "nolayer-bind-path"
    source.mkdir(mode=0o755, exist_ok=True)
    conf = readable_config(workdir, "nolayer-bind-path", f"bind path = {source}:/from/conf\n")
    before, digest = traces(image), tree_digest(image)
    result = singpy.run("--config", str(conf), "exec", "--writable", str(image), "echo", "ran", cwd="/run")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING:") and LEFT_OUT in line]
    for dest in ("/tmp", "/var/tmp", "/from/conf", "/run"):  # /run: the cwd, which the image lacks
        assert any(f" on {dest}, {LEFT_OUT}: " in line for line in warnings), result.stderr
    assert "FATAL" not in result.stderr
    assert tree_digest(image) == digest
    assert settled(before, image) == before


def test_asked_bind_is_one_fatal_naming_its_destination(singpy: Singpy, workdir: Path) -> None:
    """The home the image lacks no longer stops the launch first: the FATAL line names the bind asked for."""
    image = homeless_sandbox(singpy, workdir, "nolayer-asked", staged_only=True)
    source = workdir / "nolayer-asked-source"
    source.mkdir(mode=0o755, exist_ok=True)
    before, digest = traces(image), tree_digest(image)
    result = singpy.run("exec", "-w", "-B", f"{source}:/not/there", str(image), "true")
    assert_one_fatal(result, f"can't bind {source} on /not/there: /not/there does not exist in the image")
    result = singpy.run("exec", "-w", "--home", f"{source}:/elsewhere/home", str(image), "true")
    assert_one_fatal(result, f"can't bind {source} on /elsewhere/home: /elsewhere/home does not exist in the image")
    assert tree_digest(image) == digest
    assert settled(before, image) == before


def test_no_overlay_and_no_underlay_stage_the_home(singpy: Singpy, workdir: Path) -> None:
    """The same without --writable, where the configuration allows no layer: a read-only image, the home there."""
    image = homeless_sandbox(singpy, workdir, "nolayer-conf")
    conf = readable_config(workdir, "nolayer-neither", "enable overlay = no\nenable underlay = no\n")
    before = traces(image)
    result = singpy.run("--config", str(conf), "exec", str(image), "sh", "-c", 'stat -c %i "$HOME" || echo none')
    assert result.returncode == 0, result.stderr
    if singpy.home.count("/") > 1:
        assert result.stdout.strip() == str(host_home_inode(singpy)), result.stderr
    else:
        assert "`enable overlay = no` and `enable underlay = no`" in result.stderr
    assert settled(before, image) == before

"""--overlay DIR[:ro]: persistent overlay directories over sandboxes and SIFs, kernel overlayfs and fuse-overlayfs."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.images import build_busybox_rootfs, tree_digest
from tests.support.leftovers import settled, traces, wait_until_gone

# In the container (no --pid: /proc is the host's), the pid and name of every other child of our parent:
# under fuse-overlayfs the launcher stays as supervisor, and the helper is its child beside the container.
SIBLINGS = ("for s in /proc/[0-9]*/status; do grep -q \"^PPid:[[:space:]]*$PPID\\$\" $s 2>/dev/null && "
            "echo \"$(basename $(dirname $s)) $(sed -n 's/^Name:[[:space:]]*//p' $s)\"; done; true")


@pytest.fixture
def image(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A sandbox of the profile's user (kernel overlayfs in a user namespace copies up only ids it maps)."""
    root = workdir / "overlay-images" / f"{request.node.name}-{singpy.profile}"
    root.parent.mkdir(exist_ok=True)
    build_busybox_rootfs(root)
    (root / "srv").mkdir()
    (root / "srv" / "doomed").write_text("image file\n")
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(root)], check=True)
    return root


@pytest.fixture
def overlay(singpy: Singpy, workdir: Path) -> Path:
    """An empty overlay directory of the profile's user (a short path: messages quote it whole)."""
    (workdir / "ov").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=workdir / "ov", prefix=singpy.profile[0]))
    path.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def driver_conf(workdir: Path) -> Path:
    conf = workdir / "overlay-driver.conf"
    conf.write_text("enable overlay = driver\n")
    return conf


def test_writes_land_in_upper_and_persist(singpy: Singpy, image: Path, overlay: Path) -> None:
    before_image, before = tree_digest(image), traces(image, overlay)
    out = singpy.ok("exec", "--overlay", str(overlay), str(image), "sh", "-c",
                    "echo layered > /opt/file && mkdir -p /srv/new && cat /opt/file")
    assert out == "layered\n"
    assert sorted(os.listdir(overlay)) == ["upper", "work"]  # made by the first run, as Apptainer does
    assert (overlay / "upper" / "opt" / "file").read_text() == "layered\n"
    assert (overlay / "upper" / "srv" / "new").is_dir()
    assert tree_digest(image) == before_image
    assert singpy.ok("exec", "-o", str(overlay), str(image), "cat", "/opt/file") == "layered\n"
    assert singpy.run("exec", str(image), "cat", "/opt/file").returncode != 0
    assert traces(image, overlay) == before


def test_deleted_file_stays_hidden_image_untouched(singpy: Singpy, image: Path, overlay: Path) -> None:
    before = tree_digest(image)
    singpy.ok("exec", "-o", str(overlay), str(image), "rm", "/srv/doomed")
    result = singpy.run("exec", "-o", f"{overlay}:ro", str(image), "cat", "/srv/doomed")
    assert result.returncode != 0 and "No such file" in result.stderr
    assert (image / "srv" / "doomed").read_text() == "image file\n"
    assert tree_digest(image) == before
    assert singpy.ok("exec", str(image), "cat", "/srv/doomed") == "image file\n"


def test_read_only_overlay_with_writable_tmpfs(singpy: Singpy, image: Path, overlay: Path) -> None:
    (overlay / "upper" / "opt").mkdir(parents=True)
    (overlay / "upper" / "opt" / "from-overlay").write_text("lower layer\n")
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(overlay)], check=True)
    before = tree_digest(overlay)
    denied = singpy.run("exec", "-o", f"{overlay}:ro", str(image), "touch", "/opt/x")
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr
    out = singpy.ok("exec", "-o", f"{overlay}:ro", "--writable-tmpfs", str(image), "sh", "-c",
                    "cat /opt/from-overlay && echo scratch > /opt/from-overlay && cat /opt/from-overlay")
    assert out == "lower layer\nscratch\n"
    assert tree_digest(overlay) == before
    assert not (overlay / "work").exists()


def test_read_only_directory_without_upper_is_the_layer(singpy: Singpy, image: Path, overlay: Path) -> None:
    (overlay / "srv").mkdir()
    (overlay / "srv" / "plain").write_text("whole directory\n")
    assert singpy.ok("exec", "-o", f"{overlay}:ro", str(image), "cat", "/srv/plain") == "whole directory\n"
    assert sorted(os.listdir(overlay)) == ["srv"]


def test_layers_stack_in_order_and_from_the_environment(singpy: Singpy, image: Path, overlay: Path,
                                                        workdir: Path) -> None:
    lower = overlay / "lower"
    top = overlay / "top"
    for path, text in ((lower, "lower\n"), (top, "top\n")):
        (path / "upper" / "srv").mkdir(parents=True)
        (path / "upper" / "srv" / "which").write_text(text)
    assert singpy.ok("exec", "-o", f"{lower}:ro,{top}:ro", str(image), "cat", "/srv/which") == "top\n"
    for prefix in ("SINGULARITY", "APPTAINER", "SINGPY"):
        env = singpy.env(**{f"{prefix}_OVERLAY": f"{top}:ro,{lower}:ro"})
        assert singpy.ok("exec", str(image), "cat", "/srv/which", env=env) == "lower\n"


def test_missing_mount_point_leaves_no_junk_in_upper(singpy: Singpy, image: Path, overlay: Path,
                                                     workdir: Path) -> None:
    source = workdir / "overlay-bind-source"
    source.mkdir(exist_ok=True)
    (source / "seen").write_text("bound\n")
    out = singpy.ok("exec", "-o", str(overlay), "-B", f"{source}:/brand/new", str(image), "cat", "/brand/new/seen")
    assert out == "bound\n"
    assert not (overlay / "upper" / "brand").exists()
    assert not (image / "brand").exists()


def test_overlay_over_a_sif(singpy: Singpy, overlay: Path, workdir: Path, fuse_open: str) -> None:
    sif = sifs.singpy_sif(workdir)
    before = traces(workdir)
    # A new top directory: a user can't copy up the image's own, owned by root (unmapped in their namespace).
    singpy.ok("exec", "-o", str(overlay), str(sif), "sh", "-c", "mkdir /data && echo on-sif > /data/file")
    assert (overlay / "upper" / "data" / "file").read_text() == "on-sif\n"
    assert singpy.ok("exec", "-o", f"{overlay}:ro", str(sif), "cat", "/data/file", "/etc/marker") == \
        f"on-sif\n{sifs.MARKER}\n"
    assert settled(before, workdir) == before


def test_fuse_overlayfs_driver(singpy: Singpy, image: Path, overlay: Path, workdir: Path, fuse_open: str) -> None:
    """`enable overlay = driver`: fuse-overlayfs serves the root, supervised, and is gone with the container."""
    before = traces(image, overlay)
    result = singpy.run("--config", str(driver_conf(workdir)), "-v", "exec", "-o", str(overlay), str(image), "sh",
                        "-c", f"echo fused > /opt/f && rm /srv/doomed && grep ' / / ' /proc/self/mountinfo; {SIBLINGS}")
    assert result.returncode == 0, result.stderr
    assert "root overlay: fuse-overlayfs" in result.stderr
    lines = result.stdout.splitlines()
    assert "fuse.fuse-overlayfs" in lines[0]
    helpers = [int(line.split()[0]) for line in lines[1:] if line.split()[1:] == ["fuse-overlayfs"]]
    assert len(helpers) == 1, result.stdout
    assert (overlay / "upper" / "opt" / "f").read_text() == "fused\n"
    assert (image / "srv" / "doomed").exists()
    # The kernel's overlayfs reads what fuse-overlayfs wrote, deletions included.
    assert singpy.run("exec", "-o", f"{overlay}:ro", str(image), "cat", "/srv/doomed").returncode != 0
    assert singpy.ok("exec", "-o", f"{overlay}:ro", str(image), "cat", "/opt/f") == "fused\n"
    assert wait_until_gone(helpers, "", timeout=5) == []
    assert all(not Path(f"/proc/{pid}").exists() or "fuse-overlayfs" not in Path(f"/proc/{pid}/comm").read_text()
               for pid in helpers)
    assert settled(before, image, overlay) == before


def test_fuse_overlayfs_needs_fuse(as_user: Singpy, workdir: Path, fuse_closed: str) -> None:
    image = workdir / "busybox"
    if not image.exists():
        build_busybox_rootfs(image)
    overlay = workdir / "ov" / "closed-fuse"
    overlay.mkdir(parents=True, exist_ok=True)
    result = as_user.run("--config", str(driver_conf(workdir)), "exec", "-o", f"{overlay}:ro", str(image), "true")
    assert_one_fatal(result, "the overlay needs fuse-overlayfs (`enable overlay = driver` in the configuration), "
                             "but /dev/fuse is not readable and writable by you")


@pytest.mark.parametrize("case", ["two-writable", "with-writable-tmpfs", "missing", "plain-file", "fifo",
                                  "upper-is-a-file"])
def test_bad_overlays_are_one_fatal(singpy: Singpy, image: Path, overlay: Path, case: str) -> None:
    second = overlay / "second"
    second.mkdir()
    os.chown(second, singpy.uid, singpy.gid)
    args, message = {
        "two-writable": (["-o", str(overlay), "-o", str(second)],
                         f"only one writable overlay can be used: {overlay} is writable already"),
        "with-writable-tmpfs": (["-o", str(overlay), "--writable-tmpfs"],
                                f"--writable-tmpfs can't be used with the writable overlay {overlay}"),
        "missing": (["-o", str(overlay / "nowhere")], f"overlay {overlay}/nowhere does not exist"),
        "plain-file": (["-o", str(overlay / "plain")], f"overlay {overlay}/plain is not a directory or an ext3 image"),
        "fifo": (["-o", str(overlay / "fifo")], f"overlay {overlay}/fifo is not a directory or an image file"),
        "upper-is-a-file": (["-o", str(overlay / "bad")], f"overlay {overlay}/bad: upper is not a directory"),
    }[case]
    (overlay / "plain").write_text("not an ext3 image\n" * 100)
    os.mkfifo(overlay / "fifo")
    (overlay / "bad").mkdir()
    (overlay / "bad" / "upper").write_text("")
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(overlay)], check=True)
    before_image, before = tree_digest(image), sorted(os.listdir(overlay))
    result = singpy.run("exec", *args, str(image), "true", timeout=20)
    assert_one_fatal(result, message)
    assert tree_digest(image) == before_image
    assert sorted(os.listdir(overlay)) == before
    assert not (second / "upper").exists()


@pytest.mark.parametrize("args", [["-o", "{overlay}:ro"], ["--writable-tmpfs"]], ids=["overlay", "writable-tmpfs"])
def test_enable_overlay_no_refuses_overlays(singpy: Singpy, image: Path, overlay: Path, workdir: Path,
                                           args: list[str]) -> None:
    conf = workdir / "overlay-no.conf"
    conf.write_text("enable overlay = no\n")
    result = singpy.run("--config", str(conf), "exec", *[arg.format(overlay=overlay) for arg in args], str(image),
                        "true")
    assert_one_fatal(result, "needs overlays, but `enable overlay = no` in the configuration")


def test_enable_overlay_no_adds_no_mount_point(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = workdir / "overlay-no.conf"
    conf.write_text("enable overlay = no\n")
    source = workdir / "overlay-bind-source"
    source.mkdir(exist_ok=True)
    assert singpy.ok("--config", str(conf), "exec", "--no-home", str(image), "sh", "-c",
                     "grep -c ' / / overlay' /proc/self/mountinfo || true") == "0\n"
    # The missing mount point goes in the underlay (issue 15), as in Apptainer: still no overlay.
    assert singpy.ok("--config", str(conf), "exec", "--no-home", "-B", f"{source}:/brand/new", str(image), "sh",
                     "-c", "test -d /brand/new && grep -c ' / / overlay' /proc/self/mountinfo || true") == "0\n"
    neither = workdir / "overlay-underlay-no.conf"
    neither.write_text("enable overlay = no\nenable underlay = no\n")
    result = singpy.run("--config", str(neither), "exec", "--no-home", "-B", f"{source}:/brand/new", str(image),
                        "true")
    assert_one_fatal(result, "/brand/new does not exist in the image (`enable overlay = no`")


def test_a_link_at_work_leaves_no_upper_behind(singpy: Singpy, image: Path, overlay: Path, workdir: Path) -> None:
    """upper/ and work/ are both checked before either is made: a refusal leaves the directory as it was."""
    target = Path(tempfile.mkdtemp(dir=workdir / "ov", prefix="target"))
    (overlay / "work").symlink_to(target)
    os.chown(overlay / "work", singpy.uid, singpy.gid, follow_symlinks=False)
    result = singpy.run("exec", "-o", str(overlay), str(image), "true", timeout=20)
    assert_one_fatal(result, f"overlay {overlay}: work is not a directory")
    assert sorted(os.listdir(overlay)) == ["work"]
    assert os.listdir(target) == []


# upper/ swapped for a link after singpy checked it, before the overlay is mounted (a race another user who can
# write the overlay directory could run against root), made deterministic: a wrapper runs singpy's own main
# with overlayfs._mount wrapped to do the swap first. It shows that the kernel (or fuse-overlayfs) gets the
# directory checked; it can't show the windows of other paths (the overlay directory itself is bound by path).
_SWAPPING = """
import os, sys
from singpy.layers import overlayfs, rootfs
original = overlayfs._mount
def swapped(*args, **kwargs):
    upper = rootfs.HOST + {upper!r}
    os.rename(upper, upper + ".checked")
    os.symlink({target!r}, upper)
    return original(*args, **kwargs)
overlayfs._mount = swapped
from singpy.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("driver", ["kernel", "fuse-overlayfs"])
def test_upper_swapped_for_a_link_after_the_check(singpy: Singpy, image: Path, overlay: Path, workdir: Path,
                                                  fuse_open: str, driver: str) -> None:
    import sys

    from tests.conftest import SINGPY

    target = Path(tempfile.mkdtemp(dir=workdir / "ov", prefix="target"))
    os.chown(target, singpy.uid, singpy.gid)
    (overlay / "upper").mkdir()
    (overlay / "work").mkdir()
    subprocess.run(["chown", "-R", f"{singpy.uid}:{singpy.gid}", str(overlay)], check=True)
    script = workdir / "ov" / f"swap-{singpy.profile}-{driver}.py"
    script.write_text(_SWAPPING.format(upper=str(overlay / "upper"), target=str(target)))
    config = ["--config", str(driver_conf(workdir))] if driver != "kernel" else []
    argv, ids = singpy.command([*config, "exec", "-o", str(overlay), str(image), "sh", "-c", "echo x > /opt/w"])
    argv[argv.index(SINGPY):argv.index(SINGPY) + 1] = [sys.executable, str(script)]
    result = subprocess.run(argv, env=singpy.env(), capture_output=True, text=True, timeout=30, **ids)  # type: ignore[call-overload]
    assert result.returncode == 0, result.stderr
    assert os.listdir(target) == []
    assert (overlay / "upper.checked" / "opt" / "w").read_text() == "x\n"

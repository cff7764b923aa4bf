"""Apptainer's admin directives applied (issue 11): what a user sees when the site's singpy.conf sets them.

Each case writes a configuration, runs the real singpy with `--config` as root and as the test user,
and checks what the user observes: ENOSPC past `sessiondir max size`, one FATAL naming the image
and the directive when an image is refused, a warning and the host's namespace when `allow ipc ns`
or `allow uts ns` is no, the refusal's wording for `allow net groups`. As Apptainer documents them,
the image limits do not apply to root, nor the session's size limit.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.configs import readable_config
from tests.support.leftovers import settled, traces

WRITE = "dd if=/dev/zero of=/{name} bs=1M count={count} 2>&1; echo {name}=$?"


def _conf(workdir: Path, name: str, text: str) -> Path:
    return readable_config(workdir, f"admin-{name}", text)


def _owner_name(path: Path) -> str:
    return pwd.getpwuid(path.stat().st_uid).pw_name


def _group_name(path: Path) -> str:
    return grp.getgrgid(path.stat().st_gid).gr_name


def _other_group(path: Path) -> str:
    gid = path.stat().st_gid
    return next(entry.gr_name for entry in grp.getgrall() if entry.gr_gid != gid)


def _other_user(path: Path) -> str:
    uid = path.stat().st_uid
    return next(entry.pw_name for entry in pwd.getpwall() if entry.pw_uid != uid)


# --- sessiondir max size, memory fs type -------------------------------------------------------------------------


def test_sessiondir_max_size_bounds_writable_tmpfs_for_users(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _conf(workdir, "session-4", "sessiondir max size = 4\n")
    script = WRITE.format(name="small", count=2) + "; rm /small; " + WRITE.format(name="big", count=8)
    out = singpy.ok("--config", str(conf), "exec", "--writable-tmpfs", str(image), "sh", "-c", script)
    assert "small=0" in out  # under the size: written
    if singpy.uid == 0:  # Apptainer gives root's session no size limit
        assert "big=0" in out, out
    else:
        assert "No space left on device" in out and "big=1" in out, out


def test_sessiondir_max_size_zero_is_no_limit(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _conf(workdir, "session-0", "sessiondir max size = 0\n")
    out = singpy.ok("--config", str(conf), "exec", "--writable-tmpfs", str(image), "sh", "-c",
                    WRITE.format(name="big", count=8))
    assert "big=0" in out, out


def test_memory_fs_type_ramfs_has_no_size(singpy: Singpy, image: Path, workdir: Path) -> None:
    """ramfs, as in Apptainer's session directory: no size limit (and no size to report)."""
    conf = _conf(workdir, "ramfs", "memory fs type = ramfs\nsessiondir max size = 4\n")
    out = singpy.ok("--config", str(conf), "exec", "--writable-tmpfs", str(image), "sh", "-c",
                    WRITE.format(name="big", count=8) + "; df -k / | tail -n 1")
    assert "big=0" in out, out
    assert out.splitlines()[-1].split()[1] == "0", out  # ramfs has no total size (a tmpfs would show one)


# --- max loop devices --------------------------------------------------------------------------------------------


def test_max_loop_devices(singpy: Singpy, workdir: Path) -> None:
    """Root mounts a SIF on a loop device: none below `max loop devices = 0`; a user's runs use none."""
    sif = sifs.singpy_sif(workdir)
    none = _conf(workdir, "loop-0", "max loop devices = 0\n")
    before = traces(sif)
    result = singpy.run("--config", str(none), "exec", str(sif), "cat", "/etc/marker")
    if singpy.uid == 0:
        assert_one_fatal(result, "no loop devices available")
        assert "max loop devices = 0" in result.stderr
        assert settled(before, sif) == before  # no device left attached, no mount
    else:
        assert (result.returncode, result.stdout) == (0, sifs.MARKER + "\n"), result.stderr
    enough = _conf(workdir, "loop-default", "max loop devices = 256\n")
    assert singpy.ok("--config", str(enough), "exec", str(sif), "cat", "/etc/marker") == sifs.MARKER + "\n"


# --- limit container paths / owners / groups ---------------------------------------------------------------------


def test_limit_container_paths(singpy: Singpy, image: Path, workdir: Path) -> None:
    elsewhere = _conf(workdir, f"paths-elsewhere-{singpy.profile}", "limit container paths = /nonexistent, "
                      f"{workdir}/busy\n")  # a string prefix of the image's path, not a directory holding it
    result = singpy.run("--config", str(elsewhere), "exec", str(image), "echo", "ran")
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    else:
        assert_one_fatal(result, f"image {image} is not under a directory the system administrator allows "
                                 "(limit container paths = ")
    allowed = _conf(workdir, "paths-allowed", f"limit container paths = /nonexistent, {image.parent}\n")
    assert singpy.ok("--config", str(allowed), "exec", str(image), "echo", "ran") == "ran\n"
    itself = _conf(workdir, "paths-itself", f"limit container paths = {image}\n")
    assert singpy.ok("--config", str(itself), "exec", str(image), "echo", "ran") == "ran\n"


def test_limit_container_paths_follows_links(singpy: Singpy, image: Path, workdir: Path) -> None:
    """A link in an allowed directory to an image elsewhere is the image elsewhere."""
    links = workdir / "admin-links"
    links.mkdir(mode=0o755, exist_ok=True)
    link = links / "busybox"
    if not link.is_symlink():
        link.symlink_to(image)
    conf = _conf(workdir, "paths-links", f"limit container paths = {links}\n")
    result = singpy.run("--config", str(conf), "exec", str(link), "echo", "ran")
    if singpy.uid == 0:
        assert result.returncode == 0, result.stderr
    else:
        assert_one_fatal(result, "limit container paths")


def test_relative_limit_container_path_is_a_config_error(singpy: Singpy, image: Path, workdir: Path) -> None:
    conf = _conf(workdir, "paths-relative", "# site\nlimit container paths = /scratch, images\n")
    assert_one_fatal(singpy.run("--config", str(conf), "exec", str(image), "true"),
                     f"{conf}:2: limit container paths 'images' is not a usable absolute path")


@pytest.mark.parametrize("which", ["owners", "groups"])
def test_limit_container_owners_and_groups(singpy: Singpy, image: Path, workdir: Path, which: str) -> None:
    owner, other = ((_owner_name(image), _other_user(image)) if which == "owners"
                    else (_group_name(image), _other_group(image)))
    kind = "user" if which == "owners" else "group"
    refused = _conf(workdir, f"{which}-other", f"limit container {which} = no-such-name-here, {other}\n")
    result = singpy.run("--config", str(refused), "exec", str(image), "echo", "ran")
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    else:
        assert_one_fatal(result, f"image {image} is owned by {kind} {owner}, not one the system administrator "
                                 f"allows (limit container {which} = no-such-name-here, {other})")
    allowed = _conf(workdir, f"{which}-owner",
                    f"limit container {which} = {other}\nlimit container {which} = {owner}\n")  # may repeat
    assert singpy.ok("--config", str(allowed), "exec", str(image), "echo", "ran") == "ran\n"


# --- allow container sif / squashfs / dir / extfs / encrypted ----------------------------------------------------


def _image_of_kind(kind: str, image: Path, workdir: Path) -> Path:
    return {"dir": image, "sif": sifs.singpy_sif(workdir), "squashfs": sifs.bare_squashfs(workdir)}[kind]


@pytest.mark.parametrize(("kind", "what"), [("dir", "sandbox directories"), ("sif", "SIF images"),
                                            ("squashfs", "squashfs images")])
def test_allow_container_kind(singpy: Singpy, image: Path, workdir: Path, kind: str, what: str) -> None:
    target = _image_of_kind(kind, image, workdir)
    others = [_image_of_kind(other, image, workdir) for other in ("dir", "sif", "squashfs") if other != kind]
    conf = _conf(workdir, f"no-{kind}", f"allow container {kind} = no\n")
    cached = sorted(os.listdir(singpy.cachedir))
    result = singpy.run("--config", str(conf), "exec", str(target), "echo", "ran")
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    else:
        assert_one_fatal(result, f"{what} are not allowed by the system administrator (allow container {kind} = no): "
                                 f"can't run {target}")
        assert sorted(os.listdir(singpy.cachedir)) == cached  # refused before anything is extracted
    for other in others:  # the other kinds still run
        assert singpy.ok("--config", str(conf), "exec", str(other), "echo", "ran") == "ran\n"


def test_allow_container_extfs_and_encrypted_change_nothing_singpy_runs(singpy: Singpy, image: Path,
                                                                        workdir: Path) -> None:
    """Neither directive refuses a sandbox, a SIF or a squashfs image (ext3 images: test_singularity2_images.py)."""
    conf = _conf(workdir, "no-extfs-encrypted", "allow container extfs = no\nallow container encrypted = no\n")
    for target in (image, sifs.singpy_sif(workdir), sifs.bare_squashfs(workdir)):
        assert singpy.ok("--config", str(conf), "exec", str(target), "echo", "ran") == "ran\n"


# --- the same limits on --overlay (Apptainer loads an overlay as an image) -------------------------------------


def _overlay_dir(workdir: Path, singpy: Singpy) -> Path:
    layer = workdir / f"admin-overlay-{singpy.profile}"
    (layer / "upper").mkdir(parents=True, exist_ok=True)
    (layer / "upper" / "from-overlay").write_text("layer\n")
    for path in (layer, layer / "upper", layer / "upper" / "from-overlay"):
        os.chown(path, singpy.uid, singpy.gid)
    return layer


def test_limit_container_paths_applies_to_overlays(singpy: Singpy, image: Path, workdir: Path) -> None:
    layer = _overlay_dir(workdir, singpy)
    conf = _conf(workdir, "paths-overlay", f"limit container paths = {image}\n")  # the image, not the overlay
    result = singpy.run("--config", str(conf), "exec", "--overlay", f"{layer}:ro", str(image), "cat", "/from-overlay")
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, "layer\n"), result.stderr
    else:
        assert_one_fatal(result, f"overlay {layer} is not under a directory the system administrator allows "
                                 f"(limit container paths = {image})")


def test_allow_container_dir_applies_to_overlay_directories(singpy: Singpy, workdir: Path) -> None:
    layer = _overlay_dir(workdir, singpy)
    squashfs = sifs.bare_squashfs(workdir)
    conf = _conf(workdir, "no-dir-overlay", "allow container dir = no\n")
    result = singpy.run("--config", str(conf), "exec", "--overlay", f"{layer}:ro", str(squashfs), "cat",
                        "/from-overlay")
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, "layer\n"), result.stderr
    else:
        assert_one_fatal(result, "overlay directories are not allowed by the system administrator "
                                 f"(allow container dir = no): can't use {layer}")


# --- allow ipc ns, allow uts ns ----------------------------------------------------------------------------------


@pytest.mark.parametrize("allowed", ["yes", "no"])
def test_allow_ipc_ns(singpy: Singpy, image: Path, workdir: Path, allowed: str) -> None:
    """As Apptainer: `no` runs the container without an IPC namespace (here with a warning)."""
    conf = _conf(workdir, f"ipc-{allowed}", f"allow ipc ns = {allowed}\n")
    result = singpy.run("--config", str(conf), "exec", "--ipc", str(image), "readlink", "/proc/self/ns/ipc")
    assert result.returncode == 0, result.stderr
    host = os.readlink("/proc/self/ns/ipc")  # the test user shares this process's IPC namespace
    if allowed == "no":
        assert result.stdout == host + "\n"
        assert result.stderr.startswith("WARNING:") and "(allow ipc ns = no)" in result.stderr
    else:
        assert result.stdout.startswith("ipc:[") and result.stdout != host + "\n"
        assert result.stderr == ""


@pytest.mark.parametrize("allowed", ["yes", "no"])
def test_allow_uts_ns(singpy: Singpy, image: Path, workdir: Path, allowed: str) -> None:
    """As Apptainer: `no` ignores --hostname (here with a warning); the host's name is never touched."""
    conf = _conf(workdir, f"uts-{allowed}", f"allow uts ns = {allowed}\n")
    host = socket.gethostname()
    result = singpy.run("--config", str(conf), "exec", "--hostname", "site-node", str(image), "hostname")
    assert result.returncode == 0, result.stderr
    assert socket.gethostname() == host
    if allowed == "no":
        assert result.stdout == host + "\n"
        assert result.stderr.startswith("WARNING:") and "--hostname ignored" in result.stderr
        assert "(allow uts ns = no)" in result.stderr
    else:
        assert (result.stdout, result.stderr) == ("site-node\n", "")


# --- allow net groups, allow netns paths -------------------------------------------------------------------------


def test_allow_net_groups(singpy: Singpy, image: Path, workdir: Path) -> None:
    """A member of a listed group (by name or gid) is allowed by the site; singpy still needs root for bridge."""
    if singpy.uid == 0:  # root is not limited by the allow net directives; --network none needs no host setup
        conf = _conf(workdir, "net-groups-root", "allow net groups = no-such-group\n")
        assert singpy.ok("--config", str(conf), "exec", "--net", "--network", "none", str(image), "echo", "ran") \
            == "ran\n"
        return
    group = grp.getgrgid(singpy.gid)
    for value in (group.gr_name, str(group.gr_gid)):
        member = _conf(workdir, f"net-groups-{value}", f"allow net groups = {value}\nallow net networks = bridge\n")
        result = singpy.run("--config", str(member), "exec", "--network", "bridge", str(image), "true")
        assert_one_fatal(result, f"network bridge needs root: singpy is never setuid, so it cannot create interfaces "
                                 f"on the host for user {singpy.user}, although singpy.conf allows it")
    other = next(entry.gr_name for entry in grp.getgrall()
                 if entry.gr_gid != singpy.gid and singpy.user not in entry.gr_mem)
    outsider = _conf(workdir, "net-groups-other", f"allow net groups = {other}\nallow net networks = bridge\n")
    result = singpy.run("--config", str(outsider), "exec", "--network", "bridge", str(image), "true")
    assert_one_fatal(result, f"network bridge is not allowed for user {singpy.user}")


# allow netns paths: tests/integration/test_netns_path.py

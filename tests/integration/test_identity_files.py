"""The container's /etc/passwd and /etc/group as Apptainer 1.5 writes them (its files/passwd.go, group.go and
addIdentityMount): every group of the user's, none for an image without the file, root's entry with --fakeroot,
the target's with --security uid:/gid: (root only: `as_root`).

Each test runs as root and as the test user (the `singpy` fixture). The supplementary groups are given to the
process that starts singpy (subprocess's `extra_groups`, setgroups(2) as root): groups the host's /etc/group
already has, so nothing on the host changes; a suite not run as root can't choose them and uses its own.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.users import ensure_test_user, is_root

IMAGE_PASSWD = "root:x:0:0:Image Root:/toor:/bin/ash\nnobody:x:65534:65534::/:/bin/false\n"
IMAGE_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _image(workdir: Path, name: str, *, passwd: str | None, group: str | None) -> Path:
    """A busybox sandbox with these /etc/passwd and /etc/group (None: the image has none)."""
    root = workdir / f"identity-{name}"
    if not root.exists():
        build_busybox_rootfs(root)
        for path, content in (("passwd", passwd), ("group", group)):
            (root / "etc" / path).unlink(missing_ok=True)
            if content is not None:
                (root / "etc" / path).write_text(content)
        readable_by_all(root)
    return root


def _unknown_gid() -> int:
    """A gid the host's group database has no entry for."""
    for gid in range(54321, 54421):
        try:
            grp.getgrgid(gid)
        except KeyError:
            return gid
    raise AssertionError("no free gid in 54321-54420")


def _run_with_groups(singpy: Singpy, extra: list[int], *args: str) -> subprocess.CompletedProcess[str]:
    """singpy ARGS as this profile's user, with `extra` as its supplementary groups."""
    argv, _ = singpy.command(list(args))
    return subprocess.run(argv, env=singpy.env(), cwd=str(singpy.workdir), user=singpy.uid, group=singpy.gid,
                          extra_groups=extra, capture_output=True, text=True, timeout=60)


def _host_groups(singpy: Singpy) -> tuple[list[int], list[int]]:
    """(supplementary gids to run with, those of them with a host entry): two of the host's groups the user's
    primary is not, and one without an entry, which Apptainer skips. Not root: the suite's own groups."""
    if not is_root():
        others = [gid for gid in os.getgroups() if gid != singpy.gid and _named(gid)]
        if not others:
            pytest.skip("the suite's user has no supplementary group with a host entry, and can't be given one")
        return others, others
    named = sorted({entry.gr_gid for entry in grp.getgrall()} - {singpy.gid, 0})[:2]
    if len(named) < 2:
        pytest.skip("the host's /etc/group has fewer than two groups besides the user's")
    return [named[1], _unknown_gid(), named[0]], named  # the kernel keeps them sorted: getgroups(2)'s order


def _named(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def test_every_group_of_the_user_is_added(singpy: Singpy, workdir: Path) -> None:
    """The primary group, then each supplementary group with a host entry (getgroups order), the user their
    member; a gid the host can't name is left out; the image's own lines stay first, as they were."""
    extra, named = _host_groups(singpy)
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    result = _run_with_groups(singpy, extra, "exec", str(image), "cat", "/etc/group")
    assert result.returncode == 0, result.stderr
    primary = grp.getgrgid(singpy.gid).gr_name
    added = [f"{primary}:x:{singpy.gid}:{singpy.user}"]
    added += [f"{grp.getgrgid(gid).gr_name}:x:{gid}:{singpy.user}" for gid in named]
    assert result.stdout == IMAGE_GROUP + "".join(f"{line}\n" for line in added)
    shown = _run_with_groups(singpy, extra, "exec", "--dry-run", str(image), "true")
    assert "\\n".join(added) in shown.stdout  # the plan shows what is written


def test_config_group_no_adds_no_group(singpy: Singpy, workdir: Path) -> None:
    extra, _ = _host_groups(singpy)
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    conf = workdir / "identity-no-group.conf"  # where the test user can read it
    conf.write_text("config group = no\n")
    conf.chmod(0o644)
    result = _run_with_groups(singpy, extra, "--config", str(conf), "exec", str(image), "cat", "/etc/group")
    assert (result.returncode, result.stdout) == (0, IMAGE_GROUP), result.stderr


def test_image_without_passwd_and_group_gets_none(singpy: Singpy, workdir: Path) -> None:
    """As Apptainer: nothing is bound (nor a mount point made) where the image has no such file; a warning each."""
    image = _image(workdir, "none", passwd=None, group=None)
    result = singpy.run("exec", str(image), "sh", "-c", "ls /etc; id -u")
    assert result.returncode == 0, result.stderr
    listed, uid = result.stdout.split()[:-1], result.stdout.split()[-1]
    assert "passwd" not in listed and "group" not in listed and uid == str(singpy.uid)
    assert result.stderr == "WARNING: passwd file doesn't exist in container, not updating\n" \
        "WARNING: group file doesn't exist in container, not updating\n"
    assert not (image / "etc" / "passwd").exists()


def test_image_with_an_empty_passwd_gets_the_entry(singpy: Singpy, workdir: Path) -> None:
    """An empty file is a file: the user's entry is its one line (Apptainer's fs.IsFile)."""
    image = _image(workdir, "empty", passwd="", group=None)
    result = singpy.run("exec", str(image), "cat", "/etc/passwd")
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[:3] for line in result.stdout.splitlines()] == [[singpy.user, "x", str(singpy.uid)]]
    assert result.stderr == "WARNING: group file doesn't exist in container, not updating\n"


def test_fakeroot_gets_the_images_root_entry(singpy: Singpy, workdir: Path) -> None:
    """--fakeroot: the image's root line with /root as its home (its name, gecos, gid and shell kept), the
    host's groups named for the user, as Apptainer (which then runs uid 0's addIdentityMount)."""
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    result = singpy.run("exec", "--fakeroot", str(image), "sh", "-c", 'cat /etc/passwd; whoami; echo "$HOME"')
    assert result.returncode == 0, result.stderr
    assert result.stdout == IMAGE_PASSWD.replace("/toor", "/root") + "root\n/root\n"
    group = singpy.ok("exec", "--fakeroot", str(image), "cat", "/etc/group")
    assert group.startswith(IMAGE_GROUP + f"{grp.getgrgid(singpy.gid).gr_name}:x:{singpy.gid}:{singpy.user}\n")


def test_fakeroot_on_an_image_without_root_gets_the_hosts_root_entry(singpy: Singpy, workdir: Path) -> None:
    """An image whose /etc/passwd has no uid 0 (built FROM scratch with its own users): --fakeroot appends the
    host's root entry (its name, gecos and shell) with /root as its home, so that `whoami` says root (Apptainer
    1.5 appends the user's own entry at their host uid, and uid 0 stays without a name: docs/isolation.md)."""
    image = _image(workdir, "no-root", passwd="app:x:1000:1000:App:/app:/bin/sh\n", group=IMAGE_GROUP)
    result = singpy.run("exec", "--fakeroot", str(image), "sh", "-c", "cat /etc/passwd; whoami")
    assert result.returncode == 0, result.stderr
    root = pwd.getpwuid(0)
    assert result.stdout == (f"app:x:1000:1000:App:/app:/bin/sh\n{root.pw_name}:x:0:0:{root.pw_gecos}:/root:"
                             f"{root.pw_shell}\n{root.pw_name}\n")


@pytest.mark.parametrize("flags", [["--writable-tmpfs"], ["--fakeroot", "--writable-tmpfs"]],
                         ids=["writable-tmpfs", "fakeroot-writable-tmpfs"])
def test_root_writing_the_container_keeps_the_images_files(singpy: Singpy, workdir: Path, flags: list[str]) -> None:
    """uid 0 inside a writable container (Apptainer: "skipping bind-mount of /etc/passwd and /etc/group"): the
    image's own files, which root may then edit; a user without --fakeroot still gets their entries."""
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    out = singpy.ok("exec", *flags, str(image), "sh", "-c", "cat /etc/passwd /etc/group")
    if singpy.uid == 0 or "--fakeroot" in flags:
        assert out == IMAGE_PASSWD + IMAGE_GROUP
    else:
        assert f"{singpy.user}:x:{singpy.uid}:" in out


def _unknown_uid() -> int:
    """A uid the host's passwd database has no entry for."""
    return next(uid for uid in range(54321, 54421) if uid not in {entry.pw_uid for entry in pwd.getpwall()})


def _target_line(target: pwd.struct_passwd) -> str:
    """uid N's passwd line as --security uid:N writes it: its host entry, root's home (the launcher's)."""
    return (f"{target.pw_name}:x:{target.pw_uid}:{target.pw_gid}:{target.pw_gecos}:{pwd.getpwuid(0).pw_dir}:"
            f"{target.pw_shell}\n")


@pytest.mark.parametrize("flags", [[], ["--writable-tmpfs"]], ids=["read-only", "writable-tmpfs"])
def test_security_uid_gets_that_users_host_entry(as_root: Singpy, workdir: Path, flags: list[str]) -> None:
    """--security uid:N as root: N's host entry and its own group (N the member), as Apptainer's
    setUserInfo(useTargetIDs); a writable container keeps them (the payload is not root)."""
    target = ensure_test_user()
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    out = as_root.ok("exec", *flags, "--security", f"uid:{target.pw_uid}", str(image), "sh", "-c",
                     "cat /etc/passwd /etc/group; whoami")
    group = f"{grp.getgrgid(target.pw_gid).gr_name}:x:{target.pw_gid}:{target.pw_name}\n"
    assert out == IMAGE_PASSWD + _target_line(target) + IMAGE_GROUP + group + f"{target.pw_name}\n"


def test_security_uid_and_gid_get_the_gid_groups(as_root: Singpy, workdir: Path) -> None:
    """With gid: the groups are the gid: list's (a gid the host can't name left out), not N's own."""
    target = ensure_test_user()
    named = sorted({entry.gr_gid for entry in grp.getgrall()} - {target.pw_gid, 0})[:2]
    if len(named) < 2:
        pytest.skip("the host's /etc/group has fewer than two groups besides the test user's")
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    gids = ":".join(str(gid) for gid in (named[1], _unknown_gid(), named[0]))
    out = as_root.ok("exec", "--security", f"uid:{target.pw_uid},gid:{gids}", str(image), "sh", "-c",
                     "cat /etc/passwd /etc/group; id -g")
    groups = "".join(f"{grp.getgrgid(gid).gr_name}:x:{gid}:{target.pw_name}\n" for gid in (named[1], named[0]))
    assert out == IMAGE_PASSWD + _target_line(target) + IMAGE_GROUP + groups + f"{named[1]}\n"


def test_security_gid_alone_keeps_roots_entry(as_root: Singpy, workdir: Path) -> None:
    """gid: alone (the payload stays uid 0): root's entry as without it, the gid: groups with root their member."""
    gid = sorted({entry.gr_gid for entry in grp.getgrall()} - {0})[0]
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    out = as_root.ok("exec", "--security", f"gid:{gid}", str(image), "cat", "/etc/passwd", "/etc/group")
    root = pwd.getpwuid(0)
    assert out == IMAGE_PASSWD.replace("/toor", root.pw_dir) + IMAGE_GROUP + \
        f"{grp.getgrgid(gid).gr_name}:x:{gid}:{root.pw_name}\n"


def test_security_uid_without_a_host_entry_leaves_the_images_files(as_root: Singpy, workdir: Path) -> None:
    """A uid the host's passwd lacks: a warning, and the image's two files as they are (Apptainer's warning and
    skipped binds), the payload still running as that uid."""
    uid = _unknown_uid()
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    result = as_root.run("exec", "--security", f"uid:{uid}", str(image), "sh", "-c",
                         "cat /etc/passwd /etc/group; id -u")
    assert (result.returncode, result.stdout) == (0, IMAGE_PASSWD + IMAGE_GROUP + f"{uid}\n"), result.stderr
    assert result.stderr == f"WARNING: --security uid:{uid}: the host has no passwd entry for uid {uid}: the " \
        "image's /etc/passwd and /etc/group are left as they are\n"


def _on_a_host_with(runner: Singpy, files: dict[str, str], workdir: Path,
                    *args: str) -> subprocess.CompletedProcess[str]:
    """singpy ARGS as `runner`'s user where the host's files (/etc/passwd, /etc/group) read as `files` say: copies
    bound over them in a mount namespace of this run's own, by root (the host's own files never change)."""
    binds = []
    for dest, text in files.items():
        copy = workdir / f"host{dest.replace('/', '-')}-{len(text)}"
        copy.write_text(text)
        copy.chmod(0o644)
        binds.append(f"mount --bind {shlex.quote(str(copy))} {dest}")
    drop = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}", "--clear-groups"] if runner.uid else []
    script = " && ".join([*binds, "exec " + " ".join(shlex.quote(word) for word in (*drop, SINGPY, *args))])
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=runner.env(),
                          cwd=runner.workdir, capture_output=True, text=True, timeout=60, check=False)


def test_a_primary_group_without_a_name_writes_no_group_file(as_root: Singpy, as_user: Singpy,
                                                              workdir: Path) -> None:
    """Apptainer's files.Group fails where the entry's primary group has no name on the host: a warning (Go's
    os/user words) and the image's /etc/group as it is; for the user's own entry and for --security uid:N."""
    image = _image(workdir, "groups", passwd=IMAGE_PASSWD, group=IMAGE_GROUP)
    own = grp.getgrgid(as_user.gid).gr_name
    without = "".join(line for line in Path("/etc/group").read_text().splitlines(keepends=True)
                      if not line.startswith(f"{own}:"))
    result = _on_a_host_with(as_user, {"/etc/group": without}, workdir, "exec", str(image), "cat", "/etc/group")
    assert (result.returncode, result.stdout) == (0, IMAGE_GROUP), result.stderr
    assert result.stderr == f"WARNING: group: unknown groupid {as_user.gid}\n"
    uid, gid = _unknown_uid(), _unknown_gid()
    ghost = f"singpy-ghost:x:{uid}:{gid}:Ghost:/nonexistent:/bin/sh\n"
    result = _on_a_host_with(as_root, {"/etc/passwd": Path("/etc/passwd").read_text() + ghost}, workdir, "exec",
                             "--security", f"uid:{uid}", str(image), "sh", "-c", "cat /etc/passwd /etc/group; id -u")
    assert result.stderr == f"WARNING: group: unknown groupid {gid}\n", result.stderr
    assert result.stdout == IMAGE_PASSWD + ghost.replace("/nonexistent", pwd.getpwuid(0).pw_dir) + IMAGE_GROUP + \
        f"{uid}\n"

"""Identity and namespaces: what a process inside sees, as root and as a user."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from pathlib import Path

from tests.conftest import SINGPY, Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs


def test_identity_is_the_invoking_user(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", str(image), "id")
    assert f"uid={singpy.uid}({singpy.user})" in out
    assert f"gid={singpy.gid}" in out


def test_passwd_and_group_carry_the_user(singpy: Singpy, image: Path) -> None:
    passwd = singpy.ok("exec", str(image), "cat", "/etc/passwd")
    assert f"{singpy.user}:x:{singpy.uid}:{singpy.gid}:" in passwd
    assert "nobody:x:65534" in passwd  # the image's own entries are kept
    group = singpy.ok("exec", str(image), "cat", "/etc/group")
    assert f":x:{singpy.gid}:{singpy.user}" in group


def _identity_image(singpy: Singpy, workdir: Path, name: str, passwd: list[str], group: str) -> Path:
    """A busybox sandbox of this profile with `passwd`'s lines and `group` as its /etc/passwd and /etc/group."""
    root = workdir / f"{name}-{singpy.profile}"
    if not root.exists():
        build_busybox_rootfs(root)
    (root / "etc" / "passwd").write_text("".join(f"{line}\n" for line in passwd))
    (root / "etc" / "group").write_text(group)
    readable_by_all(root)
    return root


def test_passwd_entry_of_the_users_uid_is_rewritten_in_place(singpy: Singpy, workdir: Path) -> None:
    """As Apptainer: the image's entry with the user's uid is theirs (name, gecos and home from the host, the
    image's gid and shell), not a second entry after it that getpwuid() never finds; root keeps the image's
    name, gecos and shell (/bin/ash: a busybox image has no /bin/bash)."""
    passwd = ["root:x:0:0:Image Root:/toor:/bin/ash", "daemon:x:1:1:daemon:/usr/sbin:/bin/false",
              f"ubuntu:x:{singpy.uid}:4242:Ubuntu:/home/ubuntu:/bin/ash", "nobody:x:65534:65534::/:/bin/false"]
    if singpy.uid == 0:
        del passwd[2]
    image = _identity_image(singpy, workdir, "identity-uid", passwd, "root:x:0:\n")
    name, home, *inside = singpy.ok("exec", str(image), "sh", "-c", 'id -un; echo "$HOME"; cat /etc/passwd').split("\n")
    assert (name, home, inside.pop()) == (singpy.user, singpy.home, "")
    mine = 0 if singpy.uid == 0 else 2
    passwd[mine] = f"root:x:0:0:Image Root:{singpy.home}:/bin/ash" if singpy.uid == 0 else \
        f"{singpy.user}:x:{singpy.uid}:4242:{pwd.getpwuid(singpy.uid).pw_gecos}:{singpy.home}:/bin/ash"
    assert inside == passwd
    assert [line for line in inside if line.split(":")[2] == str(singpy.uid)] == [passwd[mine]]


def test_group_keeps_the_images_groups_and_adds_the_users(singpy: Singpy, workdir: Path) -> None:
    """As Apptainer: the image's group of the same name keeps its members; the user's line comes after it."""
    group = grp.getgrgid(singpy.gid).gr_name
    image_group = f"nogroup:x:65534:\n{group}:x:{singpy.gid}:ubuntu,other"  # no newline at its end
    image = _identity_image(singpy, workdir, "identity-group", ["root:x:0:0:root:/root:/bin/sh"], image_group)
    inside = singpy.ok("exec", str(image), "cat", "/etc/group")
    assert inside == f"{image_group}\n{group}:x:{singpy.gid}:{singpy.user}\n"


def test_passwd_apptainer_cant_parse_is_left_as_it_is(singpy: Singpy, workdir: Path) -> None:
    """A line before the user's that is no passwd entry: the image's file as it is, and a warning, as Apptainer."""
    passwd = ["# written by hand", "root:x:0:0:root:/root:/bin/sh", f"ubuntu:x:{singpy.uid}:4242::/home/u:/bin/sh"]
    image = _identity_image(singpy, workdir, "identity-unparsed", passwd, "root:x:0:\n")
    result = singpy.run("exec", str(image), "cat", "/etc/passwd")
    assert (result.returncode, result.stdout) == (0, "".join(f"{line}\n" for line in passwd)), result.stderr
    assert result.stderr == "WARNING: the image's /etc/passwd is left as it is, without your entry: line " \
        "b'# written by hand' is not a passwd entry (7 fields, separated by ':')\n"


def test_home_that_would_split_the_passwd_entry_is_refused(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--home", f"{singpy.home}:/home/a\nevil", str(image), "cat", "/etc/passwd")
    assert_one_fatal(result, "can't write the container's /etc/passwd: the home '/home/a\\nevil' holds a ':' or a "
                     "line break")


def test_home_from_the_environment_of_an_unknown_uid(as_root: Singpy, image: Path) -> None:
    """A uid the host's passwd lacks gets $HOME as its home in the container's passwd, never a second entry."""
    uid = next(uid for uid in range(43210, 43310) if not _known(uid))
    home = f"/singpy-absent-home-{uid}-{os.getpid()}"  # not under a bound host directory
    ok = _run_as(uid, home, as_root, "exec", str(image), "grep", f":x:{uid}:", "/etc/passwd")
    assert (ok.returncode, ok.stdout) == (0, f"{uid}:x:{uid}:{uid}::{home}:/bin/sh\n"), ok.stderr
    for bad in ("/tmp/x\nevil::0:0::/:/bin/sh", "/tmp/a:b"):
        assert_one_fatal(_run_as(uid, bad, as_root, "exec", str(image), "true"),
                         f"the home {bad!r} holds a ':' or a line break")
    assert not os.path.exists(home)


def _run_as(uid: int, home: str, root: Singpy, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SINGPY, *args], user=uid, group=uid, extra_groups=[], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "TMPDIR": str(root.tmpdir), "HOME": home}, cwd="/", timeout=60)


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_image_file_is_not_modified(singpy: Singpy, image: Path) -> None:
    before = (image / "etc" / "passwd").read_text()
    singpy.ok("exec", str(image), "true")
    assert (image / "etc" / "passwd").read_text() == before


def test_unprivileged_payload_has_no_capabilities(as_user: Singpy, image: Path) -> None:
    status = as_user.ok("exec", str(image), "cat", "/proc/self/status")
    caps = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Cap")}
    assert caps["CapEff"] == caps["CapPrm"] == "0000000000000000"


def test_no_new_privs_is_set(singpy: Singpy, image: Path) -> None:
    status = singpy.ok("exec", str(image), "cat", "/proc/self/status")
    assert "NoNewPrivs:\t1" in status


def test_mount_namespace_is_private(singpy: Singpy, image: Path) -> None:
    inside = singpy.ok("exec", str(image), "readlink", "/proc/self/ns/mnt").strip()
    assert inside != os.readlink("/proc/self/ns/mnt")


def test_pid_namespace(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", "--pid", str(image), "sh", "-c", "echo $$; ps -o pid | tail -n +2")
    pid, *visible = out.split()
    # PID 1 is singpy's init, which forwards signals (as Apptainer's sinit); the payload comes next.
    assert pid == "2"
    assert visible[0] == "1" and len(visible) <= 4  # init, sh, ps, tail


def test_without_pid_namespace_host_pids_are_visible(singpy: Singpy, image: Path) -> None:
    out = singpy.ok("exec", str(image), "sh", "-c", "echo $$")
    assert int(out) > 1


def test_ipc_and_uts_namespaces(singpy: Singpy, image: Path) -> None:
    for flag, ns in (("--ipc", "ipc"), ("--uts", "uts")):
        inside = singpy.ok("exec", flag, str(image), "readlink", f"/proc/self/ns/{ns}").strip()
        assert inside != os.readlink(f"/proc/self/ns/{ns}"), flag
    same = singpy.ok("exec", str(image), "readlink", "/proc/self/ns/uts").strip()
    assert same == os.readlink("/proc/self/ns/uts")


def test_hostname(singpy: Singpy, image: Path) -> None:
    assert singpy.ok("exec", "--hostname", "box42", str(image), "hostname").strip() == "box42"
    # and in /etc/hostname, as Apptainer binds it (addHostnameMount): the busybox image has none of its own
    assert singpy.ok("exec", "--hostname", "box42", str(image), "cat", "/etc/hostname") == "box42\n"
    assert not (image / "etc" / "hostname").exists()
    assert os.uname().nodename != "box42"


def test_containall_implies_pid_ipc_and_cleanenv(singpy: Singpy, image: Path) -> None:
    env = singpy.env(MARKER="host")
    out = singpy.ok("exec", "--containall", str(image), "sh", "-c",
                    "echo $$; readlink /proc/self/ns/ipc; echo marker=$MARKER", env=env)
    pid, ipc, marker = out.split()
    assert pid == "2"
    assert ipc != os.readlink("/proc/self/ns/ipc")
    assert marker == "marker="

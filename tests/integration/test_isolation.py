"""Identity and namespaces: what a process inside sees, as root and as a user."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import Singpy


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
    assert os.uname().nodename != "box42"


def test_containall_implies_pid_ipc_and_cleanenv(singpy: Singpy, image: Path) -> None:
    env = singpy.env(MARKER="host")
    out = singpy.ok("exec", "--containall", str(image), "sh", "-c",
                    "echo $$; readlink /proc/self/ns/ipc; echo marker=$MARKER", env=env)
    pid, ipc, marker = out.split()
    assert pid == "2"
    assert ipc != os.readlink("/proc/self/ns/ipc")
    assert marker == "marker="

"""--fusemount: real FUSE programs (squashfuse) serving mounts in the container, as root and as a user.

`host:` runs the host's squashfuse on a squashfs file of the host; `container:`
runs the squashfuse of an image that carries it (and its libraries). /dev/fuse
open (0666) and closed (0600) are simulated for singpy alone (the `fuse`
fixtures); closed, a user gets one FATAL line. Nothing may be left behind:
no mount naming the test's files, no squashfuse process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal, readable_by_all
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import descendants, settled, traces, wait_for_descendants, wait_until_gone

pytestmark = pytest.mark.skipif(shutil.which("squashfuse") is None or shutil.which("mksquashfs") is None,
                                reason="needs squashfuse and mksquashfs (Debian packages squashfuse, squashfs-tools)")

TEXT = "served by squashfuse\n"


@pytest.fixture(scope="module")
def squash(workdir: Path) -> Path:
    """A squashfs file holding hello.txt, readable by the test user."""
    path = workdir / "fusemount" / "data.sqfs"
    if not path.exists():
        source = workdir / "fusemount" / "src"
        source.mkdir(parents=True)
        (source / "hello.txt").write_text(TEXT)
        subprocess.run(["mksquashfs", str(source), str(path), "-quiet", "-noappend", "-all-root"], check=True,
                       stdout=subprocess.DEVNULL)
        readable_by_all(path.parent)
    return path


@pytest.fixture(scope="module")
def fuse_image(workdir: Path, squash: Path) -> Path:
    """A busybox image that carries squashfuse, its libraries and the squashfs file (for container:)."""
    root = workdir / "busybox-squashfuse"
    if not root.exists():
        build_busybox_rootfs(root)
        program = shutil.which("squashfuse")
        assert program is not None
        listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
        needed = [program, *(word for line in listed.splitlines() for word in line.split() if word.startswith("/"))]
        for path in needed:
            real = os.path.realpath(path)
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, target)
        shutil.copy2(squash, root / "data.sqfs")
        (root / "mnt" / "sq").mkdir(parents=True, exist_ok=True)
        readable_by_all(root)
    return root


def test_host_program_serves_a_mount(singpy: Singpy, image: Path, squash: Path, fuse_open: str) -> None:
    before = traces(squash)
    out = singpy.ok("exec", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image),
                    "sh", "-c", "cat /mnt/data/hello.txt; grep ' /mnt/data ' /proc/mounts")
    text, mount = out.split("\n", 1)
    assert text + "\n" == TEXT
    assert "fuse.squashfuse" in mount and "nosuid" in mount and "nodev" in mount
    assert settled(before, squash) == before


def test_container_program_serves_a_mount(singpy: Singpy, fuse_image: Path, fuse_open: str) -> None:
    """The program, its libraries and its file are the image's: the host's tree plays no part."""
    before = traces(fuse_image)
    out = singpy.ok("exec", "--fusemount", "container:squashfuse /data.sqfs /mnt/sq", str(fuse_image),
                    "cat", "/mnt/sq/hello.txt")
    assert out == TEXT
    assert settled(before, fuse_image) == before


def test_fusemount_implies_pid_and_its_program_is_inside(singpy: Singpy, image: Path, squash: Path,
                                                         fuse_open: str) -> None:
    out = singpy.ok("exec", "--fusemount", f"host-daemon:squashfuse {squash} /mnt/data", str(image),
                    "sh", "-c", "echo $$; ps -o comm")
    pid, *commands = out.split()
    assert pid != "1" and "squashfuse" in commands  # its own PID namespace, the program in it


def test_several_mounts_from_the_environment(singpy: Singpy, image: Path, squash: Path, fuse_open: str) -> None:
    env = singpy.env(APPTAINER_FUSESPEC=f"host:squashfuse {squash} /mnt/a")
    out = singpy.ok("exec", "--fusemount", f"host:squashfuse {squash} /opt/b", str(image),
                    "cat", "/opt/b/hello.txt", env=env)
    assert out == TEXT  # the command line's value stands in for the variable's, as for Apptainer's flags


def test_closed_fuse_is_one_fatal_line_for_a_user(as_user: Singpy, image: Path, squash: Path,
                                                  fuse_closed: str) -> None:
    result = as_user.run("exec", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image), "true")
    assert_one_fatal(result, "--fusemount needs FUSE, and /dev/fuse is not readable and writable by you")


def test_closed_fuse_is_no_matter_for_root(as_root: Singpy, image: Path, squash: Path, fuse_closed: str) -> None:
    out = as_root.ok("exec", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image),
                     "cat", "/mnt/data/hello.txt")
    assert out == TEXT


def test_a_failing_program_is_one_fatal_line(singpy: Singpy, image: Path, workdir: Path, fuse_open: str) -> None:
    missing = workdir / "no-such.sqfs"
    before = traces(image)
    result = singpy.run("exec", "--fusemount", f"host:squashfuse {missing} /mnt/data", str(image), "true")
    assert_one_fatal(result, "--fusemount on /mnt/data: squashfuse failed")
    assert settled(before, image) == before


def test_a_program_that_never_answers_is_one_fatal_line(singpy: Singpy, image: Path, workdir: Path,
                                                        fuse_open: str) -> None:
    """A program that lives on but never answers FUSE: stopped after 10 s, one FATAL line, nothing left."""
    marker = workdir / f"silent-fuse-{singpy.profile}.log"
    marker.write_text("")
    program = workdir / f"silent-fuse-{singpy.profile}.sh"
    program.write_text(f"#!/bin/sh\nexec tail -f {marker}\n")  # alive, silent, named by `traces`
    program.chmod(0o755)
    readable_by_all(marker)
    before = traces(image, marker)
    started = time.monotonic()
    result = singpy.run("exec", "--fusemount", f"host:{program} /mnt/f", str(image), "echo", "hi", timeout=30)
    assert time.monotonic() - started < 20
    assert_one_fatal(result, "--fusemount on /mnt/f: " + program.name + " did not answer in 10 s")
    assert settled(before, image, marker) == before


@pytest.mark.parametrize(("spec", "message"), [
    ("host:squashfuse", "no whitespace separators found in command"),
    ("remote:squashfuse x /mnt", "fusemount spec begin with an unknown prefix remote"),
    ("host:squashfuse x mnt", "the mount point must be an absolute path in the container"),
    ("host:squashfuse x /", "the mount point must be an absolute path in the container, not its root"),
])
def test_bad_specs_are_usage_errors(singpy: Singpy, image: Path, spec: str, message: str) -> None:
    assert_one_fatal(singpy.run("exec", "--fusemount", spec, str(image), "true"), message, code=1)


def test_missing_host_program(singpy: Singpy, image: Path) -> None:
    result = singpy.run("exec", "--fusemount", "host:no-such-fuse-program x /mnt/x", str(image), "true")
    assert_one_fatal(result, "FUSE program no-such-fuse-program not found on the host")


def test_missing_container_program(singpy: Singpy, image: Path, fuse_open: str) -> None:
    result = singpy.run("exec", "--fusemount", "container:no-such-fuse-program x /mnt/x", str(image), "true")
    assert_one_fatal(result, "FUSE program no-such-fuse-program not found in the container")


def test_enable_fusemount_no(singpy: Singpy, image: Path, squash: Path, workdir: Path) -> None:
    conf = workdir / f"fusemount-off-{singpy.profile}.conf"
    conf.write_text("enable fusemount = no\n")
    conf.chmod(0o644)
    result = singpy.run("--config", str(conf), "exec", "--fusemount", f"host:squashfuse {squash} /mnt/d",
                        str(image), "true")
    assert_one_fatal(result, "fusemount disabled by configuration 'enable fusemount = no'")


def test_dry_run_shows_the_fuse_mounts(singpy: Singpy, image: Path, squash: Path, fuse_open: str) -> None:
    import json

    out = singpy.ok("exec", "--dry-run", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image), "true")
    plan = json.loads(out)["plan"]
    assert plan["fusemounts"] == [{"side": "host", "program": [shutil.which("squashfuse"), str(squash)],
                                   "mountpoint": "/mnt/data", "daemon": False}]
    assert plan["namespaces"]["pid"] is True
    assert any(mount["op"] == "tmpfs" and mount["dest"] == "/mnt/data" for mount in plan["mounts"])


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killed_launcher_leaves_nothing(singpy: Singpy, image: Path, squash: Path, fuse_open: str, how: str) -> None:
    """Whatever way the launcher ends, the FUSE program and the payload end with it (and so does the mount)."""
    before = traces(squash)
    process = singpy.popen(["exec", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image),
                            "sleep", "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    payload = wait_for_descendants(process.pid, "sleep 300")
    program = [pid for pid, line in descendants(process.pid).items() if line.startswith(shutil.which("squashfuse")
                                                                                           or "squashfuse")]
    assert payload and program, process.communicate(timeout=5)
    process.send_signal(getattr(signal, how))
    process.communicate(timeout=20)
    assert process.returncode == (-9 if how == "SIGKILL" else 143)
    assert wait_until_gone(payload, "sleep 300") == []
    assert settled(before, squash, timeout=10) == before  # no squashfuse naming the file, no mount of it


def test_fakeroot_user_serves_a_mount(as_user: Singpy, image: Path, squash: Path, fuse_open: str) -> None:
    out = as_user.ok("exec", "--fakeroot", "--fusemount", f"host:squashfuse {squash} /mnt/data", str(image),
                     "sh", "-c", "id -u; stat -c %u /mnt/data/hello.txt; cat /mnt/data/hello.txt")
    assert out == "0\n0\n" + TEXT  # root inside, and the files served as root's (squashfuse's -all-root image)


def test_container_program_runs_as_the_payload(singpy: Singpy, fuse_image: Path, fuse_open: str) -> None:
    """A program of the image gets what the payload gets: no_new_privs, and root's capabilities less --no-privs."""
    out = singpy.ok("exec", "--no-privs", "--fusemount", "container:squashfuse /data.sqfs /mnt/sq", str(fuse_image),
                    "sh", "-c", "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = squashfuse ] && "
                    "grep -E '^(CapEff|NoNewPrivs):' $p/status; done; true")
    # squashfuse daemonizes: under load its first process may not be gone yet, with the same status as the second
    words = out.split()
    assert words and [words[index:index + 4] for index in range(0, len(words), 4)] == \
        [["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]] * (len(words) // 4), out

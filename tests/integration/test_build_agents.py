"""`Bootstrap: debootstrap|yum|dnf|zypper|arch|busybox`: root filesystems made by a host tool (issue 28).

debootstrap for real, against the Debian mirror this machine reaches (skipped with the reason where it
can't); the tools this host lacks (dnf, zypper, pacstrap) at their boundary: a recording program of that
name first on PATH, which writes down how it was called (its arguments, its uid) and fills the new root
from the busybox base as the real tool would, so that the rest of the build (%post, the SIF) runs for
real. busybox downloads the real busybox binary from a local web server. As root and as the unprivileged
test user (whose tools run as root of the build's user namespace, with its subordinate ids).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.answering import Answering
from tests.support.leftovers import descendants, settled, traces, wait_for_descendants, wait_until_gone
from tests.support.recipes import (
    base_sandbox,
    build_dirs,
    out_dir,
    read_until,
    sif_owners,
    subordinate_ranges,
    write_recipe,
)

BUILD_TIMEOUT = 120
DEBOOTSTRAP_TIMEOUT = 900  # a minimal Debian: about 35 MB from the mirror, then dpkg on 2 shared cores
MIRROR = ("deb.debian.org", 80)

# The recording host tool: one script, linked under each tool's name.
RECORDER = """#!/usr/bin/python3
import json, os, subprocess, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if name == "rpm":
    print("/var/lib/rpm")
    sys.exit(0)
record = {"tool": name, "argv": args, "uid": os.getuid()}
root = ""
for flag in ("--installroot", "--root"):
    if flag in args:
        root = args[args.index(flag) + 1]
if name == "pacstrap":
    root = args[args.index("-M") + 1]
    record["conf"] = open(args[args.index("-C") + 1]).read()
if name == "dnf":
    record["config"] = open(args[args.index("-c") + 1]).read()
if name == "arch-chroot":
    root = ""
record["dev_null"] = os.path.exists(os.path.join(root, "dev/null")) if root else False
with open(os.path.join(os.environ["RECORD"], "calls"), "a") as out:
    out.write(json.dumps(record) + "\\n")
if os.environ.get("HANG"):
    print("tool-is-hanging", flush=True)
    subprocess.run(["sleep", "300"])
if root and ("install" in args or name == "pacstrap"):
    subprocess.run(["cp", "-R", os.environ["BASE"] + "/.", root], check=True)
"""


def build(singpy: Singpy, *args: str, env: dict[str, str] | None = None,
          timeout: float = BUILD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    result = singpy.run("build", *args, env=env, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result


def recorders(out: Path) -> Path:
    """A directory of recording dnf, rpm, zypper, pacstrap and arch-chroot, for PATH."""
    where = out / "tools"
    where.mkdir()
    (where / "recorder").write_text(RECORDER)
    (where / "recorder").chmod(0o755)
    for name in ("dnf", "rpm", "zypper", "pacstrap", "arch-chroot"):
        (where / name).symlink_to("recorder")
    (out / "record").mkdir()
    os.chmod(out / "record", 0o777)
    return where


def calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "record" / "calls").read_text().splitlines()]


def tool_env(singpy: Singpy, out: Path, workdir: Path) -> dict[str, str]:
    return singpy.env(PATH=f"{out / 'tools'}:/usr/bin:/bin", RECORD=str(out / "record"),
                      BASE=str(base_sandbox(workdir)))


POST = """
    %post
        echo "post ran as $(id -u)" > /post-made
    """


@pytest.mark.parametrize("agent", ["dnf", "yum"])
def test_dnf_is_called_as_apptainer_calls_it(singpy: Singpy, workdir: Path, agent: str) -> None:
    out = out_dir(singpy, workdir, f"agent-{agent}")
    recorders(out)
    recipe = write_recipe(out, f"""
        Bootstrap: {agent}
        OSVersion: 9
        MirrorURL: http://mirror.example/rocky/%{{OSVERSION}}/BaseOS/x86_64/os/
        UpdateURL: http://mirror.example/rocky/%{{OSVERSION}}/AppStream/x86_64/os/
        Include: vim-minimal
        """ + POST)
    sif = out / "image.sif"
    build(singpy, str(sif), str(recipe), env=tool_env(singpy, out, workdir))
    (call,) = calls(out)
    assert call["tool"] == "dnf" and call["uid"] == 0 and call["dev_null"]
    root = call["argv"][call["argv"].index("--installroot") + 1]
    assert call["argv"] == ["--noplugins", "-c", f"{root}/etc/bootstrap-yum.conf", "--installroot", root,
                            "--releasever=9", "-y", "install", "/etc/redhat-release", "coreutils", "vim-minimal"]
    assert "baseurl=http://mirror.example/rocky/9/BaseOS/x86_64/os/" in call["config"]
    assert "baseurl=http://mirror.example/rocky/9/AppStream/x86_64/os/" in call["config"]
    assert singpy.ok("exec", str(sif), "cat", "/post-made") == "post ran as 0\n"
    assert "/etc/bootstrap-yum.conf" in sif_owners(sif)  # as Apptainer leaves it
    assert build_dirs(out) == []


def test_zypper_adds_the_repositories_then_installs(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "agent-zypper")
    recorders(out)
    recipe = write_recipe(out, """
        Bootstrap: zypper
        OSVersion: 15.6
        MirrorURL: http://mirror.example/leap/%{OSVERSION}/repo/oss/
        Include: zypper
        """ + POST)
    sif = out / "image.sif"
    build(singpy, str(sif), str(recipe), env=tool_env(singpy, out, workdir))
    recorded = calls(out)
    root = recorded[0]["argv"][1]
    assert [call["argv"] for call in recorded] == [
        ["--root", root, "ar", "http://mirror.example/leap/15.6/repo/oss/", "repo"],
        ["--root", root, "--gpg-auto-import-keys", "refresh"],
        ["--non-interactive", "-c", f"{root}/etc/zypp/zypp.conf", "--root", root, "--releasever=15.6", "-n",
         "install", "--auto-agree-with-licenses", "--download-in-advance", "aaa_base", "zypper"]]
    assert {call["uid"] for call in recorded} == {0}
    assert singpy.ok("exec", str(sif), "cat", "/post-made") == "post ran as 0\n"


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def web(workdir: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server of a directory of its own: (base URL, directory)."""
    where = workdir / f"web-{os.getpid()}-{threading.get_ident()}"
    where.mkdir(exist_ok=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files, directory=str(where)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", where
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_arch_runs_pacstrap_with_the_configuration_from_confurl(singpy: Singpy, workdir: Path,
                                                                 web: tuple[str, Path]) -> None:
    url, served = web
    (served / "pacman.conf").write_text("[options]\nArchitecture = auto\n")
    out = out_dir(singpy, workdir, "agent-arch")
    recorders(out)
    recipe = write_recipe(out, f"""
        Bootstrap: arch
        ConfURL: {url}/pacman.conf
        Include: base-devel
        """ + POST)
    sandbox = out / "sandbox"
    build(singpy, "--sandbox", str(sandbox), str(recipe), env=tool_env(singpy, out, workdir))
    pacstrap, keys, cleanup = calls(out)
    assert pacstrap["tool"] == "pacstrap" and pacstrap["conf"] == "[options]\nArchitecture = auto\n"
    assert pacstrap["argv"][:2] == ["-C", pacstrap["argv"][1]] and pacstrap["argv"][2:5] == ["-c", "-G", "-M"]
    assert pacstrap["argv"][6:] == ["haveged", "base-devel"]
    assert keys["argv"][1:3] == ["/bin/sh", "-c"] and "pacman-key --populate archlinux" in keys["argv"][3]
    assert cleanup["argv"][1:] == ["pacman", "-Rs", "--noconfirm", "haveged"]
    assert (sandbox / "post-made").read_text() == "post ran as 0\n"


def test_busybox_downloads_the_binary_and_installs_its_applets(singpy: Singpy, workdir: Path,
                                                              web: tuple[str, Path]) -> None:
    url, served = web
    busybox = shutil.which("busybox") or "/bin/busybox"
    shutil.copy(busybox, served / "busybox")
    out = out_dir(singpy, workdir, "agent-busybox")
    recipe = write_recipe(out, f"""
        Bootstrap: busybox
        MirrorURL: {url}/busybox
        """ + POST)
    sif = out / "image.sif"
    build(singpy, str(sif), str(recipe))
    assert singpy.ok("exec", str(sif), "cat", "/post-made") == "post ran as 0\n"
    passwd = subprocess.run(["unsquashfs", "-o", str(sifs.primary_offset(sif)), "-cat", str(sif), "etc/passwd"],
                            capture_output=True, text=True, check=True).stdout
    assert passwd == "root:!:0:0:root:/root:/bin/sh"  # Apptainer's (singpy exec binds the host's over it)
    listing = sif_owners(sif)
    assert "/bin/busybox" in listing and "/bin/ls" in listing and "/bin/sh" in listing


@pytest.mark.parametrize("failure", ["404", "garbage"])
def test_busybox_mirror_that_fails_is_one_error_and_leaves_nothing(singpy: Singpy, workdir: Path,
                                                                  web: tuple[str, Path], failure: str) -> None:
    url, _ = web
    out = out_dir(singpy, workdir, f"agent-busybox-{failure}")
    garbage = Answering(b"GARBAGE\r\n\r\n") if failure == "garbage" else None  # no HTTP status line at all
    mirror = f"http://127.0.0.1:{garbage.port}/busybox" if garbage else f"{url}/missing"
    recipe = write_recipe(out, f"Bootstrap: busybox\nMirrorURL: {mirror}\n")
    before = traces(out)
    try:
        result = singpy.run("build", str(out / "image.sif"), str(recipe), timeout=BUILD_TIMEOUT)
    finally:
        if garbage:
            garbage.stop()
    expected = "GARBAGE" if garbage else "404"
    assert result.returncode == 255 and "FATAL:" in result.stderr and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(os.listdir(out)) == ["recipe.def"]
    assert settled(before, out) == before


@pytest.mark.parametrize(("agent", "package"), [("dnf", "dnf"), ("yum", "dnf"), ("zypper", "zypper"),
                                                ("arch", "arch-install-scripts")])
def test_a_missing_host_tool_is_one_fatal_line_naming_the_package(singpy: Singpy, workdir: Path, agent: str,
                                                                  package: str) -> None:
    tool = {"dnf": "dnf", "yum": "dnf", "zypper": "zypper", "arch": "pacstrap"}[agent]
    if any(os.path.exists(f"{where}/{tool}") for where in ("/usr/bin", "/bin", "/usr/sbin", "/sbin")):
        pytest.skip(f"this host has {tool}")
    out = out_dir(singpy, workdir, f"agent-missing-{agent}")
    recipe = write_recipe(out, f"Bootstrap: {agent}\nOSVersion: 9\nMirrorURL: http://mirror.example/\n" + POST)
    result = singpy.run("build", str(out / "image.sif"), str(recipe), timeout=BUILD_TIMEOUT)
    assert_one_fatal(result, f"install the {package} package (apt-get install {package})")
    assert sorted(os.listdir(out)) == ["recipe.def"]


def test_a_signal_while_the_tool_runs_ends_it_and_leaves_nothing(singpy: Singpy, workdir: Path) -> None:
    out = out_dir(singpy, workdir, "agent-interrupted")
    recorders(out)
    recipe = write_recipe(out, "Bootstrap: zypper\nMirrorURL: http://mirror.example/\n" + POST)
    before = traces(out)
    process = singpy.popen(["build", str(out / "image.sif"), str(recipe)],
                           env={**tool_env(singpy, out, workdir), "HANG": "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = read_until(process, "tool-is-hanging")
    assert wait_for_descendants(process.pid, "sleep 300"), descendants(process.pid)
    started = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=30)
    assert process.returncode == 255 and "interrupted by SIGTERM" in rest, seen + rest
    left = {pid: command for pid, command in started.items() if wait_until_gone([pid], command, timeout=5)}
    assert left == {}, left  # the tool, its namespace helper and its sleep
    assert sorted(os.listdir(out)) == ["recipe.def", "record", "tools"]
    assert settled(before, out) == before


def test_a_user_without_subordinate_ids_is_told_why(as_user: Singpy, workdir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    out = out_dir(as_user, workdir, "agent-no-range")
    recorders(out)
    recipe = write_recipe(out, "Bootstrap: dnf\nMirrorURL: http://mirror.example/\n" + POST)
    with subordinate_ranges(as_user, workdir, "agent-no-range", present=False):
        result = as_user.run("-q", "build", str(out / "image.sif"), str(recipe), env=tool_env(as_user, out, workdir),
                             timeout=BUILD_TIMEOUT)
    assert_one_fatal(result, "Bootstrap: dnf as a user needs a subordinate id range")
    assert not (out / "record" / "calls").exists()  # the tool never ran
    assert sorted(os.listdir(out)) == ["recipe.def", "record", "tools"]


# --- debootstrap, for real -------------------------------------------------------------------------------------------


def _mirror_problem() -> str:
    if shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        return "debootstrap is not installed (apt-get install debootstrap)"
    try:
        socket.create_connection(MIRROR, timeout=10).close()
    except OSError as error:
        return f"the Debian mirror {MIRROR[0]} can't be reached: {error}"
    return ""


DEBIAN = """
    Bootstrap: debootstrap
    OSVersion: bookworm
    MirrorURL: http://deb.debian.org/debian
    Include: busybox

    %post
        echo "debian $(cat /etc/debian_version) built as $(id -u)" > /made

    %runscript
        exec busybox echo "runs"
    """


@pytest.fixture(scope="module")
def debian(singpy: Singpy, workdir: Path) -> Path:
    problem = _mirror_problem()
    if problem:
        pytest.skip(problem)
    out = out_dir(singpy, workdir, "agent-debootstrap")
    recipe = write_recipe(out, DEBIAN)
    before = traces(out)
    result = build(singpy, str(out / "debian.sif"), str(recipe), timeout=DEBOOTSTRAP_TIMEOUT)
    assert "I: Base system installed successfully." in result.stdout + result.stderr
    assert build_dirs(out) == []
    assert settled(before, out) == before  # debootstrap's /proc and /sys mounts ended with it
    return out / "debian.sif"


def test_debootstrap_builds_a_debian_image(singpy: Singpy, debian: Path) -> None:
    made = singpy.ok("exec", str(debian), "cat", "/made")
    assert made.startswith("debian 12.") and made.endswith(" built as 0\n")
    assert singpy.ok("run", str(debian)) == "runs\n"
    assert singpy.ok("exec", str(debian), "apt-get", "--version").startswith("apt ")  # Include: apt, as Apptainer


def test_debootstrap_keeps_the_owners_dpkg_gave(singpy: Singpy, debian: Path) -> None:
    owners = sif_owners(debian)
    # the groups dpkg gave (shadow is gid 42, mail gid 8 in every Debian), in a user's build through the
    # subordinate ids, recorded as the image's ids
    assert owners["/etc/shadow"] == "-rw-r----- 0/42"
    assert owners["/var/mail"] == "drwxrwsr-x 0/8"
    assert owners["/usr/bin/apt-get"] == "-rwxr-xr-x 0/0"

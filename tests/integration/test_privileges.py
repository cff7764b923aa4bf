"""Capabilities, no_new_privs, PR_SET_PDEATHSIG and --fakeroot, read from /proc inside real containers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy
from tests.support import hostsim, sifs
from tests.support.importtime import module_names
from tests.support.leftovers import settled, traces, wait_for_descendants, wait_until_gone
from tests.support.users import is_root

ALL_CAPS = (1 << 41) - 1  # CAP_CHOWN .. CAP_CHECKPOINT_RESTORE: a user namespace's full set
NET_RAW, SYS_ADMIN, CHOWN = 1 << 13, 1 << 21, 1 << 0


def caps_of(status: str) -> dict[str, int]:
    """CapInh/CapPrm/CapEff/CapBnd/CapAmb of a /proc/PID/status text, as numbers."""
    return {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines() if line.startswith("Cap")}


def container_caps(singpy: Singpy, *args: str, **kwargs: object) -> dict[str, int]:
    return caps_of(singpy.ok("exec", *args, "cat", "/proc/self/status", **kwargs))


HOST_BOUNDING = caps_of(Path("/proc/self/status").read_text())["CapBnd"]  # what root has to begin with


# --- unprivileged: nothing, anywhere ------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [[], ["--pid"], ["--net"], ["--containall"], ["--drop-caps", "all"], ["--no-privs"]],
                         ids=lambda flags: " ".join(flags) or "plain")
def test_user_payload_has_no_capabilities(as_user: Singpy, image: Path, flags: list[str]) -> None:
    assert container_caps(as_user, *flags, str(image)) == dict.fromkeys(
        ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0)


@pytest.mark.parametrize("flags", [[], ["--pid"], ["--net", "--network", "none"], ["--fakeroot"]],
                         ids=lambda flags: " ".join(flags) or "plain")
def test_no_new_privs_in_every_process(singpy: Singpy, image: Path, flags: list[str]) -> None:
    # `cat` is a child of the payload's shell: what the payload starts inherits the flag.
    out = singpy.ok("exec", *flags, str(image), "sh", "-c", "grep NoNewPrivs /proc/$$/status /proc/self/status")
    assert out.count("NoNewPrivs:\t1") == 2, out


def test_killed_launcher_takes_the_container_down(singpy: Singpy, image: Path) -> None:
    """--pid keeps the launcher outside as supervisor: SIGKILL to it must not leave the payload running."""
    marker = f"{300 + (singpy.uid % 97)}"
    launcher = singpy.popen(["exec", "--pid", str(image), "sh", "-c", f"echo up; exec sleep {marker}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert launcher.stdout is not None and launcher.stdout.readline() == "up\n"
    payload = wait_for_descendants(launcher.pid, f"sleep {marker}")  # this launcher's, no other sleep
    assert payload
    launcher.kill()
    launcher.communicate(timeout=30)
    assert wait_until_gone(payload, f"sleep {marker}") == [], "the payload outlived its launcher"


# --- root: Apptainer's model ----------------------------------------------------------------------------------


def conf(workdir: Path, text: str, name: str = "caps.conf") -> str:
    path = workdir / name
    path.write_text(text)
    return str(path)


def test_root_keeps_its_capabilities_by_default(as_root: Singpy, image: Path) -> None:
    caps = container_caps(as_root, str(image))
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == HOST_BOUNDING


def test_root_drop_caps(as_root: Singpy, image: Path) -> None:
    caps = container_caps(as_root, "--drop-caps", "CAP_NET_RAW,sys_admin", str(image))
    for name in ("CapEff", "CapPrm", "CapBnd"):
        assert caps[name] == HOST_BOUNDING & ~(NET_RAW | SYS_ADMIN), name
    assert caps["CapInh"] == caps["CapAmb"] == 0


@pytest.mark.parametrize(("default", "flags", "expected"), [
    ("no", [], 0),
    ("no", ["--add-caps", "net_raw"], NET_RAW),
    ("no", ["--add-caps", "CAP_NET_RAW", "--add-caps", "chown"], NET_RAW | CHOWN),
    ("no", ["--keep-privs"], HOST_BOUNDING),
    ("full", ["--no-privs"], 0),
    ("full", ["--no-privs", "--add-caps", "chown"], CHOWN),
    ("file", [], CHOWN | SYS_ADMIN),
    ("file", ["--drop-caps", "sys_admin"], CHOWN),
], ids=["no", "no + add", "no + add twice", "keep-privs", "no-privs", "no-privs + add", "file", "file - drop"])
def test_root_default_capabilities(as_root: Singpy, image: Path, workdir: Path, default: str, flags: list[str],
                                   expected: int) -> None:
    confdir = workdir / f"caps-{default}"
    confdir.mkdir(exist_ok=True)
    (confdir / "capability.json").write_text(json.dumps({"users": {"root": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}))
    path = conf(confdir, f"root default capabilities = {default}\n", "singpy.conf")
    caps = caps_of(as_root.ok("--config", path, "exec", *flags, str(image), "cat", "/proc/self/status"))
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == expected


def test_dropped_capability_is_really_gone(as_root: Singpy, image: Path) -> None:
    script = "touch /tmp/.singpy-chown-$$ && chown 1 /tmp/.singpy-chown-$$; echo rc=$?; rm -f /tmp/.singpy-chown-$$"
    assert "rc=0" in as_root.ok("exec", "--contain", str(image), "sh", "-c", script)
    dropped = as_root.run("exec", "--contain", "--drop-caps", "chown", str(image), "sh", "-c", script)
    assert "rc=1" in dropped.stdout and "Operation not permitted" in dropped.stderr


# --- bad input ----------------------------------------------------------------------------------------------

ERRORS = {
    "unknown capability": ("both", ["--add-caps", "CAP_FLY"], "--add-caps: unknown capability 'CAP_FLY'"),
    "unknown dropped": ("both", ["--drop-caps", "net_raw,teleport"], "--drop-caps: unknown capability 'teleport'"),
    "keep and no": ("root", ["--keep-privs", "--no-privs"], "--keep-privs and --no-privs cannot be used together"),
    "user add": ("user", ["--add-caps", "net_raw"], "--add-caps is for root only"),
    "user keep": ("user", ["--keep-privs"], "--keep-privs is for root only"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_capability_errors(singpy: Singpy, image: Path, workdir: Path, case: str) -> None:
    profile, flags, message = ERRORS[case]
    if profile not in ("both", singpy.profile):
        pytest.skip(f"{case}: {profile} only")
    before = traces(image, workdir)
    result = singpy.run("exec", *flags, str(image), "true")
    assert result.returncode == 255, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("HINT:")]
    assert len(lines) == 1 and lines[0].startswith("FATAL:") and message in lines[0], result.stderr
    assert settled(before, image, workdir) == before


# --- --fakeroot ---------------------------------------------------------------------------------------------


@pytest.fixture
def subids(as_user: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[bool], None]]:
    """Give the test user subordinate ranges (or none) for one test's singpy runs.

    The host's /etc/subuid and /etc/subgid are never written: private copies, with the user's
    lines replaced, are bound over them in a private mount namespace (tests.support.hostsim).
    """
    if not is_root():
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    missing = [path for path in hostsim.SUBID_FILES if not os.path.exists(path)]
    if missing:
        pytest.skip(f"{missing[0]} does not exist on this host: nothing to bind a private copy over")
    with contextlib.ExitStack() as stack:

        def set_ranges(present: bool) -> None:
            line = f"{as_user.user}:200000:65536" if present else None
            copies = hostsim.subid_copies(as_user.user, as_user.uid, line, str(workdir / request.node.name))
            stack.enter_context(hostsim.subid_files(*copies))

        yield set_ranges


@pytest.fixture
def user_dir(as_user: Singpy, workdir: Path) -> Path:
    path = workdir / "fakeroot-out"
    path.mkdir(exist_ok=True)
    os.chown(path, as_user.uid, as_user.gid)
    return path


@pytest.fixture(scope="module")
def own_image(as_user: Singpy, workdir: Path) -> Path:
    """A sandbox the user unpacked: their files, which are root's inside a --fakeroot container.

    (Overlayfs copies a file up with its owner, so only ids the namespace maps can be changed.)
    """
    from tests.support.images import build_busybox_rootfs

    root = workdir / "fakeroot-sandbox"
    if not root.exists():
        build_busybox_rootfs(root)
        for path in [root, *root.rglob("*")]:
            os.lchown(path, as_user.uid, as_user.gid)
    return root


CHOWN_TEST = "touch /opt/file && chown 1234:1234 /opt/file && stat -c owner=%u:%g /opt/file"


def test_fakeroot_with_subordinate_ranges(as_user: Singpy, own_image: Path, user_dir: Path,
                                          subids: Callable[[bool], None]) -> None:
    subids(True)
    result = as_user.run("-v", "exec", "--fakeroot", "--writable-tmpfs", "-B", f"{user_dir}:/out", str(own_image),
                         "sh", "-c", f"id; cat /proc/self/uid_map; {CHOWN_TEST}; touch /out/made-inside; "
                         "grep CapEff /proc/self/status")
    assert result.returncode == 0, result.stderr
    assert "uid=0(root) gid=0(root)" in result.stdout
    assert [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()] == [
        ["0", str(as_user.uid), "1"], ["1", "200000", "65536"]]
    assert "owner=1234:1234" in result.stdout  # an id from the range: apt-get-like chowns work
    assert f"CapEff:\t{ALL_CAPS:016x}" in result.stdout  # full, inside its own user namespace only
    assert (user_dir / "made-inside").stat().st_uid == as_user.uid  # themselves outside
    assert "fakeroot: subordinate ranges" in result.stderr and "newuidmap" in result.stderr


def test_fakeroot_runs_newuidmap_without_loading_subprocess(as_user: Singpy, own_image: Path,
                                                            subids: Callable[[bool], None]) -> None:
    """The helper that runs newuidmap and newgidmap spawns them itself: `subprocess` (and the site it brought, for
    msvcrt) cost a --fakeroot launch ~18 ms here (benchmarks/README.md)."""
    subids(True)
    result = as_user.run("exec", "--fakeroot", str(own_image), "cat", "/proc/self/uid_map", "/proc/self/gid_map",
                         env=as_user.env(PYTHONPROFILEIMPORTTIME="1"))
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["0", str(as_user.uid), "1"], ["1", "200000", "65536"], ["0", str(as_user.gid), "1"], ["1", "200000", "65536"]]
    imported = module_names(result.stderr)  # singpy's, not those of tests.support.hostsim's wrapper before it
    assert "singpy.layers.fakeroot" in imported
    assert not set(imported) & {"subprocess", "site"}


def test_fakeroot_without_ranges_maps_one_id(as_user: Singpy, own_image: Path, user_dir: Path,
                                             subids: Callable[[bool], None]) -> None:
    subids(False)
    result = as_user.run("-v", "exec", "--fakeroot", "--writable-tmpfs", "-B", f"{user_dir}:/out", str(own_image),
                         "sh", "-c", f"id -u; cat /proc/self/uid_map; {CHOWN_TEST}; echo rc=$?; "
                         "touch /out/single-inside")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[:4] == ["0", "0", str(as_user.uid), "1"]
    assert "rc=1" in result.stdout and "owner=" not in result.stdout  # uid 1234 does not exist inside
    assert (user_dir / "single-inside").stat().st_uid == as_user.uid
    assert f"fakeroot: no range for {as_user.user} in /etc/subuid: single mapping" in result.stderr


def test_fakeroot_capabilities_can_be_dropped(as_user: Singpy, image: Path) -> None:
    caps = container_caps(as_user, "--fakeroot", "--drop-caps", "sys_admin", str(image))
    assert caps["CapEff"] == caps["CapBnd"] == ALL_CAPS & ~SYS_ADMIN


def test_root_fakeroot(as_root: Singpy, image: Path) -> None:
    out = as_root.ok("exec", "--fakeroot", str(image), "sh", "-c", "id -u; readlink /proc/self/ns/user; echo $HOME")
    uid, userns, home = out.split()
    assert uid == "0" and home == "/root"
    assert userns != os.readlink("/proc/self/ns/user")


def test_fakeroot_environment_variable(as_user: Singpy, image: Path) -> None:
    assert as_user.ok("exec", str(image), "id", "-u", env=as_user.env(APPTAINER_FAKEROOT="1")).strip() == "0"


def test_sigterm_reaches_a_fakeroot_payload(as_user: Singpy, image: Path) -> None:
    launcher = as_user.popen(["exec", "--fakeroot", str(image), "sh", "-c", "echo up; exec sleep 77"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert launcher.stdout is not None and launcher.stdout.readline() == "up\n"
    launcher.send_signal(signal.SIGTERM)
    launcher.communicate(timeout=30)
    assert launcher.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)


def test_fakeroot_runs_a_sif(singpy: Singpy, workdir: Path) -> None:
    """Root too: the kernel mounts no squashfs inside a user namespace, so the SIF is opened with FUSE
    (or extracted), never left to fail with "Operation not permitted" (issue 11)."""
    image = sifs.singpy_sif(workdir)
    assert singpy.ok("exec", "--fakeroot", str(image), "id", "-u") == "0\n"
    assert singpy.ok("exec", "--fakeroot", "--unsquash", str(image), "cat", "/etc/marker") == sifs.MARKER + "\n"


def test_fakeroot_maps_one_range_of_a_messy_subid_file(singpy: Singpy, own_image: Path, workdir: Path) -> None:
    """Apptainer's rule (GetIDRange): one range, the first of 65536 ids; a line written twice is not mapped
    twice (newuidmap refuses overlapping ranges), and another user's Latin-1 line is no error."""
    if not is_root():
        pytest.skip("subordinate ranges are simulated with files bound over /etc/subuid: needs root")
    missing = [path for path in hostsim.SUBID_FILES if not os.path.exists(path)]
    if missing:
        pytest.skip(f"{missing[0]} does not exist on this host: nothing to bind a private copy over")
    line = f"{singpy.user}:300000:65536"
    copies = hostsim.subid_copies(singpy.user, singpy.uid, f"{singpy.user}:500000:10",
                                  str(workdir / f"messy-{singpy.profile}"))
    for copy in copies:
        with open(copy, "ab") as handle:
            handle.write(b"r\xe9my:400000:65536\n" + f"{line}\n{line}\n{singpy.user}:600000:131072\n".encode())
    with hostsim.subid_files(*copies):
        result = singpy.run("exec", "--fakeroot", str(own_image), "cat", "/proc/self/uid_map", "/proc/self/gid_map")
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["0", str(singpy.uid), "1"], ["1", "300000", "65536"], ["0", str(singpy.gid), "1"], ["1", "300000", "65536"]]

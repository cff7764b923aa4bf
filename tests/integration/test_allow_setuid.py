"""--allow-setuid (Apptainer's, root only): set-uid programs of the image and of host binds work for root outside a
user namespace; /proc, /sys and /dev stay nosuid; a user is refused; a user namespace or trimmed capabilities
leave every set-uid bit ignored, as without the flag.

The set-uid program is a copy of busybox owned by nobody (65534), mode 4755: `busybox id -u` prints the effective
uid, 65534 where the kernel honoured the bit, 0 (root's) where it did not (nosuid, or no_new_privs).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.images import build_busybox_rootfs
from tests.support.leftovers import settled, traces

SUID = "/opt/suid/busybox"
NOBODY = 65534


def _set_uid_copy(busybox: Path, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, directory / "busybox")  # named busybox: its applet comes from the first argument
    shutil.chown(directory / "busybox", NOBODY)
    (directory / "busybox").chmod(0o4755)


@pytest.fixture(scope="module")
def images(workdir: Path, as_root: Singpy) -> dict[str, Path]:
    """A sandbox holding a set-uid program (nobody's), and the SIF root builds from it (its owner kept)."""
    sandbox = build_busybox_rootfs(workdir / "suid-sandbox")
    _set_uid_copy(sandbox / "bin" / "busybox", sandbox / SUID.rsplit("/", 1)[0].lstrip("/"))
    sif = workdir / "suid.sif"
    if not sif.exists():
        as_root.ok("build", str(sif), str(sandbox))
    return {"sandbox": sandbox, "sif": sif}


def effective_uid(singpy: Singpy, *args: str, env: dict[str, str] | None = None) -> int:
    return int(singpy.ok("exec", *args, SUID, "id", "-u", env=env).strip())


@pytest.mark.parametrize("kind", ["sandbox", "sif"])
@pytest.mark.parametrize("layer", [(), ("--writable-tmpfs",)], ids=["image", "overlay"])
def test_root_runs_the_images_set_uid_programs_when_asked(as_root: Singpy, images: dict[str, Path], kind: str,
                                                          layer: tuple[str, ...]) -> None:
    image = str(images[kind])
    assert effective_uid(as_root, *layer, image) == 0  # nosuid and no_new_privs: the bit is ignored
    assert effective_uid(as_root, "--allow-setuid", *layer, image) == NOBODY
    assert effective_uid(as_root, *layer, image, env=as_root.env(APPTAINER_ALLOW_SETUID="1")) == NOBODY


def test_binds_of_the_host_are_set_uid_capable_and_the_kernels_filesystems_are_not(
        as_root: Singpy, images: dict[str, Path], tmp_path: Path) -> None:
    _set_uid_copy(images["sandbox"] / "bin" / "busybox", tmp_path / "bin")
    tmp_path.chmod(0o755)
    image = str(images["sif"])
    bound = ("-B", f"{tmp_path / 'bin'}:/mnt/suid")
    assert as_root.ok("exec", *bound, image, "/mnt/suid/busybox", "id", "-u") == "0\n"
    assert as_root.ok("exec", "--allow-setuid", *bound, image, "/mnt/suid/busybox", "id", "-u") == f"{NOBODY}\n"
    options = _options(as_root.ok("exec", "--allow-setuid", "--contain", *bound, image, "cat", "/proc/self/mountinfo"))
    for point in ("/", "/mnt/suid", "/tmp", "/var/tmp"):  # the image, a bind, the contained /tmp
        assert "nosuid" not in options[point], (point, options[point])
    for point in ("/proc", "/sys", "/dev", "/dev/pts", "/etc/passwd"):  # what Apptainer keeps nosuid too
        assert "nosuid" in options[point], (point, options[point])


def _options(mountinfo: str) -> dict[str, list[str]]:
    """The per-mount options of each mount point, the last mount on it (the one a path reaches)."""
    return {line.split()[4]: line.split()[5].split(",") for line in mountinfo.splitlines()}


def test_a_user_is_refused(as_user: Singpy, images: dict[str, Path]) -> None:
    image = str(images["sandbox"])
    before = traces(image, as_user.workdir)
    assert_one_fatal(as_user.run("exec", "--allow-setuid", image, "true"), "--allow-setuid requires root privileges")
    assert_one_fatal(as_user.run("exec", image, "true", env=as_user.env(SINGULARITY_ALLOW_SETUID="true")),
                     "--allow-setuid requires root privileges")
    assert settled(before, image, as_user.workdir) == before


@pytest.mark.parametrize(("flags", "why"), [
    (("--userns",), "--allow-setuid changes nothing in a user namespace"),
    (("--drop-caps", "CAP_NET_RAW"), "--allow-setuid changes nothing: with capabilities trimmed"),
])
def test_no_set_uid_in_a_user_namespace_nor_with_capabilities_trimmed(as_root: Singpy, images: dict[str, Path],
                                                                      flags: tuple[str, ...], why: str) -> None:
    """In a user namespace, as Apptainer; with capabilities trimmed no_new_privs stays, so that no set-uid root
    program gives them back."""
    result = as_root.run("-v", "exec", "--allow-setuid", *flags, str(images["sif"]), SUID, "id", "-u")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0\n"
    assert why in result.stderr


def test_an_instance_started_with_it(as_root: Singpy, images: dict[str, Path],
                                     named: Callable[[Singpy], str]) -> None:
    """Root's commands joining it run as it was started (Apptainer's joins take its no_new_privs); joining one
    started without the flag, the bit stays ignored."""
    with_flag, without = named(as_root), named(as_root)
    as_root.ok("instance", "start", "--allow-setuid", str(images["sif"]), with_flag)
    as_root.ok("instance", "start", str(images["sif"]), without)
    assert as_root.ok("exec", f"instance://{with_flag}", SUID, "id", "-u") == f"{NOBODY}\n"
    assert as_root.ok("exec", f"instance://{without}", SUID, "id", "-u") == "0\n"
    for name in (with_flag, without):
        as_root.ok("instance", "stop", name)


def test_a_record_says_it_only_as_a_boolean() -> None:
    from singpy.launch.instance import _record

    record = {"name": "x", "pid": 1, "image": "/i", "socket": "s", "log_out": "o", "log_err": "e", "started": 1.0}
    assert _record({**record, "allow_setuid": True}, "x").allow_setuid is True  # type: ignore[union-attr]
    assert _record(record, "x").allow_setuid is False  # type: ignore[union-attr]  # an older singpy's record
    assert _record({**record, "allow_setuid": 1}, "x") is None
    assert _record({**record, "pid_ns": True}, "x") is None  # an int field is never a boolean

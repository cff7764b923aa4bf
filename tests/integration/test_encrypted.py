"""Encrypted images: `build --passphrase | --pem-path`, and `run|exec|shell` with the key (singpy.image.crypt*).

Laid out as Apptainer's gocryptfs images (the kind Apptainer >= 1.3 builds
unprivileged and runs as root and as a user): checked here by what a user
sees: the image runs with the right key, and fails with one FATAL line with
a wrong one or none, leaving no mount, loop device or process behind; the
passphrase never shows in --dry-run or -v output. Apptainer's root-built
dm-crypt (LUKS) kind is refused with one line saying why: this kernel may
have no device-mapper at all, and singpy makes no dm device.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.leftovers import descendants
from tests.support.swapping import run_swapping

PASSPHRASE = "correct horse 42"  # with a space: passed whole, never split

pytestmark = pytest.mark.skipif(shutil.which("gocryptfs") is None or shutil.which("openssl") is None,
                                reason="gocryptfs and openssl are needed (Debian packages gocryptfs, openssl)")


@pytest.fixture(scope="module")
def keys(workdir: Path) -> dict[str, Path]:
    """RSA keys in Apptainer's PEM forms (PKCS#1), readable by the test user: the pair and a stranger's key."""
    folder = workdir / "encryption-keys"
    folder.mkdir(exist_ok=True)
    paths = {name: folder / f"{name}.pem" for name in ("private", "public", "other")}
    for name in ("private", "other"):
        if not paths[name].exists():
            subprocess.run(["openssl", "genrsa", "-traditional", "-out", str(paths[name]), "2048"], check=True,
                           capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(paths["private"]), "-RSAPublicKey_out", "-out",
                    str(paths["public"])], check=True, capture_output=True)
    for path in paths.values():
        path.chmod(0o644)
    return paths


def _build(workdir: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Path:
    """An encrypted copy of the busybox SIF, built by root."""
    out = workdir / name
    if not out.exists():
        subprocess.run([sifs.SINGPY, "-q", "build", *flags, str(out), str(sifs.singpy_sif(workdir))], check=True,
                       env={**os.environ, **(env or {})})
        out.chmod(0o644)
    return out


@pytest.fixture
def place(workdir: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """An empty directory every profile can write and read (pytest's tmp_path is private to root)."""
    parent = workdir / "encrypted"
    parent.mkdir(mode=0o755, exist_ok=True)
    path = parent / "".join(c if c.isalnum() else "-" for c in request.node.name)
    path.mkdir()
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def by_passphrase(workdir: Path) -> Path:
    return _build(workdir, "encrypted-passphrase.sif", "--encrypt",
                  env={"APPTAINER_ENCRYPTION_PASSPHRASE": PASSPHRASE})


@pytest.fixture(scope="module")
def by_pem(workdir: Path, keys: dict[str, Path]) -> Path:
    return _build(workdir, "encrypted-pem.sif", "--pem-path", str(keys["public"]))


def test_passphrase_image_runs_with_its_passphrase(singpy: Singpy, workdir: Path, by_passphrase: Path,
                                                   fuse_open: str) -> None:
    before = sifs.snapshot(workdir)
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    assert singpy.ok("exec", str(by_passphrase), "cat", "/etc/marker", env=env) == sifs.MARKER + "\n"
    assert singpy.ok("run", str(by_passphrase), env=env) != ""
    sifs.assert_restored(before, workdir)


def test_passphrase_asked_with_the_flag(singpy: Singpy, by_passphrase: Path, fuse_open: str) -> None:
    """--passphrase asks for it (read from stdin here, with no terminal), as Apptainer's prompt."""
    result = singpy.run("exec", "--passphrase", str(by_passphrase), "cat", "/etc/marker", input=PASSPHRASE + "\n")
    assert (result.returncode, result.stdout) == (0, sifs.MARKER + "\n"), result.stderr


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_signal_leaves_no_helper_or_mount(singpy: Singpy, workdir: Path, by_passphrase: Path, fuse_open: str,
                                          how: signal.Signals) -> None:
    """gocryptfs and squashfuse are the launcher's helpers: they end with it, their mounts with its namespace."""
    before = sifs.snapshot(workdir)
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    process = singpy.popen(["exec", str(by_passphrase), "sh", "-c", "echo up; exec sleep 60"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    helpers = {pid: line for pid, line in descendants(process.pid).items() if "sleep" not in line}
    assert any("gocryptfs" in line for line in helpers.values()), helpers
    process.send_signal(how)
    process.communicate(timeout=30)
    assert process.returncode != 0
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [line for pid, line in helpers.items() if _alive(pid)] == []
    sifs.assert_restored(before, workdir)


def test_image_swapped_after_the_check_is_not_mounted(singpy: Singpy, by_passphrase: Path, place: Path,
                                                       fuse_open: str) -> None:
    """Root (loop device) and the user (squashfuse): the encrypted SIF checked before the launch is the one
    mounted and decrypted, not a file renamed over its path meanwhile (here, zeros: reopened, it fails)."""
    image, junk = place / "encrypted.sif", place / "junk"
    shutil.copy(by_passphrase, image)
    junk.write_bytes(b"\0" * image.stat().st_size)
    for path in (image, junk):
        os.chown(path, singpy.uid, singpy.gid)
    result = run_swapping(singpy, place, "cryptmount", junk, image, "exec", str(image), "cat", "/etc/marker",
                          env=singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE))
    assert (result.returncode, result.stdout) == (0, sifs.MARKER + "\n"), result.stderr
    assert image.read_bytes().strip(b"\0") == b""  # the swap did happen


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_instance_is_joined_without_the_key(singpy: Singpy, workdir: Path, by_passphrase: Path,
                                            fuse_open: str) -> None:
    """The key opens the image once, at `instance start`; `exec instance://` joins what is mounted."""
    before = sifs.snapshot(workdir)
    name = f"encrypted{os.getpid()}"
    singpy.ok("instance", "start", str(by_passphrase), name, env=singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE))
    try:
        assert singpy.ok("exec", f"instance://{name}", "cat", "/etc/marker") == sifs.MARKER + "\n"
    finally:
        singpy.ok("instance", "stop", name)
    sifs.assert_restored(before, workdir)


def test_pem_image_runs_with_the_private_key(singpy: Singpy, workdir: Path, by_pem: Path, keys: dict[str, Path],
                                            fuse_open: str) -> None:
    before = sifs.snapshot(workdir)
    assert singpy.ok("exec", "--pem-path", str(keys["private"]), str(by_pem), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"
    env = singpy.env(SINGULARITY_ENCRYPTION_PEM_PATH=str(keys["private"]))
    assert singpy.ok("exec", str(by_pem), "cat", "/etc/marker", env=env) == sifs.MARKER + "\n"
    sifs.assert_restored(before, workdir)


def test_pem_image_holds_its_sealed_key(by_pem: Path) -> None:
    """As Apptainer lays it out: a gocryptfs partition, and an RSA-OAEP message linked to it."""
    listing = subprocess.run([sifs.SINGPY, "sif", "list", str(by_pem)], capture_output=True, text=True, check=True)
    assert "FS (Gocryptfs squashfs/*System/" in listing.stdout
    assert "Cryptographic Message (PEM/RSA-OAEP)" in listing.stdout


def test_wrong_passphrase_is_one_fatal_line(singpy: Singpy, workdir: Path, by_passphrase: Path,
                                            fuse_open: str) -> None:
    before = sifs.snapshot(workdir)
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE="not it")
    assert_one_fatal(singpy.run("exec", str(by_passphrase), "true", env=env), "wrong passphrase or key")
    sifs.assert_restored(before, workdir)


def test_an_overlong_passphrase_is_one_fatal_line(singpy: Singpy, workdir: Path, by_passphrase: Path,
                                                 fuse_open: str) -> None:
    """A key over a pipe's 64 KiB, written before its helper read it, hung the run for ever."""
    before = sifs.snapshot(workdir)
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE="x" * 70000)
    assert_one_fatal(singpy.run("exec", str(by_passphrase), "true", env=env, timeout=30),
                     "APPTAINER_ENCRYPTION_PASSPHRASE is longer than 2048 bytes")
    asked = singpy.run("exec", "--passphrase", str(by_passphrase), "true", input="y" * 100000 + "\n", timeout=30)
    assert asked.returncode == 255 and "FATAL:   the passphrase is longer than 2048 bytes" in asked.stderr
    sifs.assert_restored(before, workdir)


def test_wrong_key_is_one_fatal_line(singpy: Singpy, by_pem: Path, keys: dict[str, Path], fuse_open: str) -> None:
    result = singpy.run("exec", "--pem-path", str(keys["other"]), str(by_pem), "true")
    assert_one_fatal(result, "is not the one it was encrypted for")
    result = singpy.run("exec", "--pem-path", str(keys["public"]), str(by_pem), "true")
    assert_one_fatal(result, "not an RSA private key")


def test_no_key_is_one_fatal_line(singpy: Singpy, by_passphrase: Path, by_pem: Path, fuse_open: str) -> None:
    assert_one_fatal(singpy.run("exec", str(by_passphrase), "true"), "is encrypted: give its key")
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)  # a passphrase for an RSA-encrypted image
    assert_one_fatal(singpy.run("exec", str(by_pem), "true", env=env), "wrong passphrase or key")


def test_passphrase_never_shown(singpy: Singpy, by_passphrase: Path, fuse_open: str) -> None:
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    plan = singpy.run("exec", "--dry-run", str(by_passphrase), "true", env=env)
    assert plan.returncode == 0, plan.stderr
    assert "passphrase from APPTAINER_ENCRYPTION_PASSPHRASE" in plan.stdout  # where it came from, not what
    verbose = singpy.run("-d", "exec", str(by_passphrase), "true", env=env)
    assert verbose.returncode == 0, verbose.stderr
    for output in (plan.stdout, plan.stderr, verbose.stdout, verbose.stderr):
        assert PASSPHRASE not in output


def test_site_can_refuse_encrypted_images(singpy: Singpy, workdir: Path, by_passphrase: Path,
                                          fuse_open: str) -> None:
    """`allow container encrypted = no` binds users, as Apptainer's; root is not bound by image-kind limits."""
    conf = workdir / "no-encrypted.conf"
    conf.write_text("allow container encrypted = no\n")
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    result = singpy.run("--config", str(conf), "exec", str(by_passphrase), "cat", "/etc/marker", env=env)
    if singpy.uid == 0:
        assert (result.returncode, result.stdout) == (0, sifs.MARKER + "\n"), result.stderr
    else:
        assert_one_fatal(result, "configuration disallows users from running encrypted SIF containers")


def test_user_without_fuse_is_told_why(as_user: Singpy, by_passphrase: Path, fuse_closed: str) -> None:
    env = as_user.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    assert_one_fatal(as_user.run("exec", str(by_passphrase), "true", env=env), "gocryptfs needs FUSE")


def test_user_builds_what_root_runs(as_user: Singpy, as_root: Singpy, workdir: Path, keys: dict[str, Path],
                                    fuse_open: str, place: Path) -> None:
    """An unprivileged build (Apptainer's gocryptfs case), run by root with the private key."""
    out = place / "user-built.sif"
    as_user.ok("build", "--pem-path", str(keys["public"]), str(out), str(sifs.singpy_sif(workdir)))
    assert os.stat(out).st_uid == as_user.uid
    assert sorted(os.listdir(place)) == ["user-built.sif"]  # the work directory is gone
    assert as_root.ok("exec", "--pem-path", str(keys["private"]), str(out), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"


def test_build_asks_for_the_passphrase(singpy: Singpy, workdir: Path, fuse_open: str, place: Path) -> None:
    """--passphrase on a definition file's build: asked once (stdin here), the %post result encrypted."""
    recipe = place / "encrypted.def"
    recipe.write_text(f"Bootstrap: localimage\nFrom: {sifs.singpy_sif(workdir)}\n\n%post\n    echo posted > /posted\n")
    out = place / "from-recipe.sif"
    result = singpy.run("build", "--passphrase", str(out), str(recipe), input=PASSPHRASE + "\n", timeout=300)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(place)) == ["encrypted.def", "from-recipe.sif"]
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    assert singpy.ok("exec", str(out), "cat", "/posted", env=env) == "posted\n"


def test_failed_build_leaves_nothing(singpy: Singpy, workdir: Path, keys: dict[str, Path], place: Path) -> None:
    source = str(sifs.singpy_sif(workdir))
    result = singpy.run("build", "--pem-path", str(keys["private"]), str(place / "out.sif"), source)
    assert_one_fatal(result, "not an RSA public key")
    result = singpy.run("build", "--encrypt", str(place / "out.sif"), source)
    assert_one_fatal(result, "--encrypt needs a key", code=1)
    assert os.listdir(place) == []


def test_dm_crypt_image_is_refused_with_the_reason(singpy: Singpy, workdir: Path, place: Path) -> None:
    """Apptainer's root-built kind (filesystem type 5, LUKS2): a user, or a host without a device-mapper, is
    told why it can't be opened (as Apptainer: "cannot mount device-mapper encrypted files without ... root")."""
    if singpy.uid == 0 and _device_mapper():
        pytest.skip("this host has a device-mapper: test_luks_image_runs_as_root opens a real one")
    plain = sifs.singpy_sif(workdir)
    primary = next(i for i in range(1, 6) if _fstype_at(plain, i) == 1)
    at = sifs.descriptor_offset(plain, primary) + 201  # the descriptor's metadata: fstype (int32) first
    luks = sifs.patched(plain, place / "luks.sif", [(at, (5).to_bytes(4, "little"))])
    env = singpy.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    why = "this kernel has no device-mapper" if singpy.uid == 0 else "only root can open it"
    assert_one_fatal(singpy.run("exec", str(luks), "true", env=env), why)


def _fstype_at(sif: Path, object_id: int) -> int:
    with open(sif, "rb") as f:
        f.seek(sifs.descriptor_offset(sif, object_id))
        raw = f.read(205)
    is_partition = int.from_bytes(raw[:4], "little") == 0x4004
    return int.from_bytes(raw[201:205], "little") if is_partition else 0


def _device_mapper() -> bool:
    with open("/proc/misc") as misc:
        return "device-mapper" in misc.read().split()


def _singpy_devices() -> set[str]:
    """The device-mapper devices singpy made (`dmsetup ls`: NAME (MAJOR:MINOR) lines), others left alone."""
    listing = subprocess.run(["dmsetup", "ls"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line.startswith("singpy-")}


@pytest.fixture(scope="module")
def luks_sif(workdir: Path) -> Path:
    """A SIF laid out as Apptainer's root build writes one: its squashfs in a LUKS2 volume (cryptsetup)."""
    if not _device_mapper() or shutil.which("cryptsetup") is None or os.geteuid() != 0:
        pytest.skip("dm-crypt can't work here: this kernel has no device-mapper (none in /proc/misc), or "
                    "cryptsetup (cryptsetup-bin) or root is missing")
    from singpy.image import sif
    from singpy.image.detect import host_arch
    from singpy.image.sifwrite import SifObject, create_sif

    plain = sif.read_sif(sifs.singpy_sif(workdir))
    squashfs = plain.read_object(plain.primary_partition())
    volume = workdir / "luks-volume.img"
    with open(volume, "wb") as f:
        f.truncate(len(squashfs) + 16 * 1024 * 1024)  # Apptainer's room for the LUKS2 header
    key = PASSPHRASE.encode()
    subprocess.run(["cryptsetup", "luksFormat", "--batch-mode", "--type", "luks2", "--key-file", "-", str(volume)],
                   input=key, check=True, capture_output=True)
    name = f"singpy-test-{os.getpid()}"
    subprocess.run(["cryptsetup", "open", "--type", "luks2", "--key-file", "-", str(volume), name], input=key,
                   check=True, capture_output=True)
    try:
        with open(f"/dev/mapper/{name}", "wb") as device:
            device.write(squashfs)
    finally:
        subprocess.run(["cryptsetup", "close", name], check=True)
    out = workdir / "encrypted-luks.sif"
    create_sif(out, [SifObject(sif.DATA_PARTITION, path=volume, fstype=sif.FS_ENCRYPTED_SQUASHFS,
                               parttype=sif.PART_PRIMSYS, arch=host_arch())])
    out.chmod(0o644)
    return out


def test_luks_image_runs_as_root(as_root: Singpy, as_user: Singpy, luks_sif: Path) -> None:
    """dm-crypt as root: the image runs; a wrong key, or a user, is one FATAL line; no dm device is left."""
    before = _singpy_devices()
    env = as_root.env(APPTAINER_ENCRYPTION_PASSPHRASE=PASSPHRASE)
    assert as_root.ok("exec", str(luks_sif), "cat", "/etc/marker", env=env) == sifs.MARKER + "\n"
    wrong = as_root.env(APPTAINER_ENCRYPTION_PASSPHRASE="not it")
    assert_one_fatal(as_root.run("exec", str(luks_sif), "true", env=wrong), "wrong passphrase or key")
    assert_one_fatal(as_user.run("exec", str(luks_sif), "true", env=env), "only root can open it")
    deadline = time.monotonic() + 10  # deferred removal: once the namespace's mount is gone
    while _singpy_devices() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _singpy_devices() - before == set()

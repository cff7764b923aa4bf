"""A cache someone else made, or whose content is not what its names claim, is never trusted (issue 24, class 1).

docs/images.md once suggested `SINGPY_CACHEDIR=${TMPDIR:-/tmp}/$USER-singpy`: another user could make that
directory first and plant a SIF (whose runscript then ran as the victim, root included), a layer blob, a
reference record or a link. Each test plants one of them and checks what the victim sees: the planted
runscript did not run (its marker file is absent), the planted layer is not in the image, a file a planted
link points to is unchanged, and a refused directory is named with the reason in one FATAL line.

The attacker is `singpy-test2` (the `other_user` fixture); the victims are root and `singpy-test`. Images
come from the session's real registry (registry_plain); the planted SIF is a real SIF that `singpy pull`
made from another image, so that only singpy's checks stand between it and the victim.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from singpy.host import cachefiles
from singpy.oci import platform, store
from singpy.oci.ref import parse
from tests.conftest import Singpy, assert_one_fatal
from tests.support.oci import Layer, busybox_image, file
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache
from tests.support.users import run_as

MARKER = "planted-ran"  # what the planted image's runscript writes into its working directory
GENUINE_LAYER = [file("etc/image-marker", "genuine\n")]
PLANTED_LAYER = [file("etc/image-marker", "planted\n")]


class Images:
    """The genuine image in the registry, and what an attacker plants instead of it."""

    def __init__(self, registry: RegistryServer, planted_sif: Path) -> None:
        genuine = busybox_image(extra=GENUINE_LAYER, entrypoint=["/bin/cat", "/etc/image-marker"])
        self.digest = registry.upload(genuine, "trust/genuine")
        self.hex = self.digest.removeprefix("sha256:")
        self.tag = registry.ref("trust/genuine")
        self.by_digest = registry.ref("trust/genuine", self.digest)
        self.layer_digest = genuine.layers[-1].digest  # the layer holding /etc/image-marker
        self.planted_layer = Layer(PLANTED_LAYER).data  # other bytes at that layer's name
        self.planted_sif = planted_sif


@pytest.fixture(scope="module")
def images(singpy: Singpy, registry_plain: RegistryServer, workdir: Path) -> Images:
    """Per profile: the genuine image, and a real SIF whose runscript leaves MARKER in its working directory."""
    planted = busybox_image(extra=PLANTED_LAYER,
                            entrypoint=["/bin/sh", "-c", f"echo ran > {MARKER}; cat /etc/image-marker"])
    registry_plain.upload(planted, "trust/planted")
    sif = workdir / "trust" / f"{singpy.profile}-planted.sif"
    sif.parent.mkdir(exist_ok=True)
    os.chown(sif.parent, singpy.uid, singpy.gid)
    singpy.ok("pull", "--no-https", str(sif), registry_plain.ref("trust/planted"),
              env=singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "trust-planted"))))
    sif.chmod(0o644)  # the attacker copies it
    return Images(registry_plain, sif)


@pytest.fixture
def cwd(singpy: Singpy, workdir: Path, images: Images) -> Path:
    """An empty working directory of the victim's, where the planted runscript would leave MARKER."""
    path = Path(tempfile.mkdtemp(prefix=f"{singpy.profile}-cwd-", dir=workdir / "trust"))
    path.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


@pytest.fixture
def shared_tmp(workdir: Path) -> Iterator[Path]:
    """The session's TMPDIR (sticky and world-writable, like /tmp): what an attacker creates there goes after."""
    tmp = workdir / "tmp"
    before = set(os.listdir(tmp))
    yield tmp
    for name in set(os.listdir(tmp)) - before:
        shutil.rmtree(tmp / name, ignore_errors=True)


def plant_sealed_sif(cache: Path, images: Images, owner: int, group: int) -> None:
    """The planted SIF as the cache entry of the genuine digest, with a seal (`.id`) that matches it and a
    reference record for the tag: everything a cache of singpy's own would hold."""
    for sub in ("sif", "refs"):
        (cache / sub).mkdir(exist_ok=True)
    sif = cache / "sif" / f"{images.hex}.sif"
    shutil.copyfile(images.planted_sif, sif)
    (cache / "sif" / f"{images.hex}.id").write_text(f"{images.digest} {cachefiles.identity(os.lstat(sif))}\n")
    (cache / "refs" / ref_name(images.tag)).write_text(f"{images.digest} {images.digest}\n")
    for path in (cache, *cache.rglob("*")):
        os.lchown(path, owner, group)


def ref_name(reference: str) -> str:
    """The name of the reference record singpy keeps for `reference` on this host's platform."""
    return os.path.basename(store._ref_path("", str(parse(reference)), str(platform.host_platform())))


def assert_genuine(result: object, cwd: Path) -> None:
    assert getattr(result, "returncode", None) == 0, getattr(result, "stderr", "")
    assert getattr(result, "stdout", None) == "genuine\n"
    assert not (cwd / MARKER).exists()


# --- a cache directory someone else could have filled is refused -------------------------------------------------


def test_the_planted_sif_really_runs_when_run_directly(singpy: Singpy, images: Images, cwd: Path) -> None:
    """The control: the planted runscript leaves its marker, so its absence below means it did not run."""
    assert singpy.ok("run", str(images.planted_sif), cwd=cwd) == "planted\n"
    assert (cwd / MARKER).exists()


def test_a_cache_directory_another_user_made_first_is_refused(singpy: Singpy, images: Images,
                                                               other_user: pwd.struct_passwd, shared_tmp: Path,
                                                               cwd: Path) -> None:
    cache = shared_tmp / f"{singpy.user}-singpy"  # what the old advice in docs/images.md named
    run_as(other_user, ["mkdir", "-m", "0777", str(cache)]).check_returncode()
    plant_sealed_sif(cache, images, other_user.pw_uid, other_user.pw_gid)
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    reason = f"refusing the cache directory {cache}: it belongs to uid {other_user.pw_uid}"
    for args in (["run", "--no-https", images.by_digest], ["run", "--no-https", images.tag], ["cache", "list"],
                 ["cache", "clean", "--force"]):
        assert_one_fatal(singpy.run(*args, env=env, cwd=cwd), reason)
    assert not (cwd / MARKER).exists()
    assert (cache / "sif" / f"{images.hex}.sif").exists()  # not cleaned either: refused, not touched


@pytest.mark.parametrize(("mode", "who"), [(0o777, "others"), (0o770, "its group"), (0o1777, "others")])
@pytest.mark.parametrize("where", ["", "sif"])
def test_a_cache_directory_others_can_write_is_refused(singpy: Singpy, images: Images, workdir: Path, cwd: Path,
                                                       mode: int, who: str, where: str) -> None:
    cache = new_cache(singpy, workdir, f"writable-{mode:o}-{where}")
    plant_sealed_sif(cache, images, singpy.uid, singpy.gid)  # as if another user had added them
    (cache / where).chmod(mode)
    result = singpy.run("run", "--no-https", images.by_digest, env=singpy.env(SINGPY_CACHEDIR=str(cache)), cwd=cwd)
    bad = cache / where if where else cache
    assert_one_fatal(result, f"refusing the cache directory {bad}: it is writable by {who} (mode {mode:04o})")
    assert not (cwd / MARKER).exists()


@pytest.mark.parametrize("command", [["cache", "list"], ["cache", "clean", "-f"]])
def test_a_cache_you_cannot_read_is_one_line(singpy: Singpy, workdir: Path, command: list[str]) -> None:
    """`chmod 000 ~/.cache/singpy; singpy cache list`: one line saying which directory, not a traceback."""
    if singpy.uid == 0:
        pytest.skip("root reads a directory of mode 000 all the same")
    cache = new_cache(singpy, workdir, f"unreadable-{command[1]}")
    (cache / "rootfs").mkdir()
    cache.chmod(0)
    try:
        result = singpy.run(*command, env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    finally:
        cache.chmod(0o700)
    assert_one_fatal(result, f"can't use the cache directory {cache}: permission denied")


def test_a_work_directory_in_another_users_directory_is_refused(singpy: Singpy, images: Images, workdir: Path,
                                                                other_user: pwd.struct_passwd, shared_tmp: Path,
                                                                cwd: Path) -> None:
    work = shared_tmp / f"{singpy.user}-work"
    run_as(other_user, ["mkdir", "-m", "0777", str(work)]).check_returncode()
    out = cwd / "out.sif"
    for variable in ("SINGPY_TMPDIR", "APPTAINER_TMPDIR"):
        env = singpy.env(**{variable: str(work), "SINGPY_CACHEDIR": str(new_cache(singpy, workdir, variable))})
        result = singpy.run("pull", "--no-https", str(out), images.tag, env=env, cwd=cwd)
        assert_one_fatal(result, f"refusing the work directory's parent ({variable}) {work}: it belongs to uid "
                                 f"{other_user.pw_uid}")
        assert os.listdir(work) == [] and not out.exists()


def test_a_sticky_shared_work_directory_and_the_default_cache_are_fine(singpy: Singpy, images: Images, cwd: Path,
                                                                       shared_tmp: Path) -> None:
    """TMPDIR-like directories (root's, sticky) still work, and the default cache is made private (0700)."""
    env = singpy.env(SINGPY_TMPDIR=str(shared_tmp), XDG_CACHE_HOME=str(cwd / "xdg"))
    del env["SINGPY_CACHEDIR"]
    assert_genuine(singpy.run("run", "--no-https", images.tag, env=env, cwd=cwd), cwd)
    for path in (cwd / "xdg" / "singpy", *(cwd / "xdg" / "singpy").iterdir()):
        assert path.stat().st_mode & 0o777 == 0o700, path


# --- in the user's own cache, nothing is taken for what its name claims -----------------------------------------


def test_a_sif_swapped_in_the_cache_does_not_run(singpy: Singpy, images: Images, workdir: Path, cwd: Path) -> None:
    cache = new_cache(singpy, workdir, "swapped-sif")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    assert_genuine(singpy.run("run", "--no-https", images.tag, env=env, cwd=cwd), cwd)
    cached = cache / "sif" / f"{images.hex}.sif"
    shutil.copyfile(images.planted_sif, cached)  # a copy gone wrong: not the SIF of that digest any more
    os.chown(cached, singpy.uid, singpy.gid)
    for reference in (images.by_digest, images.tag):  # by digest: no request; by tag: the registry agrees
        assert_genuine(singpy.run("run", "--no-https", reference, env=env, cwd=cwd), cwd)


def test_a_reference_record_pointing_at_a_planted_sif_is_not_followed(singpy: Singpy, images: Images,
                                                                       workdir: Path, cwd: Path) -> None:
    cache = new_cache(singpy, workdir, "planted-ref")
    other = hashlib.sha256(b"another manifest").hexdigest()
    for sub in ("sif", "refs"):
        (cache / sub).mkdir(mode=0o700)
    shutil.copyfile(images.planted_sif, cache / "sif" / f"{other}.sif")  # no seal: singpy never made it
    (cache / "refs" / ref_name(images.tag)).write_text(f"{images.digest} sha256:{other}\n")
    for path in (cache, *cache.rglob("*")):
        os.chown(path, singpy.uid, singpy.gid)
    assert_genuine(singpy.run("run", "--no-https", images.tag, env=singpy.env(SINGPY_CACHEDIR=str(cache)), cwd=cwd),
                   cwd)


@pytest.mark.parametrize("planted", ["other bytes", "a link"])
def test_a_layer_blob_with_other_bytes_is_downloaded_again(singpy: Singpy, images: Images, workdir: Path,
                                                           cwd: Path, planted: str) -> None:
    cache = new_cache(singpy, workdir, f"blob-{planted.replace(' ', '-')}")
    blobs = cache / "blobs" / "sha256"
    blobs.mkdir(parents=True, mode=0o700)
    blob = blobs / images.layer_digest.removeprefix("sha256:")
    decoy = cwd / "decoy-layer"
    decoy.write_bytes(images.planted_layer)
    if planted == "a link":
        blob.symlink_to(decoy)
    else:
        shutil.copyfile(decoy, blob)
    for path in (cache, *cache.rglob("*")):
        os.lchown(path, singpy.uid, singpy.gid)
    result = singpy.run("exec", "--no-https", images.tag, "cat", "/etc/image-marker",
                        env=singpy.env(SINGPY_CACHEDIR=str(cache)), cwd=cwd)
    assert (result.returncode, result.stdout) == (0, "genuine\n"), result.stderr
    assert f"the cached layer {images.layer_digest[:19]} does not match its digest" in result.stderr
    assert not blob.is_symlink() and f"sha256:{hashlib.sha256(blob.read_bytes()).hexdigest()}" == images.layer_digest
    assert decoy.read_bytes() == images.planted_layer


def test_a_link_at_a_lock_name_is_not_followed(singpy: Singpy, images: Images, workdir: Path, cwd: Path) -> None:
    """A lock file is opened O_NOFOLLOW: a link there never creates (as root, anywhere) the file it names."""
    cache = new_cache(singpy, workdir, "lock-link")
    (cache / "sif").mkdir(mode=0o700)
    target = cwd / "created-through-the-link"
    (cache / "sif" / f".{images.hex}.lock").symlink_to(target)
    for path in (cache, *cache.rglob("*")):
        os.lchown(path, singpy.uid, singpy.gid)
    assert_genuine(singpy.run("run", "--no-https", images.tag, env=singpy.env(SINGPY_CACHEDIR=str(cache)), cwd=cwd),
                   cwd)
    assert not os.path.lexists(target)

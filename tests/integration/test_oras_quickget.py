"""`pull oras://` from a registry asked anonymously goes through singpy.oci.quickget (no http.client): the same
file, the same rules and errors as the full client, and the full client for everything else.

A registry of this module's own: anonymous, its blobs answered by a redirect to another host (tests.support's
BlobHost on 127.0.0.2, which refuses any request that carries Authorization, as S3 does), so that each rule is
seen on the blob host's side. Every case runs as root and as the unprivileged test user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.leftovers import settled, traces
from tests.support.oras_sifs import cache_env, sha256, sif_copy
from tests.support.registry import BlobHost, RegistryServer, start_registry

QUICK = "done without the full HTTP client"  # singpy.oci.oras's -d line when the quick client pulled it
FALLBACK = "asking with the full client"


@pytest.fixture(scope="module")
def anonymous_redirect(workdir: Path) -> Iterator[RegistryServer]:
    """An anonymous registry whose blob GETs are redirected to a blob host on another address."""
    directory = Path(os.path.realpath(workdir)) / "registries" / f"quickget-{os.getpid()}-{time.monotonic_ns()}"
    with start_registry(directory, redirect=True) as registry:
        yield registry


def pushed(singpy: Singpy, registry: RegistryServer, workdir: Path, name: str, extra: int) -> tuple[Path, str, str]:
    """A SIF unique to the test (`extra` random bytes added), pushed; the file, its reference and its digest."""
    sif = sif_copy(singpy, workdir, name)
    blob = sif.parent / "random.bin"
    blob.write_bytes(os.urandom(extra))
    subprocess.run(["siftool", "add", "--datatype", "7", str(sif), str(blob)], check=True, stdout=subprocess.DEVNULL)
    blob.unlink()
    reference = f"oras://{registry.host}/quick/{name}-{singpy.profile}:v1"
    singpy.ok("push", "--no-https", str(sif), reference, env=cache_env(singpy, workdir, f"{name}-push"))
    return sif, reference, f"sha256:{sha256(sif)}"


def blob_host(registry: RegistryServer) -> BlobHost:
    assert registry.blob_host is not None
    return registry.blob_host


def test_a_redirected_blob_is_fetched_quickly_without_credentials(singpy: Singpy, anonymous_redirect: RegistryServer,
                                                                  workdir: Path) -> None:
    """Credentials in the environment: never sent (the registry asks none), least of all to the blob host."""
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "redirect", 9 << 20)  # hashed on a thread
    out = sif.parent / "out.sif"
    result = singpy.run("-d", "pull", "--no-https", str(out), reference,
                        env=cache_env(singpy, workdir, "redirect", SINGPY_DOCKER_USERNAME="alice",
                                      SINGPY_DOCKER_PASSWORD="secret"))
    assert result.returncode == 0, result.stderr
    assert QUICK in result.stderr and FALLBACK not in result.stderr
    assert out.read_bytes() == sif.read_bytes()
    requests = blob_host(anonymous_redirect).requests_for(digest)
    assert [(request.method, request.authorization, request.status) for request in requests] == [("GET", None, 200)]


def test_a_short_body_is_resumed_from_where_it_ended(singpy: Singpy, anonymous_redirect: RegistryServer,
                                                     workdir: Path) -> None:
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "short", 3 << 20)
    stall = blob_host(anonymous_redirect).stall(digest, after=1 << 20)
    out = sif.parent / "out.sif"
    pull = singpy.popen(["-d", "pull", "--no-https", str(out), reference], env=cache_env(singpy, workdir, "short"),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert stall.reached.wait(60)
    finally:
        threading.Thread(target=stall.release).start()  # the connection closes with 2 MiB unsent
    _, err = pull.communicate(timeout=60)
    assert pull.returncode == 0 and QUICK in err, err
    assert blob_host(anonymous_redirect).requests_for(digest)[-1].range == f"bytes={1 << 20}-"
    assert out.read_bytes() == sif.read_bytes()


def test_a_wrong_digest_leaves_nothing(singpy: Singpy, anonymous_redirect: RegistryServer, workdir: Path) -> None:
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "wrong", 1 << 20)
    hex_digest = digest.removeprefix("sha256:")
    stored = anonymous_redirect.storage / "docker/registry/v2/blobs/sha256" / hex_digest[:2] / hex_digest / "data"
    stored.write_bytes(os.urandom(stored.stat().st_size))  # the blob host now serves other bytes of that size
    out = sif.parent / "out.sif"
    env = cache_env(singpy, workdir, "wrong")
    cache = Path(env["SINGPY_CACHEDIR"])
    before = traces(sif.parent, cache)
    result = singpy.run("-q", "pull", "--no-https", str(out), reference, env=env)
    assert_one_fatal(result, f"digest mismatch for blob {digest}")
    assert not out.exists()
    assert sorted(path.name for path in (cache / "sif").iterdir()) == []  # no SIF, no .partial, no lock
    assert settled(before, sif.parent, cache) == before


def test_a_stalling_blob_host_fails_within_the_stall_timeout(singpy: Singpy, anonymous_redirect: RegistryServer,
                                                             workdir: Path) -> None:
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "stall", 2 << 20)
    stall = blob_host(anonymous_redirect).stall(digest, after=1 << 20)
    out = sif.parent / "out.sif"
    env = cache_env(singpy, workdir, "stall", SINGPY_PULL_STALL_TIMEOUT="2")
    started = time.monotonic()
    try:
        result = singpy.run("-q", "pull", "--no-https", str(out), reference, env=env, timeout=60)
    finally:
        threading.Thread(target=stall.release).start()
    assert_one_fatal(result, "(for registry 127.0.0.1:")
    assert "is too slow: fewer than" in result.stderr and "SINGPY_PULL_STALL_TIMEOUT" in result.stderr
    assert time.monotonic() - started < 15  # 2 s of stall, once: not tried again (a trickle would trickle again)
    assert not out.exists()
    assert len(blob_host(anonymous_redirect).requests_for(digest)) == 1


def test_what_the_quick_client_does_not_handle_goes_to_the_full_one(singpy: Singpy,
                                                                    anonymous_redirect: RegistryServer,
                                                                    workdir: Path) -> None:
    """A 503 from the blob host: the full client's retry rules (Retry-After), the same file."""
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "fallback", 1 << 20)
    blob_host(anonymous_redirect).fail(digest, status=503, times=1)
    out = sif.parent / "out.sif"
    result = singpy.run("-d", "pull", "--no-https", str(out), reference, env=cache_env(singpy, workdir, "fallback"))
    assert result.returncode == 0, result.stderr
    assert FALLBACK in result.stderr and QUICK not in result.stderr
    assert [request.status for request in blob_host(anonymous_redirect).requests_for(digest)] == [503, 200]
    assert out.read_bytes() == sif.read_bytes()


def test_a_killed_disable_cache_pull_is_swept_by_the_next_one(singpy: Singpy, anonymous_redirect: RegistryServer,
                                                              workdir: Path, other_user: pwd.struct_passwd) -> None:
    """`pull --disable-cache` killed by SIGKILL leaves its temporary cache in $TMPDIR; the next --disable-cache
    run removes it, and only it: not one a live run holds, not a link, not another user's."""
    import fcntl

    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "killed", 2 << 20)
    tmpdir = Path(singpy.tmpdir)
    live = tmpdir / f"singpy-nocache-live-{singpy.profile}"  # a run in progress: its lock held (here, by the test)
    live.mkdir(mode=0o700)
    (live / ".lock").touch()
    target = workdir / f"nocache-target-{singpy.profile}"  # a link's target, with an unlocked .lock
    target.mkdir()
    (target / ".lock").touch()
    link = tmpdir / f"singpy-nocache-link-{singpy.profile}"
    link.symlink_to(target)
    foreign = tmpdir / f"singpy-nocache-foreign-{singpy.profile}"  # another user's
    foreign.mkdir(mode=0o700)
    (foreign / ".lock").touch()
    for path in (live, live / ".lock"):
        os.chown(path, singpy.uid, singpy.gid)
    for path in (foreign, foreign / ".lock"):
        os.chown(path, other_user.pw_uid, other_user.pw_gid)
    before = set(os.listdir(tmpdir))
    env = cache_env(singpy, workdir, "killed")
    out = sif.parent / "b.sif"
    with open(live / ".lock", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stall = blob_host(anonymous_redirect).stall(digest, after=1 << 20)
        killed = singpy.popen(["-q", "pull", "--disable-cache", "--no-https", str(sif.parent / "a.sif"), reference],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert stall.reached.wait(60)
            left = set(os.listdir(tmpdir)) - before
            assert len(left) == 1 and left.pop().startswith("singpy-nocache-")
            killed.kill()
            killed.communicate(timeout=60)
        finally:
            threading.Thread(target=stall.release).start()
        assert len(set(os.listdir(tmpdir)) - before) == 1  # SIGKILL: nothing removed it
        singpy.ok("-q", "pull", "--disable-cache", "--no-https", str(out), reference, env=env)
    assert set(os.listdir(tmpdir)) == before  # the killed run's directory is gone; the others stay
    assert (target / ".lock").exists() and (live / ".lock").exists() and (foreign / ".lock").exists()
    assert out.read_bytes() == sif.read_bytes()
    assert os.listdir(env["SINGPY_CACHEDIR"]) == []
    link.unlink()
    for planted in (live, foreign):
        shutil.rmtree(planted)


def test_over_tls_the_quick_client_verifies_as_the_full_one(singpy: Singpy, registry_tls: RegistryServer,
                                                            workdir: Path) -> None:
    """The quick client's TLS: the registry's CA trusted (SSL_CERT_FILE) or the pull refused, with the full
    client's words, and nothing written."""
    assert registry_tls.ca_file
    sif = sif_copy(singpy, workdir, "quick-tls")
    reference = f"oras://{registry_tls.host}/quick/tls-{singpy.profile}:v1"
    singpy.ok("push", str(sif), reference, env=cache_env(singpy, workdir, "quick-tls-push",
                                                         SSL_CERT_FILE=registry_tls.ca_file))
    out = sif.parent / "out.sif"
    untrusted = singpy.run("-q", "pull", str(out), reference, env=cache_env(singpy, workdir, "quick-tls-untrusted"))
    assert_one_fatal(untrusted, f"can't make a TLS connection to {registry_tls.host}")
    assert not out.exists()
    result = singpy.run("-d", "pull", str(out), reference,
                        env=cache_env(singpy, workdir, "quick-tls", SSL_CERT_FILE=registry_tls.ca_file))
    assert result.returncode == 0 and QUICK in result.stderr, result.stderr
    assert out.read_bytes() == sif.read_bytes()


def seal_of(cache: Path, digest: str) -> Path:
    return cache / "sif" / f"{digest.removeprefix('sha256:')}.id"


def as_if_sealed_in_an_earlier_boot(seal: Path) -> None:
    """The seal's boot id replaced by another (the file keeps its owner and mode: written in place)."""
    words = seal.read_text().split()
    assert len(words) == 3 and words[2] == "unsynced:" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    seal.write_text(f"{words[0]} {words[1]} unsynced:00000000-0000-4000-8000-000000000000\n")


def test_a_download_not_synced_is_hashed_again_after_a_restart(singpy: Singpy, anonymous_redirect: RegistryServer,
                                                               workdir: Path) -> None:
    """The quick pull does not fsync the SIF: its seal names the boot. In a later boot (simulated: the seal's
    boot id changed), a pull or run hashes it again first: the same bytes are sealed for good, a file torn
    by a crash (same size, inode and mtime; other bytes) is downloaded again."""
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "restart", 1 << 20)
    env = cache_env(singpy, workdir, "restart")
    cache = Path(env["SINGPY_CACHEDIR"])
    out = sif.parent / "out.sif"
    singpy.ok("-q", "pull", "--no-https", str(out), reference, env=env)
    out.unlink()  # the cached SIF alone holds those bytes (the pull had linked them there)
    seal = seal_of(cache, digest)
    as_if_sealed_in_an_earlier_boot(seal)
    checked = singpy.run("pull", "--no-https", str(out), reference, env=env)
    assert checked.returncode == 0 and "again: the machine restarted" in checked.stderr, checked.stderr
    assert "does not match" not in checked.stderr and len(seal.read_text().split()) == 2  # sealed for good
    assert out.read_bytes() == sif.read_bytes()
    out.unlink()

    cached = cache / "sif" / f"{digest.removeprefix('sha256:')}.sif"
    seal.write_text(seal.read_text().strip() + " unsynced:00000000-0000-4000-8000-000000000000\n")
    before = cached.stat()
    with open(cached, "r+b") as torn:  # as a crash may leave it: blocks of zeros, the metadata intact
        torn.seek(before.st_size - (256 << 10))
        torn.write(bytes(256 << 10))
    os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    redone = singpy.run("pull", "--no-https", str(out), reference, env=env)
    assert redone.returncode == 0 and "does not match its digest after a restart" in redone.stderr, redone.stderr
    assert out.read_bytes() == sif.read_bytes() == cached.read_bytes()


def test_an_interrupted_quick_download_is_resumed_by_the_next_pull(singpy: Singpy,
                                                                   anonymous_redirect: RegistryServer,
                                                                   workdir: Path) -> None:
    sif, reference, digest = pushed(singpy, anonymous_redirect, workdir, "interrupted", 3 << 20)
    host = blob_host(anonymous_redirect)
    stall = host.stall(digest, after=1 << 20)
    env = cache_env(singpy, workdir, "interrupted")
    out = sif.parent / "out.sif"
    partial = Path(env["SINGPY_CACHEDIR"]) / "sif" / f"{digest.removeprefix('sha256:')}.sif.partial"
    cut = singpy.popen(["pull", "--no-https", str(out), reference], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    try:
        assert stall.reached.wait(60)
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size == 1 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)
        cut.send_signal(signal.SIGTERM)
        _, err = cut.communicate(timeout=60)
    finally:
        threading.Thread(target=stall.release).start()
    assert cut.returncode == 255 and "FATAL:" in err and "SIGTERM" in err and "Traceback" not in err, err
    assert not out.exists() and partial.stat().st_size == 1 << 20
    resumed = singpy.run("-d", "pull", "--no-https", str(out), reference, env=env)
    assert resumed.returncode == 0 and QUICK in resumed.stderr, resumed.stderr
    assert host.requests_for(digest)[-1].range == f"bytes={1 << 20}-"
    assert out.read_bytes() == sif.read_bytes() and not partial.exists()

"""`singpy pull`, `build` and `run` end to end (issue 10), as test_pull.py: credentials, TLS and redirects of
docker:// registries, local sources (OCI layouts and archives, docker archives) and build, and the errors a
user can cause (one FATAL line that leaves nothing behind). Real registries (tests.support.registry), images
written byte for byte by tests.support.oci, and the real `singpy` command as root and as the test user.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.leftovers import settled, traces
from tests.support.oci import (
    busybox_image,
    file,
    multiarch_index,
    write_docker_archive,
    write_layout,
    write_oci_archive,
)
from tests.support.pulling import cache_env, main_image, pushed, user_dir
from tests.support.registry import (
    RegistryServer,
    start_registry,
)


@pytest.fixture(scope="module")
def plain(registry_plain: RegistryServer, workdir: Path) -> RegistryServer:
    """registry_plain holding the pull tests' images."""
    return pushed(registry_plain, workdir)


# --- credentials, TLS, redirects -------------------------------------------------------------------------------------


def test_basic_auth(singpy: Singpy, registry_basic: RegistryServer, workdir: Path, tmp_path: Path) -> None:
    registry_basic.push(write_layout(tmp_path / "layout", {"latest": main_image()}), "pull/basic")
    reference = registry_basic.ref("pull/basic")
    anonymous = singpy.run("exec", "--no-https", reference, "true", env=cache_env(singpy, workdir, "basic-anon"))
    assert_one_fatal(anonymous, f"access to {reference} denied by {registry_basic.host}")
    wrong = singpy.run("exec", "--no-https", reference, "true", env=cache_env(
        singpy, workdir, "basic-wrong", APPTAINER_DOCKER_USERNAME="alice", APPTAINER_DOCKER_PASSWORD="wrong"))
    assert_one_fatal(wrong, f"access to {reference} denied by {registry_basic.host}")
    right = cache_env(singpy, workdir, "basic-right", SINGULARITY_DOCKER_USERNAME=registry_basic.username,
                      SINGULARITY_DOCKER_PASSWORD=registry_basic.password)
    assert singpy.ok("exec", "--no-https", reference, "cat", "/etc/image-marker", env=right) == "main image\n"
    config = user_dir(singpy, workdir, "docker-config")
    (config / "config.json").write_text(__import__("json").dumps(registry_basic.docker_config()))
    config.chmod(0o755)
    (config / "config.json").chmod(0o644)
    from_config = cache_env(singpy, workdir, "basic-config", DOCKER_CONFIG=str(config))
    assert singpy.ok("exec", "--no-https", reference, "true", env=from_config) == ""
    authfile = cache_env(singpy, workdir, "basic-authfile")
    assert singpy.ok("exec", "--no-https", "--authfile", str(config / "config.json"), reference, "true",
                     env=authfile) == ""
    login = singpy.run("pull", "--docker-login", "--no-https", str(tmp_path / "never.sif"), reference,
                       env=cache_env(singpy, workdir, "basic-login"), input="")
    assert login.returncode != 0 and "Traceback" not in login.stderr


def test_token_auth(singpy: Singpy, registry_token: RegistryServer, workdir: Path, tmp_path: Path) -> None:
    layout = write_layout(tmp_path / "layout", {"latest": main_image()})
    registry_token.push(layout, "public/main")
    registry_token.push(layout, "private/main")
    anonymous = cache_env(singpy, workdir, "token-anon")
    assert singpy.ok("exec", "--no-https", registry_token.ref("public/main"), "true", env=anonymous) == ""
    refused = singpy.run("exec", "--no-https", registry_token.ref("private/main"), "true", env=anonymous)
    assert_one_fatal(refused, f"access to {registry_token.ref('private/main')} denied")
    assert "--docker-login" in refused.stderr
    user = cache_env(singpy, workdir, "token-user", SINGPY_DOCKER_USERNAME="alice",
                     SINGPY_DOCKER_PASSWORD="wonderland")
    assert singpy.ok("exec", "--no-https", registry_token.ref("private/main"), "cat", "/etc/image-marker",
                     env=user) == "main image\n"


def test_tls_with_the_ca_in_ssl_cert_file(singpy: Singpy, registry_tls: RegistryServer, workdir: Path,
                                         tmp_path: Path) -> None:
    registry_tls.push(write_layout(tmp_path / "layout", {"latest": main_image()}), "pull/tls")
    reference = registry_tls.ref("pull/tls")
    untrusted = singpy.run("exec", reference, "true", env=cache_env(singpy, workdir, "tls-untrusted"))
    assert_one_fatal(untrusted, registry_tls.host)
    assert registry_tls.ca_file
    trusted = cache_env(singpy, workdir, "tls-trusted", SSL_CERT_FILE=registry_tls.ca_file)
    assert singpy.ok("exec", reference, "cat", "/etc/image-marker", env=trusted) == "main image\n"


def test_blob_redirect_never_forwards_authorization(singpy: Singpy, registry_redirect: RegistryServer,
                                                    workdir: Path, tmp_path: Path) -> None:
    layer = oci.Layer([file("etc/redirected", "yes\n"), file("etc/profile-name", singpy.profile)])
    registry_redirect.push(write_layout(tmp_path / "layout", {"latest": busybox_image(layers=[layer])}),
                           "pull/redirect")
    env = cache_env(singpy, workdir, "redirect", SINGPY_DOCKER_USERNAME=registry_redirect.username,
                    SINGPY_DOCKER_PASSWORD=registry_redirect.password)
    assert singpy.ok("exec", "--no-https", registry_redirect.ref("pull/redirect"), "cat", "/etc/redirected",
                     env=env) == "yes\n"
    assert registry_redirect.blob_host is not None
    served = registry_redirect.blob_host.requests_for(layer.digest)
    assert served and all(request.authorization is None for request in served)


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_interrupted_download_resumes_with_a_range_request(singpy: Singpy, registry_redirect: RegistryServer,
                                                           workdir: Path, signal_number: int) -> None:
    layer = oci.Layer([file("big", os.urandom(3 << 20))], compression="none")  # unique: os.urandom
    registry_redirect.upload(busybox_image(layers=[layer]), "pull/resume")
    host = registry_redirect.blob_host
    assert host is not None
    env = cache_env(singpy, workdir, f"resume-{signal_number}", SINGPY_DOCKER_USERNAME=registry_redirect.username,
                    SINGPY_DOCKER_PASSWORD=registry_redirect.password)
    out = user_dir(singpy, workdir, f"resume-{signal_number}") / "resume.sif"
    stall = host.stall(layer.digest, after=1 << 20)
    cut = singpy.popen(["pull", "--no-https", str(out), registry_redirect.ref("pull/resume")], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert stall.reached.wait(60)
        partial = Path(env["SINGPY_CACHEDIR"]) / "blobs" / "sha256" / f"{layer.digest.removeprefix('sha256:')}.partial"
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size == 1 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)  # the first megabyte is on disk: what a resume starts from
        cut.send_signal(signal_number)
        _, err = cut.communicate(timeout=60)
    finally:
        threading.Thread(target=stall.release).start()
    if signal_number == signal.SIGTERM:
        assert cut.returncode == 255 and "FATAL:" in err and "SIGTERM" in err and "Traceback" not in err
    assert not out.exists() and os.listdir(out.parent) == []
    singpy.ok("pull", "--no-https", str(out), registry_redirect.ref("pull/resume"), env=env)
    assert host.requests_for(layer.digest)[-1].range == f"bytes={1 << 20}-"
    assert singpy.ok("exec", str(out), "stat", "-c", "%s", "/big", env=env) == f"{3 << 20}\n"
    cache = Path(env["SINGPY_CACHEDIR"])
    assert os.listdir(cache / "tmp") == []  # a killed pull's work directory went with the next conversion
    assert not [name for name in os.listdir(cache / "blobs" / "sha256") if name.endswith(".partial")]


# --- local sources and build -----------------------------------------------------------------------------------------


def test_local_layouts_and_archives(singpy: Singpy, workdir: Path) -> None:
    tmp_path = user_dir(singpy, workdir, "local")
    image = main_image()
    layout = write_layout(tmp_path / "layout", {"v1": image, "multi": multiarch_index()})
    archive = write_oci_archive(tmp_path / "image.tar", {"v1": image})
    saved = write_docker_archive(tmp_path / "saved.tar", image, repo_tags=["test/main:latest"])
    env = cache_env(singpy, workdir, "local")
    for reference in (f"oci:{layout}:v1", f"oci-archive:{archive}", f"docker-archive:{saved}"):
        assert singpy.ok("run", reference, "x", env=env) == "tool ran x\n", reference
    assert singpy.ok("exec", f"oci:{layout}:multi", "cat", "/etc/platform-marker", env=env) == "linux/amd64\n"
    # Apptainer 1.5's pull --sandbox (APPTAINER_SANDBOX): a directory, as build --sandbox makes it
    singpy.ok("pull", "--sandbox", str(tmp_path / "tree"), f"oci:{layout}:v1", env=env)
    singpy.ok("pull", str(tmp_path / "tree2"), f"oci-archive:{archive}", env={**env, "APPTAINER_SANDBOX": "1"})
    for tree in ("tree", "tree2"):
        assert singpy.ok("run", str(tmp_path / tree), "y", env=env) == "tool ran y\n"
    assert_one_fatal(singpy.run("pull", "--sandbox", str(tmp_path / "tree"), f"oci:{layout}:v1", env=env),
                     "already exists")
    # Apptainer's deprecated -U/--allow-unsigned/--allow-unauthenticated: accepted, with a warning
    for flag in ("-U", "--allow-unsigned", "--allow-unauthenticated"):
        pulled = singpy.run("pull", flag, str(tmp_path / f"pulled{flag}.sif"), f"oci:{layout}:v1", env=env)
        assert pulled.returncode == 0 and pulled.stderr.startswith(
            "WARNING: --allow-unsigned (--allow-unauthenticated) is deprecated and changes nothing"), pulled.stderr
        assert (tmp_path / f"pulled{flag}.sif").stat().st_size > 0


def test_a_docker_archive_listing_one_layer_100000_times_is_one_fatal_at_once(singpy: Singpy, workdir: Path) -> None:
    """A 4 MB archive whose manifest.json names its 4 MiB layer 100000 times: 400 GB to hash and unpack."""
    out = user_dir(singpy, workdir, "repeats")
    manifest = [{"Config": "config.json", "RepoTags": ["x/repeats:1"], "Layers": ["layer.tar"] * 100000}]
    archive = workdir / f"repeats-{singpy.profile}.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("manifest.json", json.dumps(manifest).encode()), ("config.json", b"{}"),
                           ("layer.tar", b"\0" * (4 << 20))):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    archive.chmod(0o644)
    result = singpy.run("pull", str(out / "repeats.sif"), f"docker-archive:{archive}",
                        env=cache_env(singpy, workdir, "repeats"), timeout=30)
    assert_one_fatal(result, "lists 100000 layers (singpy reads at most 1000)")
    assert os.listdir(out) == []


def test_build_sif_and_sandbox_from_docker(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    tmp_path = user_dir(singpy, workdir, "build")
    env = cache_env(singpy, workdir, "build")
    singpy.ok("build", "--no-https", str(tmp_path / "built.sif"), plain.ref("pull/main"), env=env)
    assert singpy.ok("run", str(tmp_path / "built.sif"), env=env) == "tool ran default arg\n"
    singpy.ok("build", "--sandbox", "--no-https", str(tmp_path / "sandbox"), plain.ref("pull/main"), env=env)
    sandbox = tmp_path / "sandbox"
    assert (sandbox / "etc" / "image-marker").read_text() == "main image\n"
    assert singpy.ok("run", str(sandbox), "y", env=env) == "tool ran y\n"
    if singpy.profile == "root":  # a user's sandbox holds the user's files, as Apptainer's does
        assert (sandbox / "home" / "user").stat().st_uid == 1000
    assert sorted(os.listdir(tmp_path)) == ["built.sif", "sandbox"]


def test_cache_clean_removes_pulled_images_and_blobs(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    env = cache_env(singpy, workdir, "clean")
    singpy.ok("exec", "--no-https", plain.ref("pull/main"), "true", env=env)
    cache = Path(env["SINGPY_CACHEDIR"])
    assert os.listdir(cache / "sif") and os.listdir(cache / "blobs" / "sha256")
    singpy.ok("cache", "clean", "--force", env=env)
    assert [name for name in os.listdir(cache / "sif")] == []
    assert os.listdir(cache / "blobs" / "sha256") == []
    assert "pulled" not in singpy.ok("cache", "list", env=env)


def test_cache_types_select_what_is_listed_and_cleaned(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    """Apptainer's `cache list|clean -T TYPE,...`: a docker:// pull is an `oci` image, its layers `blob`s."""
    env = cache_env(singpy, workdir, "clean-types")
    singpy.ok("exec", "--no-https", plain.ref("pull/main"), "true", env=env)
    cache = Path(env["SINGPY_CACHEDIR"])
    blobs = len(os.listdir(cache / "blobs" / "sha256"))
    listed = singpy.ok("cache", "list", "-T", "library", env=env)
    assert listed == f"nothing of type library in {cache}\n"
    listed = singpy.ok("cache", "list", "--type", "blobs", "-v", env=env)
    assert listed.startswith(f"{blobs} layer blob(s), ") and "pulled" not in listed and "unpacked" not in listed
    listed = singpy.ok("cache", "list", "-T", "oci,shub", env=env)
    assert f"{plain.host}/pull/main:latest" in listed and "1 pulled image(s)" in listed and "blob" not in listed
    assert singpy.ok("cache", "clean", "-f", "-T", "library,net,oras", env=env) == f"nothing to remove in {cache}\n"
    assert singpy.ok("cache", "clean", "-f", "-T", "blob", env=env) == f"removed {blobs} cache entries from {cache}\n"
    assert os.listdir(cache / "blobs" / "sha256") == []
    assert any(name.endswith(".sif") for name in os.listdir(cache / "sif"))
    assert singpy.ok("cache", "clean", "-f", "-T", "oci", env=env) == f"removed 1 cache entries from {cache}\n"
    assert os.listdir(cache / "sif") == []
    assert_one_fatal(singpy.run("cache", "list", "-T", "bogus", env=env), "unknown cache type 'bogus'", code=1)


# --- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reference", "message"), [
    ("foo://x/y", "unknown transport"),
    ("docker://Upper/Case", "docker://Upper/Case"),
    ("docker://127.0.0.1:1/nothing/here", "127.0.0.1:1"),
    ("oci-archive:/nonexistent/archive.tar", "/nonexistent/archive.tar"),
])
def test_bad_references_are_one_fatal_line(singpy: Singpy, workdir: Path, reference: str, message: str) -> None:
    tmp_path = user_dir(singpy, workdir, f"bad-{abs(hash(reference))}")
    env = cache_env(singpy, workdir, f"bad-{abs(hash(reference))}")
    before = traces(tmp_path, env["SINGPY_CACHEDIR"])
    result = singpy.run("pull", "--no-https", str(tmp_path / "x.sif"), reference, env=env)
    assert_one_fatal(result, message)
    assert os.listdir(tmp_path) == []
    assert settled(before, tmp_path, env["SINGPY_CACHEDIR"]) == before


def test_unknown_tag_names_the_reference_and_registry(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    reference = plain.ref("pull/main", "no-such-tag")
    result = singpy.run("exec", "--no-https", reference, "true", env=cache_env(singpy, workdir, "unknown-tag"))
    assert_one_fatal(result, reference)
    assert plain.host in result.stderr.splitlines()[0]


def test_digest_mismatch_discards_the_blob(singpy: Singpy, workdir: Path, tmp_path: Path) -> None:
    layer = oci.Layer([file("etc/tampered", "original\n")])
    with start_registry(tmp_path / "registry") as registry:
        registry.upload(busybox_image(layers=[layer]), "pull/tampered")
        hex_digest = layer.digest.removeprefix("sha256:")
        stored = registry.storage / "docker/registry/v2/blobs/sha256" / hex_digest[:2] / hex_digest / "data"
        stored.write_bytes(oci.compress(oci.tar_bytes([file("etc/tampered", "evil\n")]), "gzip"))
        env = cache_env(singpy, workdir, "tampered")
        result = singpy.run("-q", "exec", "--no-https", registry.ref("pull/tampered"), "true", env=env)
    assert_one_fatal(result, "digest mismatch")
    blobs = Path(env["SINGPY_CACHEDIR"]) / "blobs" / "sha256"
    assert not [name for name in os.listdir(blobs) if name.startswith(hex_digest)]
    assert os.listdir(Path(env["SINGPY_CACHEDIR"]) / "sif") == []


def test_full_work_directory_names_it_and_the_variable(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = user_dir(singpy, workdir, "small")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=1777", "tmpfs", str(small)], check=True)
    try:
        env = cache_env(singpy, workdir, "full", SINGPY_TMPDIR=str(small))
        result = singpy.run("-q", "exec", "--no-https", plain.ref("pull/main"), "true", env=env)
        assert_one_fatal(result, f"no space left on device in {small}: set SINGPY_TMPDIR")
        assert "SINGPY_TMPDIR" in result.stderr
        assert os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a small filesystem of the test's own needs root to mount")
@pytest.mark.parametrize("full", ["cache", "tmpdir"])
def test_a_full_disk_is_named_right(singpy: Singpy, workdir: Path, full: str) -> None:
    """The cache on one small disk and SINGPY_TMPDIR on another: the error names the one that is full."""
    from tests.conftest import SINGPY

    base = user_dir(singpy, workdir, f"full-{full}")
    archive = write_oci_archive(base / "image.tar", {"latest": busybox_image()})
    cache, tmp = base / "cache", base / "tmp"
    for made in (cache, tmp):
        made.mkdir(mode=0o700)
        os.chown(made, singpy.uid, singpy.gid)
    small = cache if full == "cache" else tmp
    user = f"setpriv --reuid={singpy.uid} --regid={singpy.gid} --clear-groups " if singpy.uid else ""
    script = (f"mount -t tmpfs -o size=300k,mode=0700,uid={singpy.uid},gid={singpy.gid} small {small} && "
              f"{user}{SINGPY} pull {base}/out.sif oci-archive:{archive}")
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env=singpy.env(SINGPY_CACHEDIR=str(cache), SINGPY_TMPDIR=str(tmp)), check=False)
    variable = "SINGPY_CACHEDIR (or APPTAINER_CACHEDIR)" if full == "cache" else "SINGPY_TMPDIR"
    assert done.returncode == 255, done.stderr
    assert f"FATAL:   no space left on device in {small}: set {variable} to a directory with room" in done.stderr
    assert not (base / "out.sif").exists() and os.listdir(tmp) == []


def test_on_a_terminal_the_squash_bar_shows_counts_not_a_stuck_zero(singpy: Singpy, plain: RegistryServer,
                                                                    workdir: Path) -> None:
    """mksquashfs draws its progress only on a terminal: singpy gives it one, and shows no "0/?" meanwhile."""
    from tests.conftest import SINGPY

    base = user_dir(singpy, workdir, "squash-bar")
    archive = write_oci_archive(base / "image.tar", {"latest": busybox_image()})
    command = f"{SINGPY} pull {base}/out.sif oci-archive:{archive}"
    # the tree path, whose squasher is mksquashfs (a merged stream's bar: test_pull_stream.py)
    env = cache_env(singpy, workdir, "squash-bar", TERM="xterm", COLUMNS="120", SINGPY_PULL_TREE="1")
    done = subprocess.run(["script", "-q", "-e", "-c", command, "/dev/null"], capture_output=True, text=True,
                          env=env, timeout=120, check=False, **singpy.switch())  # type: ignore[call-overload]
    assert done.returncode == 0, done.stdout + done.stderr
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout)
    assert "Squashing oci-archive:" in screen and re.search(r"Squashing oci-archive:\S+\s+\S*\s*(\d+)/\1 ", screen)
    assert "0/?" not in screen
    assert (base / "out.sif").is_file()
    # two images on the same busybox layer: the second's cached layer is an INFO line on a terminal too
    for number, name in enumerate(("pull/no-media-type", "pull/main")):
        command = f"{SINGPY} pull --no-https {base}/{number}.sif {plain.ref(name)}"
        again = subprocess.run(["script", "-q", "-e", "-c", command, "/dev/null"], capture_output=True, text=True,
                               env=env, timeout=120, check=False, **singpy.switch())  # type: ignore[call-overload]
        assert again.returncode == 0, again.stdout + again.stderr
    assert "INFO:    Using cached layer sha256:" in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", again.stdout)

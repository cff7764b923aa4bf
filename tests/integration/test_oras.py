"""`oras://`: SIF files in OCI registries, pulled, run and pushed as Apptainer does (issue 29, part A).

Real things only: Debian's docker-registry (plain, Basic, token, TLS: tests.support.registry), a SIF built by
singpy, and an independent client, the `oras` Python SDK from PyPI, which pushes what singpy pulls and pulls
what singpy pushes, byte for byte. Every case runs as root and as the unprivileged test user.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support.leftovers import settled, traces
from tests.support.oci import busybox_image
from tests.support.oras_sifs import (
    SIF_CONFIG,
    SIF_LAYER,
    cache_env,
    sdk,
    sdk_push,
    sdk_pushed,
    sha256,
    sif_copy,
    user_dir,
)
from tests.support.registry import RegistryServer, start_registry
from tests.support.sifs import new_cache


def manifest(registry: RegistryServer, repository: str, tag: str) -> dict[str, object]:
    request = urllib.request.Request(f"{registry.url}/v2/{repository}/manifests/{tag}",
                                     headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        found: dict[str, object] = json.load(response)
    return found


def cached_files(cache: Path) -> list[str]:
    """Every file under the pulled images' cache, the private directories included (none half-written)."""
    return sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file())


def test_a_sif_pushed_by_the_oras_sdk_is_pulled_and_runs(singpy: Singpy, registry_plain: RegistryServer,
                                                          workdir: Path) -> None:
    repository = f"oras/sdk-{singpy.profile}"
    sif, reference = sdk_pushed(singpy, registry_plain, workdir, "sdk-pushed", f"{repository}:v1")
    out = user_dir(singpy, workdir, "sdk-pull") / "pulled.sif"
    env = cache_env(singpy, workdir, "sdk-pull")
    result = singpy.run("pull", "--no-https", str(out), reference, env=env)
    assert result.returncode == 0, result.stderr
    assert f"pulled {reference} to {out}" in result.stderr
    assert out.read_bytes() == sif.read_bytes()
    assert singpy.ok("exec", str(out), "echo", "from the pulled file", env=env) == "from the pulled file\n"
    # exec oras://: from the cache filled by the pull, one HEAD request and nothing printed
    ran = singpy.run("exec", "--no-https", reference, "echo", "from the cache", env=env)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "from the cache\n", "")
    listing = singpy.ok("cache", "list", env=env)
    assert f"{registry_plain.host}/{repository}:v1" in listing


def test_a_pulled_sif_takes_the_users_umask(singpy: Singpy, registry_plain: RegistryServer, workdir: Path) -> None:
    """Under umask 077 the pulled SIF is 0700, not readable by others (it was always 0755)."""
    _, reference = sdk_pushed(singpy, registry_plain, workdir, "umask", f"oras/umask-{singpy.profile}:v1")
    out = user_dir(singpy, workdir, "umask-pull") / "private.sif"
    done: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]  # switch(): user, group
        [SINGPY, "pull", "--no-https", str(out), reference], env=cache_env(singpy, workdir, "umask"),
        capture_output=True, text=True, timeout=120, umask=0o077, **singpy.switch())
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700


def test_default_name_and_exec_without_a_pull(singpy: Singpy, registry_plain: RegistryServer, workdir: Path) -> None:
    sif, reference = sdk_pushed(singpy, registry_plain, workdir, "default-name", f"oras/named-{singpy.profile}:2.0")
    env = cache_env(singpy, workdir, "default-name")
    first = singpy.run("exec", "--no-https", reference, "cat", "/proc/self/comm", env=env)
    assert (first.returncode, first.stdout) == (0, "cat\n"), first.stderr
    assert f"Downloading {reference}" in first.stderr
    folder = user_dir(singpy, workdir, "default-name-out")
    singpy.ok("pull", "--no-https", reference, env=env, cwd=folder)
    assert (folder / f"named-{singpy.profile}_2.0.sif").read_bytes() == sif.read_bytes()


def test_singpy_push_is_pulled_by_the_oras_sdk_byte_for_byte(singpy: Singpy, registry_plain: RegistryServer,
                                                             workdir: Path, tmp_path: Path) -> None:
    sif = sif_copy(singpy, workdir, "singpy-pushed")
    repository = f"oras/pushed-{singpy.profile}"
    reference = f"oras://{registry_plain.host}/{repository}:v1"
    result = singpy.run("push", "--no-https", str(sif), reference, env=cache_env(singpy, workdir, "push"))
    assert result.returncode == 0, result.stderr
    assert f"pushed {sif} to {reference} (sha256:{sha256(sif)})" in result.stderr
    body = manifest(registry_plain, repository, "v1")
    assert body["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    empty = f"sha256:{hashlib.sha256(b'{}').hexdigest()}"
    assert body["config"] == {"mediaType": SIF_CONFIG, "size": 2, "digest": empty}
    assert body["layers"] == [{"mediaType": SIF_LAYER, "size": sif.stat().st_size, "digest": f"sha256:{sha256(sif)}",
                               "annotations": {"org.opencontainers.image.title": sif.name}}]
    files = sdk(registry_plain).pull(target=f"{registry_plain.host}/{repository}:v1", outdir=str(tmp_path))
    assert [Path(name).name for name in files] == [sif.name]
    assert Path(files[0]).read_bytes() == sif.read_bytes()
    # pushed again: the blobs are there already, only the manifest is put
    again = singpy.run("push", "--no-https", str(sif), reference, env=cache_env(singpy, workdir, "push-again"))
    assert again.returncode == 0, again.stderr


def test_cached_oras_image_runs_when_the_registry_is_gone(singpy: Singpy, workdir: Path, tmp_path: Path) -> None:
    sif = sif_copy(singpy, workdir, "offline")
    env = cache_env(singpy, workdir, "offline")
    with start_registry(tmp_path / "registry") as registry:
        sdk_push(registry, sif, "oras/offline:v1")
        reference = f"oras://{registry.host}/oras/offline:v1"
        singpy.ok("exec", "--no-https", reference, "true", env=env)
    result = singpy.run("exec", "--no-https", reference, "echo", "offline", env=env)
    assert (result.returncode, result.stdout) == (0, "offline\n"), result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:") and registry.host in warnings[0]


def test_basic_auth_push_and_pull(singpy: Singpy, registry_basic: RegistryServer, workdir: Path) -> None:
    sif = sif_copy(singpy, workdir, "basic")
    reference = f"oras://{registry_basic.host}/oras/basic-{singpy.profile}:v1"
    anonymous = singpy.run("push", "--no-https", str(sif), reference, env=cache_env(singpy, workdir, "basic-anon"))
    assert_one_fatal(anonymous, f"access to {reference} denied by {registry_basic.host}")
    wrong = cache_env(singpy, workdir, "basic-wrong", SINGPY_DOCKER_USERNAME="alice", SINGPY_DOCKER_PASSWORD="no")
    refused = singpy.run("push", "--no-https", str(sif), reference, env=wrong)
    assert_one_fatal(refused, "the password of 'alice' was refused")
    right = cache_env(singpy, workdir, "basic-right", SINGPY_DOCKER_USERNAME=registry_basic.username,
                      SINGPY_DOCKER_PASSWORD=registry_basic.password)
    singpy.ok("push", "--no-https", str(sif), reference, env=right)
    out = user_dir(singpy, workdir, "basic-out") / "basic.sif"
    singpy.ok("pull", "--no-https", str(out), reference, env=right)
    assert out.read_bytes() == sif.read_bytes()
    denied = singpy.run("exec", "--no-https", reference, "true", env=cache_env(singpy, workdir, "basic-denied"))
    assert_one_fatal(denied, f"access to {reference} denied")


def test_token_auth_push_and_pull(singpy: Singpy, registry_token: RegistryServer, workdir: Path) -> None:
    sif = sif_copy(singpy, workdir, "token")
    private = f"oras://{registry_token.host}/private/oras-{singpy.profile}:v1"
    credentials = {"SINGPY_DOCKER_USERNAME": "alice", "SINGPY_DOCKER_PASSWORD": "wonderland"}
    anonymous = singpy.run("push", "--no-https", str(sif), private, env=cache_env(singpy, workdir, "token-anon"))
    assert_one_fatal(anonymous, f"access to {private} denied")
    singpy.ok("push", "--no-https", str(sif), private, env=cache_env(singpy, workdir, "token-push", **credentials))
    env = cache_env(singpy, workdir, "token-run", **credentials)
    assert singpy.ok("exec", "--no-https", private, "echo", "token", env=env) == "token\n"
    refused = singpy.run("exec", "--no-https", private, "true", env=cache_env(singpy, workdir, "token-refused"))
    assert_one_fatal(refused, f"access to {private} denied")


def test_tls_push_and_pull(singpy: Singpy, registry_tls: RegistryServer, workdir: Path) -> None:
    sif = sif_copy(singpy, workdir, "tls")
    reference = f"oras://{registry_tls.host}/oras/tls-{singpy.profile}:v1"
    untrusted = singpy.run("push", str(sif), reference, env=cache_env(singpy, workdir, "tls-untrusted"))
    assert_one_fatal(untrusted, f"can't make a TLS connection to {registry_tls.host}")
    assert registry_tls.ca_file
    env = cache_env(singpy, workdir, "tls", SSL_CERT_FILE=registry_tls.ca_file)
    singpy.ok("push", str(sif), reference, env=env)
    assert singpy.ok("exec", reference, "echo", "over tls", env=env) == "over tls\n"


def test_errors_are_one_fatal_line_and_leave_nothing(singpy: Singpy, registry_plain: RegistryServer,
                                                     workdir: Path) -> None:
    registry_plain.upload(busybox_image(), f"oras/docker-{singpy.profile}")
    cache = new_cache(singpy, workdir, "oras-errors")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    folder = user_dir(singpy, workdir, "errors")
    out = folder / "out.sif"
    before = traces(folder, cache)
    host = registry_plain.host
    missing = singpy.run("pull", "--no-https", str(out), f"oras://{host}/oras/none-{singpy.profile}:v1", env=env)
    assert_one_fatal(missing, f"oras://{host}/oras/none-{singpy.profile}:v1 not found in registry {host}")
    docker = singpy.run("pull", "--no-https", str(out), f"oras://{host}/oras/docker-{singpy.profile}", env=env)
    assert_one_fatal(docker, "is not a SIF stored with ORAS: its layer is of type 'application/vnd.oci.image.layer")
    ran = singpy.run("exec", "--no-https", f"oras://{host}/oras/docker-{singpy.profile}", "true", env=env)
    assert_one_fatal(ran, "is not a SIF stored with ORAS")
    not_sif = folder / "notes.txt"
    not_sif.write_text("not an image\n")
    pushed = singpy.run("push", "--no-https", str(not_sif), f"oras://{host}/oras/text:v1", env=env)
    assert_one_fatal(pushed, f"can't push {not_sif}: it is not a usable SIF")
    bad = singpy.run("push", "--no-https", str(not_sif), f"oras://{host}/Oras/UPPER:v1", env=env)
    assert_one_fatal(bad, f"malformed reference oras://{host}/Oras/UPPER:v1", code=255)
    by_digest = singpy.run("push", "--no-https", str(not_sif), f"oras://{host}/oras/x@sha256:{'0' * 64}", env=env)
    assert_one_fatal(by_digest, "name a tag, not a digest")
    unknown = singpy.run("push", str(not_sif), "ftp://example.org/x", env=env)
    assert_one_fatal(unknown, "singpy push takes oras://HOST/REPO:TAG", code=1)
    fifo = folder / "image.fifo"
    os.mkfifo(fifo)
    blocked = singpy.run("push", "--no-https", str(fifo), f"oras://{host}/oras/fifo:v1", env=env, timeout=20)
    assert_one_fatal(blocked, f"image {fifo} is a FIFO, not a regular file")
    assert sorted(os.listdir(folder)) == ["image.fifo", "notes.txt"]
    assert [name for name in cached_files(cache) if not name.startswith("refs/")] == []
    assert settled(before, folder, cache) == before


def test_bootstrap_oras_builds_on_the_pulled_sif(singpy: Singpy, registry_plain: RegistryServer,
                                                 workdir: Path) -> None:
    sif = sif_copy(singpy, workdir, "bootstrap")
    repository = f"oras/bootstrap-{singpy.profile}"
    sdk_push(registry_plain, sif, f"{repository}:v1")
    folder = sif.parent
    recipe = folder / "recipe.def"
    recipe.write_text(f"Bootstrap: oras\nFrom: {registry_plain.host}/{repository}:v1\n\n"
                      "%post\n    echo built on the oras image > /post-made\n")
    env = cache_env(singpy, workdir, "bootstrap")
    built = singpy.run("build", "--no-https", str(folder / "built.sif"), str(recipe), env=env, timeout=180)
    assert built.returncode == 0, built.stderr
    assert singpy.ok("exec", str(folder / "built.sif"), "cat", "/post-made", env=env) == "built on the oras image\n"
    # `build OUT oras://REF`: the pulled SIF built from as a local one (Apptainer's oras build source)
    reference = f"oras://{registry_plain.host}/{repository}:v1"
    direct = singpy.run("build", "--no-https", "--sandbox", str(folder / "tree"), reference, env=env, timeout=180)
    assert direct.returncode == 0 and direct.stderr.endswith(f"into the sandbox {folder / 'tree'}\n"), direct.stderr
    assert singpy.ok("exec", str(folder / "tree"), "echo", "from the tree", env=env) == "from the tree\n"


def test_an_interrupted_download_resumes_with_a_range_request(singpy: Singpy, registry_redirect: RegistryServer,
                                                              workdir: Path) -> None:
    sif = sif_copy(singpy, workdir, "resume")
    blob = sif.parent / "random.bin"
    blob.write_bytes(os.urandom(3 << 20))  # unique bytes: a SIF no other test pushed
    subprocess.run(["siftool", "add", "--datatype", "7", str(sif), str(blob)], check=True, stdout=subprocess.DEVNULL)
    blob.unlink()
    digest = f"sha256:{sha256(sif)}"
    reference = f"oras://{registry_redirect.host}/oras/resume-{singpy.profile}:v1"
    env = cache_env(singpy, workdir, "resume", SINGPY_DOCKER_USERNAME=registry_redirect.username,
                    SINGPY_DOCKER_PASSWORD=registry_redirect.password)
    singpy.ok("push", "--no-https", str(sif), reference, env=env)
    host = registry_redirect.blob_host
    assert host is not None
    out = sif.parent / "resumed.sif"
    stall = host.stall(digest, after=1 << 20)
    cut = singpy.popen(["pull", "--no-https", str(out), reference], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    partial = Path(env["SINGPY_CACHEDIR"]) / "sif" / f"{digest.removeprefix('sha256:')}.sif.partial"
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
    singpy.ok("pull", "--no-https", str(out), reference, env=env)
    assert host.requests_for(digest)[-1].range == f"bytes={1 << 20}-"
    assert out.read_bytes() == sif.read_bytes() and not partial.exists()


def test_on_a_terminal_pull_and_push_show_a_byte_count_bar(singpy: Singpy, registry_plain: RegistryServer,
                                                           workdir: Path) -> None:
    from tests.conftest import SINGPY

    sif = sif_copy(singpy, workdir, "terminal")
    reference = f"oras://{registry_plain.host}/oras/terminal-{singpy.profile}:v1"
    env = cache_env(singpy, workdir, "terminal", TERM="xterm", COLUMNS="120")
    for command in (f"{SINGPY} push --no-https {sif} {reference}",
                    f"{SINGPY} pull --no-https {sif.parent}/pulled.sif {reference}"):
        done = subprocess.run(["script", "-q", "-e", "-c", command, "/dev/null"], capture_output=True, text=True,
                              env=env, timeout=120, check=False, **singpy.switch())  # type: ignore[call-overload]
        assert done.returncode == 0, done.stdout + done.stderr
        screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout)
        assert re.search(r"SIF sha256:[0-9a-f]{12}\S*\s+\S*\s*[0-9.]+/[0-9.]+ [kMG]?B", screen), screen
    assert (sif.parent / "pulled.sif").read_bytes() == sif.read_bytes()


def test_delete_removes_a_manifest_as_apptainer_does(singpy: Singpy, registry_basic: RegistryServer,
                                                     workdir: Path) -> None:
    """`delete oras://` sends what Apptainer's does (go-containerregistry's remote.Delete): DELETE of the manifest
    the reference names, with its question and words. Debian's docker-registry, as Docker's distribution 2.x,
    deletes by digest only: a tag is its refusal, one FATAL line, and the image stays."""
    sif = sif_copy(singpy, workdir, "delete")
    repository = f"oras/delete-{singpy.profile}"
    tagged = f"oras://{registry_basic.host}/{repository}:v1"
    env = cache_env(singpy, workdir, "delete", SINGPY_DOCKER_USERNAME=registry_basic.username,
                    SINGPY_DOCKER_PASSWORD=registry_basic.password)
    singpy.ok("push", "--no-https", str(sif), tagged, env=env)
    by_tag = singpy.run("delete", "--no-https", "-F", tagged, env=env)
    assert_one_fatal(by_tag, f"registry {registry_basic.host} answered HTTP 400 to the delete of "
                             f"{registry_basic.host}/{repository}:v1")
    assert "DIGEST_INVALID" in by_tag.stderr
    digest = f"sha256:{sha256(sif)}"
    manifest_digest = "sha256:" + hashlib.sha256(
        urllib.request.urlopen(urllib.request.Request(  # the manifest's own digest, by its bytes
            f"{registry_basic.url}/v2/{repository}/manifests/v1",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json",
                     "Authorization": "Basic " + registry_basic.docker_config()["auths"][registry_basic.host]["auth"]}),
        timeout=30).read()).hexdigest()
    assert manifest_digest != digest
    pinned = f"oras://{registry_basic.host}/{repository}@{manifest_digest}"
    anonymous = singpy.run("delete", "--no-https", "-F", pinned, env=cache_env(singpy, workdir, "delete-anon"))
    assert_one_fatal(anonymous, f"access to oras://{registry_basic.host}/{repository}")
    kept = singpy.run("delete", "--no-https", pinned, env=env, input="n\n")
    assert (kept.returncode, kept.stderr) == (0, ""), kept
    assert kept.stdout == f"Are you sure you want to delete {registry_basic.host}/{repository}@{manifest_digest} " \
                          "(amd64) [y/N] "
    singpy.ok("pull", "--no-https", str(sif.parent / "still.sif"), tagged, env=env)
    done = singpy.run("delete", "--no-https", pinned, env=env, input="y\n")
    assert done.returncode == 0 and done.stderr == (
        f"INFO:    Image {registry_basic.host}/{repository}@{manifest_digest} (amd64) deleted.\n"), done
    gone = singpy.run("pull", "--no-https", str(sif.parent / "gone.sif"), tagged,
                      env=cache_env(singpy, workdir, "delete-gone", SINGPY_DOCKER_USERNAME=registry_basic.username,
                                    SINGPY_DOCKER_PASSWORD=registry_basic.password))
    assert_one_fatal(gone, "not found")

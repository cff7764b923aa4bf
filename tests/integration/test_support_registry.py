"""The registry fixtures and image writers of tests/support, checked with real tools (skopeo, curl, umoci).

The pull tests trust these fixtures to behave as a real registry, a token service and S3 do; here each
variant is shown to do so for clients that are not singpy. Repository names are unique per test.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.oci import (
    DOCKER_CONFIG,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    IN_TOTO,
    OCI_INDEX,
    Image,
    Layer,
    block_device,
    busybox_image,
    char_device,
    directory,
    fifo,
    file,
    hardlink,
    multiarch_index,
    opaque,
    platform_marker,
    symlink,
    whiteout,
    write_docker_archive,
    write_layout,
    write_oci_archive,
)
from tests.support.registry import (
    PASSWORD,
    USERNAME,
    RegistryServer,
    start_registry,
)

CURL = "/usr/bin/curl"


def curl(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CURL, "-sS", *args], capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin"})


def unique_image(tmp_path: Path, size: int = 300_000) -> tuple[Path, Image, Layer]:
    """An image with a layer no other test has (random bytes; gzip, which skopeo pushes unchanged)."""
    layer = Layer([file("random.bin", os.urandom(size))])
    image = Image([layer], env=["PATH=/bin"])
    return write_layout(tmp_path / "layout", {"latest": image}), image, layer


def inspect(registry: RegistryServer, ref: str, *flags: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return registry.skopeo("inspect", *registry.tls_flags(), *flags, ref, check=check)


# --- plain HTTP -------------------------------------------------------------------------------------------------------


def test_plain_push_keeps_the_bytes_and_copies_back(registry_plain: RegistryServer, tmp_path: Path) -> None:
    image = busybox_image(extra=[file("etc/hello", "hi\n")], env=["PATH=/bin", "A=1"], cmd=["sh"])
    layout = write_layout(tmp_path / "layout", {"v1": image})
    assert registry_plain.push(layout, "support/plain", tag="v1") == image.digest
    raw = inspect(registry_plain, registry_plain.ref("support/plain", "v1"), "--raw").stdout
    assert hashlib.sha256(raw.encode()).hexdigest() == image.digest.removeprefix("sha256:")
    registry_plain.skopeo("copy", *registry_plain.tls_flags("src"), registry_plain.ref("support/plain", "v1"),
                          f"oci:{tmp_path / 'back'}:v1")
    index = json.loads((tmp_path / "back" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == image.digest


def test_plain_multiarch_index_and_docker_formats(registry_plain: RegistryServer, tmp_path: Path) -> None:
    index = multiarch_index()
    layout = write_layout(tmp_path / "layout", {"multi": index, "plain": multiarch_index(attestations=False)})
    assert registry_plain.push(layout, "support/multi", tag="multi") == index.digest
    raw = json.loads(inspect(registry_plain, registry_plain.ref("support/multi", "multi"), "--raw").stdout)
    assert raw["mediaType"] == OCI_INDEX
    platforms = [entry["platform"] for entry in raw["manifests"]]
    assert platforms == [{"architecture": "amd64", "os": "linux"},
                         {"architecture": "arm64", "os": "linux", "variant": "v8"},
                         {"architecture": "unknown", "os": "unknown"}, {"architecture": "unknown", "os": "unknown"}]
    assert raw["manifests"][2]["annotations"]["vnd.docker.reference.type"] == "attestation-manifest"
    attestation = json.loads(inspect(registry_plain, registry_plain.ref("support/multi", raw["manifests"][2]["digest"]),
                                     "--raw").stdout)
    assert attestation["layers"][0]["mediaType"] == IN_TOTO

    # skopeo converts an index without attestations to a Docker manifest list...
    registry_plain.push(layout, "support/multi-v2s2", tag="plain", format="v2s2")
    converted = json.loads(inspect(registry_plain, registry_plain.ref("support/multi-v2s2", "plain"), "--raw").stdout)
    assert converted["mediaType"] == DOCKER_LIST
    # ... and upload() pushes our own Docker list byte for byte; skopeo picks the arm64 entry from it
    docker_list = multiarch_index(docker=True)
    assert registry_plain.upload(docker_list, "support/multi-docker", "list") == docker_list.digest
    arm64 = json.loads(registry_plain.skopeo("--override-arch", "arm64", "--override-variant", "v8", "inspect",
                                             *registry_plain.tls_flags(),
                                             registry_plain.ref("support/multi-docker", "list")).stdout)
    assert (arm64["Architecture"], arm64["Digest"]) == ("arm64", docker_list.digest)  # Digest: the list's
    child = json.loads(inspect(registry_plain, registry_plain.ref("support/multi-docker",
                                                                  docker_list.manifests[1].digest), "--raw").stdout)
    assert child["mediaType"] == DOCKER_MANIFEST and child["config"]["mediaType"] == DOCKER_CONFIG


def test_plain_zstd_layer_and_manifest_without_media_type(registry_plain: RegistryServer, tmp_path: Path) -> None:
    zstd = busybox_image(extra=[file("etc/zstd", "z\n")], compression="zstd")
    bare = busybox_image(extra=[file("etc/bare", "b\n")], media_type_field=False)
    layout = write_layout(tmp_path / "layout", {"zstd": zstd, "bare": bare})
    assert registry_plain.push(layout, "support/zstd", tag="zstd") == zstd.digest
    assert registry_plain.push(layout, "support/bare", tag="bare") == bare.digest
    raw = json.loads(inspect(registry_plain, registry_plain.ref("support/bare", "bare"), "--raw").stdout)
    assert "mediaType" not in raw
    registry_plain.skopeo("copy", *registry_plain.tls_flags("src"), registry_plain.ref("support/zstd", "zstd"),
                          f"oci:{tmp_path / 'back'}:zstd")  # skopeo decompresses zstd to check the diff_ids
    copied = json.loads((tmp_path / "back" / "blobs" / "sha256" / zstd.digest[7:]).read_text())
    assert copied["layers"][1]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"


# --- Basic auth -------------------------------------------------------------------------------------------------------


def test_basic_auth_right_and_wrong_credentials(registry_basic: RegistryServer, tmp_path: Path) -> None:
    layout, image, _ = unique_image(tmp_path)
    assert registry_basic.push(layout, "support/basic") == image.digest
    ref = registry_basic.ref("support/basic")
    assert json.loads(inspect(registry_basic, ref, *registry_basic.creds_flags()).stdout)["Digest"] == image.digest
    wrong = inspect(registry_basic, ref, "--creds", f"{USERNAME}:not-{PASSWORD}", check=False)
    assert wrong.returncode != 0 and "unauthorized" in wrong.stderr
    anonymous = inspect(registry_basic, ref, "--no-creds", check=False)
    assert anonymous.returncode != 0 and "unauthorized" in anonymous.stderr
    challenge = curl("-o", "/dev/null", "-D", "-", f"{registry_basic.url}/v2/")
    assert challenge.stdout.startswith("HTTP/1.1 401") and 'Www-Authenticate: Basic realm="singpy-tests"' in \
        challenge.stdout


# --- Bearer tokens ----------------------------------------------------------------------------------------------------


def test_token_auth_anonymous_public_and_private(registry_token: RegistryServer, tmp_path: Path) -> None:
    server = registry_token.token_server
    assert server is not None
    layout, image, _ = unique_image(tmp_path)
    registry_token.push(layout, "public/support-token")
    registry_token.push(layout, "private/support-token")
    before = len(server.requests)

    public = inspect(registry_token, registry_token.ref("public/support-token"), "--no-creds")
    assert json.loads(public.stdout)["Digest"] == image.digest
    private = inspect(registry_token, registry_token.ref("private/support-token"), "--no-creds", check=False)
    assert private.returncode != 0 and "unauthorized" in private.stderr
    alice = inspect(registry_token, registry_token.ref("private/support-token"), *registry_token.creds_flags())
    assert json.loads(alice.stdout)["Digest"] == image.digest
    wrong = inspect(registry_token, registry_token.ref("private/support-token"), "--creds", "alice:nope", check=False)
    assert wrong.returncode != 0

    asked = server.requests[before:]
    assert any(r.user == "" and r.granted == {"public/support-token": ["pull"]} for r in asked), asked
    assert any(r.user == "" and r.scopes == ["repository:private/support-token:pull"] and r.granted == {}
               for r in asked), asked
    assert any(r.user == USERNAME and r.granted == {"private/support-token": ["pull"]} for r in asked), asked
    assert any(r.status == 401 for r in asked), asked


def test_token_oauth2_post_and_direct_bearer_request(registry_token: RegistryServer, tmp_path: Path) -> None:
    server = registry_token.token_server
    assert server is not None
    _, image, _ = unique_image(tmp_path)
    registry_token.upload(image, "private/support-oauth")
    answer = curl("--data", f"grant_type=password&username={USERNAME}&password={PASSWORD}&service={server.service}"
                  "&scope=repository:private/support-oauth:pull&client_id=curl", server.realm)
    token = json.loads(answer.stdout)["access_token"]
    manifest = curl("-H", f"Authorization: Bearer {token}", "-H", f"Accept: {image.media_type}",
                    f"{registry_token.url}/v2/private/support-oauth/manifests/latest")
    assert hashlib.sha256(manifest.stdout.encode()).hexdigest() == image.digest[7:]
    refused = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {token}",
                   f"{registry_token.url}/v2/private/other/manifests/latest")
    assert refused.stdout == "401"  # the token grants that one repository only


def test_token_born_expired_is_refused(registry_token: RegistryServer) -> None:
    server = registry_token.token_server
    assert server is not None
    access = [{"type": "repository", "name": "private/support-expired", "actions": ["pull"]}]
    url = f"{registry_token.url}/v2/private/support-expired/tags/list"
    token = server.token(USERNAME, access)
    fresh = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {token}", url)
    assert fresh.stdout == "404"  # accepted: the repository does not exist
    server.expired = True
    try:
        stale = server.token(USERNAME, access)
    finally:
        server.expired = False
    refused = curl("-o", "/dev/null", "-D", "-", "-H", f"Authorization: Bearer {stale}", url)
    assert refused.stdout.startswith("HTTP/1.1 401") and 'error="invalid_token"' in refused.stdout


# --- TLS --------------------------------------------------------------------------------------------------------------


def test_tls_with_the_fixture_ca_only(registry_tls: RegistryServer, tmp_path: Path) -> None:
    assert registry_tls.https and registry_tls.ca_file is not None and registry_tls.cert_dir is not None
    _, image, _ = unique_image(tmp_path)
    assert registry_tls.upload(image, "support/tls") == image.digest
    ref = registry_tls.ref("support/tls")
    assert json.loads(inspect(registry_tls, ref).stdout)["Digest"] == image.digest  # with --cert-dir
    untrusted = registry_tls.skopeo("inspect", ref, check=False)
    assert untrusted.returncode != 0 and "certificate" in untrusted.stderr
    assert curl("--cacert", registry_tls.ca_file, f"{registry_tls.url}/v2/").returncode == 0
    assert curl(f"{registry_tls.url}/v2/").returncode == 60  # the system store does not know our CA
    assert os.stat(registry_tls.ca_file).st_mode & 0o004  # readable by the unprivileged profile


# --- blob redirect ----------------------------------------------------------------------------------------------------


def _blob_url(registry: RegistryServer, name: str, digest: str) -> str:
    return f"{registry.url}/v2/{name}/blobs/{digest}"


def test_redirect_host_refuses_authorization(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layout, image, layer = unique_image(tmp_path)
    registry_redirect.push(layout, "support/redirect")
    registry_redirect.upload(image, "support/redirect-again")  # its blobs exist: HEAD answers 307
    assert all(request.authorization is None for request in blob_host.requests_for(layer.digest))
    user = f"{USERNAME}:{PASSWORD}"
    answer = curl("-o", "/dev/null", "-w", "%{http_code} %{redirect_url}", "-u", user,
                  _blob_url(registry_redirect, "support/redirect", layer.digest))
    status, location = answer.stdout.split()
    assert status == "307" and location.startswith(blob_host.url + "/")

    refused = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Authorization: Basic YWxpY2U6d29uZGVybGFuZA==",
                   location)
    assert refused.stdout == "400"
    assert blob_host.requests_for(layer.digest)[-1].authorization == "Basic YWxpY2U6d29uZGVybGFuZA=="

    # curl follows the redirect without the credentials, as a client must
    fetched = tmp_path / "blob"
    assert curl("-L", "-u", user, "-o", str(fetched), _blob_url(registry_redirect, "support/redirect",
                                                                 layer.digest)).returncode == 0
    assert fetched.read_bytes() == layer.data
    last = blob_host.requests_for(layer.digest)[-1]
    assert last.status == 200 and last.authorization is None


def test_redirect_with_token_auth_skopeo_copy(registry_redirect_token: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect_token.blob_host
    assert blob_host is not None
    layout, image, layer = unique_image(tmp_path)
    registry_redirect_token.push(layout, "private/support-redirect")
    registry = registry_redirect_token
    registry.skopeo("copy", *registry.tls_flags("src"), *registry.creds_flags("src"),
                    registry.ref("private/support-redirect"), f"oci:{tmp_path / 'back'}:x")
    assert (tmp_path / "back" / "blobs" / "sha256" / layer.digest[7:]).read_bytes() == layer.data
    seen = blob_host.requests_for(layer.digest) + blob_host.requests_for(image.config_digest)
    assert seen and all(request.authorization is None and request.status == 200 for request in seen), seen


def test_blob_host_failure_then_success(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layout, _, layer = unique_image(tmp_path)
    registry_redirect.push(layout, "support/fail")
    blob_host.fail(layer.digest, 503, times=1, headers={"Retry-After": "2"})
    url = _blob_url(registry_redirect, "support/fail", layer.digest)
    first = curl("-L", "-u", f"{USERNAME}:{PASSWORD}", "-o", "/dev/null", "-D", "-", "-w", "%{http_code}", url)
    assert first.stdout.endswith("503") and "Retry-After: 2" in first.stdout
    second = curl("-L", "-u", f"{USERNAME}:{PASSWORD}", "-o", "/dev/null", "-w", "%{http_code}", url)
    assert second.stdout == "200"


# --- interrupted downloads --------------------------------------------------------------------------------------------


def test_stalled_blob_then_resumed_with_range(registry_redirect: RegistryServer, tmp_path: Path) -> None:
    blob_host = registry_redirect.blob_host
    assert blob_host is not None
    layout, _, layer = unique_image(tmp_path, size=500_000)
    registry_redirect.push(layout, "support/stall")
    url = _blob_url(registry_redirect, "support/stall", layer.digest)
    partial = tmp_path / "partial"
    stall = blob_host.stall(layer.digest, after=123_456)
    first = subprocess.Popen([CURL, "-sS", "-L", "-u", f"{USERNAME}:{PASSWORD}", "-o", str(partial), url],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert stall.reached.wait(20)
        time.sleep(0.3)
        assert first.poll() is None, "the connection is held open until released"
    finally:
        stall.release()
        _, error = first.communicate(timeout=20)
    assert first.returncode == 18, error  # CURLE_PARTIAL_FILE: the rest never came
    assert partial.stat().st_size == 123_456
    resumed = curl("-L", "-C", "-", "-u", f"{USERNAME}:{PASSWORD}", "-o", str(partial), url)
    assert resumed.returncode == 0, resumed.stderr
    assert hashlib.sha256(partial.read_bytes()).hexdigest() == layer.digest[7:]
    ranges = [(request.range, request.status) for request in blob_host.requests_for(layer.digest)]
    assert ranges[-2:] == [(None, 200), ("bytes=123456-", 206)]


# --- teardown ---------------------------------------------------------------------------------------------------------


def test_teardown_leaves_no_process_or_listener(tmp_path: Path) -> None:
    with start_registry(tmp_path / "registry", auth="token", tls=True, redirect=True) as registry:
        assert registry.token_server is not None and registry.blob_host is not None
        pid = registry.pid
        listeners = [registry.url + "/v2/", registry.token_server.realm, registry.blob_host.url + "/"]
        assert Path(f"/proc/{pid}/exe").resolve() == Path("/usr/bin/docker-registry")
        stall = registry.blob_host.stall("sha256:" + "0" * 64, after=1)  # never reached: released at stop
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/exe").resolve() != Path("/usr/bin/docker-registry")
    assert stall.released.is_set()
    for url in listeners:
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)


# --- image writers ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="umoci unpack makes device nodes and owners only as root")
def test_layout_layers_unpack_with_umoci(tmp_path: Path) -> None:
    lower = [directory("etc"), file("etc/gone", "x"), directory("opt"), file("opt/old", "o"),
             file("bin-a", "same\n", mode=0o755)]
    upper = [whiteout("etc/gone"), opaque("opt"), file("opt/new", "n"), hardlink("bin-b", "bin-a"),
             symlink("link", "bin-a"), char_device("null", 1, 3), block_device("loop9", 7, 9), fifo("pipe"),
             file("su", "#!/bin/sh\n", mode=0o4755), directory("home/user", uid=1000, gid=1000, mode=0o700)]
    image = Image([Layer(lower), Layer(upper)], env=["PATH=/bin"], entrypoint=["/bin/sh"])  # umoci 0.4.7: no zstd
    layout = write_layout(tmp_path / "layout", {"t": image})
    done = subprocess.run(["umoci", "unpack", "--image", f"{layout}:t", str(tmp_path / "bundle")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "bundle" / "rootfs"
    assert not (root / "etc" / "gone").exists() and (root / "etc").is_dir()
    assert sorted(os.listdir(root / "opt")) == ["new"]
    assert os.stat(root / "bin-a").st_ino == os.stat(root / "bin-b").st_ino
    assert os.readlink(root / "link") == "bin-a"
    null = os.lstat(root / "null")
    assert stat.S_ISCHR(null.st_mode) and (os.major(null.st_rdev), os.minor(null.st_rdev)) == (1, 3)
    assert stat.S_ISBLK(os.lstat(root / "loop9").st_mode)
    assert stat.S_ISFIFO(os.lstat(root / "pipe").st_mode)
    assert stat.S_IMODE(os.lstat(root / "su").st_mode) == 0o4755
    home = os.lstat(root / "home" / "user")
    assert (home.st_uid, home.st_gid, stat.S_IMODE(home.st_mode)) == (1000, 1000, 0o700)


def test_hostile_names_are_written_as_given() -> None:
    layer = Layer([file("../../etc/escape", "x"), file("/etc/absolute", "y"), symlink("out", "/etc"),
                   file("out/through-link", "z"), hardlink("hl", "../../etc/passwd")])
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer.data))) as archive:
        members = [(member.name, member.type, member.linkname) for member in archive]
    assert members == [("../../etc/escape", tarfile.REGTYPE, ""), ("/etc/absolute", tarfile.REGTYPE, ""),
                       ("out", tarfile.SYMTYPE, "/etc"), ("out/through-link", tarfile.REGTYPE, ""),
                       ("hl", tarfile.LNKTYPE, "../../etc/passwd")]


def test_archives_read_by_skopeo(tmp_path: Path) -> None:
    index = multiarch_index(attestations=False)
    amd64 = index.manifests[0]
    assert isinstance(amd64, Image)
    oci_archive = write_oci_archive(tmp_path / "image.oci.tar", {"multi": index, "single": amd64})
    docker_archive = write_docker_archive(tmp_path / "image.docker.tar", amd64, repo_tags=["support/busybox:1"])
    layout_inside = write_docker_archive(tmp_path / "image.docker25.tar", amd64, layout_inside=True)

    def skopeo(*args: str) -> str:
        done = subprocess.run(["skopeo", "--insecure-policy", *args], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert json.loads(skopeo("inspect", f"oci-archive:{oci_archive}:single"))["Digest"] == amd64.digest
    assert json.loads(skopeo("inspect", "--raw", f"oci-archive:{oci_archive}:multi"))["manifests"][1]["platform"] \
        == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    for archive in (docker_archive, layout_inside):
        copy = tmp_path / f"{archive.name}.layout"
        skopeo("copy", f"docker-archive:{archive}", f"oci:{copy}:x")  # skopeo checks the layers' diff_ids
        config = json.loads(skopeo("inspect", "--config", f"oci:{copy}:x"))
        assert config["rootfs"]["diff_ids"] == amd64.config["rootfs"]["diff_ids"]
    marker = [layer for layer in amd64.layers if any(e.name == "etc/platform-marker" for e in layer.entries)]
    assert marker[0].entries[0].content.decode() == platform_marker("amd64")

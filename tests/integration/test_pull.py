"""`singpy pull`, `build` and `run` from docker:// registries and OCI layouts/archives, end to end (issue 10).

Real things only: Debian's docker-registry started by tests.support.registry (plain, Basic, token, TLS,
redirecting to a blob host that refuses Authorization), images written byte for byte by tests.support.oci
and pushed with skopeo (or the registry API), and the real `singpy` command as root and as the unprivileged
test user. What is checked is what a user sees: the pulled SIF runs and shows the image's environment,
runscript and owners (read back with `unsquashfs -lln`, the reference tool), and every error is one FATAL
line that leaves nothing behind. Credentials, TLS, redirects, local sources and errors are in
test_pull_sources.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.oci import (
    busybox_image,
    directory,
    file,
    hardlink,
    opaque,
    symlink,
    whiteout,
    write_layout,
)
from tests.support.pulling import IMAGE_ENV, cache_env, main_image, owners, pushed, user_dir
from tests.support.registry import (
    RegistryServer,
    start_registry,
)


@pytest.fixture(scope="module")
def plain(registry_plain: RegistryServer, workdir: Path) -> RegistryServer:
    """registry_plain holding the pull tests' images."""
    return pushed(registry_plain, workdir)


# --- pull, and what the SIF holds ------------------------------------------------------------------------------------


def test_pull_writes_a_sif_with_the_image_env_runscript_and_owners(singpy: Singpy, plain: RegistryServer,
                                                                    workdir: Path, tmp_path: Path) -> None:
    out = user_dir(singpy, workdir, "pull-main") / "main.sif"
    env = cache_env(singpy, workdir, "pull-main", IMAGE_WINS="host value", HOST_ONLY="host")
    result = singpy.run("pull", "--no-https", str(out), plain.ref("pull/main"), env=env)
    assert result.returncode == 0, result.stderr
    assert f"pulled {plain.ref('pull/main')} to {out}" in result.stderr
    listed = owners(out)
    assert listed["/home/user"] == "drwxr-xr-x 1000/1000"
    assert listed["/home/user/notes"] == "-rw------- 1000/1000"
    assert listed["/usr/bin/suid-tool"] == "-rwsr-xr-x 0/0"
    assert listed["/usr"].endswith(" 0/0") and listed["/"].endswith(" 0/0")
    assert listed["/dev/null"] == "crw-rw-rw- 0/0"
    assert listed["/run/pipe"] == "prw--w---- 1000/1000"
    # As in Apptainer: the image's variables win over the host's; the host's others pass.
    shown = singpy.ok("exec", str(out), "sh", "-c", 'echo "$GREETING|$IMAGE_WINS|$HOST_ONLY|$PATH"', env=env)
    assert shown == f"hello from the image|image value|host|{IMAGE_ENV[0].removeprefix('PATH=')}\n"
    assert singpy.ok("run", str(out), env=env) == "tool ran default arg\n"
    assert singpy.ok("run", str(out), "two words", "x", env=env) == "tool ran two words x\n"
    labels = singpy.ok("inspect", str(out), env=env)
    assert "org.example.team: singpy tests" in labels
    assert f"org.label-schema.usage.singularity.deffile.from: {plain.host}/pull/main:latest" in labels


def test_pull_default_name_and_force(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    tmp_path = user_dir(singpy, workdir, "default-name")
    env = cache_env(singpy, workdir, "pull-name")
    singpy.ok("pull", "--no-https", plain.ref("pull/main"), env=env, cwd=tmp_path)
    assert (tmp_path / "main_latest.sif").is_file()
    again = singpy.run("pull", "--no-https", plain.ref("pull/main"), env=env, cwd=tmp_path)
    assert_one_fatal(again, f"{tmp_path}/main_latest.sif already exists (use --force to overwrite it)")
    singpy.ok("pull", "--force", "--no-https", plain.ref("pull/main"), env=env, cwd=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["main_latest.sif"]


def test_pull_name_and_dir_as_apptainer_reads_them(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    """spython, cwltool and Snakemake pull with --name and --dir (Apptainer's hidden --name still works)."""
    out = user_dir(singpy, workdir, "name-dir")
    env = cache_env(singpy, workdir, "pull-name-dir")
    for sub in ("sub", "env"):
        (out / sub).mkdir()
        os.chown(out / sub, singpy.uid, singpy.gid)
    singpy.ok("pull", "--no-https", "--name", "named.sif", plain.ref("pull/main"), env=env, cwd=out)
    singpy.ok("pull", "--no-https", "--dir", str(out / "sub"), "--name", "both.sif", plain.ref("pull/main"), env=env)
    singpy.ok("pull", "--no-https", "--dir", str(out / "sub"), plain.ref("pull/main"), env=env)
    singpy.ok("pull", "--no-https", plain.ref("pull/main"), env={**env, "APPTAINER_PULLDIR": str(out / "env")})
    assert sorted(str(path.relative_to(out)) for path in out.rglob("*.sif")) == [
        "env/main_latest.sif", "named.sif", "sub/both.sif", "sub/main_latest.sif"]
    assert singpy.ok("exec", str(out / "sub" / "both.sif"), "cat", "/etc/image-marker", env=env) == "main image\n"


def test_quiet_pull_prints_nothing(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    out = user_dir(singpy, workdir, "quiet") / "q.sif"
    result = singpy.run("-q", "pull", "--no-https", str(out), plain.ref("pull/main"),
                        env=cache_env(singpy, workdir, "quiet"))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("name", ["pull/v2s2", "pull/no-media-type"])
def test_docker_v2_manifest_and_oci_manifest_without_media_type(singpy: Singpy, plain: RegistryServer,
                                                                workdir: Path, name: str) -> None:
    env = cache_env(singpy, workdir, name.replace("/", "-"))
    out = singpy.ok("exec", "--no-https", plain.ref(name), "cat", "/etc/image-marker", env=env)
    assert out == ("no media type\n" if "no-media" in name else "main image\n")


# --- run from docker:// through the cache ----------------------------------------------------------------------------


def test_run_pulls_once_then_runs_from_the_cache(singpy: Singpy, plain: RegistryServer, workdir: Path) -> None:
    env = cache_env(singpy, workdir, "run-cache")
    first = singpy.run("run", "--no-https", plain.ref("pull/main"), "a", env=env)
    assert (first.returncode, first.stdout) == (0, "tool ran a\n"), first.stderr
    assert "Getting" in first.stderr
    second = singpy.run("run", "--no-https", plain.ref("pull/main"), "b", env=env)
    assert (second.returncode, second.stdout, second.stderr) == (0, "tool ran b\n", "")
    listing = singpy.ok("cache", "list", env=env)
    assert f"{plain.host}/pull/main:latest" in listing and "1 pulled image(s)" in listing
    # A record its user damaged (a time no calendar holds): listed with "?", not a traceback
    [record] = Path(env["SINGPY_CACHEDIR"]).glob("**/sif/*.json")
    record.write_text(json.dumps({**json.loads(record.read_text()), "created": 10**20}))
    listing = singpy.ok("cache", "list", env=env)
    assert f"{plain.host}/pull/main:latest" in listing and " ? " in listing


def test_cached_image_runs_when_the_registry_is_gone(singpy: Singpy, workdir: Path, tmp_path: Path) -> None:
    env = cache_env(singpy, workdir, "offline")
    with start_registry(tmp_path / "registry") as registry:
        digest = registry.push(write_layout(tmp_path / "layout", {"latest": main_image()}), "pull/offline")
        reference = registry.ref("pull/offline")
        singpy.ok("exec", "--no-https", reference, "true", env=env)
    result = singpy.run("exec", "--no-https", reference, "cat", "/etc/image-marker", env=env)
    assert (result.returncode, result.stdout) == (0, "main image\n"), result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("WARNING:") and registry.host in warnings[0]
    # By digest, nothing needs asking: no request, no warning.
    by_digest = singpy.run("exec", "--no-https", registry.ref("pull/offline", digest), "cat", "/etc/image-marker",
                           env=env)
    assert (by_digest.returncode, by_digest.stdout, by_digest.stderr) == (0, "main image\n", "")


def test_thirty_two_runs_at_once_download_and_convert_once(singpy: Singpy, registry_redirect: RegistryServer,
                                                          workdir: Path, tmp_path: Path) -> None:
    layer = oci.Layer([file("etc/concurrent", "32\n"), file("etc/profile-name", singpy.profile)])
    registry_redirect.push(write_layout(tmp_path / "layout", {"latest": busybox_image(layers=[layer])}),
                           "pull/thirty-two")
    assert registry_redirect.blob_host is not None
    env = cache_env(singpy, workdir, "thirty-two", SINGPY_DOCKER_USERNAME=registry_redirect.username,
                    SINGPY_DOCKER_PASSWORD=registry_redirect.password)
    runs = [singpy.popen(["exec", "--no-https", registry_redirect.ref("pull/thirty-two"), "cat", "/etc/concurrent"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(32)]
    results = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0] * 32, [err for run, (_, err) in zip(runs, results, strict=True)
                                                          if run.returncode]
    assert [out for out, _ in results] == ["32\n"] * 32
    assert sum("Getting" in err for _, err in results) == 1
    assert [request.method for request in registry_redirect.blob_host.requests_for(layer.digest)] == ["GET"]


# --- platforms -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pull/multi", "pull/multi-docker"])
def test_index_gives_the_host_platform_or_the_chosen_one(singpy: Singpy, plain: RegistryServer, workdir: Path,
                                                        name: str) -> None:
    tmp_path = user_dir(singpy, workdir, f"arch-{name.replace('/', '-')}")
    env = cache_env(singpy, workdir, f"arch-{name.replace('/', '-')}")
    assert singpy.ok("exec", "--no-https", plain.ref(name), "cat", "/etc/platform-marker", env=env) \
        == "linux/amd64\n"
    for arch in ("arm64", "arm64/v8", "linux/arm64"):
        sandbox = tmp_path / arch.replace("/", "-")
        singpy.ok("build", "--sandbox", "--arch", arch, "--no-https", str(sandbox), plain.ref(name), env=env)
        assert (sandbox / "etc" / "platform-marker").read_text() == "linux/arm64/v8\n"
    # Apptainer's --arch-variant (APPTAINER_PULL_ARCH_VARIANT, APPTAINER_BUILD_ARCH_VARIANT): the variant of --arch
    singpy.ok("build", "--sandbox", "--arch", "arm64", "--arch-variant", "8", "--no-https",
              str(tmp_path / "variant"), plain.ref(name), env=env)
    assert (tmp_path / "variant" / "etc" / "platform-marker").read_text() == "linux/arm64/v8\n"
    for flags, variables in ((["--arch-variant", "v7"], {}), ([], {"APPTAINER_PULL_ARCH_VARIANT": "7"})):
        refused = singpy.run("pull", "--arch", "arm", *flags, "--no-https", str(tmp_path / "v7.sif"), plain.ref(name),
                             env={**env, **variables})
        assert_one_fatal(refused, "no linux/arm/v7 image")
    singpy.ok("pull", "--arch", "arm64", "--no-https", str(tmp_path / "arm64.sif"), plain.ref(name), env=env)
    assert_one_fatal(singpy.run("exec", str(tmp_path / "arm64.sif"), "true", env=env),
                     "image is arm64, this host is amd64")
    refused = singpy.run("pull", "--arch", "ppc64le", "--no-https", str(tmp_path / "p.sif"), plain.ref(name),
                         env=env)
    assert_one_fatal(refused, "linux/ppc64le")
    assert "linux/amd64" in refused.stderr and "linux/arm64" in refused.stderr
    assert "unknown" not in refused.stderr  # attestation entries are not platforms
    assert not (tmp_path / "p.sif").exists()


# --- layers ----------------------------------------------------------------------------------------------------------


def test_layers_whiteouts_links_zstd_and_escapes_stay_inside(singpy: Singpy, registry_plain: RegistryServer,
                                                              workdir: Path, tmp_path: Path) -> None:
    canary = tmp_path / "host-canary"
    canary.mkdir()
    canary.chmod(0o777)
    lower = oci.Layer([directory("data"), file("data/old", "old\n"), file("data/keep", "keep\n"),
                       directory("opaque"), file("opaque/gone", "x\n"), file("etc/remove-me", "x\n"),
                       symlink("escape", str(canary)), symlink("up", "../../../../../..")])
    upper = oci.Layer([whiteout("data/old"), whiteout("etc/remove-me"), opaque("opaque"),
                       file("opaque/new", "new\n"), file("data/original", "linked\n"),
                       hardlink("data/hardlink", "data/original"),
                       file("escape/planted", "must stay in the image\n"),
                       file("up/tmp/planted-through-dotdot", "inside\n"),
                       file("../../../outside-by-name", "inside too\n")], compression="zstd")
    image = busybox_image(layers=[lower, upper])
    registry_plain.upload(image, "pull/layers")
    env = cache_env(singpy, workdir, "layers")
    script = "ls /data; ls /opaque; stat -c %h /data/hardlink; test -e /etc/remove-me || echo removed"
    out = singpy.ok("exec", "--no-https", registry_plain.ref("pull/layers"), "sh", "-c", script, env=env)
    assert out.split() == ["hardlink", "keep", "original", "new", "2", "removed"], out
    # What escaped by name or through a link landed inside the image: a sandbox shows where.
    sandbox = user_dir(singpy, workdir, "layers") / "sandbox"
    singpy.ok("build", "--sandbox", "--no-https", str(sandbox), registry_plain.ref("pull/layers"), env=env)
    inside = sandbox / str(canary).lstrip("/") / "planted"
    assert inside.read_text() == "must stay in the image\n"
    assert (sandbox / "tmp" / "planted-through-dotdot").read_text() == "inside\n"
    assert (sandbox / "outside-by-name").read_text() == "inside too\n"
    assert os.listdir(canary) == []
    assert not Path("/outside-by-name").exists() and not (tmp_path / "outside-by-name").exists()

"""`library://` images end to end (issue 29): pull, exec and run from the cache, push, search and
`Bootstrap: library`, against the suite's strict library (tests.support.library_server: real HTTP(S) on
127.0.0.1, a second "object storage" server the library redirects to, real files), as root and as the
unprivileged test user. What is checked is what a user sees: the pulled file is byte for byte the
library's and runs; every error is one FATAL line naming the reference and the fix, and leaves nothing
in the cache or at the output path.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.library_server import LibraryServer, start_library
from tests.support.library_store import file_hash
from tests.support.library_users import ALICE, BOB, login, user_env
from tests.support.sifs import MARKER, bare_squashfs, singpy_sif
from tests.support.signing_cases import golden, trust_golden_key


def arm64_sif(workdir: Path) -> Path:
    """A SIF whose system partition is for arm64 (siftool, the reference tool, writes it)."""
    out = workdir / "busybox-arm64.sif"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        subprocess.run(["siftool", "new", str(tmp)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["siftool", "add", "--datatype", "4", "--parttype", "2", "--partfs", "1", "--partarch", "4",
                        "--groupid", "1", str(tmp), str(bare_squashfs(workdir))], check=True)
        tmp.chmod(0o644)
        tmp.rename(out)
    return out


@pytest.fixture(scope="module")
def library(workdir: Path) -> Iterator[LibraryServer]:
    """The module's library: alice's busybox (latest, 1.0), an image for arm64 only, and one the library
    lies about (an arm64 SIF announced as amd64)."""
    with start_library(workdir / "library-plain", tokens={ALICE: "alice", BOB: "bob"}) as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest", "1.0"))
        server.store.add(arm64_sif(workdir), "alice/tools/armonly", ("latest",))
        server.store.add(arm64_sif(workdir), "alice/tools/liar", ("latest",), arch="amd64")
        yield server


def cached_sifs(env: dict[str, str]) -> list[str]:
    sifs = Path(env["SINGPY_CACHEDIR"]) / "sif"
    return sorted(os.listdir(sifs)) if sifs.exists() else []


def test_pull_by_host_tag_and_hash_is_the_library_file(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "by-host")
    source = singpy_sif(workdir)
    singpy.ok("pull", "--no-https", str(home / "tag.sif"), library.ref("alice/tools/busybox", "1.0"), env=env)
    assert (home / "tag.sif").read_bytes() == source.read_bytes()
    by_hash = library.ref("alice/tools/busybox", f"sha256.{file_hash(source)}")
    singpy.ok("pull", "--no-https", "--dir", str(home), by_hash, env=env)
    assert (home / f"busybox_sha256.{file_hash(source)}.sif").read_bytes() == source.read_bytes()
    assert singpy.ok("exec", str(home / "tag.sif"), "cat", "/etc/marker", env=env) == MARKER + "\n"


def test_remote_login_pull_and_exec_from_the_cache(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "remote-exec")
    login(singpy, library, env, home)
    assert singpy.ok("exec", "library://alice/tools/busybox", "cat", "/etc/marker", env=env) == MARKER + "\n"
    downloads = len(library.object_requests)
    assert singpy.ok("exec", "library://alice/tools/busybox:latest", "cat", "/etc/marker", env=env) == MARKER + "\n"
    assert len(library.object_requests) == downloads  # the second run used the cached SIF
    sealed = [name for name in cached_sifs(env) if name.endswith(".sif")]
    assert sealed == [f"{file_hash(singpy_sif(workdir))}.sif"]
    # the library's token went to the library, never to object storage
    assert any(auth == f"Bearer {ALICE}" for _, path, auth in library.requests if path.startswith("/v1/imagefile/"))
    assert all(auth == "" for _, _, auth in library.object_requests)


def test_run_library_image(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "run")
    login(singpy, library, env, home)
    result = singpy.run("run", "library://alice/tools/busybox:1.0", env=env)
    assert result.returncode == 0, result.stderr


def test_missing_tag_is_one_fatal_line_and_nothing_written(singpy: Singpy, library: LibraryServer,
                                                             workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "missing-tag")
    result = singpy.run("pull", "--no-https", str(home / "out.sif"), library.ref("alice/tools/busybox", "nope"),
                        env=env)
    assert_one_fatal(result, f"library://{library.host}/alice/tools/busybox:nope: no tag nope")
    assert "(tags: 1.0, latest): name an existing tag" in result.stderr
    assert not (home / "out.sif").exists()
    assert [name for name in cached_sifs(env) if not name.startswith(".")] == []


def test_unknown_container_names_the_fix(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "unknown-container")
    result = singpy.run("pull", "--no-https", str(home / "out.sif"), library.ref("alice/tools/nothing"), env=env)
    assert_one_fatal(result, f"library://{library.host}/alice/tools/nothing:latest does not exist in the library")
    assert not (home / "out.sif").exists()


def test_wrong_architecture_names_the_one_there(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "arch")
    ref = library.ref("alice/tools/armonly")
    result = singpy.run("pull", "--no-https", str(home / "out.sif"), ref, env=env)
    assert_one_fatal(result, f"{ref} exists for arm64, not amd64: pull it with --arch arm64")
    assert not (home / "out.sif").exists()
    singpy.ok("pull", "--no-https", "--arch", "arm64", str(home / "out.sif"), ref, env=env)
    assert (home / "out.sif").read_bytes() == arm64_sif(workdir).read_bytes()


def test_a_sif_of_the_wrong_architecture_is_not_kept(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "liar")
    ref = library.ref("alice/tools/liar")
    result = singpy.run("pull", "--no-https", str(home / "out.sif"), ref, env=env)
    assert_one_fatal(result, f"the library sent a SIF for arm64 as {ref} for amd64: nothing was kept")
    assert not (home / "out.sif").exists()
    assert [name for name in cached_sifs(env) if not name.startswith(".")] == []
    assert [name for name in cached_sifs(env) if name.endswith(".tmp")] == []


def test_refused_token_is_one_fatal_line(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "bad-token")
    login(singpy, library, env, home)
    remote_yaml = Path(env["APPTAINER_CONFIGDIR"]) / "remote.yaml"
    remote_yaml.write_text(remote_yaml.read_text().replace(ALICE, "revoked-token"))
    result = singpy.run("pull", str(home / "out.sif"), "library://alice/tools/busybox", env=env)
    assert_one_fatal(result, "the library refused the token for library://alice/tools/busybox:latest (401")
    assert "singpy remote login --tokenfile FILE" in result.stderr
    assert not (home / "out.sif").exists()


def test_no_remote_and_unknown_remote(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "no-remote")
    conf = home / "singpy.conf"  # no system remote.yaml beside it
    conf.write_text("")
    result = singpy.run("--config", str(conf), "pull", str(home / "out.sif"), "library://alice/tools/busybox",
                        env=env)
    assert_one_fatal(result, "no default remote in use: add one with 'singpy remote add NAME URI'")
    result = singpy.run("--config", str(conf), "remote", "use", "nosuch", env=env)
    assert_one_fatal(result, "nosuch is not a remote")
    assert not (home / "out.sif").exists()


def test_push_refuses_unsigned_then_pushes_with_allow_unsigned(singpy: Singpy, library: LibraryServer,
                                                                  workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "push")
    login(singpy, library, env, home)
    source = singpy_sif(workdir)
    target = f"library://alice/pushed/{singpy.profile}:v1,v2"
    result = singpy.run("push", str(source), target, env=env)
    assert_one_fatal(result, f"can't push {source}: it is not signed")
    assert "--allow-unsigned" in result.stderr
    assert library.store.containers.get(f"alice/pushed/{singpy.profile}") is None
    singpy.ok("push", "--allow-unsigned", str(source), target, env=env)
    singpy.ok("pull", str(home / "back.sif"), f"library://alice/pushed/{singpy.profile}:v2", env=env)
    assert (home / "back.sif").read_bytes() == source.read_bytes()
    found = singpy.ok("search", f"pushed/{singpy.profile}", env=env)
    assert f"\tlibrary://alice/pushed/{singpy.profile}:v1,v2" in found
    uploads = [auth for method, _, auth in library.object_requests if method == "PUT"]
    assert uploads and all(auth == "" for auth in uploads)


def test_push_into_someone_elses_entity_is_refused(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "push-bob")
    login(singpy, library, env, home, token=BOB)
    result = singpy.run("push", "-U", str(singpy_sif(workdir)), "library://alice/bobs/tool:1", env=env)
    assert_one_fatal(result, "the library does not let this token's user write alice/bobs (403")


def test_tls_library_needs_its_ca(singpy: Singpy, workdir: Path) -> None:
    with start_library(workdir / f"library-tls-{singpy.profile}", tokens={ALICE: "alice"}, tls=True) as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        env, home = user_env(singpy, workdir, "tls")
        result = singpy.run("pull", str(home / "out.sif"), server.ref("alice/tools/busybox"), env=env)
        assert_one_fatal(result, "TLS certificate not trusted")
        assert server.ca_file is not None
        singpy.ok("pull", str(home / "out.sif"), server.ref("alice/tools/busybox"),
                  env={**env, "SSL_CERT_FILE": server.ca_file})
        assert (home / "out.sif").read_bytes() == singpy_sif(workdir).read_bytes()


def test_bootstrap_library(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "bootstrap")
    login(singpy, library, env, home)
    recipe = home / "lib.def"
    recipe.write_text("Bootstrap: library\nFrom: alice/tools/busybox:1.0\n\n%post\n    echo built > /etc/built\n")
    singpy.ok("build", str(home / "built.sif"), str(recipe), env=env, timeout=300)
    assert singpy.ok("exec", str(home / "built.sif"), "cat", "/etc/marker", "/etc/built", env=env) == \
        MARKER + "\nbuilt\n"


def test_a_cached_tag_runs_when_the_library_is_gone(singpy: Singpy, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "offline")
    with start_library(workdir / f"library-offline-{singpy.profile}") as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        ref = server.ref("alice/tools/busybox")
        assert singpy.ok("exec", "--no-https", ref, "cat", "/etc/marker", env=env) == MARKER + "\n"
    result = singpy.run("exec", "--no-https", ref, "cat", "/etc/marker", env=env)
    assert result.returncode == 0 and result.stdout == MARKER + "\n", result.stderr
    assert result.stderr.startswith("WARNING:") and "running the cached image" in result.stderr
    result = singpy.run("pull", "--no-https", str(home / "out.sif"), ref, env=env)  # a pull asks the library
    assert_one_fatal(result, "can't reach")
    assert not (home / "out.sif").exists()


def test_a_file_that_is_not_the_announced_hash_is_not_kept(singpy: Singpy, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "bad-bytes")
    with start_library(workdir / f"library-bad-bytes-{singpy.profile}") as server:
        image = server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        stored = server.store.object_path(image["hash"].removeprefix("sha256."))
        stored.write_bytes(arm64_sif(workdir).read_bytes())  # the storage holds other bytes under that name
        result = singpy.run("pull", "--no-https", str(home / "out.sif"), server.ref("alice/tools/busybox"), env=env)
    assert_one_fatal(result, "the file the library sent for library://")
    assert f"is not {image['hash']}, the hash it announced: nothing was kept" in result.stderr
    assert not (home / "out.sif").exists()
    assert cached_sifs(env) == []


def test_a_download_longer_than_announced_is_cut_short(singpy: Singpy, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "too-long")
    with start_library(workdir / f"library-too-long-{singpy.profile}") as server:
        image = server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        image["size"] = 4096  # the metadata says 4 KiB; object storage sends the whole file
        result = singpy.run("pull", "--no-https", str(home / "out.sif"), server.ref("alice/tools/busybox"), env=env)
    assert_one_fatal(result, "the library sent more than the 4096 bytes it announced for library://")
    assert not (home / "out.sif").exists()
    assert cached_sifs(env) == []


def test_an_interrupted_download_leaves_nothing(singpy: Singpy, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "interrupted")
    with start_library(workdir / f"library-interrupted-{singpy.profile}") as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        server.stall = 30.0
        process = singpy.popen(["pull", "--no-https", str(home / "out.sif"), server.ref("alice/tools/busybox")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert server.stalled.wait(30), "the download never started"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert_one_fatal(subprocess.CompletedProcess(process.args, process.returncode, out, err),
                     f"pull of {server.ref('alice/tools/busybox')} interrupted by SIGTERM: nothing was kept")
    assert not (home / "out.sif").exists()
    assert cached_sifs(env) == []


def test_bootstrap_library_header_names_the_library(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "bootstrap-header")  # no remote at all: the header says where
    recipe = home / "header.def"
    recipe.write_text(f"Bootstrap: library\nLibrary: {library.url}\nFrom: alice/tools/busybox:1.0\n")
    singpy.ok("build", "--no-https", str(home / "built.sif"), str(recipe), env=env, timeout=300)
    assert singpy.ok("exec", str(home / "built.sif"), "cat", "/etc/marker", env=env) == MARKER + "\n"


def test_library_flag_and_its_conflict_with_a_host(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "library-flag")
    singpy.ok("pull", "--library", library.url, str(home / "flag.sif"), "library://alice/tools/busybox:1.0",
              env=env)
    assert (home / "flag.sif").read_bytes() == singpy_sif(workdir).read_bytes()
    result = singpy.run("pull", "--library", library.url, str(home / "both.sif"), library.ref("alice/tools/busybox"),
                        env=env)
    assert_one_fatal(result, "conflicting arguments: do not use --library with a library:// reference naming a host",
                     code=1)
    assert not (home / "both.sif").exists()
    result = singpy.run("pull", str(home / "bad.sif"), "library://Alice/tools/busybox", env=env)
    assert_one_fatal(result, "malformed library reference library://Alice/tools/busybox", code=1)


def test_build_from_a_library_image_and_the_library_flag(singpy: Singpy, library: LibraryServer,
                                                        workdir: Path) -> None:
    """`build OUT library://REF` (the library's SIF, built from as a local one: a SIF or a sandbox), and build
    --library, which names the library of `Bootstrap: library` over the stage's `Library:` header."""
    env, home = user_env(singpy, workdir, "build-from-library")
    reference = library.ref("alice/tools/busybox", "1.0")
    made = singpy.run("build", "--no-https", str(home / "from.sif"), reference, env=env, timeout=300)
    assert made.returncode == 0 and made.stderr.endswith(f"built SIF image {home / 'from.sif'} from {reference}\n")
    assert singpy.ok("exec", str(home / "from.sif"), "cat", "/etc/marker", env=env) == MARKER + "\n"
    singpy.ok("build", "--no-https", "--sandbox", str(home / "tree"), reference, env=env, timeout=300)
    assert (home / "tree" / "etc" / "marker").read_text() == MARKER + "\n"
    pulled = singpy.run("pull", "--no-https", "--sandbox", str(home / "pulled"), reference, env=env, timeout=300)
    assert pulled.returncode == 0 and pulled.stderr.endswith(f"unpacked {reference} into the sandbox "
                                                             f"{home / 'pulled'}\n"), pulled.stderr
    assert (home / "pulled" / "etc" / "marker").read_text() == MARKER + "\n"
    assert_one_fatal(singpy.run("build", "--no-https", str(home / "from.sif"), reference, env=env), "already exists")
    recipe = home / "elsewhere.def"  # a header naming a library that is not there: the flag wins
    recipe.write_text("Bootstrap: library\nLibrary: https://127.0.0.1:9\nFrom: alice/tools/busybox:1.0\n")
    singpy.ok("build", "--library", library.url, str(home / "flag.sif"), str(recipe), env=env, timeout=300)
    assert singpy.ok("exec", str(home / "flag.sif"), "cat", "/etc/marker", env=env) == MARKER + "\n"
    assert sorted(os.listdir(home)) == ["config", "elsewhere.def", "flag.sif", "from.sif", "pulled", "tree"]


def test_library_requests_go_through_the_proxy_variables(singpy: Singpy, workdir: Path) -> None:
    """http(s)_proxy as for docker://: a TLS library and its object storage through CONNECT tunnels, a plain
    one by absolute URLs with the proxy's credentials; no_proxy bypasses it."""
    from tests.support.registry_front import ForwardProxy

    source = singpy_sif(workdir)
    with start_library(workdir / f"library-proxy-{singpy.profile}", tls=True) as server, ForwardProxy() as proxy:
        server.store.add(source, "alice/tools/busybox", ("latest",))
        env, home = user_env(singpy, workdir, "proxy-tls")
        assert server.ca_file is not None
        singpy.ok("pull", str(home / "tls.sif"), server.ref("alice/tools/busybox"),
                  env={**env, "SSL_CERT_FILE": server.ca_file, "HTTPS_PROXY": proxy.host})
        assert (home / "tls.sif").read_bytes() == source.read_bytes()
        assert {line.rpartition(" ")[0] for line in proxy.lines} == {f"CONNECT {server.host}",
                                                                     f"CONNECT 127.0.0.1:{server.object_port}"}
    with start_library(workdir / f"library-proxy-plain-{singpy.profile}") as server, ForwardProxy() as proxy:
        server.store.add(source, "alice/tools/busybox", ("latest",))
        env, home = user_env(singpy, workdir, "proxy-plain")
        proxied = {**env, "http_proxy": f"http://user:pw@{proxy.host}"}
        singpy.ok("pull", "--no-https", str(home / "plain.sif"), server.ref("alice/tools/busybox"), env=proxied)
        assert (home / "plain.sif").read_bytes() == source.read_bytes()
        assert any(line.startswith(f"GET http://{server.host}/v1/images/alice/tools/busybox:latest?arch=")
                   for line in proxy.lines)
        assert any(line.startswith(f"GET http://127.0.0.1:{server.object_port}/objects/") for line in proxy.lines)
        assert set(proxy.authorizations) == {"Basic dXNlcjpwdw=="}
        seen = len(proxy.lines)
        singpy.ok("pull", "--no-https", str(home / "direct.sif"), server.ref("alice/tools/busybox"),
                  env={**proxied, "no_proxy": "127.0.0.1"})
        assert len(proxy.lines) == seen


@pytest.fixture
def odd_library() -> Iterator[str]:
    """A library whose answers are odd JSON: archTags a list, a deeply nested image record (a real server on
    127.0.0.1 answering what the strict one never would)."""
    import http.server
    import json

    from tests.support.registry_http import serving

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith("/v1/images/e/c/deep"):
                status, body = 200, b"[" * 100000
            elif self.path.startswith("/v1/images/"):
                status, body = 404, b'{"error": {"code": 404, "message": "not found"}}'
            elif self.path.startswith("/v1/containers/"):
                status, body = 200, json.dumps({"data": {"archTags": ["amd64"]}}).encode()
            else:
                status, body = 404, b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize(("name", "message"), [("e/c/absent", "no tag latest"), ("e/c/deep", "is not JSON")])
def test_odd_answers_of_a_library_are_one_fatal_line(singpy: Singpy, odd_library: str, workdir: Path, name: str,
                                                      message: str) -> None:
    env, home = user_env(singpy, workdir, f"odd-{name.rsplit('/', 1)[1]}")
    result = singpy.run("pull", "--no-https", "--library", odd_library, str(home / "out.sif"),
                        f"library://{name}:latest", env=env)
    assert_one_fatal(result, message)
    assert not (home / "out.sif").exists()


def test_delete_removes_the_tagged_image_after_asking(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    """`delete library://REF`: Apptainer's question (no answer is no), then the image its tag names goes, with its
    other tags; only its owner's token may, and a missing one is the pull's one line."""
    env, home = user_env(singpy, workdir, "delete")
    library.store.add(singpy_sif(workdir), "alice/tools/doomed", ("latest", "v1"))
    reference = "library://alice/tools/doomed:v1"
    assert_one_fatal(singpy.run("delete", "-F", reference, env=env), "no default remote in use")
    login(singpy, library, env, home, BOB)
    assert_one_fatal(singpy.run("delete", "--force", reference, env=env),
                     "the library does not let this token's user delete library://alice/tools/doomed:v1 (403")
    (home / "token").write_text(ALICE + "\n")  # the owner's token, for the remote in use
    singpy.ok("remote", "login", "--tokenfile", str(home / "token"), "testlib", env=env)
    kept = singpy.run("delete", reference, env=env, input="")
    assert (kept.returncode, kept.stdout, kept.stderr) == (
        0, "Are you sure you want to delete alice/tools/doomed:v1 (amd64) [y/N] ", "")
    singpy.ok("pull", str(home / "still.sif"), reference, env=env)
    done = singpy.run("delete", reference, env=env, input="y\n")
    assert done.returncode == 0 and done.stderr == "INFO:    Image alice/tools/doomed:v1 (amd64) deleted.\n", done
    for tag in ("v1", "latest"):  # the image is gone, under both of its tags
        missing = singpy.run("pull", str(home / f"{tag}.sif"), f"library://alice/tools/doomed:{tag}", env=env)
        assert_one_fatal(missing, f"no tag {tag}")
    assert_one_fatal(singpy.run("delete", "-F", reference, env=env), "no tag v1")
    assert_one_fatal(singpy.run("delete", "docker://127.0.0.1/x:v1", env=env),
                     "singpy deletes library://... and oras://... images", code=1)


def test_a_library_pull_checks_the_images_signatures(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    """As Apptainer's pull from a library: an unsigned image, or one whose signer no keyring holds (and no
    keyserver gives), is its two warnings and the file all the same; a signature a key of the user's keyring
    verifies says nothing."""
    env, home = user_env(singpy, workdir, "pull-verify")
    keys = home / "keys"
    keys.mkdir()
    os.chown(keys, singpy.uid, singpy.gid)
    env["APPTAINER_KEYSDIR"] = str(keys)
    library.store.add(golden("one-group-signed-pgp.sif"), "alice/tools/signed", ("v1",))
    unsigned = singpy.run("pull", "--no-https", str(home / "unsigned.sif"), library.ref("alice/tools/busybox", "1.0"),
                          env=env)
    assert unsigned.returncode == 0 and (home / "unsigned.sif").exists(), unsigned.stderr
    assert "WARNING: integrity: signature not found for object group 1\nWARNING: Skipping container verification\n" \
        in unsigned.stderr
    signed = library.ref("alice/tools/signed", "v1")
    unknown = singpy.run("pull", "--no-https", "--arch", "386", str(home / "unknown.sif"), signed, env=env)
    assert unknown.returncode == 0 and "WARNING: Skipping container verification\n" in unknown.stderr, unknown.stderr
    trust_golden_key(singpy, home)
    known = singpy.run("pull", "--no-https", "--arch", "386", str(home / "known.sif"), signed, env=env)
    assert known.returncode == 0 and "WARNING" not in known.stderr, known.stderr
    assert (home / "known.sif").read_bytes() == golden("one-group-signed-pgp.sif").read_bytes()

"""A cached tag's check sent ahead (issue 31): `singpy exec docker://X:TAG` / `oras://X:TAG` opens the connection
and sends its one HEAD request as soon as the command line is parsed, and reads the answer where the image is
needed. What a user sees must not change: a moved tag runs the new image on this very run, a registry that
closes the connection or falls silent ends the wait (the cached image then runs with one warning), an
untrusted certificate is one FATAL line. Real registries and servers, as root and as the unprivileged user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal, readable_by_all
from tests.support.answering import Answering
from tests.support.images import build_busybox_rootfs
from tests.support.oci import Image, busybox_image, file
from tests.support.registry import RegistryServer, start_registry
from tests.support.sifs import new_cache, siftool_sif

AHEAD = "sent ahead"  # the -d line of a check sent ahead (singpy.oci.quickhead.expect)
QUICK = "quick check of"  # the -d line of its answer
RELEASED = "the TLS context begun ahead is not used: released"  # the -d line of singpy.oci.tagcheck.release


def marked(text: str) -> Image:
    return busybox_image(extra=[file("marker", f"{text}\n")])


def flags(registry: RegistryServer) -> list[str]:
    return [] if registry.https else ["--no-https"]


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_a_moved_tag_is_noticed_by_the_check_sent_ahead(singpy: Singpy, kind: str, request: pytest.FixtureRequest,
                                                        workdir: Path) -> None:
    registry: RegistryServer = request.getfixturevalue(f"registry_{kind}")
    name = f"tagahead/moved-{kind}-{singpy.profile}"
    registry.upload(marked("first"), name)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"tag-ahead-{kind}")),
                     SSL_CERT_FILE=registry.ca_file or "")
    first = singpy.run("-d", "exec", *flags(registry), registry.ref(name), "cat", "/marker", env=env)
    assert first.stdout == "first\n" and AHEAD not in first.stderr, first.stderr  # not cached: a pull
    cached = singpy.run("-d", "exec", *flags(registry), registry.ref(name), "cat", "/marker", env=env)
    assert cached.stdout == "first\n" and AHEAD in cached.stderr and QUICK in cached.stderr, cached.stderr
    registry.upload(marked("second"), name)
    moved = singpy.run("-d", "exec", *flags(registry), registry.ref(name), "cat", "/marker", env=env)
    assert moved.returncode == 0 and moved.stdout == "second\n", moved.stderr
    assert AHEAD in moved.stderr, moved.stderr


def test_a_moved_oras_tag_is_noticed_by_the_check_sent_ahead(singpy: Singpy, registry_plain: RegistryServer,
                                                             workdir: Path) -> None:
    folder = workdir / "tagahead-sifs" / singpy.profile
    folder.mkdir(parents=True)
    first, second = folder / "first.sif", folder / "second.sif"
    first.write_bytes(siftool_sif(workdir).read_bytes())
    second.write_bytes(first.read_bytes())
    extra = folder / "extra.bin"
    extra.write_bytes(os.urandom(4096))
    subprocess.run(["siftool", "add", "--datatype", "7", str(second), str(extra)], check=True,
                   stdout=subprocess.DEVNULL)
    reference = f"oras://{registry_plain.host}/tagahead/oras-{singpy.profile}:v1"
    cache = new_cache(singpy, workdir, "tag-ahead-oras")
    env = singpy.env(SINGPY_CACHEDIR=str(cache))
    push_env = {**os.environ, "SINGPY_CACHEDIR": str(workdir / "tagahead-push-cache")}
    subprocess.run([SINGPY, "-q", "push", "--no-https", str(first), reference], check=True, env=push_env)
    singpy.ok("exec", "--no-https", reference, "true", env=env)
    subprocess.run([SINGPY, "-q", "push", "--no-https", str(second), reference], check=True, env=push_env)
    moved = singpy.run("-d", "exec", "--no-https", reference, "true", env=env)
    assert moved.returncode == 0 and AHEAD in moved.stderr, moved.stderr
    assert len(list((cache / "sif").glob("*.sif"))) == 2  # the new SIF was downloaded on this run


ANSWERS = {"closing": (b"", False),  # reads the request, closes without a word
           "silent": (b"", True),  # reads the request, never answers
           "cut": (b"HTTP/1.1 200 OK\r\nDocker-Con", False),  # closes in the middle of its headers
           # Over TLS, a plain TCP server where the registry was: it reads the ClientHello, then hangs up or
           # falls silent in the middle of the handshake.
           "tls-closing": (b"", False),
           "tls-silent": (b"", True)}


@pytest.fixture
def cached_then_answering(singpy: Singpy, workdir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[str, dict[str, str], Answering]]:
    """An image cached from a registry whose port then answers as request.param says."""
    cache = str(new_cache(singpy, workdir, f"tag-ahead-{request.param}"))
    env = singpy.env(SINGPY_CACHEDIR=cache, SINGPY_PULL_DOCUMENT_TIMEOUT="2", SINGPY_PULL_STALL_TIMEOUT="1",
                     SINGPY_PULL_LOW_SPEED="1", SINGPY_PULL_RETRIES="1")
    tls = request.param.startswith("tls-")
    with start_registry(tmp_path / "registry", tls=tls) as registry:
        if tls:  # a copy the unprivileged user can read (tmp_path is the test runner's)
            ca_file = workdir / f"tag-ahead-ca-{request.param}-{singpy.profile}.crt"
            ca_file.write_bytes(Path(registry.ca_file or "").read_bytes())
            ca_file.chmod(0o644)
            env["SSL_CERT_FILE"] = str(ca_file)
        registry.upload(marked("cached"), "tagahead/closing")
        reference = registry.ref("tagahead/closing")
        singpy.ok("exec", *flags(registry), reference, "true", env=env)
    port = int(registry.host.rpartition(":")[2])
    answer, hold = ANSWERS[request.param]
    server = Answering(answer, hold=hold, port=port)
    try:
        yield reference, env, server
    finally:
        server.stop()


@pytest.mark.parametrize("cached_then_answering", ["closing", "silent"], indirect=True)
def test_a_registry_that_closes_or_hangs_ends_with_one_warning(
        singpy: Singpy, cached_then_answering: tuple[str, dict[str, str], Answering]) -> None:
    """The check sent ahead meets a registry that hangs up or falls silent: the wait ends within the
    deadlines, and the cached image runs with one warning, as when the check is made late."""
    reference, env, server = cached_then_answering
    started = time.monotonic()
    result = singpy.run("exec", "--no-https", reference, "cat", "/marker", env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert (result.returncode, result.stdout) == (0, "cached\n"), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING:") and "running the cached image" in lines[0], lines
    assert "Traceback" not in result.stderr
    assert server.requests and server.requests[0].startswith(b"HEAD /v2/tagahead/closing/manifests/latest ")
    assert elapsed < 20, elapsed


@pytest.mark.parametrize("cached_then_answering", ["cut"], indirect=True)
def test_a_registry_cut_in_its_headers_gets_one_fatal_about_its_answer(
        singpy: Singpy, cached_then_answering: tuple[str, dict[str, str], Answering]) -> None:
    """An answer cut in the middle of its headers reads as a 200 without a digest, so the manifest is asked
    for, and that answer is cut too: one FATAL naming what came back (it was "bad file descriptor": the
    connection was closed under the answer still being read)."""
    reference, env, _ = cached_then_answering
    result = singpy.run("exec", "--no-https", reference, "true", env=env, timeout=60)
    lines = result.stderr.splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("FATAL:"), result.stderr
    assert "is not JSON" in lines[0] and "descriptor" not in lines[0], lines


def test_an_untrusted_registry_is_still_refused(singpy: Singpy, registry_tls: RegistryServer, workdir: Path) -> None:
    """The handshake begun ahead verifies as every check does: without the CA, one FATAL line, no answer
    taken from the registry."""
    name = f"tagahead/untrusted-{singpy.profile}"
    registry_tls.upload(marked("tls"), name)
    cache = str(new_cache(singpy, workdir, "tag-ahead-untrusted"))
    assert registry_tls.ca_file
    singpy.ok("exec", registry_tls.ref(name), "true", env=singpy.env(SINGPY_CACHEDIR=cache,
                                                                      SSL_CERT_FILE=registry_tls.ca_file))
    result = singpy.run("exec", registry_tls.ref(name), "true", env=singpy.env(SINGPY_CACHEDIR=cache))
    assert_one_fatal(result, f"can't make a TLS connection to {registry_tls.host}")


@pytest.mark.parametrize("cached_then_answering", ["tls-closing", "tls-silent"], indirect=True)
def test_a_registry_that_closes_or_stalls_mid_handshake_ends_with_one_warning(
        singpy: Singpy, cached_then_answering: tuple[str, dict[str, str], Answering]) -> None:
    """Over TLS, the check sent ahead meets a server that reads the ClientHello and then hangs up or falls
    silent: the wait ends within the deadlines, and the cached image runs with one warning."""
    reference, env, server = cached_then_answering
    started = time.monotonic()
    result = singpy.run("exec", reference, "cat", "/marker", env=env, timeout=60)
    elapsed = time.monotonic() - started
    assert (result.returncode, result.stdout) == (0, "cached\n"), result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("WARNING:") and "running the cached image" in lines[0], lines
    assert server.requests and server.requests[0][:1] == b"\x16"  # a TLS handshake record: the ClientHello
    assert elapsed < 20, elapsed


def system_bundle() -> str:
    """The system's CA bundle where its hashed directory is beside it (Debian's), else skip."""
    import _ssl

    _, bundle, _, directory = _ssl.get_default_verify_paths()
    if not (os.path.isfile(bundle) and os.path.isdir(directory)):
        pytest.skip("no system CA bundle and hashed directory")
    return bundle


def test_the_system_bundle_in_ssl_cert_file_trusts_as_before(singpy: Singpy, registry_tls: RegistryServer,
                                                              workdir: Path) -> None:
    """SSL_CERT_FILE naming the system's own bundle (as many sites' environments do): the quick check uses the
    system's hashed directory instead of parsing the bundle; the trust is the same: a registry whose CA is in
    SSL_CERT_DIR is checked (and the moved tag seen), one whose CA is nowhere is one FATAL line."""
    bundle = system_bundle()
    name = f"tagahead/bundle-{singpy.profile}"
    registry_tls.upload(marked("first"), name)
    cadir = workdir / f"tagahead-cadir-{singpy.profile}"
    cadir.mkdir()
    assert registry_tls.ca_file
    (cadir / "registry-ca.pem").write_bytes(Path(registry_tls.ca_file).read_bytes())
    subprocess.run(["openssl", "rehash", str(cadir)], check=True)
    cache = str(new_cache(singpy, workdir, "tag-ahead-bundle"))
    env = singpy.env(SINGPY_CACHEDIR=cache, SSL_CERT_FILE=bundle, SSL_CERT_DIR=str(cadir))
    assert singpy.ok("exec", registry_tls.ref(name), "cat", "/marker", env=env) == "first\n"
    registry_tls.upload(marked("second"), name)
    moved = singpy.run("-d", "exec", registry_tls.ref(name), "cat", "/marker", env=env)
    assert moved.returncode == 0 and moved.stdout == "second\n", moved.stderr
    assert AHEAD in moved.stderr and QUICK in moved.stderr, moved.stderr  # answered by the quick check itself
    untrusted = singpy.run("exec", registry_tls.ref(name), "true", env={**env, "SSL_CERT_DIR": ""})
    assert_one_fatal(untrusted, f"can't make a TLS connection to {registry_tls.host}")


def session_members(session: int) -> list[str]:
    """The processes (pid and command) of `session` still alive."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[3]) == session:  # after the command: state, ppid, pgrp, session
            found.append(f"{entry} {stat.partition(' ')[2].partition(')')[0]}")
    return found


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_nothing_of_the_run_remains_after_it(singpy: Singpy, kind: str, request: pytest.FixtureRequest,
                                              workdir: Path, tmp_path: Path) -> None:
    """A run whose check was sent ahead leaves no process (its session is empty once it exits) and no file
    in its TMPDIR."""
    registry: RegistryServer = request.getfixturevalue(f"registry_{kind}")
    name = f"tagahead/leftover-{kind}-{singpy.profile}"
    registry.upload(marked("cached"), name)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    tmpdir.chmod(0o1777)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"tag-ahead-leftover-{kind}")),
                     SSL_CERT_FILE=registry.ca_file or "", TMPDIR=str(tmpdir))
    singpy.ok("exec", *flags(registry), registry.ref(name), "true", env=env)  # cached
    process = singpy.popen(["-d", "exec", *flags(registry), registry.ref(name), "cat", "/marker"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out == "cached\n" and AHEAD in err, err
    assert session_members(process.pid) == []
    assert list(tmpdir.iterdir()) == []


@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_the_containers_program_has_no_child_it_did_not_make(singpy: Singpy, kind: str,
                                                              request: pytest.FixtureRequest, workdir: Path) -> None:
    """Over TLS the check runs in a helper process, a child of the launcher, which becomes the container's program
    by exec: the helper is killed and reaped before that, never left to the program as a child of its own (a
    shell's `wait` would wait for it, an init would reap a stranger)."""
    registry: RegistryServer = request.getfixturevalue(f"registry_{kind}")
    name = f"tagahead/children-{kind}-{singpy.profile}"
    registry.upload(marked("cached"), name)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"tag-ahead-children-{kind}")),
                     SSL_CERT_FILE=registry.ca_file or "")
    singpy.ok("exec", *flags(registry), registry.ref(name), "true", env=env)  # cached
    for _ in range(3):
        result = singpy.run("-d", "exec", *flags(registry), registry.ref(name), "sh", "-c",
                            "exec cat /proc/$$/task/$$/children", env=env)
        assert result.returncode == 0 and AHEAD in result.stderr, result.stderr
        assert result.stdout == "", result.stdout  # the program (cat, in the launcher's process) has no child


def test_an_error_right_after_the_tls_context_is_begun_is_one_fatal_line(singpy: Singpy, tmp_path: Path) -> None:
    """Over https the check's helper is started as soon as the command line names an image
    (singpy.oci.tagcheck.prepare_early). A run that ends right after, here on a configuration file that can't be
    read, still ends as any error does: one FATAL line, exit 255, and no helper left. (When the context was made
    on a thread that was not joined at exit, OpenSSL's own exit handler freed what it was using, and 2 runs in
    30 ended in a segmentation fault instead.)"""
    missing = tmp_path / "no" / "singpy.conf"
    for _ in range(20):
        result = singpy.run("--config", str(missing), "exec", "docker://127.0.0.1:9/some/image:v1", "true")
        assert_one_fatal(result, "can't read configuration")
    process = singpy.popen(["--config", str(missing), "exec", "docker://127.0.0.1:9/some/image:v1", "true"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 255 and "FATAL" in err, err
    assert session_members(process.pid) == []  # the helper too: killed at exit


_SUBREAPER = """
import ctypes, json, os, subprocess, sys, time
argv, ids, env = json.loads(sys.argv[1])
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come to us
done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **ids)
time.sleep(0.5)  # a helper left behind dies with its launcher (PR_SET_PDEATHSIG) and is reparented here
orphans = []
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.1)
        continue
    orphans.append(pid)
print(json.dumps([done.returncode, done.stdout[:40], done.stderr, orphans]))
"""


def test_help_for_a_docker_image_leaves_no_helper_for_others_to_reap(singpy: Singpy) -> None:
    """`exec --help docker://X:TAG` prints the help and leaves at once (singpy.cli.main._exit_now, no exit
    handlers): the helper begun on the docker:// word is killed and reaped by the launcher first, not left to
    whoever reaps orphans (here a subreaper around the run)."""
    argv, ids = singpy.command(["exec", "--help", "docker://127.0.0.1:9/some/image:v1"])
    script = json.dumps([argv, ids, singpy.env()])
    done = subprocess.run([sys.executable, "-c", _SUBREAPER, script], capture_output=True, text=True, timeout=60,
                          check=True)
    status, out, err, orphans = json.loads(done.stdout)
    assert (status, err) == (0, "") and out.startswith("Usage:"), (status, out, err)
    assert orphans == []


def test_a_docker_word_that_is_not_the_image_is_no_reason_to_keep_a_helper(singpy: Singpy, workdir: Path) -> None:
    """The check's helper is started on the first docker:// word of a run, exec or shell, before the parser is
    loaded (singpy.oci.tagcheck.prepare_early). Here that word is an argument of the command: the parsed command
    line releases it (killed and reaped), and the launch runs."""
    sandbox = workdir / "tag-ahead-word"
    if not sandbox.exists():
        build_busybox_rootfs(sandbox)
        readable_by_all(sandbox)
    for word in ("docker://127.0.0.1:9/some/image:v1", "oras://127.0.0.1:9/some/image:v1"):
        result = singpy.run("exec", str(sandbox), "echo", word)
        assert (result.returncode, result.stdout, result.stderr) == (0, f"{word}\n", "")
        debug = singpy.run("-d", "exec", str(sandbox), "true")
        assert debug.returncode == 0 and RELEASED not in debug.stderr, debug.stderr  # no docker:// word: none
        debug = singpy.run("-d", "exec", str(sandbox), "echo", word)
        assert debug.returncode == 0 and RELEASED in debug.stderr, debug.stderr

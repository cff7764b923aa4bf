"""A registry that misbehaves on purpose (tests/support/hostile_registry.py), and the real `singpy` against it.

Issue 24, classes 4 to 6, each case as root and as the unprivileged test user:

* credentials and tokens travel only over TLS: a Bearer realm on plain http:// and redirects from https to
  http (manifest, blob, token) are refused, and the plain server's log proves nothing reached it;
  a redirect to another host still goes without credentials;
* every pull ends: a registry that ignores Range and cuts every blob, a trickle of bytes (headers, a
  manifest, a blob) and a silence all end within a bound set by the SINGPY_PULL_* variables;
* bad JSON from the registry (nested deep enough to crash a recursive parser, in a manifest, an error body
  and a token answer) is one FATAL line.

Every failure is one FATAL line, no traceback, and leaves no output file, no work directory and no blob
that was not verified (a `.partial` kept for a resume holds only true bytes of the blob).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import oci
from tests.support.hostile_registry import PASSWORD, USERNAME, HostileRegistry, Seen, start_hostile_registry
from tests.support.hostile_registry import fixture_hostile_registry as fixture_hostile_registry  # noqa: F401
from tests.support.sifs import new_cache

# Small limits: every failing pull here ends in a few seconds.
FAST = {"SINGPY_PULL_RETRIES": "2", "SINGPY_PULL_STALL_TIMEOUT": "1", "SINGPY_PULL_LOW_SPEED": "1000",
        "SINGPY_PULL_DOCUMENT_TIMEOUT": "2"}
CREDENTIALS = {"SINGPY_DOCKER_USERNAME": USERNAME, "SINGPY_DOCKER_PASSWORD": PASSWORD}
BOUND = 20.0  # seconds any pull here may take, start-up and all (the limits above allow a few)


class Pull:
    """One image in the hostile registry under `scenario`, and a place for the profile's singpy to pull it."""

    def __init__(self, singpy: Singpy, hostile: HostileRegistry, workdir: Path, scenario: str,
                 **params: object) -> None:
        self.singpy, self.hostile = singpy, hostile
        self.name = f"{scenario}/{singpy.profile}-{secrets.token_hex(4)}"
        self.layer = oci.Layer([oci.file("data/random", secrets.token_bytes(64 << 10))], compression="none")
        self.image = oci.Image([self.layer])
        hostile.add(self.name, self.image, scenario, **params)
        tag = self.name.replace("/", "-")
        self.cache = new_cache(singpy, workdir, tag)
        self.out_dir = workdir / "hostile-out" / tag
        self.out_dir.mkdir(parents=True)
        (workdir / "hostile-out").chmod(0o755)
        os.chown(self.out_dir, singpy.uid, singpy.gid)
        self.out = self.out_dir / "image.sif"

    def env(self, **extra: str) -> dict[str, str]:
        return self.singpy.env(SINGPY_CACHEDIR=str(self.cache), SSL_CERT_FILE=self.hostile.ca_file,
                               **{**FAST, **extra})

    def run(self, *args: str, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
        started = time.monotonic()
        result = self.singpy.run("-q", *args, env=env or self.env(**CREDENTIALS), timeout=60)
        elapsed = time.monotonic() - started
        assert elapsed < BOUND, f"{args} took {elapsed:.1f} s"
        return elapsed, result

    def pull(self, *, secure: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        flags = [] if secure else ["--no-https"]
        return self.run("pull", *flags, str(self.out), self.hostile.ref(self.name, secure=secure), env=env)[1]

    def assert_nothing_left(self) -> None:
        """No output, no work directory, no SIF, and no unverified blob (a .partial only of true bytes)."""
        assert os.listdir(self.out_dir) == []
        assert not (self.cache / "tmp").exists() or os.listdir(self.cache / "tmp") == []
        assert not (self.cache / "sif").exists() or os.listdir(self.cache / "sif") == []
        blobs = self.cache / "blobs" / "sha256"
        for name in os.listdir(blobs) if blobs.exists() else []:
            data = (blobs / name).read_bytes()
            if name.endswith(".partial"):
                assert self.layer.data.startswith(data), f"{name} holds bytes that are not the layer's"
            elif not name.startswith("."):  # a complete blob is only ever a verified one
                assert oci.sha256(data) == f"sha256:{name}"

    def plain_requests(self) -> list[Seen]:
        return list(self.hostile.seen(scheme="http", path_part=self.name))


# --- 4. credentials and TLS never downgrade --------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["environment", "docker-config"])
def test_an_http_token_realm_never_sees_the_credentials(singpy: Singpy, hostile_registry: HostileRegistry,
                                                       workdir: Path, source: str) -> None:
    pull = Pull(singpy, hostile_registry, workdir, "realm-http")
    env = pull.env(**CREDENTIALS)
    if source == "docker-config":
        config = pull.out_dir.parent / f"{pull.out_dir.name}-config"
        config.mkdir(mode=0o755)
        (config / "config.json").write_text(json.dumps(hostile_registry.docker_config()))
        (config / "config.json").chmod(0o644)
        env = pull.env(DOCKER_CONFIG=str(config))
    result = pull.pull(env=env)
    assert_one_fatal(result, "is plain HTTP")
    assert pull.plain_requests() == []  # not a byte to the realm: no password, no token in clear
    registry_side = hostile_registry.seen(scheme="https", path_part=pull.name)
    assert registry_side and all(seen.authorization is None for seen in registry_side)
    pull.assert_nothing_left()


@pytest.mark.parametrize(("scenario", "command", "words"), [
    ("redirect-http", "pull", "redirected from HTTPS to plain HTTP"),
    ("redirect-http", "exec", "redirected from HTTPS to plain HTTP"),  # the HEAD request of a run
    ("redirect-http-blob", "pull", "redirected from HTTPS to plain HTTP"),
    ("redirect-http-token", "pull", "answered HTTP 302"),  # a token request follows no redirect at all
])
def test_redirects_from_https_to_http_are_refused(singpy: Singpy, hostile_registry: HostileRegistry,
                                                  workdir: Path, scenario: str, command: str, words: str) -> None:
    pull = Pull(singpy, hostile_registry, workdir, scenario)
    if command == "pull":
        result = pull.pull()
    else:
        _, result = pull.run("exec", hostile_registry.ref(pull.name), "true")
    assert_one_fatal(result, words)
    assert pull.plain_requests() == []  # the plain server would have answered honestly: nothing went there
    pull.assert_nothing_left()


def test_a_redirect_to_another_host_goes_without_credentials(singpy: Singpy, hostile_registry: HostileRegistry,
                                                             workdir: Path) -> None:
    pull = Pull(singpy, hostile_registry, workdir, "redirect-other-host")
    result = pull.pull()
    assert result.returncode == 0, result.stderr
    assert pull.out.exists()
    elsewhere = hostile_registry.seen(scheme="https", path_part=f"/elsewhere/v2/{pull.name}/")
    assert elsewhere and all(seen.authorization is None for seen in elsewhere)
    assert any(seen.authorization for seen in hostile_registry.seen(path_part=f"/v2/{pull.name}/manifests/"))


def test_an_insecure_registry_is_the_users_choice(singpy: Singpy, hostile_registry: HostileRegistry,
                                                  workdir: Path) -> None:
    """--no-https: the same image over plain HTTP pulls (the refusals above are about downgrades only)."""
    pull = Pull(singpy, hostile_registry, workdir, "honest")
    result = pull.pull(secure=False)
    assert result.returncode == 0, result.stderr
    assert pull.plain_requests()


# --- 5. every pull ends ----------------------------------------------------------------------------------------------


def test_a_registry_that_ignores_range_and_cuts_every_blob_fails_the_pull(singpy: Singpy,
                                                                          hostile_registry: HostileRegistry,
                                                                          workdir: Path) -> None:
    pull = Pull(singpy, hostile_registry, workdir, "cut-no-range")
    result = pull.pull()
    assert_one_fatal(result, f"blob {pull.layer.digest}")
    assert "SINGPY_PULL_RETRIES" in result.stderr
    gets = [seen for seen in hostile_registry.seen(path_part=f"/blobs/{pull.layer.digest}") if seen.method == "GET"]
    assert 2 <= len(gets) <= 2 * int(FAST["SINGPY_PULL_RETRIES"]) + 1  # bounded: no endless restart
    pull.assert_nothing_left()


@pytest.mark.parametrize("scenario", ["trickle-blob", "silent-blob"])
def test_a_blob_that_trickles_or_stops_fails_on_the_low_speed_limit(singpy: Singpy,
                                                                     hostile_registry: HostileRegistry,
                                                                     workdir: Path, scenario: str) -> None:
    pull = Pull(singpy, hostile_registry, workdir, scenario, interval=0.05)
    result = pull.pull()
    assert_one_fatal(result, "is too slow: fewer than 1000 bytes arrived in 1 s")
    assert "SINGPY_PULL_LOW_SPEED" in result.stderr
    pull.assert_nothing_left()


@pytest.mark.parametrize(("scenario", "command"), [("trickle-manifest", "pull"), ("trickle-headers", "pull"),
                                                   ("trickle-headers", "exec")])
def test_a_trickled_manifest_fails_on_the_document_deadline(singpy: Singpy, hostile_registry: HostileRegistry,
                                                            workdir: Path, scenario: str, command: str) -> None:
    # 5 bytes a second passes a low-speed limit of 1 byte/s: only the deadline of a whole document stops it.
    pull = Pull(singpy, hostile_registry, workdir, scenario, interval=0.2)
    env = pull.env(SINGPY_PULL_LOW_SPEED="1", **CREDENTIALS)
    if command == "pull":
        elapsed, result = pull.run("pull", str(pull.out), hostile_registry.ref(pull.name), env=env)
    else:
        elapsed, result = pull.run("exec", hostile_registry.ref(pull.name), "true", env=env)
    assert_one_fatal(result, "is too slow: the answer took more than 2 s")
    assert "SINGPY_PULL_DOCUMENT_TIMEOUT" in result.stderr
    assert elapsed >= 2
    pull.assert_nothing_left()


@pytest.mark.parametrize(("variable", "value"), [("SINGPY_PULL_RETRIES", "0"), ("SINGPY_PULL_STALL_TIMEOUT", "soon"),
                                                 ("SINGPY_PULL_LOW_SPEED", "-1"),
                                                 ("SINGPY_PULL_DOCUMENT_TIMEOUT", "nan")])
def test_a_bad_limit_is_one_fatal_line_naming_the_variable(singpy: Singpy, hostile_registry: HostileRegistry,
                                                           workdir: Path, variable: str, value: str) -> None:
    pull = Pull(singpy, hostile_registry, workdir, "honest")
    result = pull.pull(env=pull.env(**{variable: value}))
    assert_one_fatal(result, f"{variable}={value!r}")
    assert hostile_registry.seen(path_part=pull.name) == []  # refused before any request
    pull.assert_nothing_left()


# --- 6. bad JSON is one error line -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "params", "words"), [
    ("nested-manifest", {}, "is nested too deeply"),
    ("nested-error", {"status": 404}, "not found in registry"),
    ("nested-error", {"status": 500}, "answered HTTP 500"),
    ("nested-token", {}, "is nested too deeply"),
])
def test_deeply_nested_json_is_one_fatal_line(singpy: Singpy, hostile_registry: HostileRegistry, workdir: Path,
                                              scenario: str, params: dict[str, object], words: str) -> None:
    pull = Pull(singpy, hostile_registry, workdir, scenario, **params)
    result = pull.pull()
    assert_one_fatal(result, words)
    pull.assert_nothing_left()


# --- the hostile registry itself -------------------------------------------------------------------------------------


def test_the_hostile_registry_stops_with_answers_under_way(tmp_path: Path) -> None:
    """A silent or trickling answer must not hold the fixture's teardown, nor leave a thread behind."""
    image = oci.Image([oci.Layer([oci.file("x", b"x" * 1000)], compression="none")])
    paths = (f"/v2/stop/silent/blobs/{image.layers[0].digest}", "/v2/stop/trickle/manifests/latest")
    authorization = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
    with start_hostile_registry(tmp_path / "private") as hostile:
        hostile.add("stop/silent", image, "silent-blob")
        hostile.add("stop/trickle", image, "trickle-manifest", interval=5.0)
        context = ssl.create_default_context(cafile=hostile.ca_file)
        threads_before = set(threading.enumerate())
        connections = []
        for path in paths:
            connection = context.wrap_socket(socket.create_connection(("127.0.0.1", hostile.https_port), timeout=10),
                                             server_hostname="127.0.0.1")
            connections.append(connection)
            connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\n\r\n".encode())
            assert connection.recv(12) == b"HTTP/1.1 200"  # the headers came: the answer is under way
        handlers = set(threading.enumerate()) - threads_before
        assert len(handlers) == 2
        started = time.monotonic()
    assert time.monotonic() - started < 3
    for thread in handlers:
        thread.join(3)
        assert not thread.is_alive()
    for connection in connections:
        connection.close()


def test_header_numbers_in_other_digits_are_no_traceback(singpy: Singpy, hostile_registry: HostileRegistry,
                                                        workdir: Path) -> None:
    """`Retry-After: ²` and `Content-Length: ²`: str.isdigit takes '²', int() and float() do not (a ValueError
    traceback); both are now read as absent, and the pull goes on."""
    pull = Pull(singpy, hostile_registry, workdir, "odd-digits")
    result = pull.pull(env=pull.env(SINGPY_PULL_RETRIES="2"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert pull.out.exists()

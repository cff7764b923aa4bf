"""registries.conf: mirrors, blocked and insecure registries for every docker:// pull (issue 25, item 4).

Nothing here reaches the internet: Docker Hub's name (docker.io) is given a `location` on 127.0.0.1 that is
a spy (a tiny HTTP server logging every request and answering 404), so that a test proves it was never
asked, and its mirror is the suite's real registry holding the image as library/debian. Each test writes
its registries.conf in a directory of its own and names it with CONTAINERS_REGISTRIES_CONF (or a HOME of
its own for the per-user files), as root and as the unprivileged user.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import pulling
from tests.support.oci import Image, busybox_image, file
from tests.support.registry import RegistryServer, free_port
from tests.support.sifs import new_cache

TAG = "singpy-mirrors"
MARKER = "debian from the mirror\n"


class Seen:
    def __init__(self, method: str, path: str, headers: dict[str, str]) -> None:
        self.method, self.path, self.headers = method, path, headers

    def __repr__(self) -> str:
        return f"Seen({self.method} {self.path})"


class Server:
    """An HTTP server on 127.0.0.1 that logs every request. `mode`: "spy" answers 404 to everything but /v2/;
    "bad-blob" serves `image` as library/debian:TAG with every layer's bytes changed (same size); "basic"
    asks for Basic credentials and refuses whatever it gets."""

    def __init__(self, mode: str, image: Image | None = None) -> None:
        self.mode, self.image = mode, image
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.answer(self)

            def do_HEAD(self) -> None:
                owner.answer(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        with self.lock:
            self.seen.append(Seen(handler.command, handler.path, {k.lower(): v for k, v in handler.headers.items()}))
        path = handler.path.partition("?")[0]
        if self.mode == "basic":
            return self.send(handler, 401, b'{"errors": [{"code": "UNAUTHORIZED"}]}',
                             {"WWW-Authenticate": 'Basic realm="mirror"'})
        if path in ("/v2/", "/v2"):
            return self.send(handler, 200, b"{}")
        image = self.image
        if self.mode == "bad-blob" and image is not None:
            if path == f"/v2/library/debian/manifests/{TAG}" or path == f"/v2/library/debian/manifests/{image.digest}":
                return self.send(handler, 200, image.data, {"Docker-Content-Digest": image.digest,
                                                            "Content-Type": image.media_type})
            blobs = dict(image.blobs())
            digest = path.rpartition("/")[2]
            if path.startswith("/v2/library/debian/blobs/") and digest in blobs:
                data = blobs[digest]
                if digest != image.config_digest:
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                return self.send(handler, 200, data, {"Content-Type": "application/octet-stream"})
        return self.send(handler, 404, b'{"errors": [{"code": "NAME_UNKNOWN", "message": "spy"}]}')

    @staticmethod
    def send(handler: http.server.BaseHTTPRequestHandler, status: int, body: bytes,
             headers: dict[str, str] | None = None) -> None:
        handler.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(body)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def debian() -> Image:
    return busybox_image(extra=[file("etc/marker", MARKER)])


@pytest.fixture(scope="module")
def mirror(registry_plain: RegistryServer, debian: Image) -> RegistryServer:
    """registry_plain holding library/debian:TAG: what an unqualified docker://debian:TAG is, on the mirror."""
    registry_plain.upload(debian, "library/debian", TAG)
    return registry_plain


@pytest.fixture
def spy() -> Iterator[Server]:
    server = Server("spy")
    yield server
    server.stop()


def place(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A directory of this test's own that the profile's user can read and write."""
    return pulling.user_dir(singpy, workdir, name, "mirrors")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)
    return path


def hub(location: str, *mirrors: str, blocked: bool = False, insecure: bool = False) -> str:
    """A [[registry]] for docker.io at `location`, with mirrors "HOST" (insecure: plain HTTP) or "HOST secure"."""
    text = f'[[registry]]\nprefix = "docker.io"\nlocation = "{location}"\n'
    text += "blocked = true\n" if blocked else ""
    text += "insecure = true\n" if insecure else ""
    for entry in mirrors:
        host, _, secure = entry.partition(" ")
        text += f'[[registry.mirror]]\nlocation = "{host}"\n' + ("" if secure else "insecure = true\n")
    return text


def env_for(singpy: Singpy, workdir: Path, name: str, conf: Path | None, **extra: str) -> dict[str, str]:
    more = {"CONTAINERS_REGISTRIES_CONF": str(conf)} if conf is not None else {}
    return singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"mirrors-{name}")), **more, **extra)


def marker(singpy: Singpy, env: dict[str, str], reference: str = f"docker://debian:{TAG}") -> str:
    result = singpy.run("exec", reference, "cat", "/etc/marker", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- mirrors ---------------------------------------------------------------------------------------------------------


def test_an_unqualified_name_comes_from_the_docker_io_mirror_and_nothing_else_is_asked(
        singpy: Singpy, mirror: RegistryServer, spy: Server, workdir: Path) -> None:
    here = place(singpy, workdir, "unqualified")
    conf = write(here / "registries.conf", hub(spy.host, mirror.host))
    env = env_for(singpy, workdir, "unqualified", conf)
    assert marker(singpy, env) == MARKER
    assert marker(singpy, env) == MARKER  # the cached image: its tag checked on the mirror
    out = here / "debian.sif"
    result = singpy.run("pull", str(out), f"docker://debian:{TAG}", env=env, timeout=120)
    assert result.returncode == 0 and out.is_file(), result.stderr
    assert f"docker://docker.io/library/debian:{TAG}" in result.stderr  # the image keeps its own name
    assert spy.seen == []


def test_build_and_a_definition_file_use_the_mirror_too(singpy: Singpy, mirror: RegistryServer, spy: Server,
                                                         workdir: Path) -> None:
    here = place(singpy, workdir, "build")
    conf = write(here / "registries.conf", hub(spy.host, mirror.host))
    env = env_for(singpy, workdir, "build", conf)
    singpy.ok("build", "--sandbox", str(here / "sandbox"), f"docker://debian:{TAG}", env=env, timeout=120)
    assert (here / "sandbox/etc/marker").read_text() == MARKER
    recipe = write(here / "recipe.def", f"Bootstrap: docker\nFrom: debian:{TAG}\n\n%post\n"
                                        "    cat /etc/marker > /post-made\n")
    singpy.ok("build", str(here / "built.sif"), str(recipe), env=env, timeout=300)
    assert singpy.ok("exec", str(here / "built.sif"), "cat", "/post-made", env=env) == MARKER
    assert spy.seen == []


def test_a_cached_image_runs_when_no_endpoint_can_be_reached(singpy: Singpy, mirror: RegistryServer, spy: Server,
                                                             workdir: Path) -> None:
    here = place(singpy, workdir, "offline")
    env = env_for(singpy, workdir, "offline", write(here / "online.conf", hub(spy.host, mirror.host)))
    assert marker(singpy, env) == MARKER
    dead = f"127.0.0.1:{free_port()}"
    env["CONTAINERS_REGISTRIES_CONF"] = str(write(here / "offline.conf", hub(dead, dead, insecure=True)))
    result = singpy.run("exec", f"docker://debian:{TAG}", "cat", "/etc/marker", env=env, timeout=120)
    assert result.returncode == 0 and result.stdout == MARKER, result.stderr
    assert f"WARNING: can't reach registry {dead}" in result.stderr
    assert f"running the cached image docker://docker.io/library/debian:{TAG}" in result.stderr
    assert spy.seen == []


def test_a_blocked_registry_without_a_mirror_is_one_fatal_line_naming_the_file(
        singpy: Singpy, spy: Server, workdir: Path) -> None:
    here = place(singpy, workdir, "blocked")
    conf = write(here / "registries.conf", hub(spy.host, blocked=True))
    env = env_for(singpy, workdir, "blocked", conf)
    result = singpy.run("pull", str(here / "x.sif"), f"docker://debian:{TAG}", env=env)
    assert_one_fatal(result, f"can't pull docker://docker.io/library/debian:{TAG}: registry docker.io is blocked in "
                             f"{conf}")
    assert spy.seen == [] and not (here / "x.sif").exists()


def test_a_blocked_registry_is_pulled_from_its_mirror(singpy: Singpy, mirror: RegistryServer, spy: Server,
                                                     workdir: Path) -> None:
    here = place(singpy, workdir, "blocked-mirror")
    conf = write(here / "registries.conf", hub(spy.host, mirror.host, blocked=True))
    assert marker(singpy, env_for(singpy, workdir, "blocked-mirror", conf)) == MARKER
    assert spy.seen == []


def test_a_mirror_that_is_down_falls_back_to_the_next_one_then_to_the_location(
        singpy: Singpy, mirror: RegistryServer, spy: Server, workdir: Path) -> None:
    here = place(singpy, workdir, "down")
    dead = f"127.0.0.1:{free_port()}"
    conf = write(here / "next.conf", hub(spy.host, dead, mirror.host))
    assert marker(singpy, env_for(singpy, workdir, "down-next", conf)) == MARKER
    assert spy.seen == []
    conf = write(here / "primary.conf", hub(mirror.host, dead, insecure=True))
    assert marker(singpy, env_for(singpy, workdir, "down-primary", conf)) == MARKER


def test_every_endpoint_down_is_one_fatal_line_naming_each(singpy: Singpy, workdir: Path) -> None:
    here = place(singpy, workdir, "all-down")
    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    conf = write(here / "registries.conf", hub(second, first, insecure=True))
    result = singpy.run("pull", str(here / "x.sif"), f"docker://debian:{TAG}",
                        env=env_for(singpy, workdir, "all-down", conf))
    assert_one_fatal(result, f"can't reach registry {second}")
    assert f"mirrors also failed: {first}: can't reach registry {first}" in result.stderr


def test_a_mirror_serving_a_bad_blob_is_passed_over_for_the_next(singpy: Singpy, mirror: RegistryServer,
                                                                 spy: Server, debian: Image, workdir: Path) -> None:
    bad = Server("bad-blob", debian)
    try:
        here = place(singpy, workdir, "bad-blob")
        conf = write(here / "registries.conf", hub(spy.host, bad.host, mirror.host))
        env = env_for(singpy, workdir, "bad-blob", conf)
        result = singpy.run("exec", f"docker://debian:{TAG}", "cat", "/etc/marker", env=env, timeout=120)
        assert result.returncode == 0 and result.stdout == MARKER, result.stderr
        assert "digest mismatch for blob sha256:" in result.stderr and f"from {bad.host}" in result.stderr
        assert any("/blobs/" in seen.path for seen in bad.seen)
        assert spy.seen == []
        blobs = Path(env["SINGPY_CACHEDIR"]) / "blobs" / "sha256"
        assert sorted(path.name for path in blobs.iterdir() if not path.name.startswith(".")) == \
            sorted(layer.digest.removeprefix("sha256:") for layer in debian.layers)  # only the good bytes
    finally:
        bad.stop()


def test_a_mirror_gets_its_own_credentials_never_the_ones_given_for_the_registry(
        singpy: Singpy, mirror: RegistryServer, registry_basic: RegistryServer, debian: Image,
        workdir: Path) -> None:
    asking = Server("basic")
    try:
        here = place(singpy, workdir, "credentials")
        conf = write(here / "registries.conf", hub(mirror.host, asking.host, insecure=True))
        env = env_for(singpy, workdir, "credentials-env", conf, SINGPY_DOCKER_USERNAME="alice",
                      SINGPY_DOCKER_PASSWORD="origin-secret")
        assert marker(singpy, env) == MARKER  # the mirror refused, the location answered
        assert asking.seen and all("authorization" not in seen.headers for seen in asking.seen)
    finally:
        asking.stop()
    registry_basic.upload(debian, "library/debian", TAG)
    authfile = write(here / "auth.json", json.dumps(registry_basic.docker_config()))
    spy = Server("spy")
    try:
        conf = write(here / "basic.conf", hub(spy.host, registry_basic.host))
        env = env_for(singpy, workdir, "credentials-file", conf)
        result = singpy.run("exec", "--authfile", str(authfile), f"docker://debian:{TAG}", "cat", "/etc/marker",
                            env=env, timeout=120)
        assert result.returncode == 0 and result.stdout == MARKER, result.stderr
        assert spy.seen == []
    finally:
        spy.stop()


# --- insecure --------------------------------------------------------------------------------------------------------


def test_insecure_is_for_that_registry_only(singpy: Singpy, mirror: RegistryServer, registry_tls: RegistryServer,
                                            debian: Image, workdir: Path) -> None:
    registry_tls.upload(debian, "mirrors/tls", TAG)
    here = place(singpy, workdir, "insecure")
    conf = write(here / "registries.conf", f'[[registry]]\nlocation = "{registry_tls.host}"\ninsecure = true\n')
    env = env_for(singpy, workdir, "insecure", conf)  # no SSL_CERT_FILE: the certificate is not checked
    assert marker(singpy, env, f"docker://{registry_tls.host}/mirrors/tls:{TAG}") == MARKER
    result = singpy.run("pull", str(here / "x.sif"), f"docker://{mirror.host}/library/debian:{TAG}", env=env)
    assert_one_fatal(result, f"can't make a TLS connection to {mirror.host}")


# --- the files -------------------------------------------------------------------------------------------------------


def test_drop_ins_are_read_in_name_order_after_the_file(singpy: Singpy, mirror: RegistryServer, spy: Server,
                                                        workdir: Path) -> None:
    here = place(singpy, workdir, "drop-ins")
    home = here / "home"
    conf = write(here / "registries.conf", hub(spy.host, f"127.0.0.1:{free_port()}"))
    drop_ins = home / ".config/containers/registries.conf.d"
    write(drop_ins / "10-first.conf", hub(spy.host, f"127.0.0.1:{free_port()}"))
    write(drop_ins / "20-second.conf", hub(spy.host, mirror.host))
    write(drop_ins / "30-other.conf", '[[registry]]\nprefix = "quay.io"\nlocation = "127.0.0.1:9"\n')
    write(drop_ins / "40-ignored.txt", "not TOML at all [")
    for path in (home, home / ".config", home / ".config/containers", drop_ins):
        path.chmod(0o755)
    env = env_for(singpy, workdir, "drop-ins", conf, HOME=str(home))
    assert marker(singpy, env) == MARKER
    assert spy.seen == []


def test_the_users_registries_conf_in_home(singpy: Singpy, mirror: RegistryServer, spy: Server,
                                          workdir: Path) -> None:
    home = place(singpy, workdir, "home")
    write(home / ".config/containers/registries.conf", hub(spy.host, mirror.host))
    for path in (home / ".config", home / ".config/containers"):
        path.chmod(0o755)
    assert marker(singpy, env_for(singpy, workdir, "home", None, HOME=str(home))) == MARKER
    assert spy.seen == []


@pytest.mark.parametrize(("text", "line", "problem"), [
    ('[[registry]]\nprefix = "docker.io"\nlocation = \n', 3, "not valid TOML"),
    ('\n[[registry]]\nprefix = "docker.io"\nlocation = "127.0.0.1:9"\n\n[[registry]]\nprefix = "quay.io"\n'
     'location = "127.0.0.1:9"\n[[registry.mirror]]\nlocation = "127.0.0.1:8"\npull-from-mirror = "sometimes"\n',
     6, "'pull-from-mirror' is 'sometimes'"),
    ('[[registry]]\nlocation = "https://127.0.0.1:9"\n', 1, "a location has no URL scheme"),
], ids=["toml", "pull-from-mirror", "scheme"])
def test_a_malformed_file_is_one_fatal_line_naming_file_and_line(singpy: Singpy, workdir: Path, text: str,
                                                                 line: int, problem: str) -> None:
    here = place(singpy, workdir, f"malformed-{line}")
    conf = write(here / "registries.conf", text)
    result = singpy.run("pull", str(here / "x.sif"), f"docker://debian:{TAG}",
                        env=env_for(singpy, workdir, f"malformed-{line}", conf))
    assert_one_fatal(result, f"{conf}:{line}: ")
    assert problem in result.stderr


def test_a_missing_registries_conf_named_by_the_variable(singpy: Singpy, workdir: Path) -> None:
    here = place(singpy, workdir, "missing")
    result = singpy.run("pull", str(here / "x.sif"), f"docker://debian:{TAG}",
                        env=env_for(singpy, workdir, "missing", here / "nothing.conf"))
    assert_one_fatal(result, f"CONTAINERS_REGISTRIES_CONF names {here / 'nothing.conf'}, which does not exist")

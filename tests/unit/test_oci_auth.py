"""singpy.oci.auth: where credentials come from, and WWW-Authenticate challenges."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from pathlib import Path

import pytest

from singpy.errors import ImageError
from singpy.host.hostfiles import shown
from singpy.oci.auth import (
    IDENTITY_TOKEN_USER,
    Authenticator,
    AuthFailure,
    Challenge,
    Credentials,
    find_credentials,
    normalized_host,
    parse_challenges,
)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write_config(path: Path, config: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def find(registry: str, home: Path, env: dict[str, str] | None = None,
         authfile: Path | None = None) -> Credentials | None:
    return find_credentials(registry, {"PATH": "/usr/bin:/bin", **(env or {})},
                            authfile=str(authfile) if authfile else None, home=str(home))


# --- environment ---------------------------------------------------------------------------------------------------


def test_no_credentials_anywhere_means_anonymous(tmp_path: Path) -> None:
    assert find("ghcr.io", tmp_path) is None


def test_environment_first_in_singpy_apptainer_singularity_order(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {"ghcr.io": {"auth": b64("file:secret")}}})
    env = {"SINGULARITY_DOCKER_USERNAME": "s", "SINGULARITY_DOCKER_PASSWORD": "sp",
           "APPTAINER_DOCKER_USERNAME": "a", "APPTAINER_DOCKER_PASSWORD": "ap"}
    assert find("ghcr.io", tmp_path, env) == Credentials(username="a", password="ap")
    env |= {"SINGPY_DOCKER_USERNAME": "p", "SINGPY_DOCKER_PASSWORD": "pp"}
    assert find("ghcr.io", tmp_path, env) == Credentials(username="p", password="pp")
    del env["SINGPY_DOCKER_USERNAME"], env["SINGPY_DOCKER_PASSWORD"], env["APPTAINER_DOCKER_USERNAME"]
    del env["APPTAINER_DOCKER_PASSWORD"]
    assert find("ghcr.io", tmp_path, env) == Credentials(username="s", password="sp")
    assert find("ghcr.io", tmp_path) == Credentials(username="file", password="secret")


def test_environment_beats_authfile(tmp_path: Path) -> None:
    authfile = write_config(tmp_path / "auth.json", {"auths": {"ghcr.io": {"auth": b64("file:secret")}}})
    env = {"SINGPY_DOCKER_USERNAME": "u", "SINGPY_DOCKER_PASSWORD": "p"}
    assert find("ghcr.io", tmp_path, env, authfile) == Credentials(username="u", password="p")
    assert find("ghcr.io", tmp_path, authfile=authfile) == Credentials(username="file", password="secret")


def test_password_is_not_shown_by_repr() -> None:
    assert "hunter2" not in repr(Credentials(username="u", password="hunter2"))


# --- config files --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ghcr.io", "https://ghcr.io", "http://ghcr.io/", "https://ghcr.io/v2/", "GHCR.IO"])
def test_auths_keys_in_every_spelling(tmp_path: Path, key: str) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {key: {"auth": b64("user:pa:ss")}}})
    assert find("ghcr.io", tmp_path) == Credentials(username="user", password="pa:ss")
    assert find("quay.io", tmp_path) is None


@pytest.mark.parametrize("key", ["https://index.docker.io/v1/", "docker.io", "index.docker.io",
                                 "registry-1.docker.io"])
def test_docker_hub_keys(tmp_path: Path, key: str) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {key: {"auth": b64("hub:pw")}}})
    assert find("docker.io", tmp_path) == Credentials(username="hub", password="pw")
    assert find("ghcr.io", tmp_path) is None


def test_username_password_and_identity_token_entries(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {
        "a.io": {"username": "ua", "password": "pa"},
        "b.io": {"identitytoken": "refresh-me", "auth": b64("ignored:x")},
        "c.io": {},
        "d.io": {"auth": "!!! not base64"},
        "e.io": {"auth": b64("no colon")},
        "f.io": "not an object",
    }})
    assert find("a.io", tmp_path) == Credentials(username="ua", password="pa")
    assert find("b.io", tmp_path) == Credentials(username=IDENTITY_TOKEN_USER, password="refresh-me")
    for registry in ("c.io", "d.io", "e.io", "f.io"):
        assert find(registry, tmp_path) is None


def test_port_is_part_of_the_key(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {"127.0.0.1:5000": {"auth": b64("u:p")}}})
    assert find("127.0.0.1:5000", tmp_path) == Credentials(username="u", password="p")
    assert find("127.0.0.1:5001", tmp_path) is None


def test_docker_config_variable_replaces_home(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {"ghcr.io": {"auth": b64("home:1")}}})
    write_config(tmp_path / "elsewhere/config.json", {"auths": {"ghcr.io": {"auth": b64("elsewhere:2")}}})
    env = {"DOCKER_CONFIG": str(tmp_path / "elsewhere")}
    assert find("ghcr.io", tmp_path, env) == Credentials(username="elsewhere", password="2")
    assert find("ghcr.io", tmp_path, {"DOCKER_CONFIG": str(tmp_path / "empty")}) is None


def test_apptainer_login_file_then_docker_config(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {"a.io": {"auth": b64("docker:1")},
                                                              "b.io": {"auth": b64("docker:2")}}})
    write_config(tmp_path / ".apptainer/docker-config.json", {"auths": {"a.io": {"auth": b64("apptainer:1")}}})
    assert find("a.io", tmp_path) == Credentials(username="apptainer", password="1")
    assert find("b.io", tmp_path) == Credentials(username="docker", password="2")


def test_authfile_is_the_only_file_read(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": {"ghcr.io": {"auth": b64("home:1")}}})
    authfile = write_config(tmp_path / "auth.json", {"auths": {}})
    assert find("ghcr.io", tmp_path, authfile=authfile) is None


def test_missing_authfile_warns_and_goes_anonymous(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert find("ghcr.io", tmp_path, authfile=tmp_path / "missing.json") is None
    assert f"--authfile {tmp_path / 'missing.json'} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "words"), [("{not json", "is not valid JSON"), ("[1, 2]", "is not a JSON object"),
                                                ("\xff", "is not valid JSON")])
def test_malformed_config_is_one_error_naming_the_file(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / ".docker/config.json"
    path.parent.mkdir()
    path.write_text(content, encoding="latin-1")
    with pytest.raises(ImageError) as caught:
        find("ghcr.io", tmp_path)
    assert shown(str(path)) in caught.value.message
    assert words in caught.value.message or "not UTF-8 text" in caught.value.message


def test_config_of_wrong_shape_is_ignored(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {"auths": ["ghcr.io"], "credHelpers": "x", "credsStore": 3})
    assert find("ghcr.io", tmp_path) is None


def test_a_fifo_config_does_not_block(tmp_path: Path) -> None:
    (tmp_path / ".docker").mkdir()
    os.mkfifo(tmp_path / ".docker/config.json")
    with pytest.raises(ImageError, match="is a FIFO"):
        find("ghcr.io", tmp_path)


# --- credential helpers --------------------------------------------------------------------------------------------


def helper(directory: Path, name: str, body: str) -> Path:
    """A docker-credential-NAME program in `directory` that runs the shell `body` (stdin: the server)."""
    directory.mkdir(exist_ok=True)
    path = directory / f"docker-credential-{name}"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_credential_helper_for_one_registry(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    helper(bin_dir, "test", 'read server; [ "$1" = get ] || exit 3\n'
           'printf \'{"ServerURL":"%s","Username":"helped","Secret":"s3cret for %s"}\' "$server" "$server"')
    write_config(tmp_path / ".docker/config.json", {"credHelpers": {"ghcr.io": "test"},
                                                    "auths": {"ghcr.io": {"auth": b64("file:1")},
                                                              "quay.io": {"auth": b64("file:2")}}})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert find("ghcr.io", tmp_path, env) == Credentials(username="helped", password="s3cret for ghcr.io")
    assert find("quay.io", tmp_path, env) == Credentials(username="file", password="2")


def test_creds_store_gets_docker_hubs_server_url(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    helper(bin_dir, "store", 'read server\nprintf \'{"Username":"<token>","Secret":"%s"}\' "$server"')
    write_config(tmp_path / ".docker/config.json", {"credsStore": "store",
                                                    "auths": {"https://index.docker.io/v1/": {}}})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert find("docker.io", tmp_path, env) == Credentials(username=IDENTITY_TOKEN_USER,
                                                           password="https://index.docker.io/v1/")


def test_helper_without_credentials_falls_back_to_auths(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    helper(bin_dir, "empty", "echo 'credentials not found in native keychain'; exit 1")
    helper(bin_dir, "garbage", "echo '[not, json'")
    write_config(tmp_path / ".docker/config.json", {"credHelpers": {"a.io": "empty", "b.io": "garbage"},
                                                    "credsStore": "missing-on-path",
                                                    "auths": {"a.io": {"auth": b64("file:a")}}})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert find("a.io", tmp_path, env) == Credentials(username="file", password="a")
    assert find("b.io", tmp_path, env) is None


def test_helper_that_hangs_is_abandoned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from singpy.oci import auth

    monkeypatch.setattr(auth, "_HELPER_TIMEOUT", 1)
    bin_dir = tmp_path / "bin"
    helper(bin_dir, "slow", "exec sleep 30")
    write_config(tmp_path / ".docker/config.json", {"credHelpers": {"a.io": "slow"}})
    started = time.monotonic()
    assert find("a.io", tmp_path, {"PATH": f"{bin_dir}:/usr/bin:/bin"}) is None
    assert time.monotonic() - started < 10


# --- challenges ----------------------------------------------------------------------------------------------------


def test_docker_hub_challenge() -> None:
    value = 'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",' \
            'scope="repository:library/alpine:pull"'
    [challenge] = parse_challenges([value])
    assert challenge.scheme == "bearer"
    assert challenge.param("realm") == "https://auth.docker.io/token"
    assert challenge.param("service") == "registry.docker.io"
    assert challenge.param("scope") == "repository:library/alpine:pull"
    assert challenge.param("error") is None


def test_several_challenges_quoting_and_case() -> None:
    values = ['Basic realm="Registry Realm", BEARER Realm="https://x/t?a=1,b=2", Service=reg, error="in\\"valid"',
              "Negotiate"]
    basic, bearer, negotiate = parse_challenges(values)
    assert basic == Challenge(scheme="basic", params=(("realm", "Registry Realm"),))
    assert bearer.scheme == "bearer"
    assert bearer.param("realm") == "https://x/t?a=1,b=2"
    assert bearer.param("service") == "reg"
    assert bearer.param("error") == 'in"valid'
    assert negotiate == Challenge(scheme="negotiate")


@pytest.mark.parametrize("value", ["", ",,,", '=x', 'Bearer realm="unterminated', "Bearer ===", "\x00\xff garbage",
                                   'Bearer realm=, service="s"', "x" * 100000])
def test_garbage_challenges_never_raise(value: str) -> None:
    challenges = parse_challenges([value])
    assert all(isinstance(challenge, Challenge) for challenge in challenges)


def test_normalized_host() -> None:
    assert normalized_host("https://index.docker.io/v1/") == "docker.io"
    assert normalized_host("HTTPS://Ghcr.IO/some/path") == "ghcr.io"
    assert normalized_host("localhost:5000/") == "localhost:5000"


# --- the authenticator ---------------------------------------------------------------------------------------------


class TokenRealm:
    """A stand-in for the transport: records token requests, answers with numbered tokens."""

    def __init__(self, status: int = 200, body: bytes | None = None, delay: float = 0) -> None:
        self.calls: list[tuple[str, str, dict[str, str], bytes | None]] = []
        self.status, self.body, self.delay = status, body, delay
        self.lock = threading.Lock()

    def __call__(self, method: str, url: str, headers: dict[str, str], body: bytes | None,
                 limit: int) -> tuple[int, bytes]:
        time.sleep(self.delay)
        with self.lock:
            self.calls.append((method, url, headers, body))
            number = len(self.calls)
        return self.status, self.body if self.body is not None else json.dumps({"token": f"t{number}"}).encode()


BEARER = Challenge(scheme="bearer", params=(("realm", "https://auth.example/token"), ("service", "reg"),
                                            ("scope", "repository:a/b:pull")))


def test_anonymous_bearer_token_then_cached() -> None:
    realm = TokenRealm()
    authenticator = Authenticator(credentials=None, scope="repository:a/b:pull", fetch=realm)
    assert authenticator.header() is None
    authenticator.answer([BEARER], used=None)
    assert authenticator.header() == "Bearer t1"
    assert authenticator.header() == "Bearer t1"
    [(method, url, headers, _)] = realm.calls
    assert (method, url) == ("GET", "https://auth.example/token?service=reg&scope=repository%3Aa%2Fb%3Apull")
    assert "Authorization" not in headers


def test_bearer_with_credentials_sends_basic_to_the_realm() -> None:
    realm = TokenRealm(body=b'{"access_token": "oauth", "expires_in": 3600}')
    authenticator = Authenticator(credentials=Credentials(username="u", password="p"), scope="repository:a/b:pull",
                                  fetch=realm)
    authenticator.answer([BEARER], used=None)
    assert authenticator.header() == "Bearer oauth"
    [(_, url, headers, _)] = realm.calls
    assert headers["Authorization"] == "Basic " + b64("u:p")
    assert "account=u" in url


def test_identity_token_is_exchanged_by_post() -> None:
    realm = TokenRealm(body=b'{"access_token": "fresh"}')
    authenticator = Authenticator(credentials=Credentials(username=IDENTITY_TOKEN_USER, password="refresh"),
                                  scope="repository:a/b:pull", fetch=realm)
    authenticator.answer([BEARER], used=None)
    assert authenticator.header() == "Bearer fresh"
    [(method, url, headers, body)] = realm.calls
    assert (method, url) == ("POST", "https://auth.example/token")
    assert body is not None and b"grant_type=refresh_token" in body and b"refresh_token=refresh" in body
    assert "Authorization" not in headers


def test_one_token_for_many_threads() -> None:
    realm = TokenRealm(delay=0.2)
    authenticator = Authenticator(credentials=None, scope="repository:a/b:pull", fetch=realm)
    threads = [threading.Thread(target=authenticator.answer, args=([BEARER],), kwargs={"used": None})
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(realm.calls) == 1
    assert authenticator.header() == "Bearer t1"


def test_a_rejected_token_is_fetched_again_once() -> None:
    realm = TokenRealm()
    authenticator = Authenticator(credentials=None, scope="repository:a/b:pull", fetch=realm)
    authenticator.answer([BEARER], used=None)
    authenticator.answer([BEARER], used="Bearer t1")
    assert authenticator.header() == "Bearer t2"


def test_expired_tokens_are_renewed_without_a_challenge() -> None:
    realm = TokenRealm(body=b'{"token": "short", "expires_in": 60}')
    authenticator = Authenticator(credentials=None, scope="repository:a/b:pull", fetch=realm)
    authenticator.answer([BEARER], used=None)
    assert authenticator.header() == "Bearer short"
    assert len(realm.calls) == 1
    authenticator._expires = time.monotonic() - 1  # as if a minute had passed
    assert authenticator.header() == "Bearer short"
    assert len(realm.calls) == 2  # fetched again before use, with the same challenge


@pytest.mark.parametrize(("status", "body", "words"), [
    (401, b"{}", "refused an anonymous token"), (500, b"", "answered HTTP 500"),
    (200, b"[]", "sent no token"), (200, b'{"token": 5}', "sent no token"), (200, b"<html>", "sent no token"),
    (200, b'{"token": "a\\nb"}', "sent no token"),
])
def test_token_server_failures(status: int, body: bytes, words: str) -> None:
    authenticator = Authenticator(credentials=None, scope="s", fetch=TokenRealm(status, body))
    with pytest.raises(AuthFailure, match=words):
        authenticator.answer([BEARER], used=None)


@pytest.mark.parametrize("realm", ["file:///etc/passwd", "http://[::1", "https://a b/token", "https://x/\r\nX: y",
                                   "/token", "https://"])
def test_realm_must_be_an_http_url(realm: str) -> None:
    realm_server = TokenRealm()
    authenticator = Authenticator(credentials=None, scope="s", fetch=realm_server)
    challenge = Challenge(scheme="bearer", params=(("realm", realm),))
    with pytest.raises(AuthFailure, match="is not an http"):
        authenticator.answer([challenge], used=None)
    assert realm_server.calls == []


def test_basic_challenge() -> None:
    credentials = Credentials(username="u", password="p")
    authenticator = Authenticator(credentials=credentials, scope="s", fetch=TokenRealm())
    authenticator.answer([Challenge(scheme="basic", params=(("realm", "r"),))], used=None)
    assert authenticator.header() == "Basic " + b64("u:p")
    with pytest.raises(AuthFailure, match="the password of 'u' was refused"):
        authenticator.answer([Challenge(scheme="basic")], used="Basic " + b64("u:p"))
    anonymous = Authenticator(credentials=None, scope="s", fetch=TokenRealm())
    with pytest.raises(AuthFailure, match="it needs credentials"):
        anonymous.answer([Challenge(scheme="basic")], used=None)


def test_unsupported_or_missing_challenges() -> None:
    authenticator = Authenticator(credentials=None, scope="s", fetch=TokenRealm())
    with pytest.raises(AuthFailure, match=r"does not support \(negotiate\)"):
        authenticator.answer([Challenge(scheme="negotiate")], used=None)
    with pytest.raises(AuthFailure, match="without a WWW-Authenticate"):
        authenticator.answer([], used=None)


# --- --docker-login ------------------------------------------------------------------------------------------------

PROMPT = """
from singpy.errors import ImageError
from singpy.oci.auth import prompt_credentials
try:
    found = prompt_credentials("ghcr.io")
except ImageError as error:
    print("error:", error.message)
else:
    print(f"{found.username}|{found.password}")
"""


@pytest.mark.parametrize(("typed", "printed"), [("alice\nse cret\n", "alice|se cret"),
                                                ("", "error: --docker-login: stdin is closed"),
                                                ("\n", "error: --docker-login: no username was given"),
                                                ("alice\n", "error: --docker-login: no password was given")])
def test_docker_login_prompt(typed: str, printed: str) -> None:
    import subprocess
    import sys

    # A session of its own: no controlling terminal, so getpass reads stdin as a script's pipe would give it.
    done = subprocess.run([sys.executable, "-c", PROMPT], input=typed, capture_output=True, text=True, timeout=60,
                          start_new_session=True, check=False)
    assert done.stdout.strip() == printed
    assert "Enter Docker Username for ghcr.io:" in done.stderr
    assert "se cret" not in done.stderr


# --- credentials and tokens only over TLS (issue 24) ---------------------------------------------------------------


@pytest.mark.parametrize("credentials", [None, Credentials(username="u", password="p"),
                                         Credentials(username=IDENTITY_TOKEN_USER, password="refresh")],
                         ids=["anonymous", "password", "identity-token"])
def test_an_https_registry_never_uses_a_plain_http_realm(credentials: Credentials | None) -> None:
    realm = TokenRealm()
    authenticator = Authenticator(credentials=credentials, scope="s", fetch=realm)
    challenge = Challenge(scheme="bearer", params=(("realm", "http://auth.example/token"), ("service", "reg")))
    with pytest.raises(ImageError, match="is plain HTTP: singpy sends credentials and takes tokens only over HTTPS"):
        authenticator.answer([challenge], used=None)
    assert realm.calls == []  # nothing sent: no password in clear, no token to read on the way back
    assert authenticator.header() is None


def test_a_registry_marked_insecure_may_have_a_plain_http_realm() -> None:
    realm = TokenRealm()
    authenticator = Authenticator(credentials=Credentials(username="u", password="p"), scope="s", fetch=realm,
                                  secure=False)
    authenticator.answer([Challenge(scheme="bearer", params=(("realm", "http://auth.example/token"),))], used=None)
    assert authenticator.header() == "Bearer t1"
    assert realm.calls[0][1].startswith("http://auth.example/token?")


@pytest.mark.parametrize(("body", "words"), [
    (b'{"token": ' + b"[" * 100000 + b"]" * 100000 + b"}", "sent no token: the answer is nested too deeply"),
    (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "sent no token: the answer is nested too deeply"),
    (b"<html>", "sent no token: the answer is not JSON"),
])
def test_a_malformed_token_answer_is_one_failure(body: bytes, words: str) -> None:
    authenticator = Authenticator(credentials=None, scope="s", fetch=TokenRealm(200, body))
    with pytest.raises(AuthFailure, match=words):
        authenticator.answer([BEARER], used=None)


def test_a_deeply_nested_config_file_is_one_error(tmp_path: Path) -> None:
    write_config(tmp_path / ".docker/config.json", {})
    (tmp_path / ".docker/config.json").write_text('{"auths": ' + '{"a": ' * 5000 + "1" + "}" * 5001)
    with pytest.raises(ImageError, match="is not valid JSON: nested too deeply"):
        find("ghcr.io", tmp_path)

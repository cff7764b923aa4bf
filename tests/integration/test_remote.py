"""`singpy remote add|list|use|remove|status|login|logout|get-login-password` (issue 29), in Apptainer's
remote.yaml, against the suite's library (tests.support.library_server), as root and as the unprivileged
test user. The user's file is in the test's own APPTAINER_CONFIGDIR and the system's beside the
configuration the test names (`--config DIR/singpy.conf` -> DIR/remote.yaml): never the host's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import Singpy, assert_one_fatal
from tests.support.library_server import LibraryServer, start_library
from tests.support.sifs import MARKER, new_cache, singpy_sif

TOKEN = "remote-token-alice-0001"


@pytest.fixture(scope="module")
def library(workdir: Path) -> Iterator[LibraryServer]:
    with start_library(workdir / "library-remote", tokens={TOKEN: "alice"}) as server:
        server.store.add(singpy_sif(workdir), "alice/tools/busybox", ("latest",))
        yield server


def setup(singpy: Singpy, workdir: Path, name: str) -> tuple[dict[str, str], Path]:
    """(environment with a fresh user config directory, a directory of the user's for files)."""
    home = workdir / "remote-tests" / f"{name}-{singpy.profile}"
    (home / "config").mkdir(parents=True)
    for path in (home, home / "config"):
        os.chown(path, singpy.uid, singpy.gid)
    token = home / "token"
    token.write_text(TOKEN + "\n")
    os.chown(token, singpy.uid, singpy.gid)
    return singpy.env(APPTAINER_CONFIGDIR=str(home / "config")), home


def test_add_list_use_remove_in_apptainers_layout(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = setup(singpy, workdir, "layout")
    singpy.ok("remote", "add", "--insecure", "--tokenfile", str(home / "token"), "one", library.url, env=env)
    singpy.ok("remote", "add", "--no-login", "--no-default", "two", "https://library.example.org/base", env=env)
    user_file = home / "config" / "remote.yaml"
    assert stat.S_IMODE(user_file.stat().st_mode) == 0o600
    assert yaml.safe_load(user_file.read_text()) == {
        "Active": "one",
        "Remotes": {"one": {"URI": library.host, "Token": TOKEN, "System": False, "Exclusive": False,
                            "Insecure": True},
                    "two": {"URI": "library.example.org/base", "System": False, "Exclusive": False}}}
    listing = singpy.ok("remote", "list", env=env).splitlines()
    assert listing[1].split() == ["NAME", "URI", "DEFAULT?", "GLOBAL?", "EXCLUSIVE?", "SECURE?"]
    assert listing[2].split() == ["one", library.host, "✓", "✗!"]
    assert listing[3].split() == ["two", "library.example.org/base", "✓"]
    singpy.ok("remote", "use", "two", env=env)
    assert yaml.safe_load(user_file.read_text())["Active"] == "two"
    singpy.ok("remote", "remove", "two", env=env)
    assert yaml.safe_load(user_file.read_text())["Active"] == ""
    assert list(yaml.safe_load(user_file.read_text())["Remotes"]) == ["one"]


def test_status_login_logout(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = setup(singpy, workdir, "status")
    singpy.ok("remote", "add", "--insecure", "--no-login", "lib", library.host, env=env)
    out = singpy.ok("remote", "status", env=env)
    assert ["Library", "OK", "1.0.0-singpy-tests", library.url] in [line.split() for line in out.splitlines()]
    assert "No authentication token set (logged out)." in out
    singpy.ok("remote", "login", "--tokenfile", str(home / "token"), env=env)
    assert "Valid authentication token set (logged in)." in singpy.ok("remote", "status", "lib", env=env)
    assert singpy.ok("remote", "get-login-password", env=env) == "oci-secret-of-alice\n"
    singpy.ok("remote", "logout", "lib", env=env)
    assert "Token" not in yaml.safe_load((home / "config" / "remote.yaml").read_text())["Remotes"]["lib"]


def test_refused_token_adds_nothing(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = setup(singpy, workdir, "refused")
    (home / "token").write_text("not-a-token\n")
    result = singpy.run("remote", "add", "--insecure", "--tokenfile", str(home / "token"), "lib", library.host,
                        env=env)
    assert_one_fatal(result, "remote lib refused the token (401): make a new one and log in again")
    assert not (home / "config" / "remote.yaml").exists()
    singpy.ok("remote", "add", "--insecure", "--no-login", "lib", library.host, env=env)
    before = (home / "config" / "remote.yaml").read_bytes()
    result = singpy.run("remote", "login", "--tokenfile", str(home / "token"), "lib", env=env)
    assert_one_fatal(result, "remote lib refused the token (401)")
    assert (home / "config" / "remote.yaml").read_bytes() == before


def test_http_needs_insecure_and_names_are_checked(singpy: Singpy, library: LibraryServer, workdir: Path) -> None:
    env, home = setup(singpy, workdir, "insecure")
    result = singpy.run("remote", "add", "--no-login", "lib", library.url, env=env)
    assert_one_fatal(result, "http URI requires --insecure or APPTAINER_ADD_INSECURE=true")
    singpy.ok("remote", "add", "--no-login", "lib", library.url, env={**env, "APPTAINER_ADD_INSECURE": "true"})
    result = singpy.run("remote", "add", "--no-login", "--insecure", "lib", library.url, env=env)
    assert_one_fatal(result, "lib is already a remote")
    for command in (["use", "nosuch"], ["remove", "nosuch"], ["status", "nosuch"], ["login", "nosuch"]):
        assert_one_fatal(singpy.run("remote", *command, env=env), "nosuch is not a remote")


def test_a_malformed_remote_yaml_is_one_fatal_line(singpy: Singpy, workdir: Path) -> None:
    env, home = setup(singpy, workdir, "malformed")
    (home / "config" / "remote.yaml").write_text("Active: x\nRemotes: {}\nSurprise: 1\n")
    result = singpy.run("remote", "list", env=env)
    assert_one_fatal(result, "unknown key 'Surprise'")


def test_global_remotes_beside_the_configuration(as_root: Singpy, as_user: Singpy, library: LibraryServer,
                                                 workdir: Path) -> None:
    system = workdir / "remote-tests" / "system"
    system.mkdir(parents=True)
    system.chmod(0o755)
    conf = system / "singpy.conf"
    conf.write_text("")
    conf.chmod(0o644)
    root_env, _ = setup(as_root, workdir, "global")
    as_root.ok("--config", str(conf), "remote", "add", "--global", "--insecure", "site", library.host,
               env=root_env)
    assert stat.S_IMODE((system / "remote.yaml").stat().st_mode) == 0o644
    assert not (workdir / "remote-tests" / "global-root" / "config" / "remote.yaml").exists()
    user_env, home = setup(as_user, workdir, "global")
    result = as_user.run("--config", str(conf), "remote", "add", "--global", "--no-login", "mine", "x.org",
                         env=user_env)
    assert_one_fatal(result, "not root user")
    listing = as_user.ok("--config", str(conf), "remote", "list", env=user_env).splitlines()
    assert listing[2].split() == ["site", library.host, "✓", "✓", "✗!"]
    as_user.ok("--config", str(conf), "remote", "login", "--tokenfile", str(home / "token"), "site", env=user_env)
    pulled = home / "out.sif"
    # the system's remote is the user's default: its library, with the user's token
    result = as_user.run("--config", str(conf), "pull", str(pulled), "library://alice/none/here", env=user_env)
    assert_one_fatal(result, "library://alice/none/here:latest does not exist in the library " + library.url)
    run_env = {**user_env, "SINGPY_CACHEDIR": str(new_cache(as_user, workdir, "remote-global"))}
    assert as_user.ok("--config", str(conf), "exec", "library://alice/tools/busybox", "cat", "/etc/marker",
                      env=run_env) == MARKER + "\n"
    assert [auth for _, path, auth in library.requests if path.startswith("/v1/imagefile/")] == [f"Bearer {TOKEN}"]
    result = as_user.run("--config", str(conf), "remote", "remove", "site", env=user_env)
    assert_one_fatal(result, "site is global and can't be removed")
    as_user.ok("--config", str(conf), "remote", "add", "--no-login", "--insecure", "own", "127.0.0.1:9", env=user_env)
    as_root.ok("--config", str(conf), "remote", "use", "--exclusive", "site", env=root_env)
    result = as_user.run("--config", str(conf), "remote", "use", "own", env=user_env)
    assert_one_fatal(result, "could not use own: remote site has been set exclusive by the system administrator")

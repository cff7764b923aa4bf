"""`singpy registry login|logout|list`: credentials checked with a real registry (Basic and Bearer token), kept in
Docker's config.json format (mode 0600, written whole), and read by the pulls and pushes that follow (issue 29).

The default file is ~/.apptainer/docker-config.json of the passwd home: a host-global place these tests never
write; they name theirs with --authfile (the same code path, tests/unit/test_oras.py checks the default name).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from tests.conftest import Singpy, assert_one_fatal
from tests.support import pulling
from tests.support.registry import RegistryServer
from tests.support.sifs import new_cache, siftool_sif


def user_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    return pulling.user_dir(singpy, workdir, name, "login-out")


def test_login_stores_checked_credentials_that_pull_and_push_use(singpy: Singpy, registry_basic: RegistryServer,
                                                                 workdir: Path) -> None:
    folder = user_dir(singpy, workdir, "basic")
    authfile = folder / "auth.json"
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "login-basic")))
    host = registry_basic.host
    wrong = singpy.run("registry", "login", "--no-https", "-u", "alice", "--password-stdin", "--authfile",
                       str(authfile), f"docker://{host}", input="not the password\n", env=env)
    assert_one_fatal(wrong, f"login to {host} failed: the password of 'alice' was refused")
    assert not authfile.exists()
    done = singpy.run("registry", "login", "--no-https", "--username", registry_basic.username, "--password-stdin",
                      "--authfile", str(authfile), f"oras://{host}", input=registry_basic.password + "\n", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"INFO:    Token stored in {authfile}\n"
    info = authfile.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == singpy.uid
    token = base64.b64encode(f"{registry_basic.username}:{registry_basic.password}".encode()).decode()
    assert json.loads(authfile.read_text()) == {"auths": {host: {"auth": token}}}
    listed = singpy.ok("registry", "list", "--authfile", str(authfile), env=env)
    assert listed.split() == ["REGISTRY", "USERNAME", host, registry_basic.username]
    assert registry_basic.password not in listed
    # the stored login is what a push and a pull use
    sif = folder / "image.sif"
    shutil.copyfile(siftool_sif(workdir), sif)
    os.chown(sif, singpy.uid, singpy.gid)
    reference = f"oras://{host}/login/basic-{singpy.profile}:v1"
    singpy.ok("push", "--no-https", "--authfile", str(authfile), str(sif), reference, env=env)
    assert singpy.ok("exec", "--no-https", "--authfile", str(authfile), reference, "echo", "logged in",
                     env=env) == "logged in\n"
    # logout removes it; a second logout only warns
    out = singpy.run("registry", "logout", "--authfile", str(authfile), f"docker://{host}", env=env)
    assert (out.returncode, out.stderr) == (0, f"INFO:    Token removed from {authfile}\nINFO:    Logout succeeded\n")
    assert json.loads(authfile.read_text()) == {"auths": {}}
    again = singpy.run("registry", "logout", "--authfile", str(authfile), f"docker://{host}", env=env)
    assert again.returncode == 0 and again.stderr.startswith("WARNING:") and host in again.stderr
    denied = singpy.run("push", "--no-https", "--authfile", str(authfile), str(sif), reference, env=env)
    assert_one_fatal(denied, f"access to {reference} denied")


def test_token_login_keeps_the_other_entries(singpy: Singpy, registry_token: RegistryServer, workdir: Path) -> None:
    folder = user_dir(singpy, workdir, "token")
    authfile = folder / "auth.json"
    others: dict[str, Any] = {"auths": {"other.example:5000": {"auth": base64.b64encode(b"bob:builder").decode()}},
              "credHelpers": {"ghcr.io": "pass"}, "detachKeys": "ctrl-q"}
    authfile.write_text(json.dumps(others))
    os.chown(authfile, singpy.uid, singpy.gid)
    env = singpy.env(SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "login-token")))
    host = registry_token.host
    refused = singpy.run("registry", "login", "--no-https", "-u", "alice", "--password-stdin", "--authfile",
                         str(authfile), f"docker://{host}", input="wrong", env=env)
    assert_one_fatal(refused, f"login to {host} failed: its token server")
    assert json.loads(authfile.read_text()) == others
    done = singpy.run("registry", "login", "--no-https", "-u", "alice", "-p", "wonderland", "--authfile",
                      str(authfile), f"docker://{host}", env=env)
    assert done.returncode == 0, done.stderr
    warning, stored = done.stderr.splitlines()
    assert warning.startswith("WARNING:") and "--password-stdin" in warning and stored.startswith("INFO:")
    written: dict[str, Any] = json.loads(authfile.read_text())
    assert written["credHelpers"] == others["credHelpers"] and written["detachKeys"] == "ctrl-q"
    assert written["auths"]["other.example:5000"] == others["auths"]["other.example:5000"]
    assert base64.b64decode(written["auths"][host]["auth"]) == b"alice:wonderland"
    listed = singpy.ok("registry", "list", "--authfile", str(authfile), env=env)
    assert listed.split() == ["REGISTRY", "USERNAME", "other.example:5000", "bob", host, "alice"]


def test_login_usage_errors(singpy: Singpy, workdir: Path) -> None:
    authfile = user_dir(singpy, workdir, "usage") / "auth.json"
    env = singpy.env()
    bare = singpy.run("registry", "login", "-u", "a", "--password-stdin", "--authfile", str(authfile),
                      "example.org", input="x", env=env)
    assert_one_fatal(bare, "'example.org' is not a registry: name it docker://HOST or oras://HOST", code=1)
    nobody = singpy.run("registry", "login", "--password-stdin", "--authfile", str(authfile), "docker://example.org",
                        input="x", env=env)
    assert_one_fatal(nobody, "logging in to example.org needs a username", code=1)
    empty = singpy.run("registry", "login", "-u", "a", "--authfile", str(authfile), "docker://example.org",
                       input="", env=env)
    assert empty.returncode == 1 and "FATAL:" in empty.stderr and "a password is required" in empty.stderr
    assert "Traceback" not in empty.stderr
    with_path = singpy.run("registry", "login", "-u", "a", "--password-stdin", "--authfile", str(authfile),
                           "docker://example.org/org", input="x", env=env)  # stored, no pull would ever read it
    assert_one_fatal(with_path, "registries must be valid RFC 3986 URI authorities: example.org/org", code=1)
    assert not authfile.exists()


def test_login_over_tls_needs_the_registrys_ca(singpy: Singpy, registry_tls: RegistryServer, workdir: Path) -> None:
    authfile = user_dir(singpy, workdir, "tls") / "auth.json"
    arguments = ["registry", "login", "-u", "alice", "--password-stdin", "--authfile", str(authfile),
                 f"docker://{registry_tls.host}"]
    untrusted = singpy.run(*arguments, input="secret", env=singpy.env())
    assert_one_fatal(untrusted, f"can't reach registry {registry_tls.host}: TLS certificate not trusted")
    assert "SSL_CERT_FILE" in untrusted.stderr and not authfile.exists()
    assert registry_tls.ca_file
    trusted = singpy.run(*arguments, input="secret", env=singpy.env(SSL_CERT_FILE=registry_tls.ca_file))
    assert trusted.returncode == 0, trusted.stderr
    assert authfile.exists()


def test_login_without_authfile_is_listed_in_remote_yaml_as_apptainer_lists_it(
        singpy: Singpy, registry_basic: RegistryServer, workdir: Path) -> None:
    """No --authfile: docker-config.json and remote.yaml's Credentials in the configuration directory
    ($APPTAINER_CONFIGDIR here, in place of ~/.apptainer), `registry list` printing Apptainer's table."""
    configdir = user_dir(singpy, workdir, "configdir") / "apptainer"
    env = singpy.env(APPTAINER_CONFIGDIR=str(configdir),
                     SINGPY_CACHEDIR=str(new_cache(singpy, workdir, "login-configdir")))
    host = registry_basic.host
    done = singpy.run("registry", "login", "--no-https", "-u", registry_basic.username, "--password-stdin",
                      f"docker://{host}", input=registry_basic.password, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"INFO:    Token stored in {configdir}/docker-config.json\n"
    assert host in json.loads((configdir / "docker-config.json").read_text())["auths"]
    remote = (configdir / "remote.yaml").read_text()
    assert registry_basic.password not in remote and f"URI: docker://{host}" in remote
    assert stat.S_IMODE((configdir / "remote.yaml").stat().st_mode) == 0o600
    # a second login of the same registry (as oras://) replaces nothing else but keeps one entry per URI
    singpy.ok("registry", "login", "--no-https", "-u", registry_basic.username, "--password-stdin",
              f"oras://{host}", input=registry_basic.password, env=env)
    assert singpy.ok("registry", "list", env=env).splitlines() == [
        "", "URI" + " " * (len(f"docker://{host}") + 2 - 3) + "SECURE?",
        f"docker://{host}  \u2717!", f"oras://{host}    \u2717!"]
    # the stored login is what a pull uses, without --authfile
    sif = configdir.parent / "image.sif"
    shutil.copyfile(siftool_sif(workdir), sif)
    os.chown(sif, singpy.uid, singpy.gid)
    reference = f"oras://{host}/login/configdir-{singpy.profile}:v1"
    singpy.ok("push", "--no-https", str(sif), reference, env=env)
    singpy.ok("registry", "logout", f"docker://{host}", env=env)
    assert singpy.ok("registry", "list", env=env).splitlines()[2:] == [f"oras://{host}  \u2717!"]


def test_remote_login_of_a_registry_is_registry_login_with_a_warning(
        singpy: Singpy, registry_basic: RegistryServer, workdir: Path) -> None:
    """Apptainer's older way, still in NVIDIA NGC's instructions (`remote login --username '$oauthtoken'
    docker://nvcr.io`): deprecated, it runs `registry login` (-i: over HTTP, as --no-https)."""
    configdir = user_dir(singpy, workdir, "remote-login") / "apptainer"
    env = singpy.env(APPTAINER_CONFIGDIR=str(configdir))
    host = registry_basic.host
    done = singpy.run("remote", "login", "-i", "-u", registry_basic.username, "--password-stdin",
                      f"docker://{host}", input=registry_basic.password + "\n", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("WARNING: 'remote login' is deprecated for registries or keyservers and will be removed in "
                           "a future release; running 'registry login'\n"
                           f"INFO:    Token stored in {configdir}/docker-config.json\n")
    token = base64.b64encode(f"{registry_basic.username}:{registry_basic.password}".encode()).decode()
    assert json.loads((configdir / "docker-config.json").read_text()) == {"auths": {host: {"auth": token}}}
    wrong = singpy.run("remote", "login", "-i", "-u", "alice", "--password-stdin", f"oras://{host}",
                       input="not the password\n", env=env)
    assert wrong.returncode == 255 and wrong.stderr.splitlines()[1:] == [
        f"FATAL:   login to {host} failed: the password of 'alice' was refused"], wrong.stderr
    # registry --config FILE (Apptainer's): the login listed in that remote configuration, not the user's
    other = configdir.parent / "other-remote.yaml"
    singpy.ok("registry", "--config", str(other), "login", "--no-https", "-u", registry_basic.username,
              "--password-stdin", f"oras://{host}", input=registry_basic.password, env=env)
    assert f"URI: oras://{host}" in other.read_text()
    assert f"oras://{host}" not in (configdir / "remote.yaml").read_text()
    assert f"oras://{host}" in singpy.ok("registry", "--config", str(other), "list", env=env)
    singpy.ok("registry", "-c", str(other), "logout", f"oras://{host}", env=env)
    assert f"oras://{host}" not in other.read_text()
    refused = singpy.run("remote", "login", "--tokenfile", "t.txt", f"docker://{host}", env=env)
    assert_one_fatal(refused, "--tokenfile is only supported for login to a remote endpoint", code=1)

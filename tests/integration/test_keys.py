"""`singpy key` and `singpy keyserver`: Apptainer's keyrings, and a real HKP keyserver on 127.0.0.1.

Every run points the keyrings (APPTAINER_KEYSDIR) and remote.yaml (APPTAINER_CONFIGDIR) at a directory of the
test's own, never at the profile user's real ~/.apptainer; the global keyring and the system remote.yaml are
beside a configuration file of the test's own (`--config DIR/singpy.conf`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pysequoia
import pytest
import yaml

from tests.conftest import Singpy, assert_one_fatal
from tests.support import hkp_server, sifs
from tests.support.signing_cases import GOLDEN_FINGERPRINT, golden


def _home(singpy: Singpy, workdir: Path) -> Path:
    """A fresh configuration directory of the profile's user (APPTAINER_CONFIGDIR; keys in keys/)."""
    path = Path(tempfile.mkdtemp(prefix=f"keys-{singpy.profile}-", dir=workdir))
    path.chmod(0o755)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def _env(singpy: Singpy, home: Path, **extra: str) -> dict[str, str]:
    return singpy.env(APPTAINER_CONFIGDIR=str(home), **extra)


def _site(workdir: Path) -> Path:
    """A site configuration directory of root's: singpy.conf (the defaults), readable by all."""
    site = Path(tempfile.mkdtemp(prefix="site-", dir=workdir))
    site.chmod(0o755)
    (site / "singpy.conf").write_text("")
    (site / "singpy.conf").chmod(0o644)
    return site


def _newpair(singpy: Singpy, home: Path, name: str = "Key Tester") -> str:
    out = singpy.ok("key", "newpair", "-b", "2048", env=_env(singpy, home),
                    input=f"{name}\n{name.split()[0].lower()}@example.org\ntesting\n\n\n")
    assert "Generating Entity and OpenPGP Key Pair... done" in out
    return out.split("Key fingerprint: ")[1].split()[0]


def test_newpair_makes_private_keyrings(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    fingerprint = _newpair(singpy, home)
    keys = home / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    for name in ("pgp-public", "pgp-secret"):
        info = (keys / name).stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == singpy.uid
    listing = singpy.ok("key", "list", env=_env(singpy, home))
    assert f"Public key listing ({keys}/pgp-public)" in listing
    assert "Key Tester (testing) <key@example.org>" in listing and fingerprint in listing
    assert fingerprint in singpy.ok("key", "list", "--secret", env=_env(singpy, home))
    assert [str(cert.fingerprint).upper() for cert in pysequoia.Cert.split_file(str(keys / "pgp-public"))] \
        == [fingerprint]


def test_export_public_and_secret(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    fingerprint = _newpair(singpy, home)
    singpy.ok("key", "export", "--armor", str(home / "public.asc"), env=_env(singpy, home))
    text = (home / "public.asc").read_text()
    assert text.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    assert str(pysequoia.Cert.from_bytes(text.encode()).fingerprint).upper() == fingerprint
    singpy.ok("key", "export", "--secret", str(home / "secret.gpg"), env=_env(singpy, home))
    assert stat.S_IMODE((home / "secret.gpg").stat().st_mode) == 0o600
    assert pysequoia.Tsk.from_bytes((home / "secret.gpg").read_bytes()).extract_certificate().fingerprint \
        == fingerprint.lower()


def test_import_and_remove_the_apptainer_test_key(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    out = singpy.ok("key", "import", str(golden("private.asc")), env=_env(singpy, home))
    assert f"Key with fingerprint {GOLDEN_FINGERPRINT} successfully added to the private keyring" in out
    assert f"Key with fingerprint {GOLDEN_FINGERPRINT} successfully added to the public keyring" in out
    assert stat.S_IMODE((home / "keys" / "pgp-secret").stat().st_mode) == 0o600
    assert "Unit Test <unit@test.com>" in singpy.ok("key", "list", "-s", env=_env(singpy, home))
    singpy.ok("key", "remove", GOLDEN_FINGERPRINT, env=_env(singpy, home))  # the public key only, as Apptainer
    assert GOLDEN_FINGERPRINT not in singpy.ok("key", "list", env=_env(singpy, home))
    assert GOLDEN_FINGERPRINT in singpy.ok("key", "list", "-s", env=_env(singpy, home))
    singpy.ok("key", "remove", "--both", GOLDEN_FINGERPRINT, env=_env(singpy, home))
    assert GOLDEN_FINGERPRINT not in singpy.ok("key", "list", "-s", env=_env(singpy, home))
    assert_one_fatal(singpy.run("key", "remove", GOLDEN_FINGERPRINT, env=_env(singpy, home)), "no key matching")


def test_a_file_that_is_no_key_is_refused(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    junk = home / "junk.asc"
    junk.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot a key\n-----END PGP PUBLIC KEY BLOCK-----\n")
    junk.chmod(0o644)
    assert_one_fatal(singpy.run("key", "import", str(junk), env=_env(singpy, home)), "holds no valid OpenPGP key")
    assert not (home / "keys").exists()


def _gpg_traces(singpy: Singpy) -> list[str]:
    """What a protected key's making could leave: gpg homes in singpy's TMPDIR, processes (gpg-agent) naming them."""
    marker = f"{singpy.tmpdir}/singpy-gpg-"
    left = [str(path) for path in singpy.tmpdir.glob("singpy-gpg-*")]
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                left.append(f"process {proc.name}")
        except OSError:
            continue
    return left


def test_a_passphrase_protects_the_secret_key(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    out = singpy.ok("key", "newpair", "-b", "2048", env=_env(singpy, home),
                    input="Locked Person\nlocked@example.org\n\ncorrect horse\n", timeout=300)
    fingerprint = out.split("Key fingerprint: ")[1].split()[0]
    assert _gpg_traces(singpy) == []
    secret = home / "keys" / "pgp-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    key = pysequoia.Tsk.from_bytes(secret.read_bytes())
    with pytest.raises(RuntimeError):
        key.signer()  # encrypted: nothing signs without the passphrase
    key.signer("correct horse")
    image = home / "signed.sif"
    shutil.copy(sifs.singpy_sif(workdir), image)
    os.chown(image, singpy.uid, singpy.gid)
    assert singpy.run("sign", "--keyidx", "0", str(image), env=_env(singpy, home), input="wrong\n").returncode != 0
    singpy.ok("sign", "--keyidx", "0", str(image), env=_env(singpy, home), input="correct horse\n")
    assert fingerprint in singpy.ok("verify", str(image), env=_env(singpy, home))


def test_a_passphrase_on_the_command_line_warns(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    result = singpy.run("key", "newpair", "-N", "A", "-E", "a@b", "-C", "", "-P", "hunter2", "-b", "2048",
                        env=_env(singpy, home), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "visible to other users" in result.stderr and "hunter2" not in result.stderr + result.stdout
    pysequoia.Tsk.from_bytes((home / "keys" / "pgp-secret").read_bytes()).signer("hunter2")


def test_global_keyring_is_roots_and_read_by_all(as_root: Singpy, as_user: Singpy, workdir: Path) -> None:
    site = _site(workdir)
    conf = str(site / "singpy.conf")
    user_home = _home(as_user, workdir)
    assert_one_fatal(as_user.run("--config", conf, "key", "import", "--global", str(golden("private.asc")),
                                 env=_env(as_user, user_home)), "only be changed by root")
    public = site / "public.asc"
    shutil.copy(golden("private.asc"), site / "private.asc")
    assert_one_fatal(as_root.run("--config", conf, "key", "import", "--global", str(site / "private.asc"),
                                 env=_env(as_root, _home(as_root, workdir))), "public keys only")
    key = pysequoia.Tsk.from_file(str(golden("private.asc"))).extract_certificate()
    public.write_text(str(key))
    as_root.ok("--config", conf, "key", "import", "--global", str(public), env=_env(as_root, _home(as_root, workdir)))
    info = (site / "global-pgp-public").stat()
    assert stat.S_IMODE(info.st_mode) == 0o644 and info.st_uid == 0
    listing = as_user.ok("--config", conf, "key", "list", "--global", env=_env(as_user, user_home))
    assert f"({site}/global-pgp-public)" in listing and GOLDEN_FINGERPRINT in listing


def test_push_search_pull_on_a_keyserver(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    fingerprint = _newpair(singpy, home, "Pushed Person")
    with hkp_server.running() as keyserver:
        out = singpy.ok("key", "push", "--url", keyserver.url, fingerprint, env=_env(singpy, home))
        assert f"public key `{fingerprint}' pushed to server successfully" in out
        assert list(keyserver.keys) == [fingerprint]
        found = singpy.ok("key", "search", "--url", keyserver.url, "pushed person", env=_env(singpy, home))
        assert "Showing 1 results" in found and fingerprint in found and "Pushed Person" in found
        assert "Showing 0 results" in singpy.ok("key", "search", "-u", keyserver.url, "nobody", env=_env(singpy, home))
        other = _home(singpy, workdir)
        out = singpy.ok("key", "pull", "--url", keyserver.url, fingerprint, env=_env(singpy, other))
        assert f"1 key(s) added to keyring of trust {other}/keys/pgp-public" in out
        assert fingerprint in singpy.ok("key", "list", env=_env(singpy, other))
        assert_one_fatal(singpy.run("key", "pull", "--url", keyserver.url, "0" * 40, env=_env(singpy, other)),
                         "no key matching")


def test_keyserver_login_sends_the_token_to_that_keyserver(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    fingerprint = _newpair(singpy, home)
    with hkp_server.running(token="s3cret-token") as keyserver:
        refused = singpy.run("key", "push", "--url", keyserver.url, fingerprint, env=_env(singpy, home))
        assert_one_fatal(refused, "unauthorized or missing token")
        assert_one_fatal(singpy.run("keyserver", "login", "--password-stdin", keyserver.url, env=_env(singpy, home),
                                    input="wrong-token\n"), "error response from server: 401")
        assert not (home / "remote.yaml").exists()
        singpy.ok("keyserver", "login", "--password-stdin", keyserver.url, env=_env(singpy, home),
                  input="s3cret-token\n")
        assert stat.S_IMODE((home / "remote.yaml").stat().st_mode) == 0o600
        # A registry login an older version kept in Credentials, listed first, is no keyserver's: passed over
        remote = home / "remote.yaml"
        config = yaml.safe_load(remote.read_text())
        config["Credentials"].insert(0, {"URI": "oras://registry.example.org", "Auth": "Basic b2xkOmxvZ2lu"})
        remote.write_text(yaml.safe_dump(config))
        singpy.ok("key", "push", "--url", keyserver.url, fingerprint, env=_env(singpy, home))
        assert keyserver.requests[-1] == ("POST", "/pks/add", "Bearer s3cret-token")
        assert fingerprint in keyserver.keys
        singpy.ok("keyserver", "logout", keyserver.url, env=_env(singpy, home))
        assert "s3cret-token" not in (home / "remote.yaml").read_text()
        other = home / "other-remote.yaml"  # keyserver --config FILE: that remote configuration, not the user's
        singpy.ok("keyserver", "--config", str(other), "login", "--password-stdin", keyserver.url,
                  env=_env(singpy, home), input="s3cret-token\n")
        assert "s3cret-token" in other.read_text() and "s3cret-token" not in (home / "remote.yaml").read_text()
        singpy.ok("keyserver", "-c", str(other), "logout", keyserver.url, env=_env(singpy, home))
        assert "s3cret-token" not in other.read_text()


def test_a_keyserver_token_never_follows_a_redirect_to_another_server(singpy: Singpy, workdir: Path) -> None:
    """urllib copies every header onto a redirected request: the token must stay with its keyserver."""
    home = _home(singpy, workdir)
    with hkp_server.running(token="s3cret-token") as keyserver, hkp_server.running(host="127.0.0.2") as elsewhere:
        singpy.ok("keyserver", "login", "--password-stdin", keyserver.url, env=_env(singpy, home),
                  input="s3cret-token\n")
        keyserver.redirect = elsewhere.url
        singpy.run("key", "search", "--url", keyserver.url, "someone", env=_env(singpy, home))
        assert keyserver.requests[-1][2] == "Bearer s3cret-token"  # asked the keyserver with it
        assert [path for _, path, _ in elsewhere.requests] == ["/pks/lookup?op=index&options=mr&search=someone"]
        assert [auth for _, _, auth in elsewhere.requests] == [""]  # followed there, without it


def test_keyservers_of_the_remote_are_roots(as_root: Singpy, as_user: Singpy, workdir: Path) -> None:
    site = _site(workdir)
    conf = str(site / "singpy.conf")
    root_home, user_home = _home(as_root, workdir), _home(as_user, workdir)
    as_root.ok("--config", conf, "remote", "add", "--global", "--no-login", "site", "https://library.example.org",
               env=_env(as_root, root_home))
    with hkp_server.running() as keyserver:
        assert_one_fatal(as_user.run("--config", conf, "keyserver", "add", "site", keyserver.url,
                                     env=_env(as_user, user_home)), "root only")
        as_root.ok("--config", conf, "keyserver", "add", "site", keyserver.url, env=_env(as_root, root_home))
        assert keyserver.url in as_user.ok("--config", conf, "keyserver", "list", env=_env(as_user, user_home))
        fingerprint = _newpair(as_user, user_home, "Site User")
        as_user.ok("--config", conf, "key", "push", fingerprint, env=_env(as_user, user_home))  # no --url: the site's
        assert fingerprint in keyserver.keys
        as_root.ok("--config", conf, "keyserver", "remove", "site", keyserver.url, env=_env(as_root, root_home))
        assert_one_fatal(as_user.run("--config", conf, "key", "search", "Site", env=_env(as_user, user_home)),
                         "no keyserver configured")


def test_what_a_keyserver_says_is_escaped(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    with hkp_server.running() as keyserver:
        hostile = pysequoia.Tsk.generate("\x1b]0;pwned\x07Evil\x1b[2J <evil@example.org>").extract_certificate()
        fingerprint = keyserver.add(str(hostile).encode())
        found = singpy.ok("key", "search", "--url", keyserver.url, "evil", env=_env(singpy, home))
        assert fingerprint in found and "Evil" in found
        assert "\x1b" not in found and "\x07" not in found
        singpy.ok("key", "pull", "--url", keyserver.url, fingerprint, env=_env(singpy, home))
        listing = singpy.ok("key", "list", env=_env(singpy, home))
        assert "Evil" in listing and "\x1b" not in listing


@pytest.mark.parametrize(("uri", "expected"), [
    ("keys.example.org", "https://keys.example.org"),
    ("hkp://keys.example.org", "http://keys.example.org:11371"),
    ("hkps://keys.example.org/", "https://keys.example.org"),
    ("http://127.0.0.1:8080/pks", "http://127.0.0.1:8080"),
])
def test_keyserver_uris_are_normalized_as_apptainer(uri: str, expected: str) -> None:
    from singpy.signing import hkp

    assert hkp.normalize(uri) == expected


def test_an_hkp_index_is_parsed_strictly() -> None:
    from singpy.signing import hkp

    text = ("info:1:2\npub:ABCDEF0123456789ABCDEF0123456789ABCDEF01:1:4096:1588023536::\n"
            "uid:Unit%20Test%20%3Cunit%40test.com%3E:1588023536::\nuid:Second:::\ngarbage line\n"
            "pub::1:2048:::\nuid:orphan:::\npub:0123456789abcdef:17:1024\n")
    entries = hkp.parse_index(text)
    assert [entry.fingerprint for entry in entries] == ["ABCDEF0123456789ABCDEF0123456789ABCDEF01", "0123456789ABCDEF"]
    assert entries[0].user_ids == ("Unit Test <unit@test.com>", "Second")
    assert entries[1].bits == "1024" and entries[1].user_ids == ()


def test_a_bad_bit_length_is_one_fatal(singpy: Singpy, workdir: Path) -> None:
    home = _home(singpy, workdir)
    assert_one_fatal(singpy.run("key", "newpair", "-N", "A", "-E", "a@b", "-C", "", "-P", "", "-b", "1000",
                                env=_env(singpy, home)), "unsupported key bit length 1000")
    assert not (home / "keys").exists()

"""`singpy verify` without `--local` asks the keyserver for a signer no keyring holds (Apptainer's hybrid keyring),
and `singpy key list` shows a key's length in bits as Apptainer's does.

The keyserver is the suite's real HKP server on 127.0.0.1 (tests/support/hkp_server.py); the image is Apptainer's
golden PGP-signed SIF (tests/data/sif-trust), signed by "Unit Test". Every case runs as root and as the test user,
with a fresh, empty keyring of that user's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import pysequoia
import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support import hkp_server
from tests.support.signing_cases import golden

SIGNER = "Unit Test <unit@test.com>"
FINGERPRINT = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"


@pytest.fixture
def home(singpy: Singpy, workdir: Path) -> Path:
    """The profile's user's configuration directory (APPTAINER_CONFIGDIR), no keys in it, and a copy of the image."""
    path = Path(tempfile.mkdtemp(prefix=f"verify-ks-{singpy.profile}-", dir=workdir))
    path.chmod(0o755)
    image = path / "signed.sif"
    image.write_bytes(golden("one-group-signed-pgp.sif").read_bytes())
    for owned in (path, image):
        os.chown(owned, singpy.uid, singpy.gid)
    return path


def _env(singpy: Singpy, home: Path) -> dict[str, str]:
    return singpy.env(APPTAINER_CONFIGDIR=str(home))


def _keys_asked(keyserver: hkp_server.Keyserver) -> list[str]:
    return [dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query)).get("search", "")
            for method, path, _ in keyserver.requests if method == "GET" and path.startswith("/pks/lookup")]


def _stdout_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def test_a_signer_missing_from_the_keyrings_is_fetched_from_the_keyserver(singpy: Singpy, home: Path) -> None:
    with hkp_server.running() as keyserver:
        keyserver.add(golden("private.asc").read_bytes())  # the server holds its public part
        result = singpy.run("verify", "--url", keyserver.url, str(home / "signed.sif"), env=_env(singpy, home))
        assert result.returncode == 0, result.stderr
        assert _keys_asked(keyserver) == [f"0x{FINGERPRINT}"]  # the fingerprint the signature's descriptor names
    lines = _stdout_lines(result.stdout)
    assert f"[REMOTE]           Signing entity: {SIGNER}" in lines
    assert f"[REMOTE]           Fingerprint: {FINGERPRINT}" in lines
    assert "1   |1       |NONE    |FS" in lines
    assert not (home / "keys" / "pgp-public").exists()  # used for this verification only, not imported


def test_local_verifies_with_the_keyrings_alone(singpy: Singpy, home: Path) -> None:
    with hkp_server.running() as keyserver:
        keyserver.add(golden("private.asc").read_bytes())
        result = singpy.run("verify", "--local", "--url", keyserver.url, str(home / "signed.sif"),
                            env=_env(singpy, home))
        assert keyserver.requests == []
    assert "[UNKNOWN]          Fingerprint: " + FINGERPRINT in result.stdout
    assert_one_fatal(_fatal_part(result), "signature made by unknown entity")


def test_a_keyserver_without_the_key_leaves_the_signer_unknown(singpy: Singpy, home: Path) -> None:
    with hkp_server.running() as keyserver:
        result = singpy.run("verify", "--url", keyserver.url, str(home / "signed.sif"), env=_env(singpy, home))
        assert _keys_asked(keyserver) == [f"0x{FINGERPRINT}"]
    assert "[UNKNOWN]          Fingerprint: " + FINGERPRINT in result.stdout
    assert f"WARNING: failed to get key material: no key matching {FINGERPRINT}" in result.stderr
    assert_one_fatal(_fatal_part(result), "signature made by unknown entity")


def _fatal_part(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """stderr without its INFO and WARNING lines, stdout (what was checked, printed by verify) left out: for
    assert_one_fatal."""
    kept = "".join(line for line in result.stderr.splitlines(keepends=True)
                   if not line.startswith(("INFO:", "WARNING:")))
    return subprocess.CompletedProcess(result.args, result.returncode, "", kept)


def test_a_key_the_keyserver_gives_in_place_of_the_signers_is_not_believed(singpy: Singpy, home: Path) -> None:
    """A keyserver answering for the signer's fingerprint with another key: that key is dropped (and could not
    verify the signature anyway)."""
    with hkp_server.running() as keyserver:
        impostor = keyserver.add(golden("private.asc").read_bytes())
        keyserver.keys[impostor] = _another_cert()  # served under the signer's fingerprint
        result = singpy.run("verify", "--url", keyserver.url, str(home / "signed.sif"), env=_env(singpy, home))
    assert "[REMOTE]" not in result.stdout
    assert_one_fatal(_fatal_part(result), "signature made by unknown entity")


def _another_cert() -> pysequoia.Cert:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pysequoia.Cert.generate("Impostor <impostor@example.org>")


def test_the_keyserver_of_the_remote_in_use_is_asked_without_url(as_root: Singpy, singpy: Singpy, home: Path,
                                                                 workdir: Path) -> None:
    site = Path(tempfile.mkdtemp(prefix="verify-ks-site-", dir=workdir))
    site.chmod(0o755)
    (site / "singpy.conf").write_text("")
    (site / "singpy.conf").chmod(0o644)
    conf = str(site / "singpy.conf")
    root_home = Path(tempfile.mkdtemp(prefix="verify-ks-root-", dir=workdir))
    with hkp_server.running() as keyserver:
        keyserver.add(golden("private.asc").read_bytes())
        as_root.ok("--config", conf, "remote", "add", "--global", "--no-login", "site", "https://library.example.org",
                   env=_env(as_root, root_home))
        as_root.ok("--config", conf, "keyserver", "add", "site", keyserver.url, env=_env(as_root, root_home))
        result = singpy.run("--config", conf, "verify", str(home / "signed.sif"), env=_env(singpy, home))
        assert result.returncode == 0, result.stderr
        assert _keys_asked(keyserver) == [f"0x{FINGERPRINT}"]
    assert f"[REMOTE]           Signing entity: {SIGNER}" in _stdout_lines(result.stdout)


def test_a_url_that_names_no_keyserver_is_one_fatal(singpy: Singpy, home: Path) -> None:
    result = singpy.run("verify", "--url", "ftp://keys.example.org", str(home / "signed.sif"), env=_env(singpy, home))
    assert_one_fatal(_fatal_part(result), "Error while getting keyserver client config: invalid keyserver URI")
    assert result.stdout == ""  # refused before any signature was checked


def test_key_list_shows_the_length_in_bits(singpy: Singpy, home: Path) -> None:
    singpy.ok("key", "import", str(golden("private.asc")), env=_env(singpy, home))
    for listing in (singpy.ok("key", "list", env=_env(singpy, home)),
                    singpy.ok("key", "list", "--secret", env=_env(singpy, home))):
        assert f"    Fingerprint:       {FINGERPRINT}\n    Length (in bits):  2048\n" in listing

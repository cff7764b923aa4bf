"""What the `singpy sign` / `singpy verify` tests share (tests/integration/test_sign_verify*.py): Apptainer's
golden images, keys and certificates (tests/data/sif-trust), a fresh keyring directory per test, copies of the
images the test's user owns, fresh OpenPGP keys, an unsigned SIF made by the reference siftool, and the
one-FATAL-line check that allows Apptainer's INFO lines. The key, keyserver and ECL tests (test_keys.py,
test_verify_keyserver.py, test_ecl.py) take the same test set's files with `golden`, its signer's key with
GOLDEN_FINGERPRINT."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import assert_one_fatal as assert_fatal_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tests.conftest import Singpy

TRUST = Path(__file__).resolve().parents[1] / "data" / "sif-trust"
SHARED_TRUST = Path("/work/shared/sif-trust")
GOLDEN_FINGERPRINT = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"
GOLDEN_SIGNER = "Unit Test <unit@test.com>"
SIFTOOL = shutil.which("siftool")


def golden(name: str) -> Path:
    """A file of the sif-trust test set (tests/data/sif-trust, else the shared copy it comes from)."""
    for directory in (TRUST, SHARED_TRUST):
        if (directory / name).exists():
            return directory / name
    pytest.skip(f"the sif-trust test set ({name}) is not there")


def assert_one_fatal(result: subprocess.CompletedProcess[str], message: str) -> None:
    """One FATAL line (after Apptainer's INFO lines saying which key material is used), no traceback; on stdout at
    most the passphrase question."""
    kept = "".join(line for line in result.stderr.splitlines(keepends=True) if not line.startswith("INFO:"))
    out = "".join(line for line in result.stdout.splitlines(keepends=True) if not line.startswith("Enter "))
    assert_fatal_line(subprocess.CompletedProcess(result.args, result.returncode, out, kept), message)


def own(singpy: Singpy, path: Path) -> Path:
    os.chown(path, singpy.uid, singpy.gid)
    return path


def keys_env(singpy: Singpy, place: Path) -> dict[str, str]:
    return singpy.env(APPTAINER_KEYSDIR=str(place / "keys"), SINGPY_CONFIG=str(place / "etc" / "singpy.conf"))


def golden_copy(singpy: Singpy, place: Path, name: str) -> Path:
    target = place / name
    shutil.copyfile(TRUST / name, target)
    own(singpy, target)
    return target


def trust_golden_key(singpy: Singpy, place: Path) -> None:
    """The golden signer's public key in the user's keyring, binary as Apptainer writes it."""
    import pysequoia

    cert = pysequoia.Cert.from_bytes((TRUST / "private.asc").read_bytes())
    (place / "keys" / "pgp-public").write_bytes(bytes(cert))  # bytes(): the public part only
    own(singpy, place / "keys" / "pgp-public")


def fresh_place(singpy: Singpy, workdir: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of this profile's user for one test: its keyring (keys/) and its images."""
    name: str = request.node.name.replace("[", "-").replace("]", "").replace("/", "_")[:80]
    path = workdir / "sign-verify" / name  # the test's ID names the profile
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    path.parent.chmod(0o755)
    own(singpy, path)
    (path / "keys").mkdir(mode=0o700)
    own(singpy, path / "keys")
    (path / "etc").mkdir(mode=0o755)  # this test's configuration: no global keyring unless the test writes one
    shutil.copyfile(Path(__file__).resolve().parents[2] / "etc" / "singpy.conf", path / "etc" / "singpy.conf")
    return path


def unsigned_sif(singpy: Singpy, place: Path) -> Path:
    """A two-object SIF made by the reference siftool: what singpy signs must be Apptainer's format."""
    assert SIFTOOL, "siftool (Debian's golang-github-apptainer-sif) is needed"
    image = place / "unsigned.sif"
    (place / "part1").write_bytes(b"\xfa\xce\xfe\xed" * 1024)
    (place / "part2").write_bytes(os.urandom(8192))
    subprocess.run([SIFTOOL, "new", str(image)], check=True, capture_output=True)
    for part, parttype in (("part1", "2"), ("part2", "3")):
        subprocess.run([SIFTOOL, "add", "--datatype", "4", "--parttype", parttype, "--partfs", "4", "--partarch", "2",
                        "--groupid", "1", str(image), str(place / part)], check=True, capture_output=True)
    return own(singpy, image)


def new_pgp_key(singpy: Singpy, place: Path, names: list[str]) -> list[str]:
    """Fresh OpenPGP keys in this user's secret and public keyrings (as `key newpair` would write them)."""
    import pysequoia

    tsks = [pysequoia.Tsk.generate(name, profile=pysequoia.Profile.RFC4880, cipher_suite=pysequoia.CipherSuite.Cv25519)
            for name in names]
    for filename, parts in (("pgp-secret", [bytes(t) for t in tsks]),
                            ("pgp-public", [bytes(t.extract_certificate()) for t in tsks])):
        path = place / "keys" / filename
        path.write_bytes(b"".join(parts))
        path.chmod(0o600)
        own(singpy, path)
    return [str(t.extract_certificate().fingerprint).upper() for t in tsks]

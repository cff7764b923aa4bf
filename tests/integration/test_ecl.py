"""The execution control list (ecl.toml beside the configuration in use) decides which SIF images run.

The images are a busybox SIF signed in the session with `singpy sign`: by the key of Apptainer's own tests
(tests/data/sif-trust/private.asc, "Unit Test"), by a second key made with `singpy key newpair`, by both, or
by none. The site directory holds singpy.conf, the global keyring with both public keys and ecl.toml, all
root's; every case runs as root and as the test user with `--config SITE/singpy.conf`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import SINGPY, Singpy, assert_one_fatal
from tests.support import sifs
from tests.support.signing_cases import GOLDEN_FINGERPRINT, golden


class Site:
    def __init__(self, root: Path, other_key: str) -> None:
        self.root = root
        self.conf = str(root / "singpy.conf")
        self.other_key = other_key
        self.images = root / "images"
        self.elsewhere = root / "elsewhere"

    def ecl(self, text: str, mode: int = 0o644) -> None:
        path = self.root / "ecl.toml"
        path.write_text(text)
        os.chown(path, 0, 0)
        path.chmod(mode)

    def image(self, name: str, where: Path | None = None) -> str:
        return str((where or self.images) / f"{name}.sif")


def _run(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run([SINGPY, *args], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def site(workdir: Path) -> Site:
    """Signed copies of one busybox SIF, and a site configuration directory (root's, readable by all)."""
    if os.geteuid() != 0:
        pytest.skip("the site's files must be root's: run the suite as root")
    root = Path(tempfile.mkdtemp(prefix="ecl-site-", dir=workdir))
    root.chmod(0o755)
    (root / "singpy.conf").write_text("")
    (root / "singpy.conf").chmod(0o644)
    keys = root / "signer"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "APPTAINER_KEYSDIR": str(keys), "LANG": "C.UTF-8"}
    _run("key", "import", str(golden("private.asc")), env=env)
    newpair = _run("key", "newpair", "-N", "Second Signer", "-E", "second@example.org", "-C", "", "-P", "",
                   "-b", "2048", env=env)
    other = newpair.split("Key fingerprint: ")[1].split()[0]
    site = Site(root, other)
    for directory in (site.images, site.elsewhere):
        directory.mkdir(mode=0o755)
    source = sifs.singpy_sif(workdir)
    signers = {"unsigned": [], "by-unit": ["0"], "by-other": ["1"], "by-both": ["0", "1"]}
    for name, indexes in signers.items():
        target = Path(site.image(name))
        shutil.copy(source, target)
        for index in indexes:
            _run("sign", "--keyidx", index, str(target), env=env)
        target.chmod(0o644)
    shutil.copy(site.image("by-unit"), site.image("by-unit", site.elsewhere))
    # the global keyring: both public keys (imported by root beside the configuration)
    public = keys / "pgp-public"
    _run("--config", site.conf, "key", "import", "--global", str(public), env=env)
    return site


def test_an_inactive_ecl_lets_everything_run(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = false\n[[execgroup]]\ntagname = "none"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    assert singpy.ok("--config", site.conf, "exec", site.image("unsigned"), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"


def test_whitelist_refuses_an_unsigned_image_and_runs_a_signed_one(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "trusted"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}", "{site.other_key}"]\n')
    assert singpy.ok("--config", site.conf, "exec", site.image("by-unit"), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"
    assert singpy.ok("--config", site.conf, "exec", site.image("by-other"), "true") == ""
    refused = singpy.run("--config", site.conf, "exec", site.image("unsigned"), "cat", "/etc/marker")
    assert_one_fatal(refused, "execgroup 'trusted' (whitelist")
    assert "image prohibited by ECL" in refused.stderr


def test_a_key_in_the_users_own_keyring_vouches_for_nothing(singpy: Singpy, site: Site) -> None:
    """Only the global keyring counts, as in Apptainer: a whitelisted key whose public half the user (not the
    site) holds does not make its signature count."""
    own = Path(tempfile.mkdtemp(prefix="own-keys-", dir=site.root))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(site.root), "APPTAINER_KEYSDIR": str(own), "LANG": "C.UTF-8"}
    newpair = _run("key", "newpair", "-N", "Own Signer", "-E", "own@example.org", "-C", "", "-P", "", "-b", "2048",
                   env=env)
    fingerprint = newpair.split("Key fingerprint: ")[1].split()[0]
    image = site.image(own.name)
    shutil.copy(site.image("unsigned"), image)
    _run("sign", str(image), env=env)
    own.chmod(0o755)  # the public keyring readable by the test user, as if it were theirs
    (own / "pgp-public").chmod(0o644)
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "own"\nmode = "whitelist"\nkeyfp = ["{fingerprint}"]\n')
    refused = singpy.run("--config", site.conf, "exec", image, "true", env=singpy.env(APPTAINER_KEYSDIR=str(own)))
    assert_one_fatal(refused, "has no signature verified by a key of the global keyring")
    assert singpy.ok("verify", image, env=singpy.env(APPTAINER_KEYSDIR=str(own))) is not None  # it is signed


def test_whitelist_by_one_key(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    singpy.ok("--config", site.conf, "run", site.image("by-both"))
    refused = singpy.run("--config", site.conf, "exec", site.image("by-other"), "true")
    assert_one_fatal(refused, "execgroup 'unit' (whitelist, every other directory)): image not signed by required")


def test_whitestrict_needs_every_key(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "strict"\nmode = "whitestrict"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}", "{site.other_key}"]\n')
    assert singpy.ok("--config", site.conf, "exec", site.image("by-both"), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"
    for name in ("by-unit", "by-other", "unsigned"):
        assert_one_fatal(singpy.run("--config", site.conf, "exec", site.image(name), "true"), "'strict' (whitestrict")


def test_blacklist_refuses_a_forbidden_signer(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "banned"\nmode = "blacklist"\nkeyfp = ["{site.other_key}"]\n')
    assert singpy.ok("--config", site.conf, "exec", site.image("by-unit"), "cat", "/etc/marker") == \
        sifs.MARKER + "\n"
    for name in ("by-other", "by-both"):
        assert_one_fatal(singpy.run("--config", site.conf, "shell", site.image(name)),
                         "'banned' (blacklist, every other directory)): image signed by a forbidden entity")


def test_dirpath_chooses_the_group(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "store"\nmode = "whitelist"\ndirpath = "{site.images}"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    singpy.ok("--config", site.conf, "exec", site.image("by-unit"), "true")
    elsewhere = site.image("by-unit", site.elsewhere)
    assert_one_fatal(singpy.run("--config", site.conf, "exec", elsewhere, "true"), "not part of any execgroup")
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "store"\nmode = "whitelist"\ndirpath = "{site.images}"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n[[execgroup]]\ntagname = "rest"\nmode = "whitelist"\n'
             f'keyfp = ["{site.other_key}"]\n')
    assert_one_fatal(singpy.run("--config", site.conf, "exec", elsewhere, "true"), "execgroup 'rest'")
    link = Path(tempfile.mkdtemp(dir=site.root)) / "link.sif"
    link.parent.chmod(0o755)
    link.symlink_to(site.image("by-unit"))  # the image's real directory counts, as Apptainer resolves the path
    singpy.ok("--config", site.conf, "exec", str(link), "true")


def test_a_tampered_signed_image_is_refused(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    tampered = Path(site.image("tampered"))
    if not tampered.exists():
        sifs.patched(Path(site.image("by-unit")), tampered, [(sifs.primary_offset(Path(site.image("by-unit"))) + 100,
                                                              b"\xff")]).chmod(0o644)
    assert_one_fatal(singpy.run("--config", site.conf, "exec", str(tampered), "true"), "image signature not valid")


def _with_ungrouped_partition(signed: Path, target: Path) -> Path:
    """`signed` with a copy of its system partition added outside every group, in the descriptor table's first
    slot: no signature covers it. A plain system partition: a second primary one is refused before any ECL check
    (tests/integration/test_sif_malformed.py)."""
    from singpy.image import sif

    data = bytearray(signed.read_bytes())
    header, slots, _ = sif.read_raw(str(signed))
    used = [slot for slot in slots if slot.used]
    primary = next(slot for slot in used if slot.datatype == sif.DATA_PARTITION)
    offset = len(data)
    data += data[primary.offset:primary.offset + primary.size]
    fstype, _, arch = sif.PARTITION_EXTRA.unpack_from(primary.extra)
    extra = sif.PARTITION_EXTRA.pack(fstype, sif.PART_SYSTEM, arch) + primary.extra[sif.PARTITION_EXTRA.size:]
    added = primary._replace(id=max(slot.id for slot in used) + 1, group_id=0, offset=offset, extra=extra)
    table = b"".join(sif.DESCRIPTOR.pack(*slot) for slot in [added, *used])
    data[header.descriptors_offset:header.descriptors_offset + len(table)] = table
    fields = list(sif.HEADER.unpack(data[:sif.HEADER.size]))
    fields[7] -= 1  # descriptors free
    fields[12] = len(data) - fields[11]  # data size
    data[:sif.HEADER.size] = sif.HEADER.pack(*fields)
    target.write_bytes(data)
    target.chmod(0o644)
    return target


def test_a_partition_outside_every_group_is_refused(singpy: Singpy, site: Site) -> None:
    """A signed image with an added system partition that no signature covers, first in the table: refused."""
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    added = Path(site.image("ungrouped"))
    if not added.exists():
        _with_ungrouped_partition(Path(site.image("by-unit")), added)
    assert_one_fatal(singpy.run("--config", site.conf, "exec", str(added), "echo", "ran"),
                     "not associated with object group")
    verified = singpy.run("verify", str(added))
    assert verified.returncode != 0 and "FATAL:   Failed to verify container: integrity: non-signature object not " \
        "associated with object group" in verified.stderr, verified.stderr


@pytest.mark.parametrize("mode", [0o666, 0o664])
def test_an_ecl_others_can_write_is_refused(singpy: Singpy, site: Site, mode: int) -> None:
    site.ecl("activated = false\n", mode)
    assert_one_fatal(singpy.run("--config", site.conf, "exec", site.image("unsigned"), "true"),
                     "must not be writable by group or others")


@pytest.mark.parametrize("change", ["group-writable", "link"])
def test_a_global_keyring_others_could_change_is_refused(singpy: Singpy, site: Site, change: str) -> None:
    """Who can change the keyring beside ecl.toml chooses the signers: it is held to ecl.toml's rule."""
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    keyring = site.root / "global-pgp-public"
    kept = site.root / "global-pgp-public.kept"
    shutil.copy2(keyring, kept)
    try:
        if change == "group-writable":
            keyring.chmod(0o664)
        else:
            keyring.unlink()
            keyring.symlink_to(kept)
        assert_one_fatal(singpy.run("--config", site.conf, "exec", site.image("by-unit"), "true"),
                         "must not be writable by group or others" if change == "group-writable" else "keyring")
    finally:
        keyring.unlink()
        kept.rename(keyring)
        keyring.chmod(0o644)
    singpy.ok("--config", site.conf, "exec", site.image("by-unit"), "true")


def test_an_ecl_of_the_user_is_refused(as_user: Singpy, site: Site) -> None:
    site.ecl("activated = false\n")
    os.chown(site.root / "ecl.toml", as_user.uid, as_user.gid)
    assert_one_fatal(as_user.run("--config", site.conf, "exec", site.image("unsigned"), "true"),
                     "must be owned by root")


def test_an_instance_start_is_checked(singpy: Singpy, site: Site) -> None:
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n'
             f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n')
    name = f"ecl-{singpy.profile}-{os.getpid()}"
    refused = singpy.run("--config", site.conf, "instance", "start", site.image("unsigned"), name)
    assert refused.returncode != 0 and "image prohibited by ECL" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def _recipe_dir(singpy: Singpy, site: Site, name: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"fp-{name}-{singpy.profile}-", dir=site.root))
    out.chmod(0o755)
    os.chown(out, singpy.uid, singpy.gid)
    return out


def _build(singpy: Singpy, site: Site, name: str, image: str, fingerprints: str,
           *quiet: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = _recipe_dir(singpy, site, name)
    recipe = out / "recipe.def"
    recipe.write_text(f"Bootstrap: localimage\nFrom: {image}\nFingerprints: {fingerprints}\n\n"
                      "%post\n    echo POST-RAN-MARKER\n    touch /built\n")
    recipe.chmod(0o644)
    result = singpy.run(*quiet, "--config", site.conf, "build", str(out / "image.sif"), str(recipe), timeout=300)
    return result, out


def test_fingerprints_of_the_base_image_let_the_build_go_on(singpy: Singpy, site: Site) -> None:
    site.ecl("activated = false\n")
    result, out = _build(singpy, site, "ok", site.image("by-both"),
                         f"{GOLDEN_FINGERPRINT.lower()}, {site.other_key}  # both signers")
    assert result.returncode == 0, result.stderr
    assert "Checking bootstrap image verifies with fingerprint(s)" in result.stderr
    assert singpy.ok("exec", str(out / "image.sif"), "ls", "/built") == "/built\n"


@pytest.mark.parametrize("image", ["by-unit", "unsigned"])
def test_a_base_image_not_signed_by_the_fingerprints_fails_before_post(singpy: Singpy, site: Site,
                                                                       image: str) -> None:
    site.ecl("activated = false\n")
    result, out = _build(singpy, site, "refused", site.image(image), site.other_key, "-q")
    assert_one_fatal(result, "while checking fingerprint: image not signed by required entities")
    assert "POST-RAN-MARKER" not in result.stdout + result.stderr
    assert sorted(os.listdir(out)) == ["recipe.def"]


# Recorded verdicts (singpy.signing.eclrecord): an allowed launch leaves a record in the caller's cache, and the
# next launch of the same bytes under the same ECL and global keyring skips the verification; every refusal is
# still decided in full.

WHITELIST_UNIT = f'activated = true\n[[execgroup]]\ntagname = "unit"\nmode = "whitelist"\n' \
    f'keyfp = ["{GOLDEN_FINGERPRINT}"]\n'


def _own_copy(singpy: Singpy, site: Site, source: str, label: str) -> Path:
    """A copy of a site image that this test alone uses (its path names its record)."""
    copy = Path(site.image(f"{label}-{singpy.profile}-{os.getpid()}"))
    shutil.copy(site.image(source), copy)
    copy.chmod(0o644)
    return copy


def _records(singpy: Singpy) -> Path:
    from singpy.signing import eclrecord

    return singpy.cachedir / eclrecord.SUBDIR


def _imported(result: subprocess.CompletedProcess[str]) -> set[str]:
    return {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def test_an_allowed_image_is_recorded_and_then_not_verified_again(singpy: Singpy, site: Site) -> None:
    site.ecl(WHITELIST_UNIT)
    image = _own_copy(singpy, site, "by-unit", "recorded")
    profile = singpy.env(PYTHONPROFILEIMPORTTIME="1")
    first = singpy.run("--config", site.conf, "exec", str(image), "cat", "/etc/marker", env=profile)
    assert first.returncode == 0 and first.stdout == sifs.MARKER + "\n", first.stderr
    assert {"singpy.signing.verify", "tomllib"} <= _imported(first)
    records = [entry for entry in _records(singpy).iterdir() if not entry.name.startswith(".")]
    assert records and all(entry.stat().st_uid == singpy.uid and entry.stat().st_mode & 0o077 == 0
                           for entry in [*records, _records(singpy)])
    second = singpy.run("--config", site.conf, "exec", str(image), "cat", "/etc/marker", env=profile)
    assert second.returncode == 0 and second.stdout == sifs.MARKER + "\n", second.stderr
    assert not {"singpy.signing.ecl", "singpy.signing.verify", "singpy.signing.pgp", "pysequoia", "tomllib",
                "subprocess", "hashlib", "collections"} & _imported(second)  # collections.abc: type checking only


def test_a_recorded_image_changed_in_place_is_refused_and_allowed_again_once_restored(singpy: Singpy,
                                                                                         site: Site) -> None:
    site.ecl(WHITELIST_UNIT)
    image = _own_copy(singpy, site, "by-unit", "changed")
    original = image.read_bytes()
    singpy.ok("--config", site.conf, "exec", str(image), "true")  # recorded
    offset = sifs.primary_offset(image) + 100
    with image.open("r+b") as stream:  # the same path, so the same record name: its digest must not match
        stream.seek(offset)
        stream.write(bytes([original[offset] ^ 0xFF]))
    assert_one_fatal(singpy.run("--config", site.conf, "exec", str(image), "true"), "image signature not valid")
    image.write_bytes(original)
    singpy.ok("--config", site.conf, "exec", str(image), "true")


@pytest.mark.parametrize("policy", ["blacklist", "whitelist-other"])
def test_a_recorded_verdict_does_not_survive_a_policy_change(singpy: Singpy, site: Site, policy: str) -> None:
    site.ecl(WHITELIST_UNIT)
    image = _own_copy(singpy, site, "by-unit", f"policy-{policy}")
    singpy.ok("--config", site.conf, "exec", str(image), "true")  # recorded
    mode, key = ("blacklist", GOLDEN_FINGERPRINT) if policy == "blacklist" else ("whitelist", site.other_key)
    site.ecl(f'activated = true\n[[execgroup]]\ntagname = "changed"\nmode = "{mode}"\nkeyfp = ["{key}"]\n')
    assert_one_fatal(singpy.run("--config", site.conf, "exec", str(image), "true"), "execgroup 'changed'")


@pytest.mark.parametrize("directory", ["the caller's", "another user's", "writable by others"])
def test_a_record_counts_only_in_a_directory_only_the_caller_can_write(singpy: Singpy, site: Site,
                                                                        other_user: pwd.struct_passwd,
                                                                        directory: str) -> None:
    """A record made by hand for an unsigned image: believed in the caller's own private cache (it is the
    caller's word, and the caller could run the image another way anyway: docs/security.md), never where someone
    else could have written it."""
    from singpy.signing import ecl, eclrecord, keyring

    site.ecl(WHITELIST_UNIT)
    image = _own_copy(singpy, site, "unsigned", f"forged-{directory.split()[0].strip(chr(39))}")
    cache = Path(tempfile.mkdtemp(prefix="forged-cache-", dir=singpy.workdir))
    records = cache / eclrecord.SUBDIR
    records.mkdir(mode=0o700)
    ecl_path = ecl.path_for(site.conf)
    name = eclrecord.record_name(str(site.root), Path(ecl_path).read_bytes(),
                                 keyring.read_bytes(str(site.root / keyring.GLOBAL_PUBLIC_FILE)), str(image))
    record = records / name
    record.write_text(f"singpy-ecl-verdict-1\0{eclrecord.image_digest(str(image))}\0{time.time() + 3600!r}")
    owner = other_user.pw_uid if directory == "another user's" else singpy.uid
    for path in (cache, records, record):
        os.chown(path, owner, owner)
    if directory == "writable by others":
        records.chmod(0o777)
    result = singpy.run("--config", site.conf, "exec", str(image), "cat", "/etc/marker",
                        env=singpy.env(SINGPY_CACHEDIR=str(cache)))
    if directory == "the caller's":
        assert result.returncode == 0 and result.stdout == sifs.MARKER + "\n", result.stderr
    else:
        assert_one_fatal(result, "execgroup 'unit' (whitelist")

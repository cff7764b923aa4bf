"""The execution control list's rules (singpy.signing.ecl): Apptainer's file format, validation and decisions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from singpy.errors import SingpyError
from singpy.signing import ecl

ALICE = "12045C8C0B1004D058DE4BEDA20C27EE7FF7BA84"
BOB = "7064B1D6EFF01B1262FED3F03581D99FE87EAFD1"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the file must be owned by root")


def _write(directory: Path, text: str, mode: int = 0o644) -> Path:
    path = directory / "ecl.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def _group(mode: str, *keys: str, dirpath: str = "") -> ecl.ExecGroup:
    return ecl.ExecGroup(tagname="g", mode=mode, dirpath=dirpath, keyfp=keys)


@pytest.mark.parametrize(("mode", "keys", "signers", "refused"), [
    ("whitelist", (ALICE, BOB), [ALICE], ""),
    ("whitelist", (ALICE,), [ALICE.lower()], ""),
    ("whitelist", (BOB,), [ALICE], "not signed by required"),
    ("whitestrict", (ALICE, BOB), [ALICE, BOB], ""),
    ("whitestrict", (ALICE, BOB), [ALICE], "not signed by required"),
    ("blacklist", (BOB,), [ALICE], ""),
    ("blacklist", (BOB,), [ALICE, BOB], "forbidden entity"),
])
def test_decide(mode: str, keys: tuple[str, ...], signers: list[str], refused: str) -> None:
    why = ecl.decide(_group(mode, *keys), signers)
    assert (refused in why) if refused else why == ""


@pytest.mark.parametrize(("text", "message"), [
    ('activated = "yes"\n', "true or false"),
    ("activate = true\n", "unknown key 'activate'"),
    ('[[execgroup]]\ntagname = "a"\nmode = "greylist"\n', "whitelist, whitestrict, blacklist"),
    ('[[execgroup]]\ntagname = "a"\nmode = "whitelist"\nkeyfp = ["ABCD"]\n', "40 chars hex"),
    ('[[execgroup]]\ntagname = "a"\nmode = "whitelist"\ndirpath = "relative/dir"\n', "fully cleaned"),
    ('[[execgroup]]\ntagname = "a"\nmode = "whitelist"\nsign = 1\n', "unknown key 'sign'"),
    ('[[execgroup]]\ntagname = "a"\nmode = "whitelist"\n[[execgroup]]\ntagname = "b"\nmode = "blacklist"\n',
     "only appear in one execgroup"),
    ("activated = \n", "while validating ECL configuration"),
])
@root_only
def test_invalid_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SingpyError, match=message):
        ecl.load(str(_write(tmp_path, text)))


@root_only
def test_apptainer_example_loads(tmp_path: Path) -> None:
    text = f'activated = true\n[[execgroup]]\n  tagname = "group1"\n  mode = "whitestrict"\n' \
           f'  dirpath = "{tmp_path}"\n  keyfp = ["{ALICE.lower()}","{BOB}"]\n'
    loaded = ecl.load(str(_write(tmp_path, text)))
    assert loaded.activated and not loaded.legacy
    assert loaded.groups == (ecl.ExecGroup(tagname="group1", mode="whitestrict", dirpath=str(tmp_path),
                                           keyfp=(ALICE, BOB)),)


@root_only
@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(SingpyError, match="must not be writable by group or others"):
        ecl.load(str(_write(tmp_path, "activated = false\n", mode)))


@root_only
def test_a_file_not_owned_by_root_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "activated = false\n")
    os.chown(path, 65534, 65534)
    with pytest.raises(SingpyError, match="must be owned by root"):
        ecl.load(str(path))


@root_only
def test_a_link_is_refused(tmp_path: Path) -> None:
    real = _write(tmp_path, "activated = false\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ecl.toml").symlink_to(real)
    with pytest.raises(SingpyError, match="can't read the execution control list"):
        ecl.load(str(tmp_path / "conf" / "ecl.toml"))


def test_group_of_prefers_the_image_directory() -> None:
    here, anywhere = _group("whitelist", ALICE, dirpath="/srv/images"), _group("blacklist", BOB)
    rules = ecl.Ecl(path="x", activated=True, legacy=False, groups=(anywhere, here))
    assert ecl.group_of(rules, "/srv/images/a.sif") is here
    assert ecl.group_of(rules, "/srv/images/sub/a.sif") is anywhere
    assert ecl.group_of(ecl.Ecl(path="x", activated=True, legacy=False, groups=(here,)), "/tmp/a.sif") is None


def test_path_for_follows_the_configuration() -> None:
    assert ecl.path_for("/opt/site/singpy.conf") == "/opt/site/ecl.toml"
    assert ecl.path_for("") == "/etc/singpy/ecl.toml"


@root_only
def test_check_asks_the_verifier_only_when_activated(tmp_path: Path) -> None:
    conf = tmp_path / "singpy.conf"
    image = tmp_path / "image.sif"
    image.write_bytes(b"")
    calls: list[tuple[str, bool, str, bool]] = []

    def verifier(path: str, *, legacy: bool, config_dir: str, global_only: bool) -> list[str]:
        calls.append((path, legacy, config_dir, global_only))
        return [ALICE]

    _write(tmp_path, f'activated = false\n[[execgroup]]\ntagname = "t"\nmode = "whitelist"\nkeyfp = ["{BOB}"]\n')
    ecl.check(str(image), str(conf), verifier=verifier)
    assert calls == []
    _write(tmp_path, f'activated = true\nlegacyinsecure = true\n[[execgroup]]\ntagname = "t"\nmode = "whitelist"\n'
                     f'keyfp = ["{BOB}"]\n')
    with pytest.raises(SingpyError, match="execgroup 't' \\(whitelist, every other directory\\)\\): image not signed"):
        ecl.check(str(image), str(conf), verifier=verifier)
    assert calls == [(str(image), True, str(tmp_path), True)]  # the global keyring alone


@root_only
def test_check_reports_a_bad_signature_and_no_signature(tmp_path: Path) -> None:
    conf, image = tmp_path / "singpy.conf", tmp_path / "image.sif"
    image.write_bytes(b"")
    _write(tmp_path, f'activated = true\n[[execgroup]]\ntagname = "t"\nmode = "blacklist"\nkeyfp = ["{BOB}"]\n')

    def tampered(path: str, *, legacy: bool, config_dir: str, global_only: bool) -> list[str]:
        raise SingpyError("signature object 3 not valid")

    with pytest.raises(SingpyError, match="image signature not valid: signature object 3 not valid"):
        ecl.check(str(image), str(conf), verifier=tampered)
    with pytest.raises(SingpyError, match="has no signature verified"):
        ecl.check(str(image), str(conf), verifier=lambda path, **kwargs: [])
    ecl.check(str(image), str(conf), verifier=lambda path, **kwargs: [ALICE])


def test_without_an_ecl_the_launch_imports_nothing_of_it(tmp_path: Path) -> None:
    """A host without ecl.toml pays one stat: neither the signing code nor a TOML parser is loaded."""
    import subprocess
    import sys

    code = ("import sys\nfrom singpy.launch.launch import _check_ecl\nfrom singpy.host.host import capture\n"
            f"_check_ecl({str(tmp_path / 'image.sif')!r}, {str(tmp_path / 'singpy.conf')!r}, capture())\n"
            "print(sorted(name for name in sys.modules if name.startswith(('singpy.signing', 'tomllib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\n"

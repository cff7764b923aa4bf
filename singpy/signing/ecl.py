"""The execution control list: `ecl.toml`, which SIF images a site lets run, by where they are and who signed them.

Apptainer's format and rules (internal/pkg/syecl):

    activated = true                  the rules apply only when true
    legacyinsecure = false            verify legacy (SIFHASH) signatures of the primary partition instead
    [[execgroup]]
      tagname = "group1"              a name for the rule (shown when it refuses an image)
      mode = "whitelist"              whitelist: signed by at least one of keyfp; whitestrict: by all of them;
                                      blacklist: by none of them
      dirpath = "/var/containers"     the group of images stored in this directory ("": every other image)
      keyfp = ["40 HEX DIGITS", ...]  the signers' OpenPGP fingerprints

The file lives beside the configuration in use (`--config DIR/singpy.conf` reads `DIR/ecl.toml`), and the
global public keyring (`global-pgp-public`) there holds the keys whose signatures count. A site's policy is
only worth something if users can't rewrite it: the file must be owned by root and writable by no one else,
else nothing runs. An image that no group names, an unsigned image, a bad signature and a signer the group's
mode refuses are each one error naming the rule.

`check` is called from the launch (singpy.launch.launch.prepare_image) only when the file exists, so that
a host without an ECL pays one stat; the signatures are verified by singpy.signing.verify.
"""

from __future__ import annotations

import os

from singpy.errors import SingpyError
from singpy.record import Record
from singpy.signing.eclfile import FILE, SYSTEM_DIR, EclError, path_for, read_trusted

__all__ = ["FILE", "SYSTEM_DIR", "Ecl", "EclError", "ExecGroup", "check", "decide", "group_of", "load", "parse",
           "parse_fingerprints", "parse_text", "path_for", "require_signers"]

TYPE_CHECKING = False  # see singpy.record: `typing` costs the launch milliseconds it has not got
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from singpy.signing.eclrecord import Verdicts

    Verifier = Callable[..., list[str]]

MODES = ("whitelist", "whitestrict", "blacklist")
_TOP_KEYS = {"activated", "legacyinsecure", "execgroup"}
_GROUP_KEYS = {"tagname", "mode", "dirpath", "keyfp"}


class ExecGroup(Record):
    tagname: str
    mode: str
    dirpath: str
    keyfp: tuple[str, ...]  # uppercase hex

    def describe(self) -> str:
        where = f"dirpath {self.dirpath}" if self.dirpath else "every other directory"
        return f"execgroup {self.tagname!r} ({self.mode}, {where})"


class Ecl(Record):
    path: str
    activated: bool
    legacy: bool
    groups: tuple[ExecGroup, ...]


def load(path: str) -> Ecl:
    """Read and validate `path`: root's, written by no one else, Apptainer's keys with their types."""
    return parse_text(read_trusted(path), path)


def parse_text(data: bytes, path: str) -> Ecl:
    """The ECL in `data` (the bytes of `path`), validated."""
    import tomllib

    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise EclError(f"the execution control list {path} is not UTF-8 text") from None
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise EclError(f"while validating ECL configuration {path}: {error}") from None
    return parse(parsed, path)


def parse(data: dict[str, Any], path: str) -> Ecl:
    """Apptainer's LoadConfig + ValidateConfig; an unknown key is refused (a typo must not disable a rule)."""
    def bad(why: str) -> EclError:
        return EclError(f"while validating ECL configuration {path}: {why}")

    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise bad(f"unknown key {sorted(unknown)[0]!r}")
    activated, legacy = data.get("activated", False), data.get("legacyinsecure", False)
    if not isinstance(activated, bool) or not isinstance(legacy, bool):
        raise bad("activated and legacyinsecure must be true or false")
    groups = data.get("execgroup", [])
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise bad("execgroup must be a list of tables ([[execgroup]])")
    parsed = tuple(_group(group, bad) for group in groups)
    seen: set[str] = set()
    for group in parsed:
        if group.dirpath in seen:
            raise bad(f"a specific dirpath can only appear in one execgroup: {group.dirpath}")
        seen.add(group.dirpath)
    return Ecl(path=path, activated=activated, legacy=legacy, groups=parsed)


def _group(data: dict[str, Any], bad: Callable[[str], EclError]) -> ExecGroup:
    unknown = set(data) - _GROUP_KEYS
    if unknown:
        raise bad(f"unknown key {sorted(unknown)[0]!r} in an execgroup")
    tagname, mode, dirpath = data.get("tagname", ""), data.get("mode", ""), data.get("dirpath", "")
    keyfp = data.get("keyfp", [])
    if not all(isinstance(value, str) for value in (tagname, mode, dirpath)):
        raise bad("tagname, mode and dirpath must be strings")
    if mode not in MODES:
        raise bad(f"execgroup {tagname!r}: the mode field can only be either: {', '.join(MODES)}")
    if dirpath and (not os.path.isabs(dirpath) or os.path.realpath(dirpath) != dirpath):
        raise bad(f"execgroup {tagname!r}: all execgroup dirpaths should be fully cleaned with symlinks resolved "
                  f"({dirpath})")
    if not isinstance(keyfp, list) or not all(isinstance(value, str) and _is_fingerprint(value) for value in keyfp):
        raise bad(f"execgroup {tagname!r}: expecting a 40 chars hex fingerprint string in keyfp")
    return ExecGroup(tagname=tagname, mode=mode, dirpath=dirpath, keyfp=tuple(value.upper() for value in keyfp))


def _is_fingerprint(value: str) -> bool:
    return len(value) == 40 and all(char in "0123456789abcdefABCDEF" for char in value)


def group_of(ecl: Ecl, image: str) -> ExecGroup | None:
    """The group of the image's directory, else the group without a dirpath (Apptainer's getExecGroup)."""
    directory = os.path.dirname(image)
    return next((group for group in ecl.groups if group.dirpath == directory), None) or \
        next((group for group in ecl.groups if not group.dirpath), None)


def decide(group: ExecGroup, signers: Sequence[str]) -> str:
    """Why `group` refuses an image whose valid signatures are by `signers` ("" : it may run)."""
    signed = {fingerprint.upper() for fingerprint in signers}
    if group.mode == "whitelist" and not signed & set(group.keyfp):
        return "image not signed by required entities"
    if group.mode == "whitestrict" and not set(group.keyfp) <= signed:
        return "image not signed by required entities"
    if group.mode == "blacklist" and signed & set(group.keyfp):
        return "image signed by a forbidden entity"
    return ""


def _verifier(given: Verifier | None) -> Verifier:
    """singpy.signing.verify's, imported only when an image is checked (tests give their own)."""
    if given is not None:
        return given
    from singpy.signing.verify import signer_fingerprints

    return signer_fingerprints


def check(image: str, config_path: str, *, verifier: Verifier | None = None, records: str = "") -> None:
    """Refuse (EclError) a SIF the execution control list beside `config_path` does not let run.

    `records`: the caller's cache directory, where an allowed verdict is recorded (singpy.signing.eclrecord;
    the launch looks it up first with eclrecord.allowed, and calls this only when that says no)."""
    import time

    path = path_for(config_path)
    data = read_trusted(path)
    image = os.path.realpath(image)  # as Apptainer, which resolves the image path before it looks at dirpath
    now = time.time()
    verdicts = None
    if records and verifier is None:
        from singpy.signing import eclrecord

        verdicts = eclrecord.open_for(records, path, data, image)
    ecl = parse_text(data, path)
    if not ecl.activated:
        return
    group = group_of(ecl, image)
    if group is None:
        raise EclError(f"image prohibited by ECL ({ecl.path}): {image} not part of any execgroup")
    config_dir = os.path.dirname(ecl.path)
    if verdicts is not None:
        verdicts.before_verifying(image)
    try:
        # the global keyring alone, as Apptainer's ECL: a key a user imported vouches for nothing here
        signers = _verifier(verifier)(image, legacy=ecl.legacy, config_dir=config_dir, global_only=True)
    except SingpyError as error:
        raise EclError(f"image prohibited by ECL ({ecl.path}, {group.describe()}): image signature not valid: "
                       f"{error}") from None
    if not signers:
        raise EclError(f"image prohibited by ECL ({ecl.path}, {group.describe()}): {image} has no signature "
                       "verified by a key of the global keyring")
    why = decide(group, signers)
    if why:
        raise EclError(f"image prohibited by ECL ({ecl.path}, {group.describe()}): {why}")
    if verdicts is not None:
        _remember(verdicts, image, now, signers)


def _remember(verdicts: Verdicts, image: str, now: float, signers: Sequence[str]) -> None:
    """Record an allowed image, valid until the first of its signers' keys expires (at most a day): only if the
    global keyring is still the one whose bytes name the record."""
    from singpy.signing import keyring

    try:
        keys = keyring.read_bytes(verdicts.keyring_path, roots_only=True)
        certs = keyring.parse_certs(keys, verdicts.keyring_path)
    except SingpyError:
        return
    if keys != verdicts.keyring:
        return
    wanted = {fingerprint.upper() for fingerprint in signers}
    expirations = [cert.expiration.timestamp() for cert in certs
                   if keyring.fingerprint(cert) in wanted and cert.expiration is not None]
    verdicts.remember(image, now, expirations)


def parse_fingerprints(header: str) -> list[str]:
    """A definition file's `Fingerprints:` value: comma-separated, a trailing `#` comment dropped (as Apptainer)."""
    values = [value.strip().upper().removeprefix("0X") for value in header.split("#", 1)[0].split(",")]
    values = [value for value in values if value]
    bad = next((value for value in values if not _is_fingerprint(value)), None)
    if bad is not None:
        raise EclError(f"Fingerprints: {bad!r} is not a 40 hex digit OpenPGP fingerprint")
    return values


def require_signers(image: str, header: str, *, verifier: Verifier | None = None) -> None:
    """A build's base SIF must be signed by every key of its `Fingerprints:` header (VerifyFingerprints)."""
    from singpy import console
    from singpy.image.detect import classify

    wanted = parse_fingerprints(header)
    if not wanted:
        return
    if classify(image).kind != "sif":  # Apptainer checks SIF bases only: nothing else carries signatures
        console.warning(f"Fingerprints: ignored: the base image {image} is not a SIF")
        return
    console.info(f"Checking bootstrap image verifies with fingerprint(s): {', '.join(wanted)}")
    try:
        signers = {fingerprint.upper() for fingerprint in _verifier(verifier)(image, legacy=False, config_dir=None)}
    except SingpyError as error:
        raise EclError(f"while checking fingerprint: {error}") from None
    missing = [fingerprint for fingerprint in wanted if fingerprint not in signers]
    if missing:
        raise EclError(f"while checking fingerprint: image not signed by required entities ({', '.join(missing)} "
                       "did not sign it, or their keys are not in the keyrings)")

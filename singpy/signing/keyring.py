"""Apptainer's OpenPGP keyrings: where they are, and the certificates they hold.

- the user's: `$APPTAINER_KEYSDIR` (or `SINGULARITY_SYPGPDIR`), else `keys/` in the user's
  configuration directory (`$APPTAINER_CONFIGDIR`, else `~/.apptainer`): `pgp-public`, `pgp-secret`;
- the global public keyring: `global-pgp-public` beside the configuration file in use
  (`--config DIR/singpy.conf` reads `DIR/global-pgp-public`), as Apptainer keeps it in its
  configuration directory.

Apptainer writes them as binary OpenPGP (certificates back to back); armored files are read
too. Reading is Sequoia's (pysequoia), imported only when a keyring is read. A keyring is
written by others (a user's file, an admin's): it is parsed, never trusted to be well-formed,
and a bad one is one error line.
"""

from __future__ import annotations

import os

from singpy.errors import SingpyError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping

    from pysequoia import Cert

PUBLIC_FILE = "pgp-public"
SECRET_FILE = "pgp-secret"
GLOBAL_PUBLIC_FILE = "global-pgp-public"
KEYSDIR_VARIABLES = ("SINGPY_KEYSDIR", "APPTAINER_KEYSDIR", "SINGULARITY_SYPGPDIR")
MAX_KEYRING = 64 << 20  # a keyring larger than this is not a keyring


class KeyringError(SingpyError):
    """A keyring cannot be read or holds no valid OpenPGP data."""


def keys_dir(env: Mapping[str, str] | None = None) -> str:
    """The user's keyring directory, as Apptainer's syfs.DefaultLocalKeyDirPath."""
    env = os.environ if env is None else env
    for name in KEYSDIR_VARIABLES:
        if env.get(name):
            return env[name]
    from singpy.host.hostfiles import user_config_dir

    return os.path.join(user_config_dir(env, env.get("HOME") or os.path.expanduser("~")), "keys")


def public_path(env: Mapping[str, str] | None = None) -> str:
    return os.path.join(keys_dir(env), PUBLIC_FILE)


def secret_path(env: Mapping[str, str] | None = None) -> str:
    return os.path.join(keys_dir(env), SECRET_FILE)


def config_dir(env: Mapping[str, str] | None = None) -> str:
    """The directory of the configuration in use (`--config` sets SINGPY_CONFIG), else the shipped one."""
    from singpy.config import sysconf

    env = os.environ if env is None else env
    path = sysconf.default_path(env)
    if path:
        return os.path.dirname(os.path.abspath(path))
    return sysconf.SHIPPED_DIR if os.path.isdir(sysconf.SHIPPED_DIR) else sysconf.INSTALLED_DIR


def global_public_path(config_dir_path: str | None = None) -> str:
    return os.path.join(config_dir_path or config_dir(), GLOBAL_PUBLIC_FILE)


def read_bytes(path: str, *, roots_only: bool = False) -> bytes:
    """A keyring's bytes; a missing keyring is empty (as Apptainer: nothing imported yet).

    `roots_only`: the keyring the execution control list trusts, held to ecl.toml's rule (singpy.signing.
    eclfile): not a link, owned by root, writable by no one else; who could change it could choose the signers.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if roots_only else 0))
    except FileNotFoundError:
        return b""
    except OSError as e:
        raise KeyringError(f"can't read keyring {path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not _is_regular(fd):
            raise KeyringError(f"keyring {path} is not a regular file")
        if roots_only:
            _check_roots(fd, path)
        data = f.read(MAX_KEYRING + 1)
    if len(data) > MAX_KEYRING:
        raise KeyringError(f"keyring {path} is larger than {MAX_KEYRING >> 20} MiB")
    return data


def _check_roots(fd: int, path: str) -> None:
    import stat

    info = os.fstat(fd)
    if info.st_uid != 0:
        raise KeyringError(f"keyring {path} must be owned by root")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyringError(f"keyring {path} must not be writable by group or others (mode {info.st_mode & 0o7777:o})")


def _is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


def parse_certs(data: bytes, origin: str) -> list[Cert]:
    """Every certificate in OpenPGP data (binary or armored); bad data is one KeyringError."""
    if not data.strip():
        return []
    import warnings

    from pysequoia import Cert

    try:
        with warnings.catch_warnings():  # pysequoia warns when a Cert holds secret keys (pgp-secret does)
            warnings.simplefilter("ignore", DeprecationWarning)
            return list(Cert.split_bytes(data))
    except (RuntimeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise KeyringError(f"{origin}: not an OpenPGP keyring: {reason}") from None


def read_certs(path: str) -> list[Cert]:
    """The certificates (public, or with their secret keys) of one keyring file."""
    return parse_certs(read_bytes(path), path)


def public_certs(env: Mapping[str, str] | None = None) -> list[Cert]:
    return read_certs(public_path(env))


def secret_certs(env: Mapping[str, str] | None = None) -> list[Cert]:
    return read_certs(secret_path(env))


def global_certs(config_dir_path: str | None = None, *, roots_only: bool = False) -> list[Cert]:
    path = global_public_path(config_dir_path)
    return parse_certs(read_bytes(path, roots_only=roots_only), path)


def fingerprint(cert: Cert) -> str:
    """The uppercase hex fingerprint, as Apptainer prints it."""
    return str(cert.fingerprint).upper()


def primary_name(cert: Cert) -> str:
    """The first user ID of a certificate ("" when it has none)."""
    ids = list(cert.user_ids)
    return str(ids[0]) if ids else ""

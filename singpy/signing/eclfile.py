"""The execution control list's file: where it is, and its bytes, read only if no one but root could have written them.

Apart from singpy.signing.ecl (the rules) so that a launch whose verdict is recorded (singpy.signing.eclrecord)
checks the file without importing the rules. Imports only `os` and `stat`.
"""

from __future__ import annotations

import os
import stat

from singpy.errors import SingpyError

FILE = "ecl.toml"
SYSTEM_DIR = "/etc/singpy"
_LIMIT = 1 << 20


class EclError(SingpyError):
    """An ecl.toml that can't be trusted or read, or an image it refuses."""


def path_for(config_path: str) -> str:
    """ecl.toml beside the configuration file in use ("" : the built-in defaults, read from /etc/singpy)."""
    return os.path.join(os.path.dirname(os.path.abspath(config_path)) if config_path else SYSTEM_DIR, FILE)


def read_trusted(path: str) -> bytes:
    """The file's bytes, opened without following a link and checked on the descriptor that is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise EclError(f"can't read the execution control list {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise EclError(f"the execution control list {path} is not a regular file")
        if info.st_uid != 0:
            raise EclError(f"{path} must be owned by root")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise EclError(f"{path} must not be writable by group or others (mode {info.st_mode & 0o7777:o})")
        data = stream.read(_LIMIT + 1)
    if len(data) > _LIMIT:
        raise EclError(f"the execution control list {path} is larger than {_LIMIT} bytes")
    return data

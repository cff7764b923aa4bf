"""A library's users as the `library://` tests play them (tests/integration/test_library*.py): their tokens
(alice's, bob's), a fresh directory and environment of the profile's user (its own remote.yaml directory and
cache), and `remote add` of the test library with a token."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import Singpy
from tests.support.library_server import LibraryServer
from tests.support.sifs import new_cache

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"


def own_dir(singpy: Singpy, workdir: Path, name: str) -> Path:
    """A fresh directory of this profile's user under the session's workdir (the test user can't reach tmp_path)."""
    path = workdir / "library-tests" / f"{name}-{singpy.profile}"
    path.mkdir(parents=True)
    os.chown(path, singpy.uid, singpy.gid)
    return path


def user_env(singpy: Singpy, workdir: Path, name: str) -> tuple[dict[str, str], Path]:
    """An environment with its own remote.yaml directory and cache, and a directory for output files."""
    home = own_dir(singpy, workdir, name)
    config = home / "config"
    config.mkdir()
    os.chown(config, singpy.uid, singpy.gid)
    env = singpy.env(APPTAINER_CONFIGDIR=str(config), SINGPY_CACHEDIR=str(new_cache(singpy, workdir, f"lib-{name}")))
    return env, home


def login(singpy: Singpy, library: LibraryServer, env: dict[str, str], home: Path, token: str = ALICE) -> None:
    tokenfile = home / "token"
    tokenfile.write_text(token + "\n")
    os.chown(tokenfile, singpy.uid, singpy.gid)
    singpy.ok("remote", "add", "--insecure", "--tokenfile", str(tokenfile), "testlib", library.host, env=env)

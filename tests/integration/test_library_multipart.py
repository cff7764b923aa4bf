"""`singpy push` of a large image to a library in parts (scs-library-client's multipart upload), against the
suite's strict library (tests.support.library_uploads), as root and as the unprivileged test user.

The client splits only a file larger than 64 MiB, as the Sylabs client does; the library announces the part
size, which these tests make small (16 MiB: a 65 MiB image goes in 5 parts, the last one short).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Singpy, assert_one_fatal
from tests.support.library_server import LibraryServer, start_library
from tests.support.library_users import ALICE, login, user_env
from tests.support.sifs import siftool_sif

MIB = 1 << 20
PART = 16 * MIB


def large_sif(workdir: Path) -> Path:
    """A runnable busybox SIF made larger than 64 MiB by a generic object of random bytes (siftool adds it)."""
    out = workdir / "library-large.sif"
    if not out.exists():
        blob = workdir / "library-large.bin"
        with open(blob, "wb") as handle:
            for _ in range(65):
                handle.write(os.urandom(MIB))
        tmp = out.with_suffix(".tmp")
        shutil.copyfile(siftool_sif(workdir), tmp)
        subprocess.run(["siftool", "add", "--datatype", "7", str(tmp), str(blob)], check=True,
                       stdout=subprocess.DEVNULL)
        blob.unlink()
        tmp.chmod(0o644)
        tmp.rename(out)
    return out


@pytest.fixture(scope="module")
def library(workdir: Path) -> Iterator[LibraryServer]:
    with start_library(workdir / "library-multipart", tokens={ALICE: "alice"}) as server:
        server.part_size = PART
        yield server


def uploads_of(library: LibraryServer, path: str) -> list[dict[str, Any]]:
    """The multipart uploads the library started for images of the container `path`."""
    images = library.store.containers[path]["images"]
    return [upload for upload in library.multiparts.values() if upload["image"] in images]


def test_a_large_image_goes_in_parts_and_comes_back_whole(singpy: Singpy, library: LibraryServer,
                                                         workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "multipart")
    login(singpy, library, env, home)
    source = large_sif(workdir)
    path = f"alice/large/{singpy.profile}"
    singpy.ok("push", "-U", str(source), f"library://{path}:1.0", env=env, timeout=300)
    [upload] = uploads_of(library, path)
    assert (upload["state"], upload["total"], list(upload["announced"])) == ("completed", 5, [1, 2, 3, 4, 5])
    part_puts = [auth for method, where, auth in library.object_requests
                 if method == "PUT" and where.startswith("/parts/")]
    assert part_puts and all(auth == "" for auth in part_puts)  # the token never went to object storage
    singpy.ok("pull", str(home / "back.sif"), f"library://{path}:1.0", env=env, timeout=300)
    assert (home / "back.sif").read_bytes() == source.read_bytes()


def test_a_refused_part_aborts_the_upload_and_tags_nothing(singpy: Singpy, library: LibraryServer,
                                                          workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "multipart-refused")
    login(singpy, library, env, home)
    path = f"alice/refused/{singpy.profile}"
    library.refuse_part = 3
    try:
        result = singpy.run("push", "-U", str(large_sif(workdir)), f"library://{path}:1.0", env=env, timeout=300)
    finally:
        library.refuse_part = 0
    assert_one_fatal(result, "part 3 of the upload was refused: http://127.0.0.1")
    assert "500 Internal Server Error" in result.stderr
    [upload] = uploads_of(library, path)
    assert (upload["state"], list(upload["announced"])) == ("aborted", [1, 2, 3])
    assert all(not part["path"].exists() for part in upload["stored"].values())
    assert library.store.containers[path]["archTags"] == {}
    pulled = singpy.run("pull", str(home / "none.sif"), f"library://{path}:1.0", env=env)
    assert pulled.returncode != 0 and not (home / "none.sif").exists()
    singpy.ok("push", "-U", str(large_sif(workdir)), f"library://{path}:1.0", env=env, timeout=300)  # again: whole
    assert [upload["state"] for upload in uploads_of(library, path)] == ["aborted", "completed"]


def test_a_library_without_multipart_gets_the_single_upload(singpy: Singpy, library: LibraryServer,
                                                            workdir: Path) -> None:
    env, home = user_env(singpy, workdir, "multipart-none")
    login(singpy, library, env, home)
    path = f"alice/single/{singpy.profile}"
    library.multipart_offered = False
    try:
        singpy.ok("push", "-U", str(large_sif(workdir)), f"library://{path}:1.0", env=env, timeout=300)
    finally:
        library.multipart_offered = True
    assert uploads_of(library, path) == []
    singpy.ok("pull", str(home / "back.sif"), f"library://{path}:1.0", env=env, timeout=300)
    assert (home / "back.sif").read_bytes() == large_sif(workdir).read_bytes()

"""singpy.gpu.sonames: the sonames of a CDI spec's libraries, kept in the cache while the files stay the same."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from singpy.gpu.sonames import sonames
from singpy.host.cachefiles import read_fields, write_fields
from tests.gpu.simhost import build_elf_library

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build shared objects")


def _stats(*paths: Path) -> dict[str, os.stat_result]:
    return {str(path): os.stat(path) for path in paths}


def _kept(cache: Path) -> Path:
    (entry,) = (cache / "cdi-sonames").iterdir()
    return entry


def test_read_then_kept_and_used_while_the_files_are_the_same(tmp_path: Path) -> None:
    one = build_elf_library(tmp_path / "a", "libone.so.1")
    two = build_elf_library(tmp_path / "b", "libtwo.so.2")
    cache = tmp_path / "cache"
    assert sonames(_stats(one, two), str(cache)) == {str(one): "libone.so.1", str(two): "libtwo.so.2"}
    # What is kept is used: an answer changed in the cache file comes back while the identities match.
    entry = _kept(cache)
    fields = read_fields(str(entry))
    assert fields is not None
    fields[1] = "libfrom-cache.so.9"
    write_fields(str(entry), fields)
    assert sonames(_stats(one, two), str(cache))[str(one)] == "libfrom-cache.so.9"


def test_a_replaced_library_is_read_again(tmp_path: Path) -> None:
    library = build_elf_library(tmp_path / "a", "libold.so.1")
    cache = tmp_path / "cache"
    assert sonames(_stats(library), str(cache)) == {str(library): "libold.so.1"}
    newer = build_elf_library(tmp_path / "b", "libnew.so.2")
    os.replace(newer, library)  # a driver update: another file at the same path
    assert sonames(_stats(library), str(cache)) == {str(library): "libnew.so.2"}


def test_no_cache_a_broken_cache_and_odd_files(tmp_path: Path) -> None:
    library = build_elf_library(tmp_path / "a", "libx.so.3")
    fifo = tmp_path / "libfifo.so.1"
    os.mkfifo(fifo)
    text = tmp_path / "libtext.so.1"
    text.write_text("not ELF")
    expected = {str(library): "libx.so.3", str(fifo): None, str(text): None}
    assert sonames(_stats(library, fifo, text), None) == expected  # a FIFO is not opened: nothing waits
    cache = tmp_path / "cache"
    sonames(_stats(library, fifo, text), str(cache))
    _kept(cache).write_bytes(b"garbage")
    assert sonames(_stats(library, fifo, text), str(cache)) == expected
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    assert sonames(_stats(library), str(blocked)) == {str(library): "libx.so.3"}  # can't be written: no error


def test_concurrent_runs_each_get_whole_answers(tmp_path: Path) -> None:
    libraries = [build_elf_library(tmp_path / f"d{index}", f"lib{index}.so.{index}") for index in range(4)]
    cache = tmp_path / "cache"
    results: list[dict[str, str | None]] = []

    def run() -> None:
        for _ in range(20):
            results.append(sonames(_stats(*libraries), str(cache)))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {str(path): f"lib{index}.so.{index}" for index, path in enumerate(libraries)}
    assert results == [expected] * 80
    assert [entry.name for entry in (cache / "cdi-sonames").iterdir() if entry.name.endswith(".partial")] == []

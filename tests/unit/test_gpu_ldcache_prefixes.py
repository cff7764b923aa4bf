"""Reading only the names --nv asks about from the host's ld.so.cache (singpy.gpu.ldcache.parse_ld_so_cache)."""

from __future__ import annotations

import os

import pytest

from singpy.gpu.ldcache import parse_ld_so_cache

SYSTEM_CACHE = "/etc/ld.so.cache"


@pytest.mark.skipif(parse_ld_so_cache(SYSTEM_CACHE) is None, reason="this host's ld.so.cache is not glibc's new format")
@pytest.mark.parametrize("prefixes", [("libc.",), ("libm", "libpthread.so"), ("lib",), ("no-such-library",), (),
                                      ("libc.so.6", "libcrypto", "libm.so", "libz.so.1"), ("", "libz")])
def test_prefixes_keep_exactly_the_matching_names(prefixes: tuple[str, ...]) -> None:
    full = parse_ld_so_cache(SYSTEM_CACHE)
    assert full is not None and "libc.so.6" in full
    expected = {name: paths for name, paths in full.items() if name.startswith(prefixes)}
    assert parse_ld_so_cache(SYSTEM_CACHE, prefixes) == expected


def test_absent_cache_is_none(tmp_path: os.PathLike[str]) -> None:
    assert parse_ld_so_cache(os.path.join(tmp_path, "absent"), ("libc.",)) is None

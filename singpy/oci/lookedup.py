"""A cached image's record, looked up once a run (issue 31).

singpy.oci.tagcheck looks the image up to know whether its tag check is worth sending ahead; pull.cached_image
and oras.cached_sif, a few milliseconds later in the same process, take that lookup instead of making it again.
"""

from __future__ import annotations

from singpy.oci import store

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

_LOOKED_UP: dict[tuple[str, str, str], tuple[Any, str]] = {}


def known(location: str, key: str, platform: str, *, remember: bool = False) -> tuple[Any, str]:
    """What the cache at `location` remembers of image `key` for `platform` (store.recall's record, empty if none)
    and its usable SIF ("" if none). A lookup made to be remembered (`remember`) is always a new one; one
    that is not takes (once) the lookup remembered before, if any."""
    found = None if remember else _LOOKED_UP.pop((location, key, platform), None)
    if found is None:
        record = store.recall(location, key, platform)
        found = record, store.usable_sif(location, record["digest"]) if record else ""
    if remember:
        _LOOKED_UP[(location, key, platform)] = found
    return found

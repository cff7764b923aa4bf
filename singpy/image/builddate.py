"""The date a reproducible image carries: SOURCE_DATE_EPOCH, or with --reproducible the OCI image's creation date.

As Apptainer's: a build (and a pull, which is one) given such a date writes
a SIF that is the same bytes each time: its header has the nil UUID and no
times, the build labels (org.label-schema.build-date,
org.opencontainers.image.created) say that date, and every file in the
squashfs has it as its times, as mksquashfs and tar2sqfs set them from the
variable. `--reproducible` takes the date from the image's config
(`created`), over the variable, as Apptainer's does; the tools then read it
from the variable set to that (Apptainer sets it for mksquashfs too).
"""

from __future__ import annotations

import os
import time

from singpy import console
from singpy.errors import ImageError

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

VARIABLE = "SOURCE_DATE_EPOCH"
_LAST = (1 << 32) - 1  # squashfs keeps 32-bit unsigned times


def wanted(reproducible: bool) -> bool:
    """Whether a SIF made from an OCI image now is a dated one: --reproducible, or SOURCE_DATE_EPOCH set."""
    return reproducible or VARIABLE in os.environ


def from_env(env: Mapping[str, str]) -> int | None:
    """SOURCE_DATE_EPOCH as a number of seconds, None when it is not set; an error when it is not a date."""
    raw = env.get(VARIABLE)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or int(raw) > _LAST:
        raise ImageError(f"{VARIABLE}={raw} is not a date: a number of seconds since 1970, "
                         f"0 to {_LAST}, is expected")
    return int(raw)


def created_seconds(config: Mapping[str, Any]) -> int | None:
    """The image config's `created` (RFC 3339) in seconds, None where it has none a squashfs can hold."""
    from datetime import datetime

    created = config.get("created")
    try:
        when = datetime.fromisoformat(created) if isinstance(created, str) else None
    except ValueError:
        return None
    seconds = int(when.timestamp()) if when is not None and when.tzinfo is not None else -1
    return seconds if 0 <= seconds <= _LAST else None


def of_config(config: Mapping[str, Any], what: str) -> int:
    """`created_seconds`, 0 (1970) with a warning where the image has no such date."""
    seconds = created_seconds(config)
    if seconds is None:
        console.warning(f"{what} has no creation date a squashfs can hold: its reproducible SIF is dated "
                        "1970-01-01")
        return 0
    return seconds


def chosen(reproducible: bool, created: int | None, what: str) -> int | None:
    """The date of this build: with --reproducible the image's creation date (`created`; None where it has
    none, the base of a definition file not an OCI image), else SOURCE_DATE_EPOCH's, else None (now). The
    tools are told through the variable, which they inherit from os.environ."""
    if reproducible and created is not None:
        console.debug(f"{VARIABLE} set to {created}, the creation date of {what}")
        os.environ[VARIABLE] = str(created)
        return created
    seconds = from_env(os.environ)
    if reproducible and seconds is None:
        raise ImageError(f"--reproducible takes the creation date of an OCI image, and {what} has none: set "
                         f"{VARIABLE} to the date to give the image")
    return seconds


def label_time(seconds: int | None) -> time.struct_time:
    """The time the build labels say: that date, or now."""
    return time.gmtime(seconds) if seconds is not None else time.gmtime()

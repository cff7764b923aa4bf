"""When the registry client tries again, and how long it waits first: backoff with jitter, or Retry-After.

429 and 5xx answers and dropped connections are tried again, limits.retries
in all (SINGPY_PULL_RETRIES), after an exponential backoff or the Retry-After
the server asked for (capped at RETRY_AFTER_CAP).
"""

from __future__ import annotations

import random
import time

from singpy.oci.limits import RETRIES

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    import http.client

MAX_TRIES = RETRIES  # the default of limits.retries (SINGPY_PULL_RETRIES)
BACKOFF_BASE = 0.5  # seconds before the 2nd try, doubled for each further one ...
BACKOFF_CAP = 8.0  # ... up to this
RETRY_AFTER_CAP = 60.0  # seconds: a longer Retry-After is shortened to this
RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))


def backoff(tries: int) -> float:
    delay: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(tries, 10))
    return delay + random.uniform(0, delay / 4)  # jitter, so that 32 pulls do not retry in step


def first(asked: float | None, otherwise: float) -> float:
    """The delay the server asked for (0 included), else `otherwise`."""
    return otherwise if asked is None else asked


def retry_after(response: http.client.HTTPResponse) -> float | None:
    """Retry-After in seconds (a number or an HTTP date), capped; None when absent or unreadable."""
    value = (response.getheader("Retry-After") or "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():  # str.isdigit also takes "²", which float() does not
        return min(float(value[:6]), RETRY_AFTER_CAP)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, min(when.timestamp() - time.time(), RETRY_AFTER_CAP))

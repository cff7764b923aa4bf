"""What singpy accepts from a registry: how often it tries, how slow an answer may be, what JSON it parses.

A registry (or whoever sits between it and us) is untrusted. Every pull must end, and every bad
answer must be one error line, so the limits live here, with their defaults and the variables that
change them (docs/pull.md):

* SINGPY_PULL_RETRIES (default 5): attempts of one request after dropped connections, 429 and 5xx;
  for a blob download, attempts in a row that bring no byte beyond the furthest one already had (a
  registry that ignores Range and cuts every answer short restarts a download at most that often);
* SINGPY_PULL_LOW_SPEED (bytes/s, default 1024) over SINGPY_PULL_STALL_TIMEOUT (s, default 60): an
  answer (headers and body) whose bytes arrive slower than that for that long fails at once, as
  curl's --speed-limit/--speed-time (a trickle is not retried: it would trickle again; 0 turns it off);
* SINGPY_PULL_DOCUMENT_TIMEOUT (s, default 120): the whole of one answer that is a small document
  (a manifest, a token, an image config, an error body, a HEAD) and the headers of a blob's answer.

`parse_json` is the one door for JSON from the network: a document too large, nested too deeply
(CPython's parser raises RecursionError near 1000 levels) or not JSON is one ImageError.
"""

from __future__ import annotations

import time

from singpy.errors import ImageError
from singpy.record import Record

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

RETRIES = 5
LOW_SPEED = 1024  # bytes per second ...
STALL_TIMEOUT = 60.0  # ... over this many seconds
DOCUMENT_TIMEOUT = 120.0  # seconds for a whole small answer
MAX_DEPTH = 64  # levels of nesting in a registry's JSON (manifests, configs and tokens have 2 to 5)
_VARIABLES = {"retries": "SINGPY_PULL_RETRIES", "low_speed": "SINGPY_PULL_LOW_SPEED",
              "stall_timeout": "SINGPY_PULL_STALL_TIMEOUT", "document_timeout": "SINGPY_PULL_DOCUMENT_TIMEOUT"}


class Limits(Record):
    """The limits of one pull (see the module's docstring)."""

    retries: int = RETRIES
    low_speed: int = LOW_SPEED
    stall_timeout: float = STALL_TIMEOUT
    document_timeout: float = DOCUMENT_TIMEOUT

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        """The defaults, changed by the SINGPY_PULL_* variables set in `env` (a bad value is an ImageError)."""
        return cls(retries=int(_number(env, "retries", RETRIES, integer=True, least=1)),
                   low_speed=int(_number(env, "low_speed", LOW_SPEED, integer=True, least=0)),
                   stall_timeout=_number(env, "stall_timeout", STALL_TIMEOUT, integer=False, least=0.1),
                   document_timeout=_number(env, "document_timeout", DOCUMENT_TIMEOUT, integer=False, least=0.1))


def _number(env: Mapping[str, str], field: str, default: float, *, integer: bool, least: float) -> float:
    name = _VARIABLES[field]
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = None
    if value is None or not least <= value <= 1e9:  # float("nan") fails this too
        kind = "an integer" if integer else "a number of seconds"
        raise ImageError(f"{name}={text[:40]!r} is not {kind} of at least {least:g}")
    return value


class TooSlow(OSError):
    """An answer broke a time limit; its text says which and names the variable (never retried)."""


class Meter:
    """Watches the bytes of one answer as they arrive: the low-speed rule, and an optional total deadline.

    The low-speed rule is checked on tumbling windows: a window ends early (a new one starts) once it has
    seen `least` bytes; a window that lasts `stall_timeout` seconds with fewer fails.
    """

    __slots__ = ("limits", "least", "start", "count", "deadline")

    def __init__(self, limits: Limits, *, document: bool) -> None:
        now = time.monotonic()
        self.limits = limits
        self.least = int(limits.low_speed * limits.stall_timeout)  # 0: the rule is off
        self.start, self.count = now, 0
        self.deadline: float | None = now + limits.document_timeout if document else None

    def tick(self, read_timeout: float) -> float:
        """How long one read may wait for bytes: a limit is then noticed at most this late."""
        shortest = min(read_timeout, self.limits.stall_timeout, self.limits.document_timeout)
        return max(0.01, shortest / 4)

    def check(self, received: int) -> None:
        """Count `received` bytes (0: a read timed out); raise TooSlow when a limit is broken."""
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            raise TooSlow(f"the answer took more than {self.limits.document_timeout:g} s "
                          "(the limit is SINGPY_PULL_DOCUMENT_TIMEOUT)")
        self.count += received
        if self.count >= self.least:
            self.start, self.count = now, 0
        elif now - self.start >= self.limits.stall_timeout:
            raise TooSlow(f"fewer than {self.least} bytes arrived in {self.limits.stall_timeout:g} s (the limits are "
                          "SINGPY_PULL_LOW_SPEED and SINGPY_PULL_STALL_TIMEOUT)")


def parse_json(data: bytes, what: str, *, limit: int) -> Any:
    """`data` parsed, or one ImageError naming `what` ("the manifest of X from H"): too large, not JSON,
    or nested more than MAX_DEPTH levels."""
    import json

    if len(data) > limit:
        raise ImageError(f"{what} is larger than {limit} bytes")
    try:
        value = json.loads(data)
    except RecursionError:
        raise ImageError(f"{what} is nested too deeply") from None
    except ValueError as error:  # UnicodeDecodeError included
        raise ImageError(f"{what} is not JSON ({str(error)[:80]})") from None
    if _too_deep(value):
        raise ImageError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)")
    return value


def _too_deep(value: object) -> bool:
    """Is `value` nested deeper than MAX_DEPTH? Iterative: the check itself must not recurse."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False

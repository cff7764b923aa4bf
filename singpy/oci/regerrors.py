"""What a registry's failures mean: the typed errors of the registry client, and a registry's JSON error bodies."""

from __future__ import annotations

from singpy.errors import ImageError
from singpy.oci.limits import parse_json

TYPE_CHECKING = False  # see singpy.record: `typing` is not loaded at run time
if TYPE_CHECKING:
    from typing import Any

ERROR_BODY_LIMIT = 1 << 16  # bytes of an error response read for its message


class Unreachable(ImageError):
    """The registry (or the host it sent us to) could not be reached, or kept failing (429/5xx) on every try.

    Distinct from a refusal or a missing image: a cached image may still run (singpy.oci.pull).
    """


class DigestMismatch(ImageError):
    """Bytes that are not what their digest names (singpy.oci.mirrors tells a lying mirror from a down one)."""


class CantWrite(ImageError):
    """The cache could not be written: another endpoint would not help (singpy.oci.mirrors)."""


def error_codes(body: bytes) -> set[str]:
    errors = _errors(body)
    return {code for item in errors if isinstance(code := item.get("code"), str)}


def _errors(body: bytes) -> list[dict[str, Any]]:
    """The `errors` of a registry's error body; [] when it has none or is not JSON (an HTML page, garbage)."""
    try:
        parsed = parse_json(body, "an error response", limit=ERROR_BODY_LIMIT) if body else None
    except ImageError:
        return []
    errors = parsed.get("errors") if isinstance(parsed, dict) else None
    return [item for item in errors if isinstance(item, dict)] if isinstance(errors, list) else []


def detail(body: bytes) -> str:
    """": CODE: message" from a registry's JSON error body, printable and short ("" when there is none)."""
    for item in _errors(body):
        code, message = item.get("code"), item.get("message")
        parts = [part for part in (code, message) if isinstance(part, str) and part]
        if parts:
            text = ": ".join(parts)
            text = "".join(char if char.isprintable() else " " for char in text)[:200]
            return f" ({text})"
    return ""

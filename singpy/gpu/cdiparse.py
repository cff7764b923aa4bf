"""A CDI spec file's text as data: JSON by CPython's C scanner, YAML by singpy.gpu.cdiload.

Whatever the text holds (malformed syntax, a number of 5000 digits, nesting
100000 deep) ends as one GpuError naming the file, never as a traceback.
"""

from __future__ import annotations

from singpy.errors import GpuError


def parse(path: str, text: str) -> object:
    """The data of the spec file `path` holding `text`; one GpuError naming the file (and line) if it is not."""
    try:
        return _parse_text(path, text)
    except RecursionError:  # JSON nested thousands deep (PyYAML's parse is capped: cdiload.MAX_DEPTH)
        raise GpuError(f"malformed CDI spec {path}: nested too deep") from None


def _parse_text(path: str, text: str) -> object:
    if path.endswith(".json"):
        parsed = scan_json(text)
        if parsed is not NOT_PARSED:
            return parsed
        import json  # the fallback, and the message (with its line) for a spec that is not JSON

        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise GpuError(f"malformed CDI spec {path}:{error.lineno}: {error.msg}") from None
        except ValueError:  # a number of more than 4300 digits (sys.get_int_max_str_digits)
            raise GpuError(f"malformed CDI spec {path}: a number too long to read") from None
    from singpy.gpu import cdiload

    try:
        return cdiload.loads(text)
    except cdiload.SpecError as error:
        raise GpuError(f"malformed CDI spec {path}:{error.line}: {error.message}") from None


NOT_PARSED = object()
_JSON_SPACE = " \t\n\r"


class _JsonContext:
    """What CPython's JSON scanner reads from a json.JSONDecoder: its defaults (no hooks, strict strings)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON a CDI spec may hold")


def scan_json(text: str) -> object:
    """json.loads(text) by the C scanner of CPython's `_json` accelerator, or NOT_PARSED.

    That scanner is what json.loads itself runs; importing it alone skips
    the `json` package and the `re` it imports (`python3 -c 'import json'`
    takes ~12 ms more than `pass` here, far more than the parse). Whatever it does not accept (malformed text, a
    Python without `_json`) is left to json.loads, for its verdict and message.
    """
    try:
        from _json import make_scanner

        start = len(text) - len(text.lstrip(_JSON_SPACE))
        # typeshed names the scanner's own class as its argument; any object with a decoder's attributes works
        value, end = make_scanner(_JsonContext())(text, start)  # type: ignore[arg-type]
    except (ImportError, StopIteration, ValueError):  # json.JSONDecodeError is a ValueError
        return NOT_PARSED
    return value if not text[end:].strip(_JSON_SPACE) else NOT_PARSED

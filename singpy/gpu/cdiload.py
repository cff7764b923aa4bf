"""A CDI spec's YAML, read with PyYAML's C parser: any valid YAML, nothing that could mislead.

Imported only when a YAML spec is read (a first `--device` launch, or a
spec that changed: singpy.gpu.cdicache keeps the result), so PyYAML is never
on the start-up path of a cached request. Safe loading only (no tags that
build objects), and three things refused that YAML allows but a spec never
needs, each of which could make what singpy reads differ from what the
spec's author or another CDI reader sees:

* a key given twice in one mapping (YAML says it is an error; PyYAML keeps the last);
* anchors and aliases (shared nodes: an alias bomb expands to billions of entries);
* nesting deeper than `MAX_DEPTH` (a CDI spec is 6 levels deep; PyYAML's constructor recurses).

An integer longer than `MAX_NUMBER` characters (int() raises ValueError past
4300 digits) and a scalar PyYAML can't build (the date 2001-02-30) are a
SpecError too, as is any malformed text.
"""

from __future__ import annotations

MAX_DEPTH = 64
MAX_NUMBER = 64  # characters of an integer: a spec's largest (a device's major) has ~10; int() stops at 4300 digits

TYPE_CHECKING = False  # see singpy.record
if TYPE_CHECKING:
    from typing import Any


class SpecError(Exception):
    """The text is not a YAML document singpy reads: `line` is 1-based (0 when unknown)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


def loads(text: str) -> object:
    """The one YAML document in `text` (None for an empty one)."""
    import yaml

    loader_base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _check_events(yaml.parse(text, Loader=loader_base), yaml)
        return yaml.load(text, Loader=_loader(loader_base, yaml))  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        said = ", ".join(part for part in (error.context, error.problem) if part)
        raise SpecError(mark.line + 1 if mark else 0, said) from None
    except yaml.YAMLError as error:
        raise SpecError(0, str(error)) from None
    except (ValueError, OverflowError) as error:  # a scalar PyYAML can't build: the date 2001-02-30
        raise SpecError(0, f"a value that can't be read ({error})") from None


def _check_events(events: Any, yaml: Any) -> None:
    depth = 0
    for event in events:
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise SpecError(event.start_mark.line + 1, "anchors and aliases are not read in a CDI spec")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(event.start_mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _loader(base: Any, yaml: Any) -> Any:
    class _NoDuplicates(base):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    break  # PyYAML's own check names an unhashable key
                if key in seen:
                    raise SpecError(key_node.start_mark.line + 1, f"the key {key!r} is given twice")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            if len(node.value) > MAX_NUMBER:
                raise SpecError(node.start_mark.line + 1, f"a number longer than {MAX_NUMBER} characters")
            return super().construct_yaml_int(node)

    _NoDuplicates.add_constructor("tag:yaml.org,2002:int", _NoDuplicates.construct_yaml_int)
    return _NoDuplicates

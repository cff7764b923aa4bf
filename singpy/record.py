"""Frozen records: what `dataclasses` gives, without its import cost.

`import dataclasses` pulls in `inspect` and `ast` (about 8 ms here) and each
frozen dataclass compiles generated code when its module is imported; on
the start-up path of `singpy exec` that was a quarter of the launcher's own
time (benchmarks/README.md). A `Record` subclass declares fields as class
annotations with optional defaults, exactly like a keyword-only frozen
dataclass, and type checkers treat it as one through `dataclass_transform`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` itself is not loaded at start-up; mypy treats this name as True
if TYPE_CHECKING:
    from typing import Any, Self, dataclass_transform
else:
    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


_MISSING = object()


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Record:
    """Keyword-only, immutable, compared and hashed by value."""

    __fields__: tuple[str, ...] = ()
    __field_set__: frozenset[str] = frozenset()
    __defaults__: dict[str, object] = {}

    __kw_only__: bool = True

    def __init_subclass__(cls, *, kw_only: bool | None = None) -> None:
        if kw_only is not None:  # otherwise inherited, as a dataclass subclass keeps its base's fields
            cls.__kw_only__ = kw_only
        names = [name for name in cls.__dict__.get("__annotations__", {}) if not name.startswith("__")]
        cls.__fields__ = tuple(dict.fromkeys([*cls.__fields__, *names]))
        cls.__defaults__ = {**cls.__defaults__,
                            **{name: cls.__dict__[name] for name in names if name in cls.__dict__}}
        cls.__field_set__ = frozenset(cls.__fields__)

    def __init__(self, *positional: Any, **values: Any) -> None:
        if positional:
            if self.__kw_only__:
                raise TypeError(f"{type(self).__name__} takes keyword arguments only")
            if len(positional) > len(self.__fields__):
                raise TypeError(f"{type(self).__name__} takes at most {len(self.__fields__)} arguments")
            given_twice = set(self.__fields__[:len(positional)]) & set(values)
            if given_twice:
                raise TypeError(f"{type(self).__name__} got {sorted(given_twice)[0]!r} twice")
            values.update(zip(self.__fields__, positional, strict=False))
        if not self.__field_set__.issuperset(values):
            unknown = set(values) - self.__field_set__
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        merged = {**self.__defaults__, **values}
        if len(merged) != len(self.__fields__):
            missing = next(name for name in self.__fields__ if name not in merged)
            raise TypeError(f"{type(self).__name__} needs a value for {missing!r}")
        # One dict update instead of a __setattr__ per field: records are built by the hundred per launch
        # (a MountSpec per GPU library), and the per-field loop was most of --nv's record cost.
        self.__dict__.update(merged)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__fields__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__fields__)
        return f"{type(self).__name__}({fields})"

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (records are never mutated)."""
        return type(self)(**{**self.as_dict(shallow=True), **changes})

    def as_dict(self, *, shallow: bool = False) -> dict[str, Any]:
        """Fields by name; nested records, tuples and enums converted unless `shallow`."""
        if shallow:
            return {name: getattr(self, name) for name in self.__fields__}
        return {name: _plain(getattr(self, name)) for name in self.__fields__}


def _plain(value: object) -> object:
    if isinstance(value, Record):
        return value.as_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    enum_value = getattr(type(value), "_value2member_map_", None)
    return value.value if enum_value is not None else value  # type: ignore[attr-defined]

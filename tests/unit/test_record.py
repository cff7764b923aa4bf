"""singpy.record.Record: frozen, keyword-only records compared by value (dataclass semantics, without dataclasses)."""

from __future__ import annotations

import enum

import pytest

from singpy.record import Record


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(Record):
    x: int
    y: int = 0
    label: str = "origin"


class Pair(Record, kw_only=False):
    first: str
    second: str = "b"


class Labelled(Point):
    colour: Colour = Colour.RED
    tags: tuple[str, ...] = ()


class PositionalChild(Pair):
    third: int = 3


class Holder(Record):
    point: Point
    points: tuple[Point, ...] = ()
    colours: list[Colour] = []
    mapping: dict[str, object] = {}
    level: Level = Level.LOW
    nothing: None = None


def test_defaults() -> None:
    point = Point(x=1)
    assert (point.x, point.y, point.label) == (1, 0, "origin")
    assert Point.__fields__ == ("x", "y", "label")
    assert Point.__defaults__ == {"y": 0, "label": "origin"}


def test_missing_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Point needs a value for 'x'"):
        Point(y=2)  # type: ignore[call-arg]  # the wrong call is the test


def test_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Point has no field 'z'"):
        Point(x=1, z=3)  # type: ignore[call-arg]  # the wrong call is the test


def test_too_many_positional_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="Pair takes at most 2 arguments"):
        Pair("a", "b", "c")  # type: ignore[call-arg]  # the wrong call is the test


@pytest.mark.parametrize("field", ["x", "y", "label", "other"])
def test_frozen(field: str) -> None:
    point = Point(x=1)
    with pytest.raises(AttributeError, match="Point is frozen"):
        setattr(point, field, 5)
    assert point == Point(x=1)


def test_frozen_against_delete() -> None:
    point = Point(x=1)
    with pytest.raises(AttributeError):
        del point.x


def test_equality_and_hash_by_value() -> None:
    assert Point(x=1, y=2) == Point(x=1, y=2)
    assert Point(x=1, y=2) != Point(x=1, y=3)
    assert hash(Point(x=1, y=2)) == hash(Point(x=1, y=2))
    assert len({Point(x=1), Point(x=1), Point(x=2)}) == 2
    assert {Point(x=1): "a"}[Point(x=1, y=0, label="origin")] == "a"


def test_equality_needs_the_same_type() -> None:
    assert Point(x=1) != Labelled(x=1)
    assert Labelled(x=1) != Point(x=1)
    assert Point(x=1) != (1, 0, "origin")
    assert Pair("a") != PositionalChild("a")


def test_unhashable_field_makes_the_record_unhashable() -> None:
    with pytest.raises(TypeError):
        hash(Holder(point=Point(x=1), mapping={"a": 1}))


def test_repr() -> None:
    assert repr(Point(x=1)) == "Point(x=1, y=0, label='origin')"


def test_replace() -> None:
    point = Labelled(x=1, tags=("a",))
    changed = point.replace(y=5, colour=Colour.BLUE)
    assert changed == Labelled(x=1, y=5, tags=("a",), colour=Colour.BLUE)
    assert type(changed) is Labelled
    assert point == Labelled(x=1, tags=("a",))  # the original is untouched
    assert point.replace() == point
    assert changed.tags is point.tags  # shallow: fields are carried over, not converted


def test_replace_unknown_field() -> None:
    with pytest.raises(TypeError, match="has no field 'nope'"):
        Point(x=1).replace(nope=1)


def test_as_dict_converts_nested_values() -> None:
    holder = Holder(point=Labelled(x=1, tags=("a", "b")), points=(Point(x=2), Point(x=3, label="p")),
                    colours=[Colour.RED, Colour.BLUE], mapping={"c": Colour.BLUE, "p": Point(x=4), "t": (1, 2)},
                    level=Level.HIGH)
    assert holder.as_dict() == {
        "point": {"x": 1, "y": 0, "label": "origin", "colour": "red", "tags": ["a", "b"]},
        "points": [{"x": 2, "y": 0, "label": "origin"}, {"x": 3, "y": 0, "label": "p"}],
        "colours": ["red", "blue"],
        "mapping": {"c": "blue", "p": {"x": 4, "y": 0, "label": "origin"}, "t": [1, 2]},
        "level": 2,
        "nothing": None,
    }
    assert type(holder.as_dict()["level"]) is int


def test_as_dict_shallow_keeps_values() -> None:
    inner = Point(x=1)
    holder = Holder(point=inner, points=(inner,), level=Level.HIGH)
    shallow = holder.as_dict(shallow=True)
    assert shallow["point"] is inner
    assert shallow["points"] == (inner,)
    assert shallow["level"] is Level.HIGH
    assert list(shallow) == list(Holder.__fields__)


def test_positional_construction_for_kw_only_false() -> None:
    assert Pair("a") == Pair(first="a", second="b")
    assert Pair("a", "c") == Pair(first="a", second="c")
    assert Pair("a", second="z") == Pair(first="a", second="z")


def test_subclass_inherits_fields_and_defaults() -> None:
    assert Labelled.__fields__ == ("x", "y", "label", "colour", "tags")
    labelled = Labelled(x=1)
    assert (labelled.x, labelled.y, labelled.label, labelled.colour, labelled.tags) == (1, 0, "origin",
                                                                                        Colour.RED, ())
    with pytest.raises(TypeError, match="Labelled needs a value for 'x'"):
        Labelled(colour=Colour.BLUE)  # type: ignore[call-arg]  # the wrong call is the test
    child = PositionalChild("a", "b", 7)  # type: ignore[call-arg]  # mypy's dataclass view lacks kw_only=False here
    assert (child.first, child.second, child.third) == ("a", "b", 7)
    assert Pair.__fields__ == ("first", "second")  # the parent is unchanged


def test_subclass_can_change_a_default() -> None:
    class Moved(Point):
        y: int = 9

    assert Moved.__fields__ == ("x", "y", "label")
    assert Moved(x=1).y == 9
    assert Point(x=1).y == 0


def test_keyword_only_rejects_positional() -> None:
    with pytest.raises(TypeError):
        Point(1)  # type: ignore[call-arg]  # the wrong call is the test


def test_positional_and_keyword_for_the_same_field() -> None:
    with pytest.raises(TypeError):
        Pair("a", first="b")  # type: ignore[misc]  # the wrong call is the test

"""--runscript-timeout's duration, in Go's syntax as Apptainer reads it (time.ParseDuration)."""

from __future__ import annotations

import pytest

from singpy.errors import UsageError
from singpy.launch.scripttimer import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("1.5h", 5400.0),
                                               ("2m0.5s", 120.5), ("250us", 0.00025), ("1000000ns", 0.001)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "1x", "s", "-1s", "+1s", "0s", "1..5s", ".s", "1s2", "1 s", "1S"])
def test_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--runscript-timeout"):
        parse_duration(text)

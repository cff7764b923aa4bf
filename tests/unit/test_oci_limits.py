"""singpy.oci.limits: the SINGPY_PULL_* limits, the low-speed meter, and the one parser of a registry's JSON."""

from __future__ import annotations

import json
import time

import pytest

from singpy.errors import ImageError
from singpy.oci.limits import MAX_DEPTH, Limits, Meter, TooSlow, parse_json

# --- the limits ----------------------------------------------------------------------------------------------------


def test_defaults_and_variables() -> None:
    assert Limits.from_env({}) == Limits(retries=5, low_speed=1024, stall_timeout=60.0, document_timeout=120.0)
    assert Limits.from_env({"SINGPY_PULL_RETRIES": "2", "SINGPY_PULL_LOW_SPEED": "0",
                            "SINGPY_PULL_STALL_TIMEOUT": "1.5", "SINGPY_PULL_DOCUMENT_TIMEOUT": " 30 "}) == \
        Limits(retries=2, low_speed=0, stall_timeout=1.5, document_timeout=30.0)


@pytest.mark.parametrize(("variable", "value"), [
    ("SINGPY_PULL_RETRIES", "0"), ("SINGPY_PULL_RETRIES", "1.5"), ("SINGPY_PULL_RETRIES", "many"),
    ("SINGPY_PULL_LOW_SPEED", "-1"), ("SINGPY_PULL_STALL_TIMEOUT", "0"), ("SINGPY_PULL_STALL_TIMEOUT", "nan"),
    ("SINGPY_PULL_DOCUMENT_TIMEOUT", "inf"), ("SINGPY_PULL_DOCUMENT_TIMEOUT", "1e99"),
])
def test_a_bad_value_is_one_error_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ImageError) as caught:
        Limits.from_env({variable: value})
    assert caught.value.message.startswith(f"{variable}={value!r} is not")


# --- the meter -----------------------------------------------------------------------------------------------------

QUICK = Limits(retries=1, low_speed=100, stall_timeout=0.2, document_timeout=0.5)


def test_enough_bytes_in_each_window_never_trip_the_low_speed_rule() -> None:
    meter = Meter(QUICK, document=False)
    ends = time.monotonic() + 0.7  # beyond both limits: only the low-speed rule applies to a blob
    while time.monotonic() < ends:
        meter.check(25)  # 20 bytes make a window: each check starts a new one
        time.sleep(0.01)


def test_a_trickle_trips_the_low_speed_rule_and_names_the_variables() -> None:
    meter = Meter(QUICK, document=False)
    with pytest.raises(TooSlow, match="fewer than 20 bytes arrived in 0.2 s.*SINGPY_PULL_LOW_SPEED"):
        for _ in range(100):
            meter.check(1)
            time.sleep(0.02)  # at most 10 bytes a window (sleeps only ever last longer)


def test_a_read_waits_a_quarter_of_the_shortest_limit() -> None:
    meter = Meter(QUICK, document=True)
    assert meter.tick(60.0) == 0.05  # not the 60 s of the socket: a limit is noticed at most 0.05 s late
    assert meter.tick(0.02) == 0.01  # never a busy loop


def test_a_document_has_a_deadline_even_at_full_speed() -> None:
    meter = Meter(QUICK, document=True)
    with pytest.raises(TooSlow, match="took more than 0.5 s.*SINGPY_PULL_DOCUMENT_TIMEOUT"):
        for _ in range(100):
            meter.check(1000)
            time.sleep(0.01)


# --- JSON ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "words"), [
    (b"[" * 100000 + b"]" * 100000, "is nested too deeply"),  # CPython's parser: RecursionError
    (b'{"a": ' * 5000 + b"1" + b"}" * 5000, "is nested too deeply"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), f"more than {MAX_DEPTH} levels"),  # parsed, then refused
    (b"{not json", "is not JSON"), (b"\xff\xfe", "is not JSON"), (b"", "is not JSON"),
    (b"[" + b"1," * 100 + b"1]", "larger than 64 bytes"),
])
def test_bad_json_is_one_error(data: bytes, words: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_json(data, "the manifest of x from h", limit=64 if words.startswith("larger") else 1 << 22)
    assert caught.value.message.startswith("the manifest of x from h ")
    assert words in caught.value.message and "\n" not in caught.value.message


def test_good_json_at_the_depth_limit_is_parsed() -> None:
    value: object = {"innermost": 1}
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    data = json.dumps(value).encode()
    assert parse_json(data, "x", limit=len(data)) == value


def test_a_low_speed_of_zero_turns_the_rule_off() -> None:
    meter = Meter(Limits(low_speed=0, stall_timeout=0.05), document=False)
    time.sleep(0.1)
    meter.check(0)  # a whole window without a byte: no limit broken

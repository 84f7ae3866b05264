"""Result rows are encoded (``gridstream.codec.row_json``) exactly as
``json.dumps(value, default=repr, separators=(",", ":"))`` would, whatever the
value (the fast paths for str and int included); a value read as msgpack is
shown (``gridstream.codec.as_row_value``) exactly as its row's JSON would show
it, without the round trip when JSON would change nothing."""

from __future__ import annotations

import json
import math
import random
from enum import IntEnum
from typing import Any

import pytest

from gridstream.codec import as_row_value, pack, row_json, unpack


class Level(IntEnum):
    LOW = 1


def reference(value: Any) -> str:
    return json.dumps(value, default=repr, separators=(",", ":"))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2FFF)]))
                       for _ in range(rng.randrange(12)))
    if kind == 1:
        return rng.randint(-(2**70), 2**70)
    if kind == 2:
        return rng.choice([0.5, -1e300, float("inf"), float("nan"), 3.0])
    if kind == 3:
        return rng.choice([True, False, None, Level.LOW])
    if kind == 4:
        return rng.choice([b"\x00b", {1, 2}, (1, "a")])
    if kind == 5:
        return rng.randint(-5, 5)
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {str(i): random_value(rng, depth + 1) for i in range(rng.randrange(4))}
    return {rng.randint(0, 9): random_value(rng, depth + 1)}


def test_rows_encode_like_json_dumps() -> None:
    rng = random.Random(11)
    for _ in range(5_000):
        value = random_value(rng)
        assert row_json(value) == reference(value)


def test_a_msgpack_value_is_shown_as_its_json_would_show_it() -> None:
    rng = random.Random(12)
    shown_as_is = 0
    for _ in range(5_000):
        try:
            value = unpack(pack(random_value(rng)))  # what a row read from state holds
        except (TypeError, ValueError, OverflowError):
            continue  # msgpack cannot carry it (a set, an int over 64 bits)
        via_json = json.loads(reference(value))
        shown = as_row_value(value)
        assert reference(shown) == reference(via_json)
        assert same_types(shown, via_json), (value, shown, via_json)
        if shown is value:
            shown_as_is += 1
    assert shown_as_is > 1_000  # most values skip the round trip


def same_types(a: Any, b: Any) -> bool:
    """Equal in structure and type at every level (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same_types, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_types(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def test_only_what_json_would_change_goes_through_json() -> None:
    track = "52.1,13.4;" * 1_000
    assert as_row_value(track) is track
    nested = {"a": [1, 2.5, None, True, {"b": "c"}]}
    assert as_row_value(nested) is nested
    assert as_row_value({1: "x", "y": [b"z"]}) == {"1": "x", "y": ["b'z'"]}


def test_a_value_nested_too_deeply_for_json_is_refused() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        as_row_value(deep)

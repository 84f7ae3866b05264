"""Result rows are encoded (``gridstream.codec.row_json``) exactly as
``json.dumps(value, default=repr, separators=(",", ":"))`` would, whatever the
value (the fast paths for str and int included)."""

from __future__ import annotations

import json
import random
from enum import IntEnum
from typing import Any

from gridstream.codec import row_json


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

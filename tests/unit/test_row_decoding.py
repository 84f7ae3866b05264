"""The state server's row check accepts exactly the values ``json.loads``
accepts, and decodes well-formed blobs to the same rows as before."""

from __future__ import annotations

import json
import random

import pytest

from gridstream.codec import pack
from gridstream.errors import InvalidArgument
from services.stateserver.rows import decode_dead_letters, decode_rows

PIECES = ['"', "\\", "1", "-", ".", "e", "[", "]", "{", "}", ":", ",", " ", "\n", "\t",
          "null", "true", "NaN", "Infinity", "\x01", "\ufeff", "a", "é", '"x"', "0", "2.5e3"]


def valid(value: str) -> bool:
    try:
        json.loads(value)
    except (ValueError, RecursionError):
        return False
    return True


def test_values_are_judged_like_json_loads() -> None:
    rng = random.Random(13)
    candidates = ['"a"', "1", " 1", "1 ", "1 2", "", "[1,]", "{}", "\ufeff1", '"\x01"',
                  "[" * 5000 + "]" * 5000, "NaN", "-Infinity", '{"a": [1, 2.5, null]}']
    candidates += ["".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 8)))
                   for _ in range(20_000)]
    for value in candidates:
        rows = [["k", '"ok"'], ["key", value]]
        if valid(value):
            assert decode_rows(pack(rows), 2) == [("k", '"ok"'), ("key", value)]
        else:
            with pytest.raises(InvalidArgument, match=r"rows\[1\]: json_value"):
                decode_rows(pack(rows), 2)


def test_malformed_entries_are_still_named() -> None:
    for bad, shape in (([["k", "1"], ["k"]], r"rows\[1\] must be"),
                       ([["k", "1"], ["k", 1]], r"rows\[1\] must be \[key: str, json_value"),
                       ([["k", "1"], "k"], r"rows\[1\] must be")):
        with pytest.raises(InvalidArgument, match=shape):
            decode_rows(pack(bad), 2)
    entries = [["id", "stage", "{}", "e"], ["id2", "s", "r", "x"]]
    assert decode_dead_letters(pack(entries), 2) == [tuple(e) for e in entries]
    with pytest.raises(InvalidArgument, match=r"dead_letters\[0\] must be"):
        decode_dead_letters(pack([["id", "stage", "{}"]]), 1)

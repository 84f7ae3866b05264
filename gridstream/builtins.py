"""Functions every job may name without writing code of its own."""

from __future__ import annotations

from typing import Any


def identity(value: Any) -> Any:
    """Keys a record by its own value (wordcount keys each word by itself)."""
    return value


def count(accumulator: int, _value: Any) -> int:
    """A reduce that counts records per key; use with ``initial = 0``."""
    return accumulator + 1


def sum_values(accumulator: float, value: float) -> float:
    """A reduce that sums numeric values per key; use with ``initial = 0``."""
    return accumulator + value


def split_words(line: str) -> list[str]:
    """A flat_map that splits a line of text into lowercase words."""
    return line.lower().split()

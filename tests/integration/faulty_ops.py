"""Operators for the bad-input tests; workers import them by path."""

from __future__ import annotations


def parse_int(text: str) -> int:
    """Raises ValueError on anything that is not an integer."""
    return int(text)


def parity(value: int) -> str:
    """Key: 'even' or 'odd'."""
    return "even" if value % 2 == 0 else "odd"


def add(total: int, value: int) -> int:
    """Sums values per key."""
    return total + value

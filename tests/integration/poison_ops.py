"""Operators whose output makes gridstream's own handling of a record fail
(describing it, hashing its key), for the poison-record tests; workers
import them by path."""

from __future__ import annotations

from typing import Any


class Unprintable:
    """A value whose ``repr`` and ``str`` raise: describing it in a dead
    letter fails."""

    def __repr__(self) -> str:
        raise RuntimeError("this value cannot be described")

    __str__ = __repr__


class UnhashableKey(int):
    """An int key whose hashing (and ``repr``) raises: routing it to a
    partition fails unless gridstream keys by its plain value."""

    def __hash__(self) -> int:
        raise TypeError("this key cannot be hashed")

    def __repr__(self) -> str:
        raise RuntimeError("this key cannot be described")


def parse(text: str) -> Any:
    """An int; for the record ``"unprintable"`` an :class:`Unprintable`, for
    ``"huge"`` an int msgpack cannot carry (2**70: it keys fine, but cannot be
    encoded for the next task)."""
    if text == "huge":
        return 2**70
    return Unprintable() if text == "unprintable" else int(text)


def parity(value: int) -> int:
    """Key 0 or 1 (raising TypeError on an Unprintable); 13's key is an
    :class:`UnhashableKey`."""
    key = value % 2
    return UnhashableKey(key) if value == 13 else key


def add(total: int, value: int) -> int:
    """Sums values per key."""
    return total + value

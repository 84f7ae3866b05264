"""The msgpack wire form of result rows and dead letters, checked strictly.

WriteResults carries rows as one msgpack array instead of one protobuf message
per row (one C call instead of thousands of objects). Because the blob is
opaque to protobuf, this module is where a malformed blob is caught, with a
message saying which entry is wrong and how, before anything is stored.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgpack

from gridstream.codec import pack, unpack
from gridstream.errors import InvalidArgument
from gridstream.validation import short
from services.stateserver.layout import DeadLetter, ResultRow

_ROW_FIELDS = ("key", "json_value")
_LIST_TYPE = frozenset({list})
_STR_TYPE = frozenset({str})
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = (
    json.JSONDecoder().scan_once)  # type: ignore[attr-defined]  # set in __init__, untyped
"""The C scanner behind ``json.loads``, with its defaults (strict)."""
_DEAD_LETTER_FIELDS = ("dead_letter_id", "stage", "record", "error")


def _decode_entries(
    data: bytes, count: int, fields: tuple[str, ...], what: str, count_field: str
) -> list[tuple[str, ...]]:
    """Decodes a msgpack array of fixed-size arrays of strings, or says what is wrong."""
    if not data:
        if count:
            raise InvalidArgument(f"{count_field} is {count} but {what} is empty; "
                                  f"send {count} entries or set {count_field} to 0")
        return []
    try:
        decoded = unpack(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgument(f"{what} is not valid msgpack ({type(exc).__name__}); encode "
                              f"it with gridstream.codec.pack; nothing stored") from None
    shape = "[" + ", ".join(f"{name}: str" for name in fields) + "]"
    if not isinstance(decoded, list):
        raise InvalidArgument(f"{what} must be a msgpack array of {shape} entries, got "
                              f"{type(decoded).__name__}; nothing stored")
    if len(decoded) != count:
        raise InvalidArgument(f"{count_field} is {count} but {what} holds {len(decoded)} "
                              f"entries; set {count_field} to the number sent; nothing stored")
    width = len(fields)
    if (
        _LIST_TYPE.issuperset(map(type, decoded))
        and all(len(entry) == width for entry in decoded)
        and _STR_TYPE.issuperset(map(type, itertools.chain.from_iterable(decoded)))
    ):
        # Every entry well formed (msgpack makes exact lists and strs): checked
        # a batch at a time in C; the loop below only runs to name a bad one.
        return list(map(tuple, decoded))
    entries: list[tuple[str, ...]] = []
    for index, entry in enumerate(decoded):
        if (
            not isinstance(entry, list)
            or len(entry) != len(fields)
            or not all(isinstance(part, str) for part in entry)
        ):
            raise InvalidArgument(f"{what}[{index}] must be {shape}, got {_describe(entry)}; "
                                  "nothing stored")
        entries.append(tuple(entry))
    return entries


def _describe(entry: Any) -> str:
    """A short type description of a bad entry, e.g. ``[int, str]``."""
    if isinstance(entry, list):
        return "[" + ", ".join(type(part).__name__ for part in entry) + "]"
    return type(entry).__name__


def decode_rows(data: bytes, count: int) -> list[ResultRow]:
    """Result rows from WriteResults: a msgpack array of [key, json_value] string
    pairs, each value valid JSON (readers parse what is stored, so a value
    that is not JSON is refused here rather than failing every later read)."""
    rows = _decode_entries(data, count, _ROW_FIELDS, "rows", "row_count")
    scan = _SCAN_ONCE
    for index, (_key, value) in enumerate(rows):
        try:
            # The scanner json.loads runs, without its wrapping: a value it
            # reads to the very end is valid JSON; anything else (surrounding
            # whitespace, an error) is judged by json.loads itself.
            if scan(value, 0)[1] == len(value):
                continue
        except (StopIteration, ValueError, RecursionError):
            pass
        try:
            json.loads(value)
        except (ValueError, RecursionError):
            raise InvalidArgument(f"rows[{index}]: json_value {short(value)} is not valid "
                                  "JSON; nothing stored") from None
    return cast("list[ResultRow]", rows)  # pairs: _decode_entries checked the width


def decode_dead_letters(data: bytes, count: int) -> list[DeadLetter]:
    """Dead letters from WriteResults: a msgpack array of [id, stage, record, error]."""
    return [
        (dl_id, stage, record, error)
        for dl_id, stage, record, error in _decode_entries(
            data, count, _DEAD_LETTER_FIELDS, "dead_letters", "dead_letter_count"
        )
    ]


def encode_entries(entries: Sequence[Sequence[Any]]) -> bytes:
    """The msgpack array of a chunk of rows or dead letters, as ReadResults sends it."""
    return pack(list(entries))  # msgpack writes tuples as arrays


_BIN_HEADER = {0xC4: 2, 0xC5: 3, 0xC6: 5}
"""Length of a msgpack bin's header (bin 8, 16, 32) by its first byte."""


def state_entries_size(data: bytes, count: int) -> int:
    """Checks a PutState chunk as :func:`decode_state_entries` does and
    returns its keys' and values' bytes in all, without making the values
    into objects: what a delta, stored as the chunk came, needs. Values are
    skipped over in C instead of copied out (a taxi job's deltas, tracks of
    about 2 KB: 0.43 against 0.62 ms for 833 entries, 2.5 against 4.8 ms for
    5,000). Anything it does not accept is decoded in full, which refuses it
    with the message naming the bad entry."""
    if data:
        try:
            return _scanned_size(data, count)
        except Exception:  # msgpack raises several unrelated types; named below
            pass
    return sum(len(k) + (0 if v is None else len(v))
               for _, k, v in decode_state_entries(data, count))


def _scanned_size(data: bytes, count: int) -> int:
    """:func:`state_entries_size` of a chunk that is exactly one msgpack
    array of ``count`` entries [stage: str, key: bytes(, value: bytes)],
    the limits those of ``unpack`` on the same bytes; raises otherwise."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(data), raw=False)
    unpacker.feed(data)
    if unpacker.read_array_header() != count:
        raise ValueError("not entry_count entries")
    header, unpack_one = unpacker.read_array_header, unpacker.unpack
    tell, skip = unpacker.tell, unpacker.skip
    size = 0
    for _ in range(count):
        width = header()
        stage, key = unpack_one(), unpack_one()
        if type(stage) is not str or type(key) is not bytes:
            raise ValueError("not [stage: str, key: bytes, ...]")
        size += len(key)
        if width == 3:
            start = tell()
            size -= start + _BIN_HEADER[data[start]]  # KeyError: the value is not bytes
            skip()
            size += tell()
        elif width != 2:
            raise ValueError("not 2 or 3 fields")
    if tell() != len(data):
        raise ValueError("data after the entries")
    return size


def decode_state_entries(data: bytes, count: int) -> list[tuple[str, bytes, bytes | None]]:
    """Entries of a PutState chunk: a msgpack array of [stage, key, value]
    (a key written) or [stage, key] (a key deleted), key and value each the
    msgpack encoding of the key and the value; refused with a message naming
    the bad entry, before anything is stored."""
    if not data:
        if count:
            raise InvalidArgument(f"entry_count is {count} but entries is empty; nothing stored")
        return []
    try:
        decoded = unpack(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise InvalidArgument(f"entries is not valid msgpack ({type(exc).__name__}); nothing "
                              "stored") from None
    if not isinstance(decoded, list) or len(decoded) != count:
        raise InvalidArgument(
            f"entries must be a msgpack array of entry_count ({count}) entries, got "
            f"{len(decoded) if isinstance(decoded, list) else type(decoded).__name__}; "
            "nothing stored")
    out: list[tuple[str, bytes, bytes | None]] = []
    append = out.append
    for index, entry in enumerate(decoded):
        size = len(entry) if isinstance(entry, list) else 0
        if (
            size not in (2, 3)
            or not isinstance(entry[0], str)
            or not isinstance(entry[1], bytes)
            or (size == 3 and not isinstance(entry[2], bytes))
        ):
            raise InvalidArgument(
                f"entries[{index}] must be [stage: str, key: bytes, value: bytes] or "
                f"[stage: str, key: bytes], got {_describe(entry)}; nothing stored")
        append((entry[0], entry[1], entry[2] if size == 3 else None))
    return out

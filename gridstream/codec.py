"""Record batches as one compact payload.

A batch is a msgpack array ``[keys, values]`` (``keys`` nil or one key per
value). Encoding a list of 1,000 values costs one C call, not 1,000 protobuf
messages.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgpack

from gridstream.v1 import common_pb2


class PayloadError(ValueError):
    """A batch payload cannot be decoded or does not match its header."""


def encode_batch(
    values: Sequence[Any], keys: Sequence[Any] | None = None
) -> common_pb2.RecordBatch:
    """Packs values (and optionally their keys) into one RecordBatch."""
    if keys is not None and len(keys) != len(values):
        raise ValueError("keys and values differ in length")
    try:
        # Lists go in as they are (msgpack only reads them): no copy per hop.
        payload = msgpack.packb(
            [None if keys is None else keys if type(keys) is list else list(keys),
             values if type(values) is list else list(values)], use_bin_type=True
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"records must be msgpack-serialisable (str, bytes, int, float, "
                           f"bool, None, list, dict): {exc}") from None
    return common_pb2.RecordBatch(
        encoding=common_pb2.PAYLOAD_ENCODING_MSGPACK_V1, count=len(values), payload=payload
    )


def packed_items(items: list[Any]) -> bytes:
    """The msgpack of a list's items without the array's header: runs packed
    apart join into one batch's array (:func:`batch_of_runs`)."""
    try:
        packed: bytes = msgpack.packb(items, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"records must be msgpack-serialisable (str, bytes, int, float, "
                           f"bool, None, list, dict): {exc}") from None
    return packed[len(_array_header(len(items))):]


def _array_header(count: int) -> bytes:
    """msgpack's header of an array of ``count`` items (the shortest form, as
    ``packb`` writes it)."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def batch_of_runs(count: int, key_runs: list[bytes] | None,
                  value_runs: list[bytes]) -> common_pb2.RecordBatch:
    """The RecordBatch :func:`encode_batch` makes of the records of the runs
    (:func:`packed_items` of consecutive pieces), byte for byte."""
    keys = b"\xc0" if key_runs is None else _array_header(count) + b"".join(key_runs)
    payload = b"".join((b"\x92", keys, _array_header(count), *value_runs))
    return common_pb2.RecordBatch(
        encoding=common_pb2.PAYLOAD_ENCODING_MSGPACK_V1, count=count, payload=payload)


def decode_batch(batch: common_pb2.RecordBatch, payload: bytes | None = None
                 ) -> tuple[list[Any] | None, list[Any]]:
    """Unpacks a RecordBatch into (keys or None, values), checking its header.
    ``payload``, when given, is ``batch.payload`` already read (each read of
    the field copies it)."""
    if batch.encoding != common_pb2.PAYLOAD_ENCODING_MSGPACK_V1:
        raise PayloadError(f"unknown payload encoding {batch.encoding}; use MSGPACK_V1")
    try:
        decoded = msgpack.unpackb(batch.payload if payload is None else payload,
                                  raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise PayloadError(f"payload is not valid msgpack: {type(exc).__name__}") from None
    if (
        not isinstance(decoded, list)
        or len(decoded) != 2
        or not isinstance(decoded[1], list)
        or not (decoded[0] is None or isinstance(decoded[0], list))
    ):
        raise PayloadError("payload must be a msgpack array [keys or nil, values]")
    keys, values = decoded
    if len(values) != batch.count:
        raise PayloadError(f"header says {batch.count} records, payload holds {len(values)}")
    if keys is not None and len(keys) != len(values):
        raise PayloadError("payload has a different number of keys and values")
    return keys, values


_ROW_ENCODER = json.JSONEncoder(default=repr, separators=(",", ":"))
"""What ``json.dumps(value, default=repr, separators=(",", ":"))`` builds on
every call, built once."""
_encode_str = json.encoder.encode_basestring_ascii


def row_json(value: Any) -> str:
    """A result row's stored JSON: ``json.dumps(value, default=repr,
    separators=(",", ":"))`` character for character, without building an
    encoder per row (an exact str or int takes the very C function the
    encoder would call for it)."""
    kind = type(value)
    if kind is str:
        return _encode_str(value)
    if kind is int:
        return int.__repr__(value)
    return _ROW_ENCODER.encode(value)


_JSON_AS_IS = frozenset((str, int, float, bool, type(None)))
"""Types a JSON round trip gives back unchanged (an int: msgpack holds none
beyond 64 bits)."""


def _unchanged_by_json(value: Any) -> bool:
    kind = type(value)
    if kind in _JSON_AS_IS:
        return True
    if kind is list:
        return all(map(_unchanged_by_json, value))
    if kind is dict:
        return all(type(k) is str and _unchanged_by_json(v) for k, v in value.items())
    return False


def as_row_value(value: Any) -> Any:
    """A decoded msgpack value as a reader of its result row's JSON
    (:func:`row_json`, then ``json.loads``) would see it: the value itself
    when JSON would change nothing (text, numbers, lists and text-keyed maps
    of them: the common case, checked without encoding anything), else
    its JSON round trip (a map's int keys become text, bytes their repr).
    Raises ValueError for a value nested too deeply for JSON."""
    try:
        if _unchanged_by_json(value):
            return value
        return json.loads(row_json(value))
    except RecursionError:
        raise ValueError("the value is nested too deeply to be shown as JSON") from None


def pack(obj: Any) -> bytes:
    """msgpack for internal blobs (snapshots, result rows)."""
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    """Inverse of :func:`pack`."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)

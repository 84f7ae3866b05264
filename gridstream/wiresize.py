"""Bounds on the encoded size of the messages that carry records and rows.

Pushes, replications, result writes and the SDK's segments are checked
against byte limits (``worker.max_batch_bytes``, the bytes a coalesced call
may carry, the most a push may hold). ``Message.ByteSize()`` answers
exactly, but the upb runtime answers it by encoding the whole message:
about 1.5 ms per MB, paid again at every hop for the same payload (on a
1,000,000-record taxi job, 58 MB of records, a few percent of the cluster's
CPU). The bounds here read only the payloads' lengths and the short fields:
each is at least the message's encoded size and at most a few dozen bytes
per batch above it, which is all a limit needs. They count the fields
gridstream's protos declare; a message that came from outside is cleared of
unknown fields first (``DiscardUnknownFields``), since those are not
counted. Small messages (tracking reports) keep ``ByteSize()``.
"""

from __future__ import annotations

from gridstream.v1 import common_pb2, stateserver_pb2, worker_pb2

_TAG = 1
"""Bytes of a field's tag: every field counted here is numbered below 16."""

_VARINT = 10
"""Most bytes a varint takes (a 64-bit value, or a negative enum)."""

_LENGTH = 5
"""Most bytes a length prefix takes (a message under 4 GiB)."""

_BATCH_FIELDS = (_TAG + _VARINT) * 2 + (_TAG + _LENGTH) + (_TAG + 8) * 2
"""A RecordBatch without its payload: encoding and count (varints), the
payload's tag and length, ingest time and watermark (doubles)."""

_ENTRY_FIELDS = (_TAG + _VARINT) * 6 + (_TAG + _LENGTH) * 2
"""A Segment or LogEntry without its channel's text and its batch: up to six
integers (task, partition, sequence, root, previous sequence; a LogEntry's
offset) and the channel's and the batch's tags and lengths."""


def text_bytes(text: str) -> int:
    """Bytes ``text`` takes in UTF-8 (its length when ASCII, as ids are)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def batch_bound(batch: common_pb2.RecordBatch, payload: bytes | None = None) -> int:
    """At least the bytes ``batch`` encodes to; ``payload``, when given, is
    ``batch.payload`` already read (each read of the field copies it)."""
    return len(batch.payload if payload is None else payload) + _BATCH_FIELDS


def segment_bound(segment: worker_pb2.Segment | worker_pb2.LogEntry,
                  payload: bytes | None = None) -> int:
    """At least the bytes a Segment or LogEntry encodes to, as an element of
    a repeated field (its own tag and length included); ``payload`` as for
    :func:`batch_bound`."""
    return (_TAG + _LENGTH + _ENTRY_FIELDS + text_bytes(segment.channel)
            + batch_bound(segment.batch, payload))


def push_bound(request: worker_pb2.PushRequest, payloads: list[bytes] | None = None) -> int:
    """At least the bytes ``request`` encodes to. ``payloads``, when given,
    are its segments' payloads already read, in order: a worker reads each
    once, for this bound and for decoding (a 20,000-record taxi payload is
    1.4 MB, and every read of the field copies it)."""
    if payloads is None:
        payloads = [segment.batch.payload for segment in request.segments]
    return (3 * (_TAG + _LENGTH) + _TAG + _VARINT + text_bytes(request.job_id)
            + text_bytes(request.sender)
            + sum(map(segment_bound, request.segments, payloads)))


def replication_bound(request: worker_pb2.ReplicateRequest) -> int:
    """At least the bytes ``request`` encodes to."""
    sequences = sum(2 * (_TAG + _LENGTH) + text_bytes(channel) + _TAG + _VARINT
                    for channel in request.sequences)
    return (2 * (_TAG + _LENGTH) + 7 * (_TAG + _VARINT) + text_bytes(request.job_id)
            + text_bytes(request.primary) + sequences
            + sum(map(segment_bound, request.entries)))


def result_write_bound(request: stateserver_pb2.WriteResultsRequest) -> int:
    """At least the bytes ``request`` encodes to."""
    return (4 * (_TAG + _LENGTH) + 4 * (_TAG + _VARINT) + text_bytes(request.job_id)
            + text_bytes(request.operator_id) + len(request.rows) + len(request.dead_letters))

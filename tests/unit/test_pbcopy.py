"""Messages built by copy (gridstream.pbcopy) equal those built by merge, and
hold copies: changing the source afterwards changes nothing in them."""

from __future__ import annotations

from gridstream.pbcopy import copied, copy_into
from gridstream.v1 import common_pb2, worker_pb2


def _batch(payload: bytes) -> common_pb2.RecordBatch:
    return common_pb2.RecordBatch(encoding=common_pb2.PAYLOAD_ENCODING_MSGPACK_V1,
                                  count=3, payload=payload, ingest_unix_s=12.5)


def test_copied_sets_singular_message_fields_as_a_constructor_does() -> None:
    batch = _batch(b"x" * 300_000)
    built = copied(worker_pb2.LogEntry(offset=7, channel="c", sequence=9, root=4), batch=batch)
    assert built == worker_pb2.LogEntry(offset=7, channel="c", sequence=9, root=4, batch=batch)
    batch.payload = b"changed"
    assert built.batch.payload == b"x" * 300_000


def test_copy_into_appends_copies_in_order() -> None:
    entries = [worker_pb2.LogEntry(offset=n, batch=_batch(bytes([n]) * 1000)) for n in range(3)]
    request = worker_pb2.ReplicateRequest(job_id="j", partition=2)
    copy_into(request.entries, (entry for entry in entries))
    assert request == worker_pb2.ReplicateRequest(job_id="j", partition=2, entries=entries)
    entries[0].offset = 99
    assert [entry.offset for entry in request.entries] == [0, 1, 2]


def test_copy_into_nothing_leaves_the_field_empty() -> None:
    request = worker_pb2.PushRequest(job_id="j")
    copy_into(request.segments, [])
    assert request == worker_pb2.PushRequest(job_id="j")
    assert len(request.segments) == 0

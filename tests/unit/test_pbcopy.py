"""Messages built by copy (gridstream.pbcopy) or written in place into their
parent equal those built by merge, and hold copies: changing the source
afterwards changes nothing in them."""

from __future__ import annotations

from gridstream.codec import encode_batch
from gridstream.pbcopy import copied, copy_into
from gridstream.v1 import common_pb2, worker_pb2
from services.worker.peers import OutSegment
from services.worker.queues import Entry
from services.worker.replication import fill_log_entry, to_log_entry


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


def test_a_pushed_segment_filled_in_place_carries_every_field() -> None:
    """A worker writes its segments straight into the push (OutSegment.fill):
    the same message its constructor would build, and again on a retry."""
    segment = OutSegment(task=2, partition=5, channel="t1/p3", sequence=9, keys=["a", "b"],
                         values=[1, 2], root=77, previous_sequence=8)
    expected = worker_pb2.Segment(task=2, partition=5, channel="t1/p3", sequence=9,
                                  batch=encode_batch([1, 2], ["a", "b"]), root=77,
                                  previous_sequence=8)
    for _ in range(2):  # a retry fills a new request from the same segment
        request = worker_pb2.PushRequest(job_id="j")
        segment.fill(request.segments.add())
        assert list(request.segments) == [expected]


def test_a_replicated_entry_filled_in_place_carries_every_field() -> None:
    batch = _batch(b"y" * 300_000)
    entry = Entry(4, "t0/p1", 12, None, None, batch, root=31, previous_sequence=11)
    expected = worker_pb2.LogEntry(offset=4, channel="t0/p1", sequence=12, batch=batch,
                                   root=31, previous_sequence=11)
    request = worker_pb2.ReplicateRequest(job_id="j")
    fill_log_entry(request.entries.add(), entry)
    assert list(request.entries) == [expected]
    assert to_log_entry(entry) == expected

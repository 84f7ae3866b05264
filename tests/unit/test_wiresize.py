"""The byte bounds that stand in for ``ByteSize()`` on the hot paths
(``gridstream.wiresize``): never below a message's encoded size, whatever its
fields hold, and never far above it, so every limit checked with them still
means what it says."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gridstream import codec
from gridstream.v1 import common_pb2, stateserver_pb2, worker_pb2
from gridstream.wiresize import (
    batch_bound,
    push_bound,
    replication_bound,
    result_write_bound,
    segment_bound,
)
from services.worker.server import WorkerServicer

SLACK_PER_BATCH = 96
"""How far above the encoded size a bound may be, per batch it counts."""

U64 = 2**64 - 1


def text(rng: random.Random) -> str:
    alphabet = ["a", "/", "0", "é", "世", "\U0001f600"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))


def integer(rng: random.Random, top: int) -> int:
    return rng.choice([0, 1, 127, 128, top, rng.randrange(top + 1)])


def fill_batch(batch: common_pb2.RecordBatch, rng: random.Random) -> None:
    batch.encoding = rng.choice([0, 1, -1])  # an unknown negative enum takes ten bytes
    batch.count = integer(rng, 2**32 - 1)
    batch.payload = bytes(rng.choice([0, 1, 200, 70_000]))
    if rng.random() < 0.5:
        batch.ingest_unix_s = rng.random() * 2e9
    if rng.random() < 0.5:
        batch.watermark = -rng.random()


def test_every_bound_is_at_least_the_encoded_size_and_close_to_it() -> None:
    rng = random.Random(3)
    for _ in range(500):
        batch = common_pb2.RecordBatch()
        fill_batch(batch, rng)
        assert batch.ByteSize() <= batch_bound(batch) <= batch.ByteSize() + SLACK_PER_BATCH

        push = worker_pb2.PushRequest(job_id=text(rng), epoch=integer(rng, U64),
                                      sender=text(rng))
        for _ in range(rng.randrange(4)):
            segment = push.segments.add(task=integer(rng, 2**32 - 1),
                                        partition=integer(rng, 2**32 - 1), channel=text(rng),
                                        sequence=integer(rng, U64), root=integer(rng, U64),
                                        previous_sequence=integer(rng, U64))
            fill_batch(segment.batch, rng)
            assert segment.ByteSize() < segment_bound(segment)
        slack = SLACK_PER_BATCH * (len(push.segments) + 1)
        assert push.ByteSize() <= push_bound(push) <= push.ByteSize() + slack
        # A worker passes the payloads it read once; the bound is the same.
        assert push_bound(push, [s.batch.payload for s in push.segments]) == push_bound(push)

        replication = worker_pb2.ReplicateRequest(
            job_id=text(rng), task=integer(rng, 2**32 - 1), partition=integer(rng, 2**32 - 1),
            epoch=integer(rng, U64), primary=text(rng), reset=rng.random() < 0.5,
            base_offset=integer(rng, U64), trim_below=integer(rng, U64),
            sequences={text(rng): integer(rng, U64) for _ in range(rng.randrange(3))})
        for _ in range(rng.randrange(4)):
            entry = replication.entries.add(offset=integer(rng, U64), channel=text(rng),
                                            sequence=integer(rng, U64),
                                            root=integer(rng, U64),
                                            previous_sequence=integer(rng, U64))
            fill_batch(entry.batch, rng)
        slack = SLACK_PER_BATCH * (len(replication.entries) + len(replication.sequences) + 1)
        assert (replication.ByteSize() <= replication_bound(replication)
                <= replication.ByteSize() + slack)

        write = stateserver_pb2.WriteResultsRequest(
            job_id=text(rng), operator_id=text(rng), rows=bytes(rng.choice([0, 9, 70_000])),
            row_count=integer(rng, 2**32 - 1), dead_letters=bytes(rng.choice([0, 300])),
            dead_letter_count=integer(rng, 2**32 - 1), epoch=integer(rng, U64),
            version=integer(rng, U64))
        assert write.ByteSize() <= result_write_bound(write) <= write.ByteSize() + SLACK_PER_BATCH


def length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (tag, varint length, bytes)."""
    out = bytearray([(field << 3 | 2) & 0x7F | 0x80, field >> 4])
    n = len(payload)
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + payload


async def push_accepted(request: worker_pb2.PushRequest,
                        appended: list[common_pb2.RecordBatch]) -> worker_pb2.PushResponse:
    """``request`` through a worker's Push handler whose containers accept and
    commit every segment at once; each appended wire batch goes to ``appended``."""
    async def append(channel: str, sequence: int, keys: Any, values: Any, wait: Any,
                     wire_batch: common_pb2.RecordBatch, **_: Any) -> Any:
        appended.append(wire_batch)

        async def committed() -> bool:
            return True
        return committed

    async def runner_for(*_: Any) -> Any:
        return SimpleNamespace(append=append)

    node = SimpleNamespace(runner_for=runner_for, routing=SimpleNamespace(
        epoch=1, check_reached=lambda *_: None))
    servicer = WorkerServicer(cast(Any, node), max_batch_bytes=1 << 20)
    response: worker_pb2.PushResponse = await servicer.Push(
        request, cast(Any, SimpleNamespace(time_remaining=lambda: None)))
    return response


async def test_a_push_drops_unknown_fields_and_is_sized_by_what_it_keeps() -> None:
    # The bounds count the declared fields only: a push's unknown fields
    # (here 2 MiB of them, at the top and inside its segment) are dropped
    # before it is sized, so they are neither counted nor kept and copied on.
    junk = length_delimited(100, bytes(2 << 20))
    batch = codec.encode_batch(["a record"], None)
    segment = worker_pb2.Segment(partition=0, channel="src/p", sequence=1, batch=batch)
    wire = (worker_pb2.PushRequest(job_id="j").SerializeToString()
            + length_delimited(3, segment.SerializeToString() + junk) + junk)
    request = worker_pb2.PushRequest.FromString(wire)
    assert request.ByteSize() > 4 << 20 > push_bound(request)  # received with the junk
    appended: list[common_pb2.RecordBatch] = []
    response = await push_accepted(request, appended)
    assert list(response.outcomes) == [worker_pb2.SEGMENT_OUTCOME_ACCEPTED]
    assert request.ByteSize() <= push_bound(request) < 1_000
    assert appended[0].ByteSize() == batch.ByteSize()  # kept as it was sent, without the junk


def test_a_bound_and_a_decoding_use_the_payload_they_are_given() -> None:
    # The payload passed in stands for the field, so the field is not read
    # (copied) again: a different payload shows which one was used.
    batch = codec.encode_batch(["one"], None)
    other = codec.encode_batch(["two", "three"], None)
    push = worker_pb2.PushRequest(job_id="j")
    push.segments.add(channel="src/p", sequence=1, batch=batch)
    longer = other.payload + bytes(1_000)
    assert push_bound(push, [longer]) - push_bound(push) == len(longer) - len(batch.payload)
    # batch's header says 1 record; the payload given holds 2.
    with pytest.raises(codec.PayloadError, match="says 1 records, payload holds 2"):
        codec.decode_batch(batch, other.payload)
    assert codec.decode_batch(batch, batch.payload) == (None, ["one"])


async def test_a_push_reads_each_payload_once_for_its_bound_and_its_decoding(
        monkeypatch: Any) -> None:
    from services.worker import server

    bounded: list[bytes] = []
    decoded: list[bytes | None] = []

    def recording_bound(request: worker_pb2.PushRequest,
                        payloads: list[bytes] | None = None) -> int:
        assert payloads is not None, "the handler must pass the payloads it read"
        bounded.extend(payloads)
        return push_bound(request, payloads)

    real_decode = codec.decode_batch

    def recording_decode(batch: common_pb2.RecordBatch, payload: bytes | None = None) -> Any:
        decoded.append(payload)
        return real_decode(batch, payload)

    monkeypatch.setattr(server, "push_bound", recording_bound)
    monkeypatch.setattr(server.codec, "decode_batch", recording_decode)
    request = worker_pb2.PushRequest(job_id="j")
    for sequence, record in ((1, "a"), (2, "b")):
        request.segments.add(partition=0, channel="src/p", sequence=sequence,
                             batch=codec.encode_batch([record], None))
    await push_accepted(request, [])
    assert len(bounded) == len(decoded) == 2
    # The very bytes objects the bound read are the ones decoded: one read each.
    assert all(d is b for d, b in zip(decoded, bounded, strict=True))

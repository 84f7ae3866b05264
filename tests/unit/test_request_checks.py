"""Every field of every request is checked before a servicer runs, members'
requests included: ids by field name, integers at most 2**63-1 (tuple-id
hashes excepted), floats finite, checksums short hex. Pure logic over the
generated messages; the interceptor that applies it is exercised by the
integration tests."""

from __future__ import annotations

import math

import pytest
from google.protobuf.message import Message

from gridstream.errors import InvalidArgument
from gridstream.jobspec import JobSpec, Stage, check_allowed_path, validate
from gridstream.v1 import common_pb2, scheduler_pb2, stateserver_pb2, worker_pb2
from gridstream.validation import (
    _KNOWN_GOOD_MAX,
    _PATH_IDS,
    MAX_WIRE_INTEGER,
    _passes,
    _plan_of,
    check_request,
)

TOO_BIG = 2**64 - 1


def refusal(message: Message) -> str:
    """The message of the InvalidArgument a request is refused with."""
    with pytest.raises(InvalidArgument) as info:
        check_request(message)
    return str(info.value)


def test_what_members_send_passes() -> None:
    """A request as workers build it, with a full-range tuple id as root."""
    check_request(worker_pb2.PushRequest(
        job_id="wordcount-1a2b3c4d", epoch=7, sender="worker-2", segments=[worker_pb2.Segment(
            task=1, partition=3, channel="t0/p2", sequence=MAX_WIRE_INTEGER, root=TOO_BIG,
            previous_sequence=4)]))
    check_request(worker_pb2.ReplicateRequest(
        job_id="j-1", primary="worker-1", epoch=3, sequences={"src/producer": 9, "t0/p1": 2},
        entries=[worker_pb2.LogEntry(offset=1, channel="src/p", sequence=1,
                                           root=TOO_BIG)]))
    check_request(stateserver_pb2.PutSnapshotRequest(meta=stateserver_pb2.SnapshotMeta(
        job_id="j-1", operator_id="j-1/t1/p0", window=1 << 40, checksum="0123456789abcdef")))
    check_request(scheduler_pb2.RegisterRequest(node_id="worker-1", address="127.0.0.1:7401",
                                                incarnation="5f0e"))


TOO_BIG_INTEGERS = [
    (worker_pb2.PushRequest(job_id="j", epoch=TOO_BIG), "epoch"),
    (worker_pb2.PushRequest(job_id="j", segments=[worker_pb2.Segment(
        channel="src/x", sequence=2**63)]), "segments[0].sequence"),
    (worker_pb2.ReplicateRequest(job_id="j", primary="w", trim_below=TOO_BIG), "trim_below"),
    (worker_pb2.ReplicateRequest(job_id="j", primary="w", sequences={"t0/p0": TOO_BIG}),
     "sequences['t0/p0']"),
    (worker_pb2.FetchContainerRequest(job_id="j", epoch=TOO_BIG), "epoch"),
    (worker_pb2.TrackRequest(job_id="j", sequence=TOO_BIG), "sequence"),
    (scheduler_pb2.HeartbeatRequest(node_id="w", incarnation="i", snapshot_bytes=TOO_BIG),
     "snapshot_bytes"),
    (stateserver_pb2.WriteResultsRequest(job_id="j", operator_id="j/t1/p0", version=TOO_BIG),
     "version"),
    (stateserver_pb2.StateChunk(meta=stateserver_pb2.SnapshotMeta(job_id="j", size=TOO_BIG)),
     "meta.size"),
    (stateserver_pb2.ReadOperatorRequest(job_id="j", operator_id="j/t0/p0",
                                         after_version=TOO_BIG), "after_version"),
]


@pytest.mark.parametrize(("message", "field"), TOO_BIG_INTEGERS)
def test_integers_above_the_signed_range_are_refused(message: Message, field: str) -> None:
    assert refusal(message).startswith(f"{field} is ")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_floats_must_be_finite(value: float) -> None:
    request = scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="j", tracking_timeout_s=value))
    assert "spec.tracking_timeout_s" in refusal(request)


BAD_IDS = [
    (worker_pb2.ReplicateRequest(job_id="j", primary="../../etc"), "primary"),
    (worker_pb2.PushRequest(job_id="j", sender="w" * 10_000), "sender"),
    (worker_pb2.ReplicateRequest(job_id="j", primary="w", entries=[
        worker_pb2.LogEntry(channel="t0/../p1")]), "entries[0].channel"),
    (worker_pb2.ReplicateRequest(job_id="j", primary="w", sequences={"a//b": 1}),
     "sequences key"),
    (worker_pb2.ReplicateRequest(job_id="j", primary="w", sequences={"": 1}),
     "sequences key"),
    (worker_pb2.TrackRequest(job_id="j", reporter="x/ü"), "reporter"),
    (worker_pb2.TrackRequest(job_id="j", node_id=".."), "node_id"),
    (scheduler_pb2.GetRoutingTableRequest(job_ids=["ok", "no way"]), "job_ids[1]"),
    (scheduler_pb2.RegisterRequest(node_id="w", address="host:99999"), "address"),
    (stateserver_pb2.PutSnapshotRequest(meta=stateserver_pb2.SnapshotMeta(
        job_id="j", operator_id="j/t0/p0", checksum="f" * 100_000)), "meta.checksum"),
    (stateserver_pb2.DigestRequest(job_id="j" * 100_000), "job_id"),
]


@pytest.mark.parametrize(("message", "field"), BAD_IDS)
def test_ids_are_checked_in_every_field_and_echoed_short(message: Message, field: str) -> None:
    text = refusal(message)
    assert text.startswith(f"{field} ")
    assert len(text) < 300


def test_empty_ids_are_left_to_the_servicer() -> None:
    """Which ids a call needs is the servicer's to say (Digest takes no job)."""
    check_request(stateserver_pb2.DigestRequest())
    check_request(worker_pb2.TrackRequest(job_id="j"))


def test_job_names_and_import_paths_are_echoed_short() -> None:
    huge = "n" * 100_000
    with pytest.raises(InvalidArgument) as info:
        validate(JobSpec(huge, (Stage("s", "sink"),)))
    assert len(str(info.value)) < 300
    with pytest.raises(InvalidArgument) as info:
        validate(JobSpec("j", (Stage(huge + "?", "sink"),)))
    assert len(str(info.value)) < 300
    long_path = "gridstream.builtins" + ".x" * 200 + ":f"
    with pytest.raises(InvalidArgument, match="at most 256"):
        validate(JobSpec("j", (Stage("m", "map", long_path), Stage("s", "sink"))))
    with pytest.raises(InvalidArgument, match="not an import path"):
        check_allowed_path(long_path, "stage m")


def fast_path_passes(message: Message) -> bool:
    """What the compiled plan alone (no field names) says of a request."""
    return _passes(message, _plan_of(message.DESCRIPTOR))


@pytest.mark.parametrize(("message", "field"), [
    *TOO_BIG_INTEGERS, *BAD_IDS,
    (scheduler_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(name="j", tracking_timeout_s=math.nan)),
     "spec.tracking_timeout_s"),
])
def test_the_compiled_plan_refuses_what_the_named_walk_refuses(message: Message,
                                                               field: str) -> None:
    """A valid request is decided by the plan alone (the named walk runs only
    to explain a refusal): the plan must see every wrong field itself."""
    assert not fast_path_passes(message), field


def test_the_compiled_plan_passes_what_members_send_without_the_named_walk() -> None:
    segments = [worker_pb2.Segment(task=1, partition=p, channel=f"j-1/t0/p{p}", sequence=p + 1,
                                   root=TOO_BIG, batch=common_pb2.RecordBatch(
                                       payload=b"\xff" * 10, ingest_unix_s=1.7e9))
                for p in range(12)]
    assert fast_path_passes(worker_pb2.PushRequest(job_id="j-1", epoch=7, sender="worker-2",
                                                   segments=segments))
    assert fast_path_passes(worker_pb2.ReplicateManyRequest(requests=[worker_pb2.ReplicateRequest(
        job_id="j-1", primary="worker-1", sequences={"src/producer": 9}, entries=[
            worker_pb2.LogEntry(offset=1, channel="src/p", sequence=1, root=TOO_BIG)])]))


def test_ids_remembered_as_valid_stay_bounded_and_a_bad_one_is_never_remembered() -> None:
    for n in range(_KNOWN_GOOD_MAX + 10):
        assert fast_path_passes(worker_pb2.TrackRequest(job_id="j", reporter=f"j/t0/p{n}"))
    assert len(_PATH_IDS._good) <= _KNOWN_GOOD_MAX
    for _ in range(2):  # refused the second time too: a refusal is not remembered
        assert not fast_path_passes(worker_pb2.TrackRequest(job_id="j", reporter="j/../p1"))

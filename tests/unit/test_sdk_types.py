"""The SDK's typed answers: conversion from the protocol's messages, enums
that print by name and still equal the wire values, and the stored form of
dead letters (JSON records, bounded tracebacks, never raising)."""

from __future__ import annotations

import json
import pickle
from typing import Any

from gridstream import deadletters
from gridstream.jobspec import JobSpec, Stage
from gridstream.types import (
    ClusterStatus,
    DeadLetter,
    JobInfo,
    JobProgress,
    JobState,
    MemberRole,
    MemberState,
    RoutingTable,
)
from gridstream.v1 import common_pb2, scheduler_pb2

SPEC = JobSpec("wc", (Stage("split", "flat_map", "gridstream.examples.wordcount:split"),
                      Stage("count", "reduce", "gridstream.builtins:count",
                            key="gridstream.builtins:identity", initial=0),
                      Stage("store", "sink")), partitions=4)


def test_job_info_is_a_dataclass_with_an_enum_state_and_the_submitted_spec() -> None:
    info = JobInfo.from_proto(common_pb2.JobInfo(
        job_id="j1", spec=SPEC.to_proto(), state=common_pb2.JOB_STATE_RUNNING,
        submitted_at=12.5))
    assert info.state is JobState.RUNNING
    assert info.state == common_pb2.JOB_STATE_RUNNING == 1  # old callers keep working
    assert str(info.state) == "JobState.RUNNING" and f"{info.state}" == "JobState.RUNNING"
    assert f"{info.state:d}" == "1" and info.state.label == "running"
    assert info.spec == SPEC and info.spec.partitions == 4
    assert {1: "running"}.get(info.state) == "running"  # hashes as its int
    assert pickle.loads(pickle.dumps(info)) == info
    assert not hasattr(info, "SerializeToString")


def test_progress_converts_every_task_field_and_repeated_fields_become_lists() -> None:
    task = common_pb2.TaskProgress(task=1, partition=2, records_in=10, records_processed=9,
                                   node_id="worker-1", losses=["a", "b"], roots_abandoned=3)
    progress = JobProgress.from_proto(scheduler_pb2.JobProgress(
        job_id="j", tasks=[task], drained=True, epoch=7, losses=["x"], moved=["m"]))
    assert progress.drained and progress.epoch == 7
    assert progress.losses == ["x"] and progress.moved == ["m"]
    (converted,) = progress.tasks
    assert isinstance(progress.tasks, list) and isinstance(converted.losses, list)
    # Every field of the message is a field of the dataclass, with its value.
    for field in common_pb2.TaskProgress.DESCRIPTOR.fields:
        expected = getattr(task, field.name)
        got = getattr(converted, field.name)
        assert (list(expected) if field.name == "losses" else expected) == got, field.name


def test_status_and_routing_table_convert_members_events_and_jobs() -> None:
    member = scheduler_pb2.Member(node_id="worker-1", role=scheduler_pb2.MEMBER_ROLE_WORKER,
                                  address="127.0.0.1:1", state=scheduler_pb2.MEMBER_STATE_ALIVE)
    status = ClusterStatus.from_proto(scheduler_pb2.ClusterStatus(
        epoch=3, members=[scheduler_pb2.MemberStatus(member=member, phi=0.5)],
        events=[scheduler_pb2.MemberEvent(node_id="worker-1", new_state=3, at=1.0)],
        jobs=[common_pb2.JobInfo(job_id="j", spec=SPEC.to_proto(), state=2)]))
    assert status.members[0].member.role is MemberRole.WORKER
    assert status.members[0].member.state is MemberState.ALIVE
    assert status.events[0].new_state is MemberState.DEAD
    assert status.events[0].old_state is MemberState.UNSPECIFIED
    assert status.jobs[0].state is JobState.CANCELLED
    assert "worker-1" in [m.member.node_id for m in status.members]
    table = RoutingTable.from_proto(scheduler_pb2.RoutingTable(
        epoch=5, members=[member], jobs=[scheduler_pb2.JobRouting(
            job_id="j", partitions=4, owners=["worker-1"] * 4, spec=SPEC.to_proto())]))
    assert table.jobs[0].owners == ["worker-1"] * 4 and table.jobs[0].spec == SPEC
    assert "worker-1" in table.jobs[0].owners


def test_a_value_from_a_newer_cluster_is_kept_not_refused() -> None:
    state = MemberState.of(9)
    assert state == 9 and str(state) == "MemberState.UNKNOWN_9"
    info = JobInfo.from_proto(common_pb2.JobInfo(job_id="j", state=3))
    assert info.state is JobState.FAILED and info.spec.stages == ()


def test_a_dead_letter_keeps_the_record_as_json_and_the_traceback() -> None:
    def parse(text: str) -> int:
        return int(text)

    try:
        parse("x")
    except ValueError as exc:
        error = deadletters.encode_error(exc)
    letter = DeadLetter.from_stored("b:parse:0", "parse",
                                    deadletters.encode_record("k", {"a": [1, 2]}), error)
    assert (letter.key, letter.record, letter.record_format) == ("k", {"a": [1, 2]}, "json")
    assert letter.error == "ValueError: invalid literal for int() with base 10: 'x'"
    assert letter.traceback.startswith("Traceback (most recent call last)")
    assert "in parse" in letter.traceback
    assert json.loads(json.dumps(letter.to_json()))["record"] == {"a": [1, 2]}


def test_a_record_json_cannot_carry_is_stored_as_its_repr() -> None:
    for value in ({1, 2}, b"\x00", float("nan"), object()):
        letter = DeadLetter.from_stored("i", "s", deadletters.encode_record(None, value), "")
        assert letter.record_format == "repr" and isinstance(letter.record, str), value


def test_dead_letters_stay_bounded_and_encoding_never_raises() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

        def __str__(self) -> str:
            raise RuntimeError("no str")

    class HostileError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    def recurse(n: int) -> int:
        return recurse(n + 1)

    try:
        recurse(0)
    except RecursionError as exc:
        deep = deadletters.encode_error(exc)
    assert len(deep) < deadletters.TRACEBACK_LIMIT + deadletters.TEXT_LIMIT + 100
    assert DeadLetter.from_stored("i", "s", "", deep).traceback.rstrip().endswith(
        "maximum recursion depth exceeded")
    huge = deadletters.encode_record(None, "x" * 1_000_000)
    assert len(huge) <= deadletters.TEXT_LIMIT + 50
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    assert json.loads(deadletters.encode_record(None, nested))["repr"]
    assert "unprintable" in deadletters.encode_record(None, Hostile())
    assert json.loads(deadletters.encode_error(HostileError()))["error"] == "HostileError"
    json.loads(deadletters.encode_record(None, "\ud800"))  # a lone surrogate


def test_dead_letters_stored_before_the_json_form_still_read() -> None:
    letter = DeadLetter.from_stored("i", "parse", "'seven'", "ValueError: bad")
    assert (letter.record, letter.record_format, letter.error, letter.traceback) == (
        "'seven'", "repr", "ValueError: bad", "")

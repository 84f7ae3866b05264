"""Processing-time ticks (services.worker.ticks): a tick is numbered after
the ticks the container holds, also after a restore from a log copy or a
snapshot's sequences, so a repeat is dropped as a duplicate; the earliest
pending processing-time timer is known after a restore too; a tick (an empty
batch carrying its time) fires the due timers, the same on a replay; and a
tick's tree is outside tuple tracking."""

from __future__ import annotations

import math
from typing import Any

from gridstream import codec
from gridstream.examples import wordcount
from gridstream.ids import UNTRACKED_ROOT, tuple_id
from gridstream.taskplan import plan_graph
from services.worker.operators import DELETED, OperatorChain
from services.worker.queues import JobContainer
from services.worker.ticks import (
    earliest_timer,
    next_tick_sequence,
    tick_channel,
    tick_due,
    timed_steps,
)
from services.worker.tracking import TaskTracking
from tests.integration import timer_ops


async def test_ticks_are_numbered_after_the_log_and_a_repeat_is_a_duplicate() -> None:
    container = JobContainer("c", 100)
    channel = tick_channel(3)
    assert next_tick_sequence(container.sequences(), 3) == 1
    for _ in range(3):
        sequence = next_tick_sequence(container.sequences(), 3)
        assert (await container.append(channel, sequence, None, []))[0]
        await container.append("t0/p1", sequence * 10, ["k"], [1])
    assert next_tick_sequence(container.sequences(), 3) == 4
    # A new owner restores the log copy: it goes on from there...
    copy = JobContainer("c", 100)
    copy.restore(container.base_offset, {}, container.retained(), consumed=2)
    assert next_tick_sequence(copy.sequences(), 3) == 4
    assert not (await copy.append(channel, 3, None, []))[0]  # the old owner's: a duplicate
    # ...and from a snapshot's sequences when the ticks were trimmed.
    trimmed = JobContainer("c", 100)
    trimmed.restore(6, container.sequences_below(6), [], consumed=6)
    assert next_tick_sequence(trimmed.sequences(), 3) == 4
    assert next_tick_sequence(trimmed.sequences(), 2) == 1  # each partition its own


def chain() -> OperatorChain:
    job = timer_ops.quiet_counts(partitions=1).job().with_defaults(1, 1)
    timed = [t for t in plan_graph(job).tasks if any(s.name == "counts" for s in t.stages)]
    return OperatorChain(list(timed[0].stages), "test")


def run(target: OperatorChain, records: list[dict[str, Any]], at: float,
        batch_id: str) -> list[Any]:
    keys = [timer_ops.key_of(r) for r in records]
    return sorted(codec.row_json(v) for v in
                  target.process(keys, records, batch_id, None, at).sink_rows.values())


def saved_entries(saved: dict[str, dict[Any, Any]]) -> list[list[Any]]:
    entries = [[stage, k] if v is DELETED else [stage, k, v]
               for stage, state in saved.items() for k, v in state.items()]
    return list(codec.unpack(codec.pack(entries)))


def test_the_earliest_processing_timer_is_known_also_after_a_restore() -> None:
    first = chain()
    steps = timed_steps(first.windows)
    assert len(steps) == 1
    assert earliest_timer(steps) == math.inf  # no timer yet: no tick
    run(first, [{"k": "a"}, {"k": "b"}], 100.0, "b1")
    run(first, [{"k": "a"}], 100.2, "b2")  # a's timer moves to 100.7
    assert earliest_timer(steps) == 100.5  # b's
    restored = chain()
    restored.apply_entries(saved_entries(first.capture_full()))
    assert earliest_timer(timed_steps(restored.windows)) == 100.5
    assert not tick_due(100.49, 100.5, 0)
    assert not tick_due(100.6, 100.5, 1)  # a batch (or a tick) is queued: no tick
    assert tick_due(100.6, 100.5, 0)
    # A tick: no records, its time recorded. It fires b only, then a later.
    assert run(restored, [], 100.6, "tick1") == [
        codec.row_json({"key": "b", "count": 1, "due": 100.5, "fired_at": 100.6})]
    assert earliest_timer(timed_steps(restored.windows)) == 100.7
    assert run(restored, [], 100.8, "tick2") == [
        codec.row_json({"key": "a", "count": 2, "due": 100.7, "fired_at": 100.8})]
    assert earliest_timer(timed_steps(restored.windows)) == math.inf
    # The first owner's replay of the same ticks fires the same timers.
    assert run(first, [], 100.6, "tick1") + run(first, [], 100.8, "tick2") == [
        codec.row_json({"key": "b", "count": 1, "due": 100.5, "fired_at": 100.6}),
        codec.row_json({"key": "a", "count": 2, "due": 100.7, "fired_at": 100.8})]


def test_a_chain_without_a_timed_stage_has_no_ticker() -> None:
    job = wordcount.job().with_defaults(2, 1)
    for task in plan_graph(job).tasks:
        assert timed_steps(OperatorChain(list(task.stages), "test").windows) == []


def test_a_ticks_tree_is_not_tracked() -> None:
    for is_source in (True, False):
        tracking = TaskTracking(is_source=is_source)
        tracking.retain(0, UNTRACKED_ROOT)
        tracking.processed(0, tuple_id(1, 0, tick_channel(0), 1), [123])
        assert not tracking.pending and not tracking.registrations()
        assert not tracking.unreported and tracking.keep_from() is None
        tracking.retain(1, 77)  # any other batch is
        assert tracking.keep_from() == 1

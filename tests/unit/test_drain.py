"""The drain rule, on hand-made counters."""

from __future__ import annotations

import itertools
from typing import Any

from gridstream import control
from gridstream.examples import wordcount
from gridstream.v1 import common_pb2, scheduler_pb2
from services.scheduler.progress import drain_verdict

SPEC = wordcount.job(partitions=2)


def idle(task: int, partition: int, records: int = 10, out: int = 0) -> common_pb2.TaskProgress:
    return common_pb2.TaskProgress(task=task, partition=partition, records_in=records,
                                   records_processed=records, records_out=out)


def test_idle_everywhere_is_drained_even_after_tasks_moved() -> None:
    # Task 1 partition 0 restarted on another worker: its counters began again,
    # so task 0's output no longer adds up to task 1's input; still drained.
    entries = [idle(0, 0, out=30), idle(0, 1, out=30), idle(1, 0, records=3), idle(1, 1, 30)]
    assert drain_verdict(SPEC, entries).drained


def test_work_anywhere_means_not_drained() -> None:
    base = [idle(0, 0), idle(0, 1), idle(1, 0), idle(1, 1)]
    for field in ("queue_batches", "outbound_pending", "persist_pending"):
        entries = [*base[:-1], common_pb2.TaskProgress(task=1, partition=1, **{field: 1})]
        verdict = drain_verdict(SPEC, entries)
        assert not verdict.drained and "task 1 partition 1" in verdict.reason
    behind = [*base[:-1], common_pb2.TaskProgress(task=1, partition=1, records_in=5,
                                                   records_processed=4)]
    assert "processed 4 of 5" in drain_verdict(SPEC, behind).reason


def test_missing_or_doubled_entries_mean_not_drained() -> None:
    assert "has not reported" in drain_verdict(SPEC, [idle(0, 0), idle(0, 1), idle(1, 0)]).reason
    doubled = [idle(0, 0), idle(0, 1), idle(1, 0), idle(1, 1), idle(1, 1)]
    assert "reported twice" in drain_verdict(SPEC, doubled).reason


def test_pending_tuple_trees_hold_an_exactly_once_drain_only() -> None:
    pending = common_pb2.TaskProgress(task=0, partition=1, records_in=10,
                                      records_processed=10, roots_pending=1)
    entries = [idle(0, 0), pending, idle(1, 0), idle(1, 1)]
    assert "1 tuple trees not complete" in drain_verdict(SPEC, entries).reason
    at_least_once = wordcount.job(partitions=2, delivery="at_least_once")
    assert drain_verdict(at_least_once, entries).drained


class _Clock:
    """Fake time for the drain's pacing: sleeping advances it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.asked_at: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_a_drain_asks_often_at_first_then_less_often(monkeypatch: Any) -> None:
    """Most drains end within a few tenths of a second: asking often then
    returns sooner; a long drain asks less often."""
    clock = _Clock()
    monkeypatch.setattr(control.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(control.asyncio, "sleep", clock.sleep)

    class Calls(control.ControlCalls):
        async def progress_message(self, job_id: str, flush: bool = False
                                   ) -> scheduler_pb2.JobProgress:
            clock.asked_at.append(clock.now)
            return scheduler_pb2.JobProgress(job_id=job_id, drained=clock.now >= 1.5,
                                             tasks=[idle(0, 0)])

    await Calls().drain("job-1", timeout_s=10.0)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(clock.asked_at)]
    fast = [g for t, g in zip(clock.asked_at, gaps, strict=False) if t < 0.9]
    slow = [g for t, g in zip(clock.asked_at, gaps, strict=False) if 1.1 < t < 1.5]
    assert set(fast) == {control.DRAIN_POLL_S}
    assert set(slow) == {control.DRAIN_SLOW_POLL_S}
    assert gaps[-1] == 0  # the first drained answer is confirmed at once

"""A source task's registrations ride with its next report instead of a
message per accepted batch (services/worker/tracking.py,
REGISTRATION_LINGER_S): the report after a durable window carries every
registration waiting, and registrations no report comes for go on their own
once they have waited the linger."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from gridstream.jobspec import JobSpec, Stage, plan_tasks
from services.worker import tasks as tasks_module
from services.worker.tasks import TaskRunner
from services.worker.tracking import TaskTracking

SPEC = JobSpec(
    "t", (Stage("same", "map", "gridstream.builtins:identity"), Stage("store", "sink")),
    partitions=1, window_size=1_000, delivery="exactly_once")

LINGER_S = 0.3


class Reports:
    """Stands in for the worker's TrackingReporter: records each report."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, list[int]]] = []
        self.arrived = asyncio.Event()

    async def report(self, job_id: str, partition: int, reporter: str, sequence: int,
                     roots: list[int], values: list[int]) -> None:
        self.sent.append((time.monotonic(), list(roots)))
        self.arrived.set()


def source_runner(reports: Reports) -> TaskRunner:
    """The job's source task, tracked, reporting to ``reports``; no window
    closes by itself (no test waits for the flush timer)."""
    none = cast(Any, None)
    return TaskRunner("j", SPEC, plan_tasks(SPEC), 0, 0, "worker-1", none, none, none,
                      max_records=1_000, batch_records=100, backup_count=0,
                      reporter=cast(Any, reports), tracking_flush_s=3600)


async def accept(runner: TaskRunner, first: int, count: int) -> None:
    """Appends ``count`` batches, letting the report loop run after each (a
    loop that reported every registration at once would do so here)."""
    for sequence in range(first, first + count):
        commit = await runner.append("src/c", sequence, None, [f"r{sequence}"], 5.0)
        assert await commit()
        for _ in range(3):
            await asyncio.sleep(0)


@pytest.fixture(autouse=True)
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks_module, "REGISTRATION_LINGER_S", LINGER_S)


async def test_registrations_wait_for_the_report_of_a_durable_window() -> None:
    reports = Reports()
    runner = source_runner(reports)
    assert runner.tracking is not None
    runner.ready.set()
    loop = asyncio.create_task(runner._report_loop())
    try:
        accepted_at = time.monotonic()
        await accept(runner, 1, 5)
        runner._durable(0)  # a window became durable: the task reports now
        await asyncio.wait_for(reports.arrived.wait(), 5)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    # One report for five accepted batches, before the linger ran out: it
    # was the durable window that sent them, not a message per batch.
    assert len(reports.sent) == 1, reports.sent
    sent_at, roots = reports.sent[0]
    assert len(roots) == 5 and len(set(roots)) == 5
    assert sent_at - accepted_at < LINGER_S
    assert runner.tracking.registrations() == []


async def test_registrations_no_report_carries_go_once_they_waited_the_linger() -> None:
    reports = Reports()
    runner = source_runner(reports)
    assert runner.tracking is not None
    runner.ready.set()
    loop = asyncio.create_task(runner._report_loop())
    try:
        accepted_at = time.monotonic()
        await accept(runner, 1, 3)
        await asyncio.wait_for(reports.arrived.wait(), 5 + LINGER_S)
        reports.arrived.clear()
        await accept(runner, 4, 2)  # the next ones wait their own linger
        await asyncio.wait_for(reports.arrived.wait(), 5 + LINGER_S)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [len(roots) for _, roots in reports.sent] == [3, 2]
    assert reports.sent[0][0] - accepted_at >= LINGER_S  # not one message per batch
    assert runner.tracking.registrations() == []
    assert runner.tracking.registrations_due_at(LINGER_S) is None


def test_registrations_due_at_follows_the_oldest_waiting() -> None:
    source = TaskTracking(is_source=True)
    assert source.registrations_due_at(1.0) is None
    before = time.monotonic()
    source.retain(0, 0xA1)
    source.retain(1, 0xA2)
    due = source.registrations_due_at(1.0)
    assert due is not None and before + 1.0 <= due <= time.monotonic() + 1.0
    source.mark_registered([0xA1, 0xA2])
    assert source.registrations_due_at(1.0) is None
    # A root that finished before its registration went is not waited for.
    source.retain(2, 0xA3)
    source.finished([0xA3], abandoned=True)
    assert source.registrations_due_at(1.0) is None
    assert source.registrations() == []

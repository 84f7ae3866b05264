"""A source task's registrations ride with its next report instead of a
message per accepted batch (services/worker/tracking.py,
REGISTRATION_LINGER_S): the report after a durable window carries every
registration waiting, and registrations no report comes for go on their own
once they have waited the linger."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from gridstream.jobspec import JobSpec, Stage, plan_tasks
from services.worker import tracking as tracking_module
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


@contextlib.asynccontextmanager
async def reporting(runner: TaskRunner) -> AsyncIterator[None]:
    """Runs the task's report loop for the block; cancels and awaits it after."""
    runner.ready.set()
    loop = asyncio.create_task(runner._report_loop())
    try:
        yield
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_registrations_wait_for_the_report_of_a_durable_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_module, "REGISTRATION_LINGER_S", 3600.0)  # never, here
    reports = Reports()
    runner = source_runner(reports)
    assert runner.tracking is not None
    async with reporting(runner):
        await accept(runner, 1, 5)
        runner._durable(0)  # a window became durable: the task reports now
        await asyncio.wait_for(reports.arrived.wait(), 5)
    # One report for five accepted batches: the durable window's, not a
    # message per batch.
    assert len(reports.sent) == 1, reports.sent
    assert len(set(reports.sent[0][1])) == 5
    assert runner.tracking.registrations() == []


async def test_registrations_no_report_carries_go_once_they_waited_the_linger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_module, "REGISTRATION_LINGER_S", LINGER_S)
    reports = Reports()
    runner = source_runner(reports)
    tracking = runner.tracking
    assert tracking is not None
    async with reporting(runner):
        await accept(runner, 1, 3)
        while len({r for _, roots in reports.sent for r in roots}) < 3:
            reports.arrived.clear()
            await asyncio.wait_for(reports.arrived.wait(), 5 + LINGER_S)
        await accept(runner, 4, 2)  # later ones wait their own linger
        while len({r for _, roots in reports.sent for r in roots}) < 5:
            reports.arrived.clear()
            await asyncio.wait_for(reports.arrived.wait(), 5 + LINGER_S)
    # Each report went once its oldest registration had waited the linger
    # (since: when the task accepted the root), never at once; 10 ms spare
    # for the timer's resolution.
    for sent_at, roots in reports.sent:
        assert sent_at - min(tracking.since[r] for r in roots) >= LINGER_S - 0.01, reports.sent
    assert tracking.registrations() == []
    assert tracking.registrations_due_at(LINGER_S) is None


def test_registrations_due_at_follows_the_oldest_waiting() -> None:
    source = TaskTracking(is_source=True)
    assert source.registrations_due_at(1.0) is None
    before = time.monotonic()
    assert source.retain(0, 0xA1)  # the first registration waiting starts the clock
    assert not source.retain(1, 0xA2)
    due = source.registrations_due_at(1.0)
    assert due is not None and before + 1.0 <= due <= time.monotonic() + 1.0
    source.mark_registered([0xA1, 0xA2])
    assert source.registrations_due_at(1.0) is None
    # A root that finished before its registration went is not waited for.
    source.retain(2, 0xA3)
    source.finished([0xA3], abandoned=True)
    assert source.registrations_due_at(1.0) is None
    assert source.registrations() == []

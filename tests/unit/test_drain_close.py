"""A drain that finds a task busy closes its window as soon as the task is
idle: the trees of the last batches complete then, not at
``tracking_flush_s`` nor at the caller's next progress query (one more
round trip to every worker, 25 to 60 ms apart on a busy cluster). And a
drain sends the result rows waiting for ``worker.results_linger_s`` at
once, in every delivery mode."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any, cast

from gridstream.jobspec import JobSpec, Stage, plan_tasks
from services.worker.tasks import TaskRunner

SPEC = JobSpec(
    "t", (Stage("same", "map", "gridstream.builtins:identity"), Stage("store", "sink")),
    partitions=1, window_size=1_000, delivery="exactly_once")

BATCHES = 3


def tracked_runner() -> TaskRunner:
    """The job's one task, tracked (a reporter is given; nothing is reported
    here), with a flush interval no test waits for; no peer or state server
    is called."""
    none = cast(Any, None)
    tasks = plan_tasks(SPEC)
    return TaskRunner("j", SPEC, tasks, 0, 0, "worker-1", none, none, none,
                      max_records=1_000, batch_records=100, backup_count=0,
                      reporter=cast(Any, object()), tracking_flush_s=3600)


async def test_a_drain_asked_while_busy_closes_the_window_once_the_task_is_idle() -> None:
    runner = tracked_runner()
    assert runner.tracking is not None
    runner.ready.set()
    for sequence in range(1, BATCHES + 1):
        commit = await runner.append("src/c", sequence, None, [f"r{sequence}"], 5.0)
        assert await commit()
    closes: list[int] = []  # batches still queued at each close
    closed = asyncio.Event()
    close = runner._close_window

    def counted_close() -> None:
        closes.append(runner.container.pending_batches)
        closed.set()
        close()

    runner._close_window = counted_close  # type: ignore[method-assign]
    await runner.flush_soon()  # the drain's query: every batch still queued
    assert not closes
    loop = asyncio.create_task(runner._loop())
    try:
        with contextlib.suppress(TimeoutError):  # no close at all: asserted below
            await asyncio.wait_for(closed.wait(), 5)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert runner.latest.offset == BATCHES
    assert closes == [0], closes  # once, after the last batch, with the queue empty
    assert runner.window.batches == [] and runner.persister.head == 0



async def test_a_drain_sends_the_rows_waiting_for_the_linger() -> None:
    # An at-most-once task (no windows) whose rows linger for an hour: the
    # drain's query has them written at once.
    spec = replace(SPEC, delivery="at_most_once")
    none = cast(Any, None)
    runner = TaskRunner("j", spec, plan_tasks(spec), 0, 0, "worker-1", none, none, none,
                        max_records=1_000, batch_records=100, backup_count=0,
                        results_linger_s=3600)
    written: list[dict[Any, Any]] = []
    wrote = asyncio.Event()

    async def write_rows(rows: dict[Any, Any], dead: list[Any]) -> None:
        written.append(dict(rows))
        wrote.set()

    runner.persister._write_rows = write_rows
    persisting = asyncio.create_task(runner.persister.run())
    try:
        runner.persister.submit({"a": 1}, [])  # the first rows go at once
        await asyncio.wait_for(wrote.wait(), 5)
        wrote.clear()
        runner.persister.submit({"a": 2}, [])
        await asyncio.sleep(0.05)
        assert written == [{"a": 1}]  # lingering
        await runner.flush_soon()  # the drain's query
        with contextlib.suppress(TimeoutError):  # not written at all: asserted below
            await asyncio.wait_for(wrote.wait(), 5)
    finally:
        persisting.cancel()
        await asyncio.gather(persisting, return_exceptions=True)
    assert written == [{"a": 1}, {"a": 2}]

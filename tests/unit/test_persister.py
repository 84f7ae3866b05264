"""The persister's write schedule: rows handed over between windows are
written together, at most every ``rows_linger_s``, and a window never waits
for the linger (its rows go with it, first)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.worker.snapshots import PendingSnapshot, Persister

DeadLetters = list[tuple[str, str, str, str]]


class Recorded:
    """What the persister wrote, in order."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.durable: list[int] = []

    async def rows(self, rows: dict[Any, Any], dead: DeadLetters) -> None:
        self.writes.append(("rows", dict(rows)))

    async def snapshot(self, snapshot: PendingSnapshot, chunks: list[tuple[bytes, int]]) -> None:
        self.writes.append(("window", snapshot.window))

    def row_writes(self) -> list[dict[Any, Any]]:
        return [what for kind, what in self.writes if kind == "rows"]


@contextlib.asynccontextmanager
async def running(linger_s: float) -> AsyncIterator[tuple[Persister, Recorded]]:
    recorded = Recorded()
    persister = Persister(recorded.rows, recorded.snapshot, recorded.durable.append, "op",
                          rows_linger_s=linger_s)
    task = asyncio.create_task(persister.run())
    try:
        yield persister, recorded
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def idle(persister: Persister) -> None:
    async with asyncio.timeout(10):
        await persister.wait_idle()


@pytest.mark.parametrize("linger_s, expected_writes", [(2.0, 2), (0.0, 4)])
async def test_rows_between_windows_are_written_together(linger_s: float,
                                                         expected_writes: int) -> None:
    # Rows arrive after every batch; the first write goes at once, the rows
    # of the next three batches wait out the linger and go as one write with
    # the newest value of each key. Without a linger each batch is a write.
    async with running(linger_s) as (persister, recorded):
        persister.submit({"a": 1}, [])
        await idle(persister)
        for value in (2, 3, 4):
            persister.submit({"a": value, f"k{value}": value}, [])
            await asyncio.sleep(0.02)  # the persister gets the loop between batches
        await idle(persister)
    writes = recorded.row_writes()
    assert len(writes) == expected_writes
    assert writes[-1]["a"] == 4
    merged: dict[Any, Any] = {}
    for rows in writes:
        merged.update(rows)
    assert merged == {"a": 4, "k2": 2, "k3": 3, "k4": 4}


async def test_a_window_goes_at_once_with_the_rows_before_it() -> None:
    # A linger far longer than the test's deadline: the window must end it.
    async with running(60.0) as (persister, recorded):
        persister.submit({"a": 1}, [])
        await idle(persister)
        persister.submit({"a": 2}, [])
        await asyncio.sleep(0.02)
        assert recorded.row_writes() == [{"a": 1}]  # lingering
        persister.submit({}, [], PendingSnapshot(1, 10, b"h", {}, None))
        await idle(persister)
    assert recorded.writes == [("rows", {"a": 1}), ("rows", {"a": 2}), ("window", 1)]
    assert recorded.durable == [10]

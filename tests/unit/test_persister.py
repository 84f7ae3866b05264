"""The persister's write schedule: rows handed over between windows are
written together, at most once per ``rows_linger_s`` and at multiples of it
on the process's clock (so the operators of a worker write at the same
moments and share calls), and neither a window (its rows go with it, first)
nor a drain waits for the linger. The linger stretches while row writes are
slow and returns to its floor once they are fast again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gridstream.peercalls import next_boundary
from services.worker.snapshots import (
    LINGER_STRETCH_MAX,
    PendingSnapshot,
    Persister,
    stretched_linger,
)

DeadLetters = list[tuple[str, str, str, str]]


class Recorded:
    """What the persister wrote, in order."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.durable: list[int] = []
        self.row_times: list[float] = []

    async def rows(self, rows: dict[Any, Any], dead: DeadLetters) -> None:
        self.writes.append(("rows", dict(rows)))
        self.row_times.append(time.monotonic())

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


async def just_after_a_boundary(period_s: float) -> None:
    """Waits until just after a multiple of ``period_s`` on the monotonic
    clock, where the lingers end, so a test's writes cannot straddle one."""
    if period_s > 0:
        now = time.monotonic()
        await asyncio.sleep(next_boundary(period_s, now) - now + 0.01)


@pytest.mark.parametrize("linger_s, expected_writes", [(0.5, 2), (0.0, 4)])
async def test_rows_between_windows_are_written_together(linger_s: float,
                                                         expected_writes: int) -> None:
    # Rows arrive after every batch; the first write goes at once, the rows
    # of the next three batches wait out the linger and go as one write with
    # the newest value of each key. Without a linger each batch is a write.
    # The linger ends at the clock's multiples of it, so the test starts
    # just after one: a multiple falling among the three batches would split
    # them (it did once in a loaded run, three writes instead of two).
    await just_after_a_boundary(linger_s)
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


async def test_a_drain_hurries_the_rows_waiting_for_the_linger() -> None:
    # A drain waits for every row to be durable: rows lingering (here for a
    # minute) go at once when it asks, and a hurry with nothing pending
    # leaves the next rows to the linger.
    async with running(60.0) as (persister, recorded):
        persister.submit({"a": 1}, [])
        await idle(persister)
        persister.hurry()  # nothing pending: no effect
        persister.submit({"a": 2}, [])
        await asyncio.sleep(0.05)
        assert recorded.row_writes() == [{"a": 1}]  # lingering
        persister.hurry()
        await idle(persister)
        assert recorded.row_writes() == [{"a": 1}, {"a": 2}]
        persister.submit({"a": 3}, [])
        await asyncio.sleep(0.05)
        assert recorded.row_writes() == [{"a": 1}, {"a": 2}]  # the linger holds again


async def test_operators_lingering_at_different_moments_write_at_the_same_boundary() -> None:
    # Two operators of one worker write their first rows 0.15 s apart, and
    # get more rows soon after: both lingers end at the next multiple of
    # the linger, together, so their writes can share a call.
    linger_s = 0.5
    await just_after_a_boundary(linger_s)
    async with running(linger_s) as (first, first_writes), \
            running(linger_s) as (second, second_writes):
        first.submit({"a": 1}, [])
        await idle(first)
        await asyncio.sleep(0.15)
        second.submit({"b": 1}, [])
        await idle(second)
        await asyncio.sleep(0.05)
        first.submit({"a": 2}, [])
        second.submit({"b": 2}, [])
        await idle(first)
        await idle(second)
    assert len(first_writes.row_times) == len(second_writes.row_times) == 2
    assert second_writes.row_times[0] - first_writes.row_times[0] >= 0.15
    assert abs(second_writes.row_times[1] - first_writes.row_times[1]) < 0.05, (
        first_writes.row_times, second_writes.row_times)


def test_the_linger_doubles_while_row_writes_are_slow_and_halves_back_to_its_floor() -> None:
    floor = 0.1
    linger = floor
    for expected in (0.2, 0.4, 0.8, 0.8):  # each write took a whole second
        linger = stretched_linger(linger, 1.0, floor)
        assert linger == expected
    assert linger == floor * LINGER_STRETCH_MAX
    # A write between a sixteenth and a quarter of the linger leaves it.
    assert stretched_linger(0.4, 0.05, floor) == 0.4
    for expected in (0.4, 0.2, 0.1, 0.1):  # fast writes
        linger = stretched_linger(linger, 0.001, floor)
        assert linger == expected
    # No linger configured: every batch's rows are written, however slowly.
    assert stretched_linger(0.0, 5.0, 0.0) == 0.0


async def test_slow_row_writes_stretch_the_persisters_linger_and_fast_ones_shrink_it() -> None:
    # A state server that takes 0.15 s to store rows, against a 0.4 s linger:
    # the persister waits twice as long before its next write. Once writes
    # are quick again the linger goes back to 0.4 s.
    floor = 0.4
    recorded = Recorded()
    write_s = 0.15

    async def slow_rows(rows: dict[Any, Any], dead: DeadLetters) -> None:
        await asyncio.sleep(write_s)  # the state server's time to store them
        await recorded.rows(rows, dead)

    persister = Persister(slow_rows, recorded.snapshot, recorded.durable.append, "op",
                          rows_linger_s=floor)
    task = asyncio.create_task(persister.run())
    try:
        persister.submit({"a": 1}, [])
        await idle(persister)
        assert persister.rows_linger_s == 2 * floor
        write_s = 0.0
        # A quick write (under a sixteenth of 0.8 s) halves it back; a loaded
        # machine may slow one such write past that, so a few are allowed.
        submitted = []
        for value in (2, 3, 4):
            persister.submit({"a": value}, [])
            submitted.append(value)
            await idle(persister)
            if persister.rows_linger_s == floor:
                break
        assert persister.rows_linger_s == floor
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    # Every submitted row was written, once each, in order: the linger only
    # spaces the writes out.
    assert recorded.row_writes() == [{"a": 1}] + [{"a": v} for v in submitted]

"""JobContainer: ordering, dedupe by (channel, sequence), backpressure, trim."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.queues import JobContainer


async def test_appends_in_order_and_drops_duplicates() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    assert await q.append("src/a", 1, None, [1, 2])
    assert await q.append("src/b", 1, None, [3])
    assert not await q.append("src/a", 1, None, [1, 2])  # retry of the same batch
    assert await q.append("src/a", 2, None, [4])
    entries = [await q.take(i) for i in range(3)]
    assert [e.values for e in entries] == [[1, 2], [3], [4]]
    assert q.records_in == 4


async def test_full_container_makes_senders_wait() -> None:
    q = JobContainer("j/t0/p0", max_records=3)
    await q.append("c", 1, None, [1, 2, 3])
    blocked = asyncio.create_task(q.append("c", 2, None, [4]))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    await q.take(0)
    await q.mark_consumed(1)
    assert await asyncio.wait_for(blocked, 1.0)


async def test_append_times_out_when_nobody_consumes() -> None:
    q = JobContainer("j/t0/p0", max_records=1)
    await q.append("c", 1, None, [1])
    with pytest.raises(TimeoutError):
        await q.append("c", 2, None, [2], timeout_s=0.05)


async def test_trim_keeps_unconsumed_entries() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    for seq in range(1, 6):
        await q.append("c", seq, None, [seq])
    await q.take(2)
    await q.mark_consumed(3)
    assert q.trim(10) == 3  # only consumed entries go
    assert q.retained_batches == 2
    assert (await q.take(3)).values == [4]
    with pytest.raises(LookupError):
        await q.take(1)

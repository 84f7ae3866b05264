"""JobContainer: ordering, dedupe by (channel, sequence), commit before
consumption, backpressure, trim, restore."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.queues import ContainerClosed, Entry, JobContainer


async def test_appends_in_order_and_drops_duplicates() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    assert await q.append("src/a", 1, None, [1, 2]) == (True, 0)
    assert await q.append("src/b", 1, None, [3]) == (True, 1)
    # A retry of the same batch is a duplicate; it names the offset to wait for.
    assert await q.append("src/a", 1, None, [1, 2]) == (False, 0)
    assert await q.append("src/a", 2, None, [4]) == (True, 2)
    await q.commit_through(3)
    entries = [await q.take(i) for i in range(3)]
    assert [e.values for e in entries] == [[1, 2], [3], [4]]
    assert q.records_in == 4


async def test_without_dedupe_duplicates_are_appended() -> None:
    q = JobContainer("j/t0/p0", max_records=100, dedupe=False)
    await q.append("src/a", 1, None, [1])
    assert await q.append("src/a", 1, None, [1]) == (True, 1)


async def test_uncommitted_entries_are_not_taken() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    await q.append("c", 1, None, [1])
    taker = asyncio.create_task(q.take(0))
    await asyncio.sleep(0.01)
    assert not taker.done()
    waiter = asyncio.create_task(q.wait_committed(0))
    await q.commit_through(1)
    assert (await asyncio.wait_for(taker, 1)).values == [1]
    await asyncio.wait_for(waiter, 1)


async def test_full_container_makes_senders_wait() -> None:
    q = JobContainer("j/t0/p0", max_records=3)
    await q.append("c", 1, None, [1, 2, 3])
    await q.commit_through(1)
    blocked = asyncio.create_task(q.append("c", 2, None, [4]))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    await q.take(0)
    await q.mark_consumed(1)
    assert await asyncio.wait_for(blocked, 1.0) == (True, 1)


async def test_append_times_out_when_nobody_consumes() -> None:
    q = JobContainer("j/t0/p0", max_records=1)
    await q.append("c", 1, None, [1])
    with pytest.raises(TimeoutError):
        await q.append("c", 2, None, [2], timeout_s=0.05)


async def test_trim_keeps_unconsumed_entries() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    for seq in range(1, 6):
        await q.append("c", seq, None, [seq])
    await q.commit_through(5)
    await q.take(2)
    await q.mark_consumed(3)
    assert q.trim(10) == 3  # only consumed entries go
    assert q.retained_batches == 2
    assert (await q.take(3)).values == [4]
    with pytest.raises(LookupError):
        await q.take(1)


async def test_restore_resumes_at_the_snapshot_offset() -> None:
    q = JobContainer("j/t1/p0", max_records=100)
    entries = [Entry(o, "t0/p1", o + 1, ["k"], [o]) for o in range(10, 14)]
    q.restore(10, {"t0/p1": 11, "t0/p2": 7}, entries, consumed=12)
    assert (q.base_offset, q.next_offset, q.committed_offset) == (10, 14, 14)
    assert q.pending_batches == 2
    assert q.is_duplicate("t0/p1", 14) and q.is_duplicate("t0/p2", 7)
    assert not q.is_duplicate("t0/p1", 15)
    assert (await q.take(12)).values == [12]


async def test_closing_wakes_waiters_with_an_error() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    await q.append("c", 1, None, [1])
    waiter = asyncio.create_task(q.wait_committed(0))
    await asyncio.sleep(0.01)
    await q.close()
    with pytest.raises(ContainerClosed):
        await waiter
    with pytest.raises(ContainerClosed):
        await q.append("c", 2, None, [2])


async def test_committed_sequences_leave_out_unacknowledged_batches() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    await q.append("src/a", 1, None, [1])
    await q.append("src/b", 1, None, [2])
    await q.commit_through(2)
    await q.append("src/a", 2, None, [3])  # never committed: its sender will resend it
    await q.append("src/c", 1, None, [4])
    assert q.sequences() == {"src/a": 2, "src/b": 1, "src/c": 1}
    assert q.committed_sequences() == {"src/a": 1, "src/b": 1}


async def test_a_snapshot_records_only_the_sequences_below_its_offset() -> None:
    # A window closing while a later batch waits for its backups must not
    # record that batch's sequence: if it is never committed its sender sends
    # it again, and a new owner restoring the snapshot must accept it.
    q = JobContainer("j/t0/p0", max_records=100)
    await q.append("src/a", 1, None, [1])
    await q.append("src/b", 1, None, [2])
    await q.commit_through(2)
    await q.append("src/a", 2, None, [3])
    await q.append("src/c", 1, None, [4])
    assert q.sequences_below(2) == {"src/a": 1, "src/b": 1}
    assert q.sequences_below(1) == {"src/a": 1}
    assert q.sequences_below(4) == q.sequences()


async def test_take_returns_none_when_interrupted() -> None:
    q = JobContainer("j/t0/p0", max_records=100)
    interrupted = False
    taker = asyncio.create_task(q.take(0, lambda: interrupted))
    await asyncio.sleep(0.01)
    assert not taker.done()
    interrupted = True
    await q.poke()
    assert await asyncio.wait_for(taker, 1) is None


async def test_a_gap_in_a_channel_is_named_as_lost_and_found_again_from_the_log() -> None:
    container = JobContainer("j/t1/p0", max_records=100)
    await container.append("t0/p3", 1, None, ["a"])
    await container.append("t0/p3", 2, None, ["b"], previous_sequence=1)
    assert container.losses == []
    # Sequences 3 and 4 were acknowledged to the sender, then lost with every copy.
    await container.append("t0/p3", 5, None, ["e"], previous_sequence=4)
    assert [(lost.channel, lost.first, lost.last) for lost in container.losses] == [
        ("t0/p3", 3, 4)]
    # A new owner restoring this log finds the same gap from the entries alone.
    successor = JobContainer("j/t1/p0", max_records=100)
    successor.restore(0, {}, container.retained(), 0)
    found = successor.find_gaps(0, {})
    assert [(lost.first, lost.last) for lost in found] == [(3, 4)]
    assert successor.find_gaps(0, {}) == []  # named once


async def test_at_most_once_does_not_count_gaps_as_losses() -> None:
    container = JobContainer("j/t0/p0", max_records=100, name_losses=False)
    await container.append("src/a", 5, None, ["x"], previous_sequence=4)
    assert container.losses == []

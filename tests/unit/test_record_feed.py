"""RecordFeed: blocking reads in a thread, handed to the event loop as they
come, in order, bounded, errors after what was read before them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from gridstream.recordfeed import RecordFeed


async def collect(feed: RecordFeed[int]) -> list[list[int]]:
    return [batch async for batch in feed.batches()]


async def test_every_item_comes_once_in_order_in_bounded_batches() -> None:
    batches = await asyncio.wait_for(collect(RecordFeed(iter(range(20_000)), 64)), 30)
    assert [item for batch in batches for item in batch] == list(range(20_000))
    assert all(1 <= len(batch) <= 64 for batch in batches)


async def test_an_item_from_a_slow_source_comes_before_the_source_ends() -> None:
    # The source gives one record and then waits for the test to have it:
    # a feed that held records until a chunk filled or the source ended
    # would never yield it, and the wait_for below would fail.
    received = threading.Event()

    def slow() -> Iterator[int]:
        yield 1
        assert received.wait(30), "the first record was held back"
        yield 2

    feed = RecordFeed(slow(), 50_000)
    async with contextlib.aclosing(feed.batches()) as batches:
        first = await asyncio.wait_for(anext(batches), 10)
        assert first == [1]
        received.set()
        assert [item async for batch in batches for item in batch] == [2]


async def test_an_error_comes_after_the_items_read_before_it() -> None:
    def failing() -> Iterator[int]:
        yield from range(5)
        raise ValueError("line 6 is not JSON")

    seen: list[int] = []
    with pytest.raises(ValueError, match="line 6 is not JSON"):
        async for batch in RecordFeed(failing(), 3).batches():
            seen.extend(batch)
    assert seen == [0, 1, 2, 3, 4]


async def test_leaving_early_stops_the_thread() -> None:
    def endless() -> Iterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    feed = RecordFeed(endless(), 10, name="endless feed under test")
    async with contextlib.aclosing(feed.batches()) as batches:
        assert len(await anext(batches)) <= 10
    deadline = time.monotonic() + 10
    while any(t.name == "endless feed under test" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the reading thread did not stop"
        await asyncio.sleep(0.01)


def test_max_items_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_items"):
        RecordFeed(iter([]), 0)


async def test_a_feed_is_read_once() -> None:
    feed = RecordFeed(iter([1, 2]), 10)
    assert [item for batch in await collect(feed) for item in batch] == [1, 2]
    with pytest.raises(RuntimeError, match="read once"):
        await collect(feed)

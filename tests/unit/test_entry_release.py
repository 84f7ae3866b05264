"""A container keeps a processed batch as its wire form only: the decoded
records are dropped once the operator is done with them, and decoded again,
equal, if a replay needs them."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gridstream import codec
from services.worker.queues import Entry
from tests.unit.test_task_errors import STATELESS, runner


def test_a_released_entry_decodes_its_records_again_from_its_wire_form() -> None:
    keys, values = ["k1", "k2", "k1"], [[1, "a"], {"x": 2.5}, None]
    entry = Entry(4, "src/a", 7, keys, values, codec.encode_batch(values, keys))
    entry.release()
    assert entry._keys is None and entry._values is None  # nothing held decoded
    assert entry.count == 3
    assert entry.keys == keys and entry.values == values  # decoded on first use
    assert entry._values is not None  # and held again while a replay uses them


def test_an_entry_without_a_wire_form_keeps_its_records() -> None:
    entry = Entry(0, "src/a", 1, None, ["a"])
    entry.release()
    assert entry._values == ["a"] and entry.values == ["a"] and entry.count == 1


def test_an_entry_needs_its_records_or_their_wire_form() -> None:
    with pytest.raises(ValueError, match="wire form"):
        Entry(0, "src/a", 1, None, None)
    released = Entry(0, "src/a", 1, None, None, codec.encode_batch(["a", "b"]))
    assert released.count == 2 and released.values == ["a", "b"]


async def test_the_task_loop_releases_each_batch_it_has_processed() -> None:
    task = runner(STATELESS)
    consumed = asyncio.Event()
    mark_consumed = task.container.mark_consumed

    async def marked(offset: int) -> None:
        await mark_consumed(offset)
        consumed.set()

    task.container.mark_consumed = marked  # type: ignore[method-assign]
    values = ["a", "b", "c"]
    await task.container.append("src/a", 1, None, values, None, codec.encode_batch(values))
    await task.container.commit_through(1)
    loop = asyncio.create_task(task._loop())
    try:
        await asyncio.wait_for(consumed.wait(), 10)
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    entry = task.container.entry_at(0)
    assert entry is not None and task.records_processed == 3
    assert entry._values is None  # retained until trimmed, as bytes only
    assert entry.values == values

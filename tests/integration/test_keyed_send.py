"""A keyed send pushes its first batches while it still packs the rest, when
no record can fail to pack, and packs everything before the first push
otherwise: a record msgpack cannot carry fails the send with nothing pushed.
Every record arrives once, in order per key, either way."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gridstream import client as client_module
from gridstream.client import Client
from gridstream.codec import PayloadError
from gridstream.examples import taxi
from gridstream.local import LocalCluster
from gridstream.sendbatches import PACK_CHUNK, packed_steps
from gridstream.v1 import worker_pb2

RECORDS = 8 * PACK_CHUNK
BATCH_SIZE = PACK_CHUNK // 4
"""Records per push: a chunk of packing is at most one batch, and the test
cluster's 8 partitions fill a batch every 8 chunks or so."""
STEPS = RECORDS // BATCH_SIZE + 1
"""Packing steps of such a send: one per chunk, then the partly filled batches."""


class PushWatcher(Client):
    """A client that notes, at each push, how many packing steps its send
    had made by then (the pushes themselves go to the cluster unchanged)."""

    def __init__(self, scheduler: str, batch_size: int) -> None:
        super().__init__(scheduler, batch_size=batch_size)
        self.steps_made = 0
        self.steps_at_push: list[int] = []

    async def _push(self, job_id: str, segment: worker_pb2.Segment) -> None:
        self.steps_at_push.append(self.steps_made)
        await super()._push(job_id, segment)


@pytest.fixture
def counted_steps(monkeypatch: pytest.MonkeyPatch) -> list[PushWatcher]:
    """Makes the SDK's packing tell the watching clients of each step made."""
    watchers: list[PushWatcher] = []

    def counting(*args: Any) -> Iterator[Any]:
        for step in packed_steps(*args):
            for watcher in watchers:
                watcher.steps_made += 1
            yield step

    monkeypatch.setattr(client_module, "packed_steps", counting)
    return watchers


async def _send_taxi(cluster: LocalCluster, watchers: list[PushWatcher],
                     keys: list[str], values: list[str]) -> tuple[PushWatcher, dict[str, Any]]:
    async with PushWatcher(cluster.scheduler_address, batch_size=BATCH_SIZE) as sdk:
        watchers.append(sdk)
        job_id = await sdk.submit(taxi.job(prepartitioned=True))
        await sdk.send(job_id, values, keys)
        await sdk.drain(job_id)
        return sdk, await sdk.results(job_id)


async def test_ascii_records_are_pushed_while_the_send_still_packs(
        cluster: LocalCluster, counted_steps: list[PushWatcher]) -> None:
    keys, values = taxi.keyed(RECORDS, devices=500)
    sdk, results = await _send_taxi(cluster, counted_steps, keys, values)
    assert sdk.steps_made == STEPS
    assert sdk.steps_at_push[0] < STEPS // 2, sdk.steps_at_push
    assert results == taxi.reference(values)


async def test_text_that_may_not_pack_is_packed_whole_before_the_first_push(
        cluster: LocalCluster, counted_steps: list[PushWatcher]) -> None:
    keys, values = taxi.keyed(RECORDS, devices=500)
    record = json.loads(values[-1])
    record["note"] = "caf\u00e9"  # valid text, but not ASCII
    values[-1] = json.dumps(record, ensure_ascii=False)
    sdk, results = await _send_taxi(cluster, counted_steps, keys, values)
    assert sdk.steps_at_push and min(sdk.steps_at_push) == STEPS
    assert results == taxi.reference(values)


async def test_a_record_that_cannot_pack_fails_the_send_before_any_push(
        cluster: LocalCluster, counted_steps: list[PushWatcher]) -> None:
    keys, values = taxi.keyed(RECORDS, devices=500)
    broken: list[Any] = list(values)
    broken[-1] = "\ud800"  # a lone surrogate: no UTF-8, so no msgpack
    async with PushWatcher(cluster.scheduler_address, batch_size=BATCH_SIZE) as sdk:
        counted_steps.append(sdk)
        job_id = await sdk.submit(taxi.job(prepartitioned=True))
        with pytest.raises(PayloadError, match="msgpack-serialisable"):
            await sdk.send(job_id, broken, keys)
        assert sdk.steps_at_push == []
        progress = await sdk.drain(job_id)
        assert sum(task.records_in for task in progress.tasks) == 0
        await sdk.send(job_id, values, keys)  # the same client sends the good records
        await sdk.drain(job_id)
        assert await sdk.results(job_id) == taxi.reference(values)


@pytest.mark.parametrize("producer", [None, "feed"])
async def test_a_send_started_after_another_reaches_each_partition_after_it(
        cluster: LocalCluster, producer: str | None) -> None:
    # The first send packs its batches over many steps, pushing as it goes;
    # the second, started while it packs, is one step. Each device's
    # positions must still be appended in the order the sends were called,
    # also for a producer's sends, whose later sequences would otherwise
    # make the container drop the first send's remaining batches as
    # duplicates.
    keys, values = taxi.keyed(RECORDS + 200, devices=500)

    def sequenced(chunk: int) -> dict[str, Any]:
        return {} if producer is None else {"producer": producer,
                                            "first_sequence": (chunk + 1) << 24}

    async with Client(cluster.scheduler_address, batch_size=BATCH_SIZE) as sdk:
        job_id = await sdk.submit(taxi.job(prepartitioned=True))
        # The job's routing is known from here on.
        await sdk.send(job_id, values[:1], keys[:1], **sequenced(0))
        first = asyncio.create_task(
            sdk.send(job_id, values[1:RECORDS], keys[1:RECORDS], **sequenced(1)))
        second = asyncio.create_task(
            sdk.send(job_id, values[RECORDS:], keys[RECORDS:], **sequenced(2)))
        assert await asyncio.gather(first, second) == [RECORDS - 1, 200]
        await sdk.drain(job_id)
        assert await sdk.results(job_id) == taxi.reference(values)

"""A Producer against a real cluster: records put a few at a time, faster
than a send is acknowledged, arrive once each and in order per key, in
far fewer sends than puts, also through the blocking SyncProducer; and a
producer whose job is gone says so."""

from __future__ import annotations

import asyncio

import pytest

from gridstream import SyncClient
from gridstream.client import Client
from gridstream.errors import FailedPrecondition
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster
from gridstream.producer import Producer

PUTS = 400
PER_PUT = 25


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_records_put_a_few_at_a_time_arrive_once_in_order_in_fewer_sends(
        cluster: LocalCluster, client: Client, in_flight: int) -> None:
    # With two sends in flight, a device's later positions may only reach
    # its partition after the earlier ones: the tracks would show it.
    keys, values = taxi.keyed(PUTS * PER_PUT, devices=10)  # every put holds each device
    job_id = await client.submit(taxi.job(prepartitioned=True))
    async with Producer(client, job_id, max_in_flight=in_flight) as producer:
        for start in range(0, len(values), PER_PUT):
            await producer.put(values[start:start + PER_PUT], keys[start:start + PER_PUT])
            await asyncio.sleep(0)  # a stream: the sends run between the puts
    assert producer.acknowledged == len(values)
    # Puts arriving while a send was in flight went together in the next one.
    assert 1 < producer.sends < PUTS // 4, producer.sends
    await client.drain(job_id)
    assert await client.results(job_id) == taxi.reference(values)


async def test_unkeyed_records_are_counted_once(cluster: LocalCluster, client: Client) -> None:
    lines = list(wordcount.generate(2_000, seed=3))
    job_id = await client.submit(wordcount.job())
    async with Producer(client, job_id, max_in_flight=2) as producer:
        for line in lines:
            await producer.put([line])
            await asyncio.sleep(0)  # a stream: both sends get records between the puts
    assert producer.sends < len(lines) // 2, producer.sends
    await client.drain(job_id)
    assert await client.results(job_id) == wordcount.reference(lines)


async def test_a_send_to_a_cancelled_job_stops_the_producer_with_its_error(
        cluster: LocalCluster, client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    await client.cancel(job_id)
    producer = Producer(client, job_id)
    await producer.put(["a line"])
    with pytest.raises(FailedPrecondition, match=r"a send of 1 records failed.*cancelled"):
        async with asyncio.timeout(30):
            await producer.close()


def stream_blocking(address: str, lines: list[str]) -> tuple[dict[str, int], int, int]:
    """Streams ``lines`` one put each through a SyncClient's producer."""
    with SyncClient(address, batch_size=1_000) as sdk:
        job_id = sdk.submit(wordcount.job())
        with sdk.producer(job_id) as producer:
            for line in lines:
                producer.put([line])
        sdk.drain(job_id)
        return sdk.results(job_id), producer.sends, producer.acknowledged


async def test_a_blocking_producer_sends_from_its_loop_thread(cluster: LocalCluster) -> None:
    lines = list(wordcount.generate(5_000, seed=4))
    results, sends, acknowledged = await asyncio.to_thread(
        stream_blocking, cluster.scheduler_address, lines)
    assert acknowledged == len(lines)
    assert sends < len(lines) // 2, sends  # the puts went on while sends were in flight
    assert results == wordcount.reference(lines)

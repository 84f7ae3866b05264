"""XOR tuple tracking on a real cluster: a lost report makes its roots time
out, and they are rebuilt without processing anything twice; a tracker lost
with its worker, or moved by resizing the tracker ring, leaves no root
pending. Every run is compared with the in-process reference, record for record."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from gridstream.chaos import stream, wait_healthy
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster
from gridstream.ring import HashRing
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.slow]

WORKERS = ["worker-1", "worker-2", "worker-3"]


def small_windows() -> Config:
    """Small windows, so trees complete while the stream still runs."""
    return replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=8))


def by_task(progress: scheduler_pb2.JobProgress, field: str) -> dict[int, int]:
    """Sum of one TaskProgress counter per task index."""
    out: dict[int, int] = {}
    for t in progress.tasks:
        out[t.task] = out.get(t.task, 0) + int(getattr(t, field))
    return out


def tracker_host(tracker: int) -> str:
    """The worker hosting tracker k (the owner of "tracker/<k>" on the worker ring)."""
    return HashRing(WORKERS, 100).owner(f"tracker/{tracker}")


async def test_a_lost_report_costs_a_rebuild_never_a_second_application(
    tmp_path: Path,
) -> None:
    # The worker hosting tracker 0 loses its 3rd tracking report on the way
    # (it believes it delivered it): the roots in it time out at their
    # trackers, are rebuilt from the tasks' contributions and complete.
    # Nothing is processed again: every operator ran once per record (the
    # count, which combines, once per word of each sent batch).
    lines = wordcount.generate(40_000, seed=11)
    partials = wordcount.count_records(lines, batch_size=500)
    spec = replace(wordcount.job(), tracking_timeout_s=3.0)
    env = {"GRIDSTREAM_FAULT_DROP_REPORT": f"{tracker_host(0)}:3"}
    async with (LocalCluster(tmp_path, small_windows(), extra_env=env) as cluster,
                Client(cluster.scheduler_address, batch_size=500) as client):
        job_id = await client.submit(spec)
        await client.send(job_id, lines)
        progress = await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
    assert sum(by_task(progress, "roots_failed").values()) >= 1  # the loss was felt
    assert all(t.roots_pending == 0 for t in progress.tasks)
    assert by_task(progress, "invocations") == {0: len(lines), 1: partials}


async def test_killing_a_tracker_host_leaves_no_root_pending(tmp_path: Path) -> None:
    keys, records = taxi.keyed(60_000, devices=1_000, seed=13)
    spec = replace(taxi.job(), tracking_timeout_s=4.0)
    victim = tracker_host(0)
    first = 4_000
    async with (LocalCluster(tmp_path, small_windows(), supervise=True,
                             restart_delay_s=1.0) as cluster,
                Client(cluster.scheduler_address, batch_size=1_000) as client):
        job_id = await client.submit(spec)
        await client.send(job_id, records[:first], keys[:first])  # trees in flight
        sender = asyncio.create_task(
            stream(client, job_id, keys[first:], records[first:], 4.0, chunk=2_000))
        try:
            cluster.kill(victim)
            await sender
        finally:
            sender.cancel()
        await wait_healthy(client, job_id, workers=3)
        # The kill lost tracker 0's in-flight checkValues: its new host
        # rebuilds them from the tasks, so every root still completes.
        progress = await client.drain(job_id, timeout_s=120)
        actual = await client.results(job_id)
    assert all(t.roots_pending == 0 for t in progress.tasks)
    assert actual == taxi.reference(records)


async def routing_table(address: str) -> scheduler_pb2.RoutingTable:
    """The scheduler's routing table, read over a plain channel."""
    async with grpc.aio.insecure_channel(address) as channel:
        table: scheduler_pb2.RoutingTable = await scheduler_pb2_grpc.SchedulerStub(
            channel).GetRoutingTable(scheduler_pb2.GetRoutingTableRequest(), timeout=10)
        return table


async def test_resizing_the_tracker_ring_while_a_job_runs(tmp_path: Path) -> None:
    keys, records = taxi.keyed(40_000, devices=1_000, seed=14)
    async with (LocalCluster(tmp_path, small_windows()) as cluster,
                Client(cluster.scheduler_address, batch_size=1_000) as client):
        job_id = await client.submit(taxi.job())
        third = len(records) // 3
        await client.send(job_id, records[:third], keys[:third])
        await client.set_tracker_count(5)
        assert (await routing_table(cluster.scheduler_address)).tracker_count == 5
        await client.send(job_id, records[third:2 * third], keys[third:2 * third])
        await client.set_tracker_count(1)
        assert (await routing_table(cluster.scheduler_address)).tracker_count == 1
        await client.send(job_id, records[2 * third:], keys[2 * third:])
        progress = await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == taxi.reference(records)
    assert all(t.roots_pending == 0 for t in progress.tasks)
    assert sum(t.roots_failed for t in progress.tasks) == 0

"""XOR tuple tracking on a real cluster: a batch lost inside a task times out
and only that task (and those after it) run for it again; a tracker lost with
its worker, or moved by resizing the tracker ring, leaves no root pending.
Every run is compared with the in-process reference, record for record."""

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


async def lost_batch_run(tmp_path: Path, drop: str, words: int, seed: int, batch: int = 500
                         ) -> tuple[scheduler_pb2.JobProgress, list[str]]:
    """Word count with one batch lost inside a task: the run must still give
    the reference. (Word count, because a replayed batch is processed after
    batches that came in later: an order-sensitive operator would see that.)"""
    lines = wordcount.generate(words, seed=seed)
    spec = replace(wordcount.job(), tracking_timeout_s=3.0)
    env = {"GRIDSTREAM_FAULT_DROP_BATCH": drop}
    async with (LocalCluster(tmp_path, small_windows(), extra_env=env) as cluster,
                Client(cluster.scheduler_address, batch_size=batch) as client):
        job_id = await client.submit(spec)
        await client.send(job_id, lines)
        progress = await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
    return progress, lines


async def test_a_lost_batch_times_out_and_only_its_stage_runs_again(tmp_path: Path) -> None:
    # The worker hosting tracker 0 loses the 3rd batch its counting tasks take:
    # gone from the operator's point of view, still in the task's replicated input.
    progress, lines = await lost_batch_run(tmp_path, f"{tracker_host(0)}:1:3", 40_000, 11)
    words = sum(len(line.split()) for line in lines)
    replayed = by_task(progress, "records_replayed")
    # Its root timed out at its tracker (on a loaded machine a slow root may
    # time out too: it is rebuilt, and nothing of it runs again).
    assert by_task(progress, "roots_failed")[0] >= 1
    assert by_task(progress, "batches_replayed") == {0: 0, 1: 1}  # only that stage ran it again
    assert 0 < replayed[1] < words
    # Splitting ran once per line: nothing upstream of the loss ran again.
    # Counting ran once per word: the lost batch's words ran only in the replay.
    assert by_task(progress, "invocations") == {0: len(lines), 1: words}
    root_lines = 500  # the client's batch size: one root
    root_words = round(words / len(lines) * root_lines)
    print(f"\noperator invocations to recover the lost batch: {replayed[1]} (partial "
          f"recovery) vs about {root_lines + root_words} (replaying its root from the source)")


async def test_a_batch_lost_at_the_source_task_runs_again_from_its_input(
    tmp_path: Path,
) -> None:
    # 40 root batches over 8 partitions: every worker's source tasks take several.
    progress, lines = await lost_batch_run(tmp_path, f"{tracker_host(1)}:0:2", 40_000, 12,
                                           batch=200)
    words = sum(len(line.split()) for line in lines)
    assert by_task(progress, "batches_replayed") == {0: 1, 1: 0}
    assert by_task(progress, "invocations") == {0: len(lines), 1: words}


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

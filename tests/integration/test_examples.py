"""Both seeds' workloads on a real local cluster, compared record for record
with the in-process reference."""

from __future__ import annotations

import pytest

from gridstream.client import Client
from gridstream.demo import compare
from gridstream.examples import taxi, wordcount
from gridstream.local import LocalCluster

pytestmark = pytest.mark.integration


async def test_taxi_matches_the_reference(client: Client) -> None:
    keys, records = taxi.keyed(30_000, devices=1_000, seed=7)
    job_id = await client.submit(taxi.job())
    assert await client.send(job_id, records, keys) == len(records)
    progress = await client.drain(job_id)
    results = await client.results(job_id)
    expected = taxi.reference(records)
    assert compare(results, expected) == (0, 0, 0)
    assert results == expected
    # The rows came from the reduce's stored state: none were written as rows.
    assert await client._state.read_results(job_id) == {}
    # Every input record went through both tasks exactly once.
    by_task: dict[int, int] = {}
    for t in progress.tasks:
        by_task[t.task] = by_task.get(t.task, 0) + t.records_processed
    assert by_task == {0: len(records), 1: len(records)}
    # Windows of 2,000 records were persisted asynchronously along the way.
    assert sum(t.windows_persisted for t in progress.tasks) >= len(records) // 2_000 // 2


async def test_taxi_prepartitioned_runs_in_one_task_and_matches_the_reference(
    client: Client,
) -> None:
    keys, records = taxi.keyed(30_000, devices=1_000, seed=8)
    job_id = await client.submit(taxi.job(prepartitioned=True))
    await client.send(job_id, records, keys)
    progress = await client.drain(job_id)
    assert await client.results(job_id) == taxi.reference(records)
    assert await client._state.read_results(job_id) == {}  # rows from the stored state
    assert {t.task for t in progress.tasks} == {0}  # parse and track in one task
    assert sum(t.records_processed for t in progress.tasks) == len(records)
    assert await client.dead_letters(job_id) == []


async def test_records_sent_unkeyed_to_a_prepartitioned_job_are_named_not_folded(
    client: Client,
) -> None:
    _, records = taxi.keyed(2_000, devices=100, seed=9)
    job_id = await client.submit(taxi.job(prepartitioned=True))
    await client.send(job_id, records)  # spread over the partitions, not by device
    await client.drain(job_id)
    dead = await client.dead_letters(job_id)
    assert dead and all("MisroutedRecord" in d.error and d.stage == "track" for d in dead)
    results = await client.results(job_id)
    assert sum(track.count(";") for track in results.values()) + len(dead) == len(records)


async def test_wordcount_matches_the_reference(client: Client) -> None:
    lines = wordcount.generate(50_000, seed=3)
    job_id = await client.submit(wordcount.job())
    await client.send(job_id, lines)
    await client.drain(job_id)
    results = await client.results(job_id)
    assert results == wordcount.reference(lines)
    assert sum(results.values()) == 50_000


async def test_keyed_sends_route_by_key(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    lines = ["a b c", "a b", "a"]
    await client.send(job_id, lines, keys=["k1", "k2", "k3"])
    await client.drain(job_id)
    assert await client.results(job_id) == {"a": 3, "b": 2, "c": 1}


async def test_every_member_is_a_separate_process(cluster: LocalCluster) -> None:
    pids = {m.pid for m in cluster.members.values()}
    assert len(pids) == 6
    assert all(m.alive() for m in cluster.members.values())


async def test_a_producer_resending_with_the_same_sequences_counts_once(client: Client) -> None:
    job_id = await client.submit(wordcount.job())
    lines = ["x y", "y z", "z"] * 200
    for _attempt in range(2):  # the second attempt is a replay: duplicates only
        await client.send(job_id, lines, keys=[str(i) for i in range(len(lines))],
                          producer="spark-query-1-part-0", first_sequence=(7 + 1) << 24)
    await client.send(job_id, ["x"], keys=["k"], producer="spark-query-1-part-0",
                      first_sequence=(8 + 1) << 24)
    await client.drain(job_id)
    assert await client.results(job_id) == {"x": 201, "y": 400, "z": 400}

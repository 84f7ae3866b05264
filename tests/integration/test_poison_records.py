"""One record cannot stop a partition, nor take the rest of its batch with it,
even when what fails is gridstream's own handling of the record (describing
it for a dead letter, hashing its key), not the user's function: the record
goes to dead letters with its error and the job drains with the reference
result for the others. Real processes: two workers, so batches cross the
network between the tasks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.jobspec import DEFAULT_JOB_MODULES, JobSpec, Stage
from gridstream.local import LocalCluster
from gridstream.types import DeadLetter

pytestmark = pytest.mark.integration

OPS = "tests.integration.poison_ops"
SUM_BY_PARITY = JobSpec("poison", (
    Stage("parse", "map", f"{OPS}:parse"),
    Stage("sum", "reduce", f"{OPS}:add", key=f"{OPS}:parity", initial=0),
    Stage("store", "sink"),
))


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 2 workers, 1 state server; jobs may name the poison operators."""
    config = replace(Config(), cluster=ClusterConfig(
        window_size=1_000, partitions=4, job_modules=(*DEFAULT_JOB_MODULES, OPS)))
    async with LocalCluster(tmp_path_factory.mktemp("poison"), config, workers=2,
                            state_servers=1) as local:
        yield local


async def sum_with_poison(cluster: LocalCluster, poison: dict[int, str]) -> list[DeadLetter]:
    """Sends 1..2000 with ``poison`` records inserted at the given indexes (in
    batches of 500), checks that the sums of the others are exact and that no
    process restarted; returns the job's dead letters."""
    numbers = list(range(1, 2_001))
    records = [str(n) for n in numbers]
    for index in sorted(poison, reverse=True):
        records[index:index] = [poison[index]]
    async with Client(cluster.scheduler_address, batch_size=500) as client:
        job_id = await client.submit(SUM_BY_PARITY)
        await client.send(job_id, records)
        await client.drain(job_id, timeout_s=120)
        expected = {f"r:{k}": sum(n for n in numbers if n % 2 == k) for k in (0, 1)}
        assert await client.results(job_id) == expected
        dead = await client.dead_letters(job_id)
    assert all(m.alive() and m.restarts == 0 for m in cluster.members.values())
    return dead


async def test_a_record_gridstream_cannot_describe_or_hash_goes_alone_to_dead_letters(
        cluster: LocalCluster) -> None:
    dead = await sum_with_poison(cluster, {500: "unprintable"})  # inside a batch of 500
    assert len(dead) == 1, dead
    assert dead[0].record == "<unprintable Unprintable: RuntimeError>", dead
    assert dead[0].error.startswith("TypeError"), dead


async def test_a_value_that_cannot_be_encoded_for_the_next_task_goes_alone_to_dead_letters(
        cluster: LocalCluster) -> None:
    # The value keys fine but msgpack cannot carry it to the reduce's
    # partition: only it is dead-lettered; its batch and partition go on, on
    # the local and the remote path alike, and nothing restarts.
    dead = await sum_with_poison(cluster, {700: "huge", 1200: "huge"})
    assert len(dead) == 2, dead
    assert all(d.record == 2**70 and "msgpack" in d.error for d in dead), dead

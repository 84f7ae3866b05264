"""Failure detection and self-healing with real processes: a killed worker is
declared dead within the bound, its partitions move, it is restarted and gets
them back; a paused worker is fenced and rejoins; a killed scheduler does not
stop the data already flowing."""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio

from gridstream.chaos import detection_time, wait_healthy
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from gridstream.v1 import scheduler_pb2

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DETECTION_BOUND_S = 1.5


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """A supervised cluster: members that die are restarted after 2 s (longer
    than detection, so each kill shows the whole cycle)."""
    config = replace(Config(), cluster=ClusterConfig(window_size=3_000, partitions=12))
    local = LocalCluster(tmp_path_factory.mktemp("failover"), config, workers=3,
                         state_servers=2, supervise=True, restart_delay_s=2.0)
    async with local:
        yield local


@pytest_asyncio.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    async with Client(cluster.scheduler_address, batch_size=2_000) as sdk:
        yield sdk


async def owners(client: Client, job_id: str) -> list[str]:
    return list((await client._routing(job_id, refresh=True)).owners)


async def member(client: Client, node_id: str) -> scheduler_pb2.MemberStatus:
    status = await client.status()
    return next(m for m in status.members if m.member.node_id == node_id)


async def test_kill_is_detected_rerouted_restarted_and_handed_back(
    cluster: LocalCluster, client: Client
) -> None:
    lines = wordcount.generate(40_000, seed=11)
    job_id = await client.submit(wordcount.job())
    await client.send(job_id, lines[:2_000])
    before = await owners(client, job_id)
    assert "worker-2" in before
    killed_at = time.time()
    cluster.kill("worker-2")
    detected = await detection_time(client, "worker-2", killed_at)
    assert detected is not None and detected <= DETECTION_BOUND_S, detected
    # Rerouted: the dead worker owns nothing; every partition has a live owner.
    during = await owners(client, job_id)
    assert "worker-2" not in during and len(during) == len(before)
    # Clients keep sending through the outage (stale owners answer with the new epoch).
    await client.send(job_id, lines[2_000:20_000])
    # Restarted by the supervisor, rejoined, and its partitions handed back.
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    assert await owners(client, job_id) == before
    assert cluster.members["worker-2"].restarts >= 1
    await client.send(job_id, lines[20_000:])
    await client.drain(job_id)
    assert await client.results(job_id) == wordcount.reference(lines)


async def test_status_shows_states_and_phi(cluster: LocalCluster, client: Client) -> None:
    status = await client.status()
    workers = [m for m in status.members if m.member.role == scheduler_pb2.MEMBER_ROLE_WORKER]
    assert len(workers) == 3
    assert all(m.phi < 8 for m in workers)
    convicted = [e for e in status.events
                 if e.new_state == scheduler_pb2.MEMBER_STATE_DEAD and e.reason == "detector"]
    assert convicted and all(e.phi >= 8 for e in convicted)


async def test_paused_worker_is_fenced_then_rejoins(cluster: LocalCluster,
                                                    client: Client) -> None:
    lines = wordcount.generate(30_000, seed=12)
    job_id = await client.submit(wordcount.job())
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    await client.send(job_id, lines[:5_000])
    paused_at = time.time()
    cluster.kill("worker-3", signal.SIGSTOP)
    try:
        detected = await detection_time(client, "worker-3", paused_at)
        assert detected is not None and detected <= DETECTION_BOUND_S
        assert "worker-3" not in await owners(client, job_id)
        await client.send(job_id, lines[5_000:20_000])
    finally:
        cluster.kill("worker-3", signal.SIGCONT)
    # On waking it is refused, stops every task (fenced) and registers again.
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    assert (await member(client, "worker-3")).member.state == scheduler_pb2.MEMBER_STATE_ALIVE
    assert cluster.members["worker-3"].alive()  # the same process, not a restart
    assert "fencing before rejoining" in cluster.logs("worker-3", tail=400)
    await client.send(job_id, lines[20_000:])
    await client.drain(job_id)
    assert await client.results(job_id) == wordcount.reference(lines)


async def test_scheduler_kill_does_not_stop_the_data_path(cluster: LocalCluster,
                                                          client: Client) -> None:
    lines = wordcount.generate(30_000, seed=13)
    job_id = await client.submit(wordcount.job())
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    await client.send(job_id, lines[:10_000])
    before = {m.member.node_id for m in (await client.status()).members}
    cluster.kill("scheduler")
    # With the scheduler down, records still flow from the client to workers and
    # between workers (the client already has the routing table).
    await client.send(job_id, lines[10_000:25_000])
    # The supervisor restarts it; it recovers members and jobs from its registry.
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    assert {m.member.node_id for m in (await client.status()).members} == before
    assert (await client.job(job_id)).state == 1
    await client.send(job_id, lines[25_000:])
    await client.drain(job_id)
    assert await client.results(job_id) == wordcount.reference(lines)


async def test_a_drain_outlives_a_scheduler_restart(cluster: LocalCluster,
                                                    client: Client) -> None:
    # drain() asked while the scheduler is down (and while it restarts) keeps
    # asking until its deadline instead of failing at the first refusal.
    lines = wordcount.generate(10_000, seed=14)
    job_id = await client.submit(wordcount.job())
    await wait_healthy(client, job_id, workers=3, timeout_s=30)
    await client.send(job_id, lines)
    cluster.kill("scheduler")
    await client.drain(job_id, timeout_s=60)
    assert cluster.members["scheduler"].restarts >= 1
    assert await client.results(job_id) == wordcount.reference(lines)

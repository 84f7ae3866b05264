"""Requests from authenticated members are checked too: a member's
credentials say who may call, not that what it sends is sane (a member with
a bug, or a stolen secret, must not be able to store an epoch no one can
exceed or a container that cannot exist). Every call here carries the
cluster secret (this process started the cluster, as ``gridstream up`` does)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gridstream import codec, rpc
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from gridstream.routing import REFRESH_INTERVAL_S
from gridstream.v1 import (
    scheduler_pb2,
    scheduler_pb2_grpc,
    stateserver_pb2,
    stateserver_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from services.worker.replicacalls import MAX_REPLICATIONS_PER_CALL
from services.worker.trackreports import MAX_REPORTS_PER_CALL

pytestmark = pytest.mark.integration

PARTITIONS = 2
TOO_BIG = 2**64 - 1
AHEAD = 2**62
"""An epoch within range but far ahead of any the cluster will reach."""
GHOST = "ghost-0123456789abcdef"
"""A job id no one submitted."""
CALL_TIMEOUT_S = 10.0


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 1 worker (no backups), 1 state server; DEBUG logs, in which
    the worker names every routing table it fetches (counted below)."""
    config = replace(Config(), log_level="DEBUG",
                     cluster=ClusterConfig(window_size=500, partitions=PARTITIONS,
                                           backup_count=0))
    local = LocalCluster(tmp_path_factory.mktemp("members"), config, workers=1,
                         state_servers=1)
    async with local:
        yield local


@pytest_asyncio.fixture(scope="module")
async def job_id(cluster: LocalCluster) -> str:
    """A running wordcount job (two tasks) on the cluster."""
    async with Client(cluster.scheduler_address) as client:
        return await client.submit(wordcount.job())


async def refused(call: Any, text: str) -> str:
    """Awaits a member's call that must be refused INVALID_ARGUMENT naming ``text``."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    details = info.value.details() or ""
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (info.value.code(), details)
    assert text in details, details
    assert len(details) < 400, details
    return details


STATUS_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


async def refused_outcome(call: Awaitable[Any], code: grpc.StatusCode, text: str) -> str:
    """A "many" call of one request, sent as a member does: the call or the
    request's own outcome must be refused with ``code`` naming ``text``."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        got, details = exc.code(), exc.details() or ""
    else:
        (outcome,) = reply.outcomes
        got, details = STATUS_BY_NUMBER[outcome.code], outcome.details
    assert got == code, (got, details)
    assert text in details, details
    assert len(details) < 400, details
    return str(details)


async def refused_replication(worker: worker_pb2_grpc.WorkerStub,
                              request: worker_pb2.ReplicateRequest,
                              code: grpc.StatusCode, text: str) -> str:
    """One replication as a member sends it (a ReplicateMany of one), refused."""
    return await refused_outcome(worker.ReplicateMany(
        worker_pb2.ReplicateManyRequest(requests=[request]), timeout=CALL_TIMEOUT_S),
        code, text)


async def refused_report(worker: worker_pb2_grpc.WorkerStub, request: worker_pb2.TrackRequest,
                         code: grpc.StatusCode, text: str) -> str:
    """One tracking report as a member sends it (a TrackMany of one), refused."""
    return await refused_outcome(worker.TrackMany(
        worker_pb2.TrackManyRequest(reports=[request]), timeout=CALL_TIMEOUT_S), code, text)


async def test_more_requests_in_one_call_than_allowed(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    one = worker_pb2.ReplicateRequest(job_id=job_id, task=0, partition=0, epoch=1,
                                      primary="worker-9")
    await refused(worker.ReplicateMany(
        worker_pb2.ReplicateManyRequest(requests=[one] * (MAX_REPLICATIONS_PER_CALL + 1)),
        timeout=CALL_TIMEOUT_S), f"at most {MAX_REPLICATIONS_PER_CALL}")
    report = worker_pb2.TrackRequest(job_id=job_id, tracker=0, epoch=1)
    await refused(worker.TrackMany(
        worker_pb2.TrackManyRequest(reports=[report] * (MAX_REPORTS_PER_CALL + 1)),
        timeout=CALL_TIMEOUT_S), f"at most {MAX_REPORTS_PER_CALL}")


@pytest_asyncio.fixture
async def worker(cluster: LocalCluster) -> AsyncIterator[worker_pb2_grpc.WorkerStub]:
    """The worker, called as a member."""
    async with rpc.open_channel(cluster.members["worker-1"].address) as channel:
        yield worker_pb2_grpc.WorkerStub(channel)


async def test_a_members_push_with_a_sequence_beyond_any_counter(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    await refused(worker.Push(worker_pb2.PushRequest(
        job_id=job_id, sender="worker-1", segments=[worker_pb2.Segment(
            task=1, partition=0, channel="t0/p0", sequence=2**63,
            batch=codec.encode_batch(["injected"], ["injected"]))]),
        timeout=CALL_TIMEOUT_S), "segments[0].sequence")


async def test_replication_at_an_epoch_no_one_can_exceed(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    await refused_replication(worker, worker_pb2.ReplicateRequest(
        job_id=job_id, task=0, partition=0, epoch=TOO_BIG, primary="worker-9", reset=True),
        grpc.StatusCode.INVALID_ARGUMENT, "epoch")


async def test_replication_and_log_fetch_of_containers_the_job_does_not_have(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    stub = worker
    await refused_replication(stub, worker_pb2.ReplicateRequest(
        job_id=job_id, task=99, partition=0, epoch=1, primary="worker-9"),
        grpc.StatusCode.INVALID_ARGUMENT, "task 99")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.FetchContainer(worker_pb2.FetchContainerRequest(
                job_id=job_id, task=0, partition=1_000_000, epoch=1), timeout=CALL_TIMEOUT_S):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "partition 1000000" in (info.value.details() or "")


async def test_a_heartbeat_with_counters_beyond_range(cluster: LocalCluster) -> None:
    async with rpc.open_channel(cluster.scheduler_address) as channel:
        await refused(scheduler_pb2_grpc.SchedulerStub(channel).Heartbeat(
            scheduler_pb2.HeartbeatRequest(node_id="worker-1", incarnation="whatever",
                                           snapshot_bytes=TOO_BIG),
            timeout=CALL_TIMEOUT_S), "snapshot_bytes")


async def test_state_writes_with_a_huge_checksum_or_a_path_for_an_id(
        cluster: LocalCluster, job_id: str) -> None:
    async with rpc.open_channel(cluster.members["state-1"].address) as channel:
        stub = stateserver_pb2_grpc.StateServerStub(channel)
        await refused(stub.PutSnapshot(stateserver_pb2.PutSnapshotRequest(
            meta=stateserver_pb2.SnapshotMeta(job_id=job_id, operator_id=f"{job_id}/t1/p0",
                                              window=1, epoch=1, size=1,
                                              checksum="f" * 100_000),
            payload=b"x"), timeout=CALL_TIMEOUT_S), "meta.checksum")
        await refused(stub.ReadOperator(stateserver_pb2.ReadOperatorRequest(
            job_id=job_id, operator_id=f"{job_id}/t1/p0", after_version=TOO_BIG),
            timeout=CALL_TIMEOUT_S).read(), "after_version")


def routing_fetches(cluster: LocalCluster) -> int:
    """Tables the worker has fetched so far: it logs each one it applies, and
    it applies every fetched table (the scheduler's epoch never goes back)."""
    return cluster.members["worker-1"].log_path.read_text().count("routing table epoch")


async def refused_with(call: Any, code: grpc.StatusCode, text: str) -> str:
    """Awaits a call (or drains a stream) that must fail with ``code`` naming ``text``."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    details = info.value.details() or ""
    assert info.value.code() == code, (info.value.code(), details)
    assert text in details, details
    return details


async def test_pushes_naming_an_epoch_ahead_of_the_cluster_cost_one_fetch_each_interval(
        cluster: LocalCluster) -> None:
    """A client choosing the epoch of its pushes must not make the worker ask
    the scheduler for the table once per push; the push is refused, saying why."""
    async with Client(cluster.scheduler_address) as client:
        job = await client.submit(wordcount.job())
        await client._routing(job, refresh=True)
        epoch = int(client._table.epoch)
    batch = codec.encode_batch(["ahead ahead"])
    async with grpc.aio.insecure_channel(cluster.members["worker-1"].address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)  # a client: no cluster secret

        def push(n: int) -> Any:
            return stub.Push(worker_pb2.PushRequest(
                job_id=job, epoch=AHEAD + n, segments=[worker_pb2.Segment(
                    task=0, partition=0, channel=f"src/ahead-{n}", sequence=1, batch=batch)]),
                timeout=CALL_TIMEOUT_S)

        before, began = routing_fetches(cluster), time.monotonic()
        details = await asyncio.gather(*(refused_with(
            push(n), grpc.StatusCode.FAILED_PRECONDITION, "ahead of the cluster's")
            for n in range(40)))
        for n in range(10):
            await refused_with(push(n), grpc.StatusCode.FAILED_PRECONDITION,
                               f"epoch {AHEAD + n}, ahead of the cluster's ({epoch})")
        elapsed = time.monotonic() - began
        fetches = routing_fetches(cluster) - before
        assert fetches <= elapsed / REFRESH_INTERVAL_S + 2, (fetches, elapsed)
        assert fetches < 50 // 2, (fetches, elapsed)
        assert "nothing was done" in details[0], details[0]
        # The epoch the scheduler gave is taken as before.
        await stub.Push(worker_pb2.PushRequest(job_id=job, epoch=epoch, segments=[
            worker_pb2.Segment(task=0, partition=0, channel="src/now", sequence=1,
                               batch=codec.encode_batch(["now"]))]), timeout=CALL_TIMEOUT_S)
    async with Client(cluster.scheduler_address) as client:
        await client.drain(job, timeout_s=60)
        assert await client.results(job) == {"now": 1}


async def test_member_calls_naming_an_epoch_ahead_of_the_cluster_are_refused(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    """Replication would fence the real primary out, a log fetch would fence
    the copy: an epoch no table has is refused before either."""
    ahead = grpc.StatusCode.FAILED_PRECONDITION
    text = f"routing epoch {AHEAD}, ahead of the cluster's"
    await refused_replication(worker, worker_pb2.ReplicateRequest(
        job_id=job_id, task=0, partition=0, epoch=AHEAD, primary="worker-9", reset=True),
        ahead, text)
    await refused_with(worker.FetchContainer(worker_pb2.FetchContainerRequest(
        job_id=job_id, task=0, partition=0, epoch=AHEAD), timeout=CALL_TIMEOUT_S), ahead, text)
    await refused_report(worker, worker_pb2.TrackRequest(job_id=job_id, tracker=0, epoch=AHEAD),
                         ahead, text)
    await refused_with(worker.TrackingEvents(worker_pb2.TrackingEventsRequest(
        job_id=job_id, epoch=AHEAD), timeout=CALL_TIMEOUT_S), ahead, text)


async def test_replication_tracking_and_log_fetch_of_a_job_no_table_lists(
        worker: worker_pb2_grpc.WorkerStub, job_id: str) -> None:
    """A backup or tracker host keeps state for what peers send it; for a job
    the routing table does not list, that state would never be dropped."""
    missing = grpc.StatusCode.NOT_FOUND
    text = f"job {GHOST!r} is not in the routing table"
    await refused_replication(worker, worker_pb2.ReplicateRequest(
        job_id=GHOST, task=0, partition=0, epoch=1, primary="worker-1", reset=True),
        missing, text)
    await refused_report(worker, worker_pb2.TrackRequest(job_id=GHOST, tracker=0, epoch=1),
                         missing, text)
    await refused_with(worker.FetchContainer(worker_pb2.FetchContainerRequest(
        job_id=GHOST, task=0, partition=0, epoch=1), timeout=CALL_TIMEOUT_S), missing, text)
    # A job the table lists is still served (a backup may hear of a job
    # before it deploys it).
    reply = await worker.TrackMany(worker_pb2.TrackManyRequest(
        reports=[worker_pb2.TrackRequest(job_id=job_id, tracker=0, epoch=1)]),
        timeout=CALL_TIMEOUT_S)
    assert [(o.code, o.roots_held) for o in reply.outcomes] == [(0, 0)]


async def test_afterwards_the_job_gives_the_reference_and_nothing_restarted(
        cluster: LocalCluster, job_id: str) -> None:
    lines = wordcount.generate(1_000, seed=5)
    async with Client(cluster.scheduler_address, batch_size=200) as client:
        await client.send(job_id, lines)
        await client.drain(job_id, timeout_s=120)
        assert await client.results(job_id) == wordcount.reference(lines)
    assert all(m.alive() and m.restarts == 0 for m in cluster.members.values())

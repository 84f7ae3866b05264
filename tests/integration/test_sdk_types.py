"""The SDK against a real local cluster: typed answers (enums and
dataclasses, not protobuf messages) from every control call, and the
blocking SyncClient with every call of Client, from a plain thread and from
inside a running event loop (as in a notebook); and the SDK's default batch
above the workers' push limit."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gridstream import Client, SyncClient
from gridstream.client import DEFAULT_BATCH_SIZE
from gridstream.examples import wordcount
from gridstream.local import LocalCluster
from gridstream.types import (
    ClusterStatus,
    JobInfo,
    JobProgress,
    JobState,
    MemberRole,
    MemberState,
    RoutingTable,
    TaskProgress,
)
from gridstream.v1 import common_pb2
from tests.integration.conftest import small_config

pytestmark = pytest.mark.integration

LINES = ["a b a", "c a b"]
COUNTS = {"a": 3, "b": 2, "c": 1}


@pytest_asyncio.fixture(scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """1 scheduler, 2 workers, 1 state server."""
    async with LocalCluster(tmp_path_factory.mktemp("sdk"), small_config(), workers=2,
                            state_servers=1) as local:
        yield local


async def test_every_control_call_answers_typed_objects(cluster: LocalCluster) -> None:
    async with Client(cluster.scheduler_address) as client:
        job_id = await client.submit(wordcount.job())
        await client.send(job_id, LINES)
        drained = await client.drain(job_id, timeout_s=60)
        assert isinstance(drained, JobProgress) and drained.drained
        assert all(isinstance(t, TaskProgress) for t in drained.tasks)
        assert sum(t.records_in for t in drained.tasks if t.task == 0) == len(LINES)

        info = await client.job(job_id)
        assert isinstance(info, JobInfo) and info.state is JobState.RUNNING
        assert info.state == common_pb2.JOB_STATE_RUNNING
        assert str(info.state) == "JobState.RUNNING"
        assert info.spec.name == wordcount.job().name and info.spec.partitions == 8
        assert job_id in [j.job_id for j in await client.jobs()]

        progress = await client.progress(job_id)
        assert isinstance(progress, JobProgress) and isinstance(progress.tasks, list)

        status = await client.status()
        assert isinstance(status, ClusterStatus)
        roles = sorted(m.member.role for m in status.members)
        assert roles == [MemberRole.WORKER, MemberRole.WORKER, MemberRole.STATE_SERVER]
        assert all(m.member.state is MemberState.ALIVE for m in status.members)

        table = await client.routing_table()
        assert isinstance(table, RoutingTable) and table.epoch >= 1
        (routing,) = [j for j in table.jobs if j.job_id == job_id]
        assert len(routing.owners) == 8
        assert set(routing.owners) <= {m.node_id for m in table.members}

        assert await client.results(job_id) == COUNTS
        cancelled = await client.cancel(job_id)
        assert cancelled.state is JobState.CANCELLED


def test_sync_client_offers_every_call_of_client() -> None:
    calls = {name for name, member in inspect.getmembers(Client)
             if inspect.iscoroutinefunction(member) and not name.startswith("_")}
    offered = {name for name, member in inspect.getmembers(SyncClient)
               if callable(member) and not name.startswith("_")}
    assert "progress" in calls and calls <= offered, calls - offered
    for name in calls:  # the same parameters, blocking
        ours = inspect.signature(getattr(SyncClient, name)).parameters
        theirs = inspect.signature(getattr(Client, name)).parameters
        assert list(ours) == list(theirs), name


def use_sync_client(address: str) -> tuple[dict[str, int], JobProgress, JobInfo]:
    with SyncClient(address) as sync:
        job_id = sync.submit(wordcount.job())
        sync.send(job_id, LINES)
        sync.drain(job_id, timeout_s=60)
        return sync.results(job_id), sync.progress(job_id), sync.job(job_id)


async def test_sync_client_works_inside_a_running_event_loop(cluster: LocalCluster) -> None:
    # This test runs in an event loop, as a notebook cell does: the blocking
    # client must not try to start a second loop in this thread.
    asyncio.get_running_loop()
    results, progress, info = use_sync_client(cluster.scheduler_address)
    assert results == COUNTS
    assert progress.drained and info.state is JobState.RUNNING


async def test_sync_client_works_from_a_plain_thread(cluster: LocalCluster) -> None:
    results, progress, _ = await asyncio.to_thread(use_sync_client, cluster.scheduler_address)
    assert results == COUNTS and progress.drained


def test_a_closed_sync_client_says_so() -> None:
    sync = SyncClient("127.0.0.1:1")
    sync.close()
    sync.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        sync.jobs()


async def test_a_default_batch_above_the_push_limit_is_split_and_sent(
        cluster: LocalCluster) -> None:
    """The SDK's default batch (20,000 records) of 600-byte records is 12 MB,
    above the workers' 8 MiB ``max_batch_bytes``: it goes in halves, every
    record counted once."""
    word = "z" * 600
    async with Client(cluster.scheduler_address) as sdk:
        job_id = await sdk.submit(wordcount.job())
        sent = await sdk.send(job_id, [word] * DEFAULT_BATCH_SIZE, ["one key"] * DEFAULT_BATCH_SIZE)
        await sdk.drain(job_id, timeout_s=120)
        assert sent == DEFAULT_BATCH_SIZE
        assert await sdk.results(job_id) == {word: DEFAULT_BATCH_SIZE}

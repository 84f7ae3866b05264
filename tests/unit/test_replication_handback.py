"""A primary whose partition is handed back commits nothing more.

A worker can hold a routing table that gives one of its partitions to another
worker before its tasks are aligned with that table (a shuffle's or a
replicator's refresh brings it early; aligning can lag on a loaded machine).
When the partition goes back to a restarted worker, that worker's first
backup holder is the worker handing it back: a replicator that went on
committing would copy new batches to *itself* and acknowledge them with one
copy in the cluster, and its worker dying before the new owner had fetched
the log lost them (a chaos run named them as DATA LOSS). The replicator must
hold appends uncommitted instead, and commit again once the table gives the
partition back to it. Likewise a log a new owner restored is committed (and
resent batches acknowledged as duplicates) only once its own holders hold it.

The holders are real gRPC servers holding real backup stores.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest

from gridstream import rpc
from gridstream.config import Config
from gridstream.ring import HashRing, assign_partitions
from gridstream.routing import RoutingView
from gridstream.v1 import scheduler_pb2, worker_pb2, worker_pb2_grpc
from services.worker.node import JobRuntime, WorkerNode
from services.worker.queues import Entry, JobContainer
from services.worker.replicacalls import ReplicationCalls
from services.worker.replication import BackupStore, Replicator

JOB = "job-1"
PARTITIONS = 8
VIRTUAL_NODES = 64
WORKERS = ["worker-1", "worker-2", "worker-3"]
RESTARTED = "worker-1"


class Holder(worker_pb2_grpc.WorkerServicer):
    """A worker's ReplicateMany endpoint over its backup store."""

    def __init__(self) -> None:
        self.store = BackupStore()
        self.replications = 0
        """Replications applied (or refused) so far, over all calls."""

    async def ReplicateMany(self, request: worker_pb2.ReplicateManyRequest,
                            context: grpc.aio.ServicerContext
                            ) -> worker_pb2.ReplicateManyResponse:
        self.replications += len(request.requests)
        return worker_pb2.ReplicateManyResponse(outcomes=[
            worker_pb2.ReplicateOutcome(next_offset=self.store.replicate(one))
            for one in request.requests])


def table(epoch: int, live: list[str], addresses: dict[str, str]) -> scheduler_pb2.RoutingTable:
    """The routing table the scheduler builds for these live workers."""
    owners = assign_partitions(HashRing(live, VIRTUAL_NODES), JOB, PARTITIONS)
    result = scheduler_pb2.RoutingTable(epoch=epoch)
    for worker in live:
        result.members.append(scheduler_pb2.Member(
            node_id=worker, role=scheduler_pb2.MEMBER_ROLE_WORKER, address=addresses[worker],
            state=scheduler_pb2.MEMBER_STATE_ALIVE))
    result.jobs.append(scheduler_pb2.JobRouting(job_id=JOB, partitions=PARTITIONS,
                                                owners=owners))
    return result


@pytest.fixture
async def holders() -> AsyncIterator[tuple[dict[str, Holder], dict[str, str]]]:
    servers, found, addresses = [], {}, {}
    for worker in WORKERS:
        server = grpc.aio.server()
        found[worker] = Holder()
        worker_pb2_grpc.add_WorkerServicer_to_server(found[worker], server)
        addresses[worker] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        servers.append(server)
    yield found, addresses
    for server in servers:
        await server.stop(None)


@contextlib.asynccontextmanager
async def replicating(key: tuple[str, int, int], container: JobContainer, primary: str,
                      routing: RoutingView) -> AsyncIterator[Replicator]:
    """``primary``'s replicator of ``container`` (owner since epoch 2,
    backup_count=1), running until the block ends."""
    channels = rpc.ChannelPool()
    replicator = Replicator(key, container, primary, routing, ReplicationCalls(channels), 1,
                            lambda: 0, lambda: 2)
    running = asyncio.create_task(replicator.run())
    try:
        yield replicator
    finally:
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await channels.close()


async def until(condition: Callable[[], object], what: str) -> None:
    """Lets the loop run until ``condition`` holds (at most ten seconds)."""
    for _ in range(1_000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_a_partition_handed_back_commits_nothing_with_its_own_copy_only(
        holders: tuple[dict[str, Holder], dict[str, str]]) -> None:
    stores, addresses = holders
    survivors = [w for w in WORKERS if w != RESTARTED]
    all_back = assign_partitions(HashRing(WORKERS, VIRTUAL_NODES), JOB, PARTITIONS)
    without = assign_partitions(HashRing(survivors, VIRTUAL_NODES), JOB, PARTITIONS)
    # A partition of the restarted worker: the survivor that took it over
    # hands it back, and is the restarted worker's first backup holder.
    partition = all_back.index(RESTARTED)
    primary = without[partition]
    other = next(w for w in survivors if w != primary)

    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(2, survivors, addresses))  # the takeover's table
    assert routing.backups(JOB, partition, 1) == [other]
    key = (JOB, 0, partition)
    container = JobContainer(f"{JOB}/t0/p{partition}", max_records=1_000)
    async with replicating(key, container, primary, routing) as replicator:
        await container.append("src/a", 1, None, [1])
        replicator.notify()
        await container.wait_committed(0, timeout_s=10)
        assert stores[other].store.logs[key].next_offset == 1

        # The restarted worker registered: the table hands the partition back
        # and names the primary's worker as the new owner's backup holder.
        routing._apply(table(3, WORKERS, addresses))
        assert routing.owner(JOB, partition) == RESTARTED
        assert routing.backups(JOB, partition, 1) == [primary]
        await container.append("src/a", 2, None, [2])
        replicator.notify()
        await until(lambda: replicator.shortfall or container.committed_offset > 1,
                    "the replicator neither committed nor held the append")
        assert container.committed_offset == 1, "acknowledged with its own copy only"
        assert key not in stores[primary].store.logs, "replicated to itself"
        assert RESTARTED in replicator.shortfall

        # The partition comes back (the restarted worker died again): the
        # held append is committed with a copy on the backup holder.
        routing._apply(table(4, survivors, addresses))
        replicator.notify()
        await container.wait_committed(1, timeout_s=10)
        assert stores[other].store.logs[key].next_offset == 2
        assert not replicator.shortfall


async def test_a_superseded_task_starts_again_only_where_its_worker_owns_the_partition(
        holders: tuple[dict[str, Holder], dict[str, str]]) -> None:
    # A task refused by a holder (a newer owner fenced it) is started again
    # at the epoch its worker knows; when that table gives the partition to
    # another worker, starting there would make two owners at one epoch.
    _, addresses = holders
    survivors = [w for w in WORKERS if w != RESTARTED]
    all_back = assign_partitions(HashRing(WORKERS, VIRTUAL_NODES), JOB, PARTITIONS)
    partition = all_back.index(RESTARTED)
    primary = assign_partitions(HashRing(survivors, VIRTUAL_NODES), JOB, PARTITIONS)[partition]
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(3, WORKERS, addresses))  # handed back to the restarted worker
    channels = rpc.ChannelPool()
    async with asyncio.TaskGroup() as group:
        node = WorkerNode(Config(), primary, routing, channels, group)
        runtime = JobRuntime(JOB, cast(Any, None), [])
        node.jobs[JOB] = runtime
        failed = cast(Any, SimpleNamespace(job_id=JOB, task_index=0, partition=partition,
                                           operator_id=f"{JOB}/t0/p{partition}"))
        runtime.runners[(0, partition)] = failed
        waiting = asyncio.create_task(node._await_ownership(failed))
        # It keeps waiting (several rounds) while the table names another owner.
        done, _ = await asyncio.wait({waiting}, timeout=0.3)
        assert not done, "started again where another worker owns the partition"
        routing._apply(table(4, survivors, addresses))  # back to this worker
        await asyncio.wait_for(waiting, 10)

        routing._apply(table(5, WORKERS, addresses))
        waiting = asyncio.create_task(node._await_ownership(failed))
        await asyncio.sleep(0)
        del runtime.runners[(0, partition)]  # aligning stopped the task meanwhile
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)
        await node.close()
    await channels.close()


async def test_a_restored_log_is_acknowledged_only_once_the_new_owners_holders_hold_it(
        holders: tuple[dict[str, Holder], dict[str, str]]) -> None:
    # A takeover restores the fullest copy, perhaps a holder's with entries
    # its primary never committed (the old primary hands over its committed
    # entries only). A sender resending one of them gets a duplicate's
    # acknowledgement: not before the new owner's holders hold the copy.
    stores, addresses = holders
    survivors = [w for w in WORKERS if w != RESTARTED]
    owners = assign_partitions(HashRing(survivors, VIRTUAL_NODES), JOB, PARTITIONS)
    partition = next(p for p, owner in enumerate(owners) if owner == survivors[0])
    owner, holder = survivors
    routing = RoutingView(cast(Any, None), VIRTUAL_NODES)
    routing._apply(table(2, survivors, addresses))
    assert routing.backups(JOB, partition, 1) == [holder]
    key = (JOB, 0, partition)
    container = JobContainer(f"{JOB}/t0/p{partition}", max_records=1_000)
    copy = [Entry(offset, "src/a", offset + 1, None, [offset]) for offset in range(3)]
    container.restore(0, {}, copy, consumed=0, committed=False)
    assert container.handoff_end == 3  # handed over whole if the partition moves now
    accepted, offset = await container.append("src/a", 3, None, [2])  # a resend
    assert not accepted and offset == 2
    with pytest.raises(TimeoutError):
        await container.wait_committed(offset, timeout_s=0.2)
    assert key not in stores[holder].store.logs

    async with replicating(key, container, owner, routing):
        # No append wakes it: the senders were answered before the restart.
        await container.wait_committed(offset, timeout_s=10)
        assert stores[holder].store.logs[key].next_offset == 3

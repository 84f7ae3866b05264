"""Replications waiting for the same holder go out as one call, and each keeps
its own outcome (services/worker/replicacalls.py).

The holder is a real gRPC server over a real backup store, answering each
replication of a call on its own as the worker's servicer does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gridstream import rpc
from gridstream.errors import GridstreamError, StaleEpoch, Unavailable, status_number
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from services.worker.replicacalls import MAX_REPLICATIONS_PER_CALL, ReplicationCalls
from services.worker.replication import BackupStore


class Holder(worker_pb2_grpc.WorkerServicer):
    """A backup store behind ReplicateMany, counting calls; ``gate`` holds
    every call until set (so replications pile up behind the first)."""

    def __init__(self) -> None:
        self.store = BackupStore()
        self.calls: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.arrived = asyncio.Event()
        """Set by every call as it arrives."""

    async def ReplicateMany(self, request: worker_pb2.ReplicateManyRequest,
                            context: grpc.aio.ServicerContext
                            ) -> worker_pb2.ReplicateManyResponse:
        self.calls.append(len(request.requests))
        self.arrived.set()
        await self.gate.wait()
        outcomes = []
        for one in request.requests:
            try:
                outcomes.append(worker_pb2.ReplicateOutcome(
                    next_offset=self.store.replicate(one)))
            except GridstreamError as exc:
                outcomes.append(worker_pb2.ReplicateOutcome(code=status_number(exc),
                                                            details=str(exc)))
        return worker_pb2.ReplicateManyResponse(outcomes=outcomes)


@pytest.fixture
async def holder() -> AsyncIterator[tuple[Holder, str]]:
    server = grpc.aio.server()
    found = Holder()
    worker_pb2_grpc.add_WorkerServicer_to_server(found, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    yield found, address
    await server.stop(None)


@pytest.fixture
async def calls() -> AsyncIterator[ReplicationCalls]:
    channels = rpc.ChannelPool()
    yield ReplicationCalls(channels, timeout_s=5.0)
    await channels.close()


def entries(count: int) -> list[worker_pb2.LogEntry]:
    return [worker_pb2.LogEntry(offset=i, channel="src/c", sequence=i + 1)
            for i in range(count)]


def request(partition: int, count: int, epoch: int = 2,
            primary: str = "worker-1") -> worker_pb2.ReplicateRequest:
    return worker_pb2.ReplicateRequest(job_id="job-1", task=1, partition=partition,
                                       epoch=epoch, primary=primary, reset=True,
                                       entries=entries(count))


async def held_call(store: Holder, calls: ReplicationCalls, address: str
                    ) -> asyncio.Future[int]:
    """Replicates partition 0 with the holder's gate shut: returns once the
    holder has that call, so whatever is replicated next waits behind it."""
    store.gate.clear()
    store.arrived.clear()
    first = asyncio.ensure_future(calls.replicate(address, request(0, 1), "p0"))
    # The first call finds that the holder has no ReplicateStream and falls
    # back to ReplicateMany; on a loaded machine that took more than a second.
    try:
        await asyncio.wait_for(store.arrived.wait(), 30.0)
    except TimeoutError:
        raise AssertionError("the holder never got the first call in 30 s") from None
    assert store.calls == [1]
    return first


async def test_replications_waiting_for_one_holder_share_a_call(
        holder: tuple[Holder, str], calls: ReplicationCalls) -> None:
    store, address = holder
    first = await held_call(store, calls, address)  # the other eleven wait behind it
    rest = [asyncio.ensure_future(calls.replicate(address, request(p, p + 1), f"p{p}"))
            for p in range(1, 12)]
    await asyncio.sleep(0)  # let them queue
    store.gate.set()
    offsets = await asyncio.gather(first, *rest)
    assert offsets == [p + 1 for p in range(12)]  # each its own container's end
    assert store.calls == [1, 11]
    assert calls.calls == 2
    assert {key[2]: log.next_offset for key, log in store.store.logs.items()} == {
        p: p + 1 for p in range(12)}


async def test_replications_started_in_one_step_go_out_as_one_call(
        holder: tuple[Holder, str], calls: ReplicationCalls) -> None:
    """One Push feeds several containers, whose replicators start together:
    the first waits one step for the others instead of going alone."""
    store, address = holder
    burst = [asyncio.ensure_future(calls.replicate(address, request(p, 1), f"p{p}"))
             for p in range(4)]
    assert await asyncio.gather(*burst) == [1, 1, 1, 1]
    assert store.calls == [4]


async def test_a_refused_replication_fails_alone_with_the_error_of_its_own_call(
        holder: tuple[Holder, str], calls: ReplicationCalls) -> None:
    store, address = holder
    store.store.fence(("job-1", 1, 3), epoch=9)  # a newer owner took partition 3 over
    blocker = await held_call(store, calls, address)
    fenced = asyncio.ensure_future(calls.replicate(address, request(3, 2), "replicating p3"))
    fine = asyncio.ensure_future(calls.replicate(address, request(4, 2), "replicating p4"))
    await asyncio.sleep(0)
    store.gate.set()
    assert await blocker == 1 and await fine == 2
    with pytest.raises(StaleEpoch) as refused:
        await fenced
    assert refused.value.epoch == 9
    assert str(refused.value).startswith("replicating p3: stale epoch 2")
    assert store.calls == [1, 2]


async def test_a_holder_that_cannot_be_reached_fails_every_replication_it_carries(
        calls: ReplicationCalls) -> None:
    with pytest.raises(Unavailable, match=r"^replicating p0: "):
        await calls.replicate("127.0.0.1:1", request(0, 1), "replicating p0")


async def test_a_cancelled_replication_leaves_the_others_theirs(
        holder: tuple[Holder, str], calls: ReplicationCalls) -> None:
    store, address = holder
    blocker = await held_call(store, calls, address)
    gone = asyncio.ensure_future(calls.replicate(address, request(1, 1), "p1"))
    kept = asyncio.ensure_future(calls.replicate(address, request(2, 3), "p2"))
    await asyncio.sleep(0)
    gone.cancel()
    store.gate.set()
    assert await blocker == 1 and await kept == 3
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert ("job-1", 1, 1) not in store.store.logs  # never sent
    assert store.calls == [1, 1]


async def test_a_call_carries_at_most_the_bound(
        holder: tuple[Holder, str], calls: ReplicationCalls) -> None:
    store, address = holder
    blocker = await held_call(store, calls, address)
    many = [asyncio.ensure_future(calls.replicate(address, request(p, 1), f"p{p}"))
            for p in range(1, MAX_REPLICATIONS_PER_CALL + 11)]
    await asyncio.sleep(0)
    store.gate.set()
    await asyncio.gather(blocker, *many)
    assert store.calls == [1, MAX_REPLICATIONS_PER_CALL, 10]

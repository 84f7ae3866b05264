"""Windows of one chunk from a worker's operators share PutStateMany calls to
each state server (gridstream/replicas.py over gridstream/peercalls.py); a
window keeps its own outcome; a bigger window still goes as a PutState
stream; and a state server that does not know PutStateMany (an older
version) gets each window as a PutState of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import msgpack
import pytest

from gridstream import rpc
from gridstream.client import Client
from gridstream.config import Config
from gridstream.errors import Unavailable
from gridstream.examples import wordcount
from gridstream.ids import operator_id
from gridstream.local import LocalCluster
from gridstream.replicas import ReplicaClient
from gridstream.routing import RoutingView
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc, stateserver_pb2, stateserver_pb2_grpc

pytestmark = pytest.mark.integration

WRITERS = 12
"""Operators closing a window at once, as a worker's tasks at a drain."""

PROBE_EPOCH = 1 << 30
"""Written as an owner newer than any worker, so the job's tasks (idle: the
test sends no records) never fence the test's windows out."""

BURSTS = 30
"""Windows written per operator after the first, each burst once the last is durable."""

JOB = "state-writes-job"
"""The job of the older state server's test (which checks no job)."""


def chunk(*keys: str) -> tuple[bytes, int]:
    """One chunk of entries: each key counted once."""
    return msgpack.packb([["count", msgpack.packb(k), msgpack.packb(1)] for k in keys]), len(keys)


async def test_windows_of_one_chunk_share_calls_and_keep_their_own_outcomes(
        tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, Config(), workers=1, state_servers=2) as cluster, \
            Client(cluster.scheduler_address) as client, cluster.state_client() as replicas:
        job = await client.submit(wordcount.job())  # state servers store only running jobs'
        writes = [replicas.put_state(job, operator_id(job, 1, p), 1, PROBE_EPOCH, None, b"h",
                                     [chunk(f"key-{p}")]) for p in range(WRITERS)]
        orphan = replicas.put_state(job, operator_id(job, 0, 0), 2, PROBE_EPOCH, 1, b"h",
                                    [chunk("orphan")])  # a delta whose parent no one holds
        outcomes = await asyncio.wait_for(
            asyncio.gather(*writes, orphan, return_exceptions=True), 30)

        assert outcomes[:WRITERS] == [None] * WRITERS, outcomes
        assert isinstance(outcomes[WRITERS], Unavailable), outcomes[WRITERS]
        assert "missing parent window 1" in str(outcomes[WRITERS])
        # 13 windows, each to both state servers: 26 stream calls of their own.
        assert 0 < replicas.state_write_calls <= 4, replicas.state_write_calls
        for p in range(WRITERS):
            stored = await replicas.read_state(job, operator_id(job, 1, p), epoch=0)
            assert stored is not None and [w.window for w in stored.windows] == [1]
            entries = [msgpack.unpackb(c) for w in stored.windows for c in w.chunks]
            assert [[e[1] for e in part] for part in entries] == [[f"key-{p}"]]  # decoded

        # A window of several chunks goes as a stream, as before.
        calls = replicas.state_write_calls
        big = [chunk(*(f"big-{c}-{i}" for i in range(10))) for c in range(3)]
        await replicas.put_state(job, operator_id(job, 0, 1), 1, PROBE_EPOCH, None, b"h", big)
        assert replicas.state_write_calls == calls
        stored = await replicas.read_state(job, operator_id(job, 0, 1), epoch=0)
        assert stored is not None
        assert sum(len(msgpack.unpackb(c)) for w in stored.windows for c in w.chunks) == 30
        await client.cancel(job)


async def test_windows_written_back_to_back_stay_whole_on_both_replicas_while_they_catch_up(
        tmp_path: Path) -> None:
    """Each replica's catch-up copies from its peer while windows keep
    arriving (a pass every 20 ms here): a copy read before the owner's next
    window must not be stored over it. Every write must succeed on both
    replicas (W = 2), and both must end at the last window of every operator.
    Before the fix, a whole state copied over a newer head dropped an
    acknowledged window, and the next delta was refused for a missing parent."""
    config = replace(Config(), stateserver=replace(Config().stateserver, sync_interval_s=0.02))
    async with LocalCluster(tmp_path, config, workers=1, state_servers=2) as cluster, \
            Client(cluster.scheduler_address) as client, cluster.state_client() as replicas:
        job = await client.submit(wordcount.job())
        operators = [operator_id(job, task, p) for task in range(2) for p in range(12)]
        entries = chunk(*(f"w{i}" for i in range(400)))
        await asyncio.wait_for(asyncio.gather(*(
            replicas.put_state(job, op, 1, PROBE_EPOCH, None, b"h", [entries])
            for op in operators)), 30)
        for window in range(2, BURSTS + 2):
            await asyncio.wait_for(asyncio.gather(*(
                replicas.put_state(job, op, window, PROBE_EPOCH, window - 1, b"h", [entries])
                for op in operators)), 30)
        for address in (m.address for m in cluster.members.values() if m.role == "stateserver"):
            stub = stateserver_pb2_grpc.StateServerStub(replicas.channels.get(address))
            for op in operators:
                head = await stub.StateHead(
                    stateserver_pb2.StateHeadRequest(job_id=job, operator_id=op), timeout=10)
                assert (head.found, head.head_window) == (True, BURSTS + 1), (address, op)
        await client.cancel(job)


class OlderStateServer(stateserver_pb2_grpc.StateServerServicer):
    """A state server from before PutStateMany, which it answers UNIMPLEMENTED;
    PutState stores (here: records) each window."""

    def __init__(self) -> None:
        self.windows: list[tuple[str, int]] = []
        self.asked_many = 0

    async def PutStateMany(self, request: stateserver_pb2.PutStateManyRequest,
                           context: grpc.aio.ServicerContext
                           ) -> stateserver_pb2.PutStateManyResponse:
        self.asked_many += 1  # what gRPC answers a method the server does not have
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        raise AssertionError("abort returns no answer")

    async def PutState(self, request_iterator: AsyncIterator[stateserver_pb2.StateChunk],
                       context: grpc.aio.ServicerContext) -> stateserver_pb2.PutStateResponse:
        async for message in request_iterator:
            self.windows.append((message.meta.operator_id, message.meta.window))
        return stateserver_pb2.PutStateResponse(created=True)


class OneStateServerTable(scheduler_pb2_grpc.SchedulerServicer):
    """A scheduler whose table lists one state server, R = W = 1."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def GetRoutingTable(self, request: scheduler_pb2.GetRoutingTableRequest,
                              context: grpc.aio.ServicerContext) -> scheduler_pb2.RoutingTable:
        return scheduler_pb2.RoutingTable(
            epoch=1, state_replicas=1, state_write_quorum=1,
            members=[scheduler_pb2.Member(node_id="state-old", address=self.address,
                                          role=scheduler_pb2.MEMBER_ROLE_STATE_SERVER,
                                          state=scheduler_pb2.MEMBER_STATE_ALIVE)])


async def test_an_older_state_server_gets_each_window_as_a_put_state() -> None:
    server = grpc.aio.server()
    older = OlderStateServer()
    stateserver_pb2_grpc.add_StateServerServicer_to_server(older, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(OneStateServerTable(address), server)
    await server.start()
    channels = rpc.ChannelPool()
    try:
        routing = RoutingView(channels.stub(address, scheduler_pb2_grpc.SchedulerStub), 100)
        await routing.refresh()
        replicas = ReplicaClient(routing, channels)
        await asyncio.wait_for(asyncio.gather(*(
            replicas.put_state(JOB, operator_id(JOB, 0, p), 1, 1, None, b"h", [chunk("k")])
            for p in range(3))), 30)
        await asyncio.wait_for(
            replicas.put_state(JOB, operator_id(JOB, 0, 0), 2, 1, 1, b"h", [chunk("k")]), 30)
        assert sorted(older.windows) == sorted(
            [(operator_id(JOB, 0, p), 1) for p in range(3)] + [(operator_id(JOB, 0, 0), 2)])
        assert older.asked_many == 1  # asked once, then remembered
        await replicas.close()
    finally:
        await channels.close()
        await server.stop(None)

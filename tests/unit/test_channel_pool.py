"""The channel pool keeps one channel and one stub of each service per peer:
a stub per call rebuilt a callable for every method of the service."""

from __future__ import annotations

import grpc

from gridstream import rpc
from gridstream.v1 import stateserver_pb2_grpc, worker_pb2_grpc


async def test_a_stub_is_built_once_per_address_and_service() -> None:
    pool = rpc.ChannelPool()
    built: list[grpc.aio.Channel] = []

    def make(channel: grpc.aio.Channel) -> worker_pb2_grpc.WorkerStub:
        built.append(channel)
        return worker_pb2_grpc.WorkerStub(channel)

    try:
        first = pool.stub("127.0.0.1:1", make)
        assert pool.stub("127.0.0.1:1", make) is first
        assert built == [pool.get("127.0.0.1:1")]  # on the pool's own channel
        other = pool.stub("127.0.0.1:2", make)
        assert other is not first and len(built) == 2
        state = pool.stub("127.0.0.1:1", stateserver_pb2_grpc.StateServerStub)
        assert isinstance(state, stateserver_pb2_grpc.StateServerStub)
    finally:
        await pool.close()


async def test_closing_the_pool_drops_its_stubs() -> None:
    pool = rpc.ChannelPool()
    stub = pool.stub("127.0.0.1:1", worker_pb2_grpc.WorkerStub)
    channel = pool.get("127.0.0.1:1")
    await pool.close()
    try:
        again = pool.stub("127.0.0.1:1", worker_pb2_grpc.WorkerStub)
        assert again is not stub
        assert pool.get("127.0.0.1:1") is not channel  # a stub on a closed channel never returns
    finally:
        await pool.close()

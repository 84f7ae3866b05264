"""A drain keeps to its ``timeout_s`` even when the scheduler takes long to
answer a progress call.

Each progress call of a drain had its own 10 s deadline, and the drain's
deadline was checked only between calls: ``drain(timeout_s=1.0)`` against a
scheduler that accepts the call and answers late raised after 10 s. Now no
call outlives the drain's deadline (:func:`gridstream.retry.call_timeout`).
The scheduler here is a real gRPC server on loopback whose progress method
never answers (its connection stays alive: a scheduler busy, not gone).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from gridstream.client import Client
from gridstream.errors import DeadlineExceeded


@pytest.fixture
async def silent_scheduler() -> AsyncIterator[str]:
    """The address of a server whose GetJobProgress never answers."""
    never = asyncio.Event()

    async def progress(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await never.wait()
        return b""

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "gridstream.v1.Scheduler",
        {"GetJobProgress": grpc.unary_unary_rpc_method_handler(progress)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_a_drain_raises_at_its_own_deadline_while_a_call_goes_unanswered(
        silent_scheduler: str) -> None:
    async with Client(silent_scheduler) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="did not drain within 1s"):
            await client.drain("job-1", timeout_s=1.0)
        waited = time.monotonic() - started
    assert waited < 5.0, f"a 1 s drain took {waited:.1f} s"

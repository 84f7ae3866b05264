"""Replication calls to a backup holder, coalesced across containers.

Every container a worker owns replicates its appends to its backup holders
(:mod:`services.worker.replication`). A batch of wordcount's source task
feeds the twelve partitions of the next task at once, so twelve containers
on three workers each replicate one entry to the same holders at the same
moment: as calls of their own, that was a gRPC call per container and holder
(275 per 900,000-word job), each costing the two processes about 0.4 ms of
CPU however small it was.

Here the replications waiting for one holder go out together as one
``ReplicateMany`` call. At most one call per holder is in flight; whatever
arrives meanwhile waits for it and goes in the next one (as a group commit
does). The first replication for an idle holder waits one step of the event
loop before it goes, so the replications that the same step started (one
Push appending to several containers) go with it: at 100,000 words/s paced,
300 calls/s before, 197 after. A burst costs one call.
Each replication keeps its own outcome: the holder checks and applies each on
its own and answers each, and a refusal (a stale epoch, say) raises for that
container alone the error a call of its own would have raised.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from gridstream import rpc
from gridstream.errors import Unavailable, from_rpc_error, from_status
from gridstream.v1 import worker_pb2, worker_pb2_grpc

REPLICATE_TIMEOUT_S = 5.0
"""Deadline of one call; a holder that takes longer is retried."""

MAX_REPLICATIONS_PER_CALL = 64
"""Replications in one call at most (the holder refuses more)."""

MAX_BYTES_PER_CALL = 8 * 1024 * 1024
"""A call takes no more replications once it carries this many bytes (it
always takes one, which a replicator bounds by its entries per call)."""


@dataclass
class _Waiting:
    request: worker_pb2.ReplicateRequest
    size: int
    what: str
    outcome: asyncio.Future[int]


class ReplicationCalls:
    """One worker's replication calls to its peers, one call per holder at a
    time carrying every replication waiting for that holder."""

    def __init__(self, channels: rpc.ChannelPool, timeout_s: float = REPLICATE_TIMEOUT_S) -> None:
        self._channels = channels
        self._timeout_s = timeout_s
        self._waiting: dict[str, list[_Waiting]] = {}
        self._turns: dict[str, asyncio.Lock] = {}
        self.calls = 0
        """ReplicateMany calls made so far (fewer than the replications they carried)."""

    async def replicate(self, address: str, request: worker_pb2.ReplicateRequest,
                        what: str) -> int:
        """Has the holder at ``address`` apply ``request``; returns the offset
        after its contiguous entries. Raises what a call of its own would
        have: :class:`StaleEpoch` when a newer owner fenced the holder, the
        typed error of any other refusal or failure, prefixed with ``what``."""
        waiting = _Waiting(request, request.ByteSize(), what,
                           asyncio.get_running_loop().create_future())
        self._waiting.setdefault(address, []).append(waiting)
        turn = self._turns.setdefault(address, asyncio.Lock())
        try:
            async with turn:  # FIFO: the holder of the turn sends for everyone waiting
                if len(self._waiting[address]) == 1:
                    # First of a burst: the replications the same step started
                    # (one Push feeds several containers) join this call.
                    await asyncio.sleep(0)
                while not waiting.outcome.done():
                    await self._call(address)
        except asyncio.CancelledError:
            queue = self._waiting.get(address, [])
            if waiting in queue:
                queue.remove(waiting)
            if waiting.outcome.done() and not waiting.outcome.cancelled():
                waiting.outcome.exception()  # retrieved: nobody else will
            waiting.outcome.cancel()
            raise
        return waiting.outcome.result()

    def _take(self, address: str) -> list[_Waiting]:
        queue = self._waiting.get(address, [])
        taken, size = 0, 0
        while (taken < len(queue) and taken < MAX_REPLICATIONS_PER_CALL
               and (taken == 0 or size + queue[taken].size <= MAX_BYTES_PER_CALL)):
            size += queue[taken].size
            taken += 1
        batch, queue[:taken] = queue[:taken], []
        return batch

    async def _call(self, address: str) -> None:
        batch = self._take(address)
        if not batch:
            return
        stub = worker_pb2_grpc.WorkerStub(self._channels.get(address))
        self.calls += 1
        try:
            response = await stub.ReplicateMany(
                worker_pb2.ReplicateManyRequest(requests=[w.request for w in batch]),
                timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            for waiting in batch:
                _settle(waiting, error=from_rpc_error(exc, waiting.what))
            return
        except BaseException:
            # Cancelled while carrying others' replications: they are told to
            # try again (their replicators resend in full, as after any failure).
            for waiting in batch:
                _settle(waiting, error=Unavailable(
                    f"{waiting.what}: the call carrying it was cancelled; retrying"))
            raise
        if len(response.outcomes) != len(batch):
            for waiting in batch:
                _settle(waiting, error=Unavailable(
                    f"{waiting.what}: the holder answered {len(response.outcomes)} outcomes "
                    f"for {len(batch)} replications"))
            return
        for waiting, outcome in zip(batch, response.outcomes, strict=True):
            if outcome.code:
                _settle(waiting, error=from_status(outcome.code, outcome.details, waiting.what))
            else:
                _settle(waiting, offset=outcome.next_offset)


def _settle(waiting: _Waiting, offset: int = 0, error: Exception | None = None) -> None:
    """Gives a replication its outcome, unless its caller has gone."""
    if waiting.outcome.done():
        return
    if error is not None:
        waiting.outcome.set_exception(error)
    else:
        waiting.outcome.set_result(offset)

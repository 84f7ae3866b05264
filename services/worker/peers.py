"""Talking to other members: pushing shuffled batches to the owners of the next
task's partitions (writing to the state servers is :mod:`gridstream.replicas`).

Every write carries an idempotency key (channel and sequence for batches;
job, operator and window for snapshots; row keys for results), so retries
after a timeout or a refusal cannot double anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from gridstream import codec, rpc
from gridstream.errors import GridstreamError, StaleEpoch, from_rpc_error
from gridstream.replicas import ReplicaClient
from gridstream.retry import Backoff
from gridstream.routing import RoutingView
from gridstream.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from services.worker.queues import ContainerClosed
from services.worker.replicacalls import ReplicationCalls

log = logging.getLogger(__name__)



@dataclass(slots=True)
class OutSegment:
    """A batch on its way to another task's container, kept as Python lists so
    that a local delivery never encodes it; encoded once for a remote one."""

    task: int
    partition: int
    channel: str
    sequence: int
    keys: list[Any] | None
    values: list[Any]
    root: int = 0
    """Tuple tracking: the root whose tree this batch is in."""
    previous_sequence: int = 0
    """The sequence sent on this channel to this partition before, so the
    receiver can tell a gap (lost acknowledged batches) from a first batch."""
    _batch: common_pb2.RecordBatch | None = None

    def encode(self) -> common_pb2.RecordBatch:
        """The records' wire form, encoded once (raises PayloadError for a
        record msgpack cannot carry)."""
        if self._batch is None:
            self._batch = codec.encode_batch(self.values, self.keys)
        return self._batch

    @property
    def encoded(self) -> common_pb2.RecordBatch | None:
        """The encoded batch if it was built already (a local delivery hands it
        to the container, so replicating it does not encode it again)."""
        return self._batch

    def fill(self, target: worker_pb2.Segment) -> None:
        """Writes the wire form into ``target``, a push's segment added in
        place (its root is set by then): the encoded batch is copied once,
        into the push, not into a segment of its own and then again
        (``gridstream.pbcopy`` says why by copy)."""
        target.task = self.task
        target.partition = self.partition
        target.channel = self.channel
        target.sequence = self.sequence
        target.root = self.root
        target.previous_sequence = self.previous_sequence
        target.batch.CopyFrom(self.encode())


Commit = Callable[[], Awaitable[bool]]
"""The wait for an appended batch's commit (held by every backup); answers
whether it was accepted (False: a duplicate)."""
LocalAppend = Callable[[str, OutSegment, float], Awaitable[Commit]]
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}


def _retry_or_raise(exc: BaseException) -> None:
    """Returns when a local append or commit may be retried (a timeout, a
    newer epoch, a container that moved away); raises anything else."""
    if isinstance(exc, (TimeoutError, StaleEpoch, ContainerClosed)):
        return
    if isinstance(exc, GridstreamError) and exc.code in _RETRYABLE:
        return
    raise exc


Channels = rpc.ChannelPool
"""The worker's pool of channels to peers (kept as a name for readability)."""


class PeerRouter:
    """Delivers segments to the owners of their partitions, retrying until each
    is acknowledged (accepted or duplicate). Local owners are served without
    gRPC."""

    def __init__(
        self,
        node_id: str,
        routing: RoutingView,
        channels: Channels,
        local_append: LocalAppend,
        push_timeout_s: float,
    ) -> None:
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self.local_append = local_append
        self.push_timeout_s = push_timeout_s
        self.replication = ReplicationCalls(channels)
        """The worker's replication calls to backup holders, over the same
        channels (its containers' replicators share them)."""

    async def deliver(self, job_id: str, segments: list[OutSegment]) -> None:
        """Returns once every segment is in its owner's container."""
        remaining = segments
        backoff = Backoff(f"delivering to job {job_id}", first_s=0.02, max_s=0.5)
        while remaining:
            by_owner: dict[str, list[OutSegment]] = {}
            for segment in remaining:
                owner = self.routing.owner(job_id, segment.partition)
                if owner is None:
                    await self.routing.refresh()
                    owner = self.routing.owner(job_id, segment.partition)
                    if owner is None:
                        raise GridstreamError(f"job {job_id} is no longer in the routing table")
                by_owner.setdefault(owner, []).append(segment)
            results = await asyncio.gather(
                *(self._send(job_id, owner, segs) for owner, segs in by_owner.items())
            )
            remaining = [seg for failed in results for seg in failed]
            if remaining:
                await backoff.wait()

    async def _send_local(self, job_id: str, segments: list[OutSegment]) -> list[OutSegment]:
        """Appends to this worker's containers in order, then waits for all the
        commits at once (their replications overlap). Nothing after a failed
        append is appended, so a channel's batches enter in sequence order;
        returns the segments that must be retried, in their order."""
        failed: set[int] = set()
        waits: list[tuple[int, Commit]] = []
        for i, segment in enumerate(segments):
            if failed:
                failed.add(i)
                continue
            try:
                waits.append((i, await self.local_append(job_id, segment, self.push_timeout_s)))
            except Exception as exc:
                _retry_or_raise(exc)
                failed.add(i)
        outcomes = await asyncio.gather(*(wait() for _, wait in waits), return_exceptions=True)
        for (i, _), outcome in zip(waits, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                _retry_or_raise(outcome)
                failed.add(i)
        return [segment for i, segment in enumerate(segments) if i in failed]

    async def _send(
        self, job_id: str, owner: str, segments: list[OutSegment]
    ) -> list[OutSegment]:
        """Sends to one owner; returns the segments that must be retried."""
        if owner == self.node_id:
            return await self._send_local(job_id, segments)
        address = self.routing.addresses.get(owner)
        if address is None:
            await self.routing.refresh()
            return segments
        stub = self.channels.stub(address, worker_pb2_grpc.WorkerStub)
        request = worker_pb2.PushRequest(job_id=job_id, epoch=self.routing.epoch,
                                         sender=self.node_id)
        for segment in segments:
            segment.fill(request.segments.add())
        try:
            await stub.Push(request, timeout=self.push_timeout_s)
            return []
        except grpc.aio.AioRpcError as exc:
            error = from_rpc_error(exc, f"push to {owner}")
            if isinstance(error, StaleEpoch):
                await self.routing.refresh(at_least=error.epoch)
                return segments
            if exc.code() in _RETRYABLE:
                log.debug("%s; retrying", error)
                return segments
            raise error from None


StateClient = ReplicaClient
"""The worker's writer and reader of operator state on the replicated state servers."""

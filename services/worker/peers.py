"""Talking to other members: pushing shuffled batches to the owners of the next
task's partitions, and writing to the state servers.

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
from gridstream.ids import checksum
from gridstream.v1 import stateserver_pb2, stateserver_pb2_grpc, worker_pb2, worker_pb2_grpc
from services.worker.queues import ContainerClosed
from services.worker.routing import RoutingView

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
    _proto: worker_pb2.Segment | None = None

    def to_proto(self) -> worker_pb2.Segment:
        """The wire form, built once."""
        if self._proto is None:
            self._proto = worker_pb2.Segment(
                task=self.task,
                partition=self.partition,
                channel=self.channel,
                sequence=self.sequence,
                batch=codec.encode_batch(self.values, self.keys),
            )
        return self._proto


LocalAppend = Callable[[str, OutSegment, float], Awaitable[bool]]
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}


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

    async def deliver(self, job_id: str, segments: list[OutSegment]) -> None:
        """Returns once every segment is in its owner's container."""
        remaining = segments
        delay = 0.02
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
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _send(
        self, job_id: str, owner: str, segments: list[OutSegment]
    ) -> list[OutSegment]:
        """Sends to one owner; returns the segments that must be retried."""
        if owner == self.node_id:
            failed = []
            for segment in segments:
                try:
                    await self.local_append(job_id, segment, self.push_timeout_s)
                except (TimeoutError, StaleEpoch, ContainerClosed):
                    failed.append(segment)
                except GridstreamError as exc:
                    if exc.code not in _RETRYABLE:
                        raise
                    failed.append(segment)
            return failed
        address = self.routing.addresses.get(owner)
        if address is None:
            await self.routing.refresh()
            return segments
        stub = worker_pb2_grpc.WorkerStub(self.channels.get(address))
        try:
            await stub.Push(
                worker_pb2.PushRequest(
                    job_id=job_id,
                    epoch=self.routing.epoch,
                    sender=self.node_id,
                    segments=[segment.to_proto() for segment in segments],
                ),
                timeout=self.push_timeout_s,
            )
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


class StateClient:
    """Writes an operator's rows and snapshots to the state server the ring
    assigns it, and reads its latest snapshot back."""

    def __init__(self, routing: RoutingView, channels: Channels) -> None:
        self.routing = routing
        self.channels = channels

    def _stub(self, operator_id: str) -> stateserver_pb2_grpc.StateServerStub:
        address = self.routing.state_server_for(operator_id)
        return stateserver_pb2_grpc.StateServerStub(self.channels.get(address))

    async def write_results(
        self,
        job_id: str,
        operator_id: str,
        rows: list[list[Any]],
        dead_letters: list[tuple[str, str, str, str]],
    ) -> None:
        """Upserts rows ([key, json]) and dead letters; durable on return."""
        try:
            await self._stub(operator_id).WriteResults(
                stateserver_pb2.WriteResultsRequest(
                    job_id=job_id,
                    operator_id=operator_id,
                    rows=codec.pack(rows),
                    row_count=len(rows),
                    dead_letters=codec.pack([list(d) for d in dead_letters]),
                    dead_letter_count=len(dead_letters),
                ),
                timeout=rpc.DATA_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, f"writing results of {operator_id}") from None

    async def get_latest_snapshot(
        self, job_id: str, operator_id: str
    ) -> tuple[int, bytes] | None:
        """(window, payload) of the operator's newest durable snapshot, or None."""
        try:
            response = await self._stub(operator_id).GetLatestSnapshot(
                stateserver_pb2.GetLatestSnapshotRequest(job_id=job_id, operator_id=operator_id),
                timeout=rpc.DATA_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, f"reading the latest snapshot of {operator_id}") from None
        if not response.found:
            return None
        if checksum(response.payload) != response.meta.checksum:
            raise GridstreamError(f"snapshot of {operator_id} failed its checksum in transit")
        return int(response.meta.window), bytes(response.payload)

    async def put_snapshot(
        self, job_id: str, operator_id: str, window: int, epoch: int, payload: bytes
    ) -> None:
        """Stores a window snapshot; durable on return."""
        meta = stateserver_pb2.SnapshotMeta(
            job_id=job_id,
            operator_id=operator_id,
            window=window,
            epoch=epoch,
            size=len(payload),
            checksum=checksum(payload),
        )
        try:
            await self._stub(operator_id).PutSnapshot(
                stateserver_pb2.PutSnapshotRequest(meta=meta, payload=payload),
                timeout=rpc.DATA_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc, f"storing window {window} of {operator_id}") from None

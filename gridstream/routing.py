"""The worker's copy of the scheduler's routing table.

Workers route shuffled records themselves, so the scheduler stays off the
data path. The table is refreshed when a heartbeat reports a newer epoch, when
a Push names a newer epoch, and when a peer refuses a batch as misrouted.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from gridstream import rpc
from gridstream.errors import from_rpc_error
from gridstream.placement import ReplicaSet
from gridstream.ring import HashRing
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


class RoutingView:
    """Owners of partitions, member addresses and state servers at one epoch."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub, virtual_nodes: int) -> None:
        self._stub = stub
        self._virtual_nodes = virtual_nodes
        self._lock = asyncio.Lock()
        self.epoch = 0
        self.table = scheduler_pb2.RoutingTable()
        self.owners: dict[str, list[str]] = {}
        self.addresses: dict[str, str] = {}
        self.incarnations: dict[str, str] = {}
        """node id -> the incarnation the table lists (new at every restart)."""
        self.state_servers: dict[str, str] = {}
        self.workers: list[str] = []
        self._worker_ring = HashRing([], virtual_nodes)
        self.replica_set = ReplicaSet.from_table(self.table, virtual_nodes)

    async def refresh(self, at_least: int = 0) -> scheduler_pb2.RoutingTable:
        """Fetches the table unless one at ``at_least`` or newer is already here.
        Concurrent callers share one fetch."""
        async with self._lock:
            if at_least and self.epoch >= at_least:
                return self.table
            try:
                table = await self._stub.GetRoutingTable(
                    scheduler_pb2.GetRoutingTableRequest(), timeout=rpc.CONTROL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                raise from_rpc_error(exc, "fetching the routing table") from None
            if table.epoch >= self.epoch:
                self._apply(table)
            return self.table

    def _apply(self, table: scheduler_pb2.RoutingTable) -> None:
        self.table = table
        self.epoch = table.epoch
        self.owners = {job.job_id: list(job.owners) for job in table.jobs}
        self.addresses = {m.node_id: m.address for m in table.members}
        self.incarnations = {m.node_id: m.incarnation for m in table.members}
        self.state_servers = {
            m.node_id: m.address
            for m in table.members
            if m.role == scheduler_pb2.MEMBER_ROLE_STATE_SERVER
            and m.state != scheduler_pb2.MEMBER_STATE_DEAD
        }
        self.replica_set = ReplicaSet.from_table(table, self._virtual_nodes)
        self.workers = sorted(
            m.node_id
            for m in table.members
            if m.role == scheduler_pb2.MEMBER_ROLE_WORKER
            and m.state != scheduler_pb2.MEMBER_STATE_DEAD
        )
        self._worker_ring = HashRing(self.workers, self._virtual_nodes)
        log.info("routing table epoch %d: %d jobs, %d members", table.epoch, len(table.jobs),
                 len(table.members))

    def owner(self, job_id: str, partition: int) -> str | None:
        """The node owning a partition, or None if the table does not know it."""
        owners = self.owners.get(job_id)
        if owners is None or partition >= len(owners):
            return None
        return owners[partition]

    def backups(self, job_id: str, partition: int, count: int) -> list[str]:
        """The workers holding copies of a partition's containers: the next
        ``count`` live workers on the ring after the owner."""
        if count <= 0:
            return []
        owner = self.owner(job_id, partition)
        walk = self._worker_ring.walk(f"{job_id}/{partition}")
        return [w for w in walk if w != owner][:count]

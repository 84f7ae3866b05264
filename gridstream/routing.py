"""The worker's copy of the scheduler's routing table.

Workers route shuffled records themselves, so the scheduler stays off the
data path. The table is refreshed when a heartbeat reports a newer epoch, when
a Push names a newer epoch, and when a peer refuses a batch as misrouted.

Requests name epochs their senders chose, so a fetch is never one per call:
callers that asked while a fetch was under way share it, fetches begin at
least :data:`REFRESH_INTERVAL_S` apart, and a request naming an epoch still
ahead of the scheduler's after a fetch is refused (:meth:`RoutingView.reach`).
A member that learned a newer epoch first is still answered from the newer
table, at most one interval late.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import grpc

from gridstream import rpc
from gridstream.errors import FailedPrecondition, from_rpc_error
from gridstream.placement import ReplicaSet
from gridstream.ring import assign_partitions, ring_of
from gridstream.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 0.1
"""Least time between the starts of two fetches of the table by one process:
however many calls name a newer epoch, the scheduler sees at most ten
fetches a second from each member."""

MAX_CACHED_ASSIGNMENTS = 4_096
"""Assignments without some workers a view keeps (per job and set of workers
left: a few per job); past this many, it forgets them all and starts again."""


class RoutingView:
    """Owners of partitions, member addresses and state servers at one epoch."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub, virtual_nodes: int,
                 min_interval_s: float = REFRESH_INTERVAL_S) -> None:
        self._stub = stub
        self._virtual_nodes = virtual_nodes
        self._lock = asyncio.Lock()
        self._min_interval_s = min_interval_s
        self._began = -math.inf
        """When the last fetch began (monotonic), whatever its outcome."""
        self._answered = -math.inf
        """When the last fetch that succeeded began: it answers every caller
        that asked before then."""
        self._fell_short = False
        """The last fetch failed or brought an older epoch than its caller
        named: the next one waits out the interval. A fetch for an epoch the
        cluster has made (a new job's, announced by a peer's call) goes at
        once: epochs advance only as fast as the scheduler makes them."""
        self.fetches = 0
        """Fetches begun: what callers naming epochs cost the scheduler."""
        self.epoch = 0
        self.table = scheduler_pb2.RoutingTable()
        self.owners: dict[str, list[str]] = {}
        self.created_epochs: dict[str, int] = {}
        """job id -> the epoch of the first table listing it (0: unknown)."""
        self.addresses: dict[str, str] = {}
        self.incarnations: dict[str, str] = {}
        """node id -> the incarnation the table lists (new at every restart)."""
        self.state_servers: dict[str, str] = {}
        self.workers: list[str] = []
        self._worker_ring = ring_of((), virtual_nodes)
        self._successors: dict[tuple[str, int, tuple[str, ...]], list[str]] = {}
        """(job, partitions, workers left) -> the owners the scheduler would
        assign with only those workers: what it depends on is the key, so it
        stays valid from one table to the next (bounded by
        :data:`MAX_CACHED_ASSIGNMENTS`)."""
        self.replica_set = ReplicaSet.from_table(self.table, virtual_nodes)

    async def refresh(self, at_least: int = 0) -> scheduler_pb2.RoutingTable:
        """Fetches the table unless one at ``at_least`` or newer is already here.

        Concurrent callers share one fetch: a caller that finds, once it holds
        the lock, that a fetch begun after it asked has succeeded takes that
        table (it is as new as anything the caller could have been told).
        A fetch begins at least ``min_interval_s`` after the one before
        unless that one brought the epoch its caller named and this caller
        names one too, so callers naming epochs the cluster does not have
        cannot turn each call into a fetch, while a new epoch the cluster
        made (a job just submitted) is fetched as soon as a call names it."""
        asked = time.monotonic()
        async with self._lock:
            if at_least and self.epoch >= at_least:
                return self.table
            if self._answered >= asked:
                return self.table
            delay = self._began + self._min_interval_s - time.monotonic()
            if delay > 0 and (not at_least or self._fell_short):
                await asyncio.sleep(delay)  # spacing fetches, not waiting for readiness
            began = self._began = time.monotonic()
            self.fetches += 1
            self._fell_short = True  # until this fetch brings what was asked
            try:
                table = await self._stub.GetRoutingTable(
                    scheduler_pb2.GetRoutingTableRequest(), timeout=rpc.CONTROL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                raise from_rpc_error(exc, "fetching the routing table") from None
            self._answered = began
            self._fell_short = table.epoch < at_least
            if table.epoch >= self.epoch:
                self._apply(table)
            return self.table

    def check_reached(self, epoch: int, what: str) -> None:
        """Refuses a request naming an epoch ahead of the table here, once the
        table has been refreshed for it: the scheduler has no such epoch, and
        asking it again per call would let the sender multiply the
        scheduler's load."""
        if epoch > self.epoch:
            raise FailedPrecondition(
                f"{what} names routing epoch {epoch}, ahead of the cluster's ({self.epoch}); "
                "use the epoch of a routing table from the scheduler (nothing was done)")

    async def reach(self, epoch: int, what: str) -> None:
        """Makes the table here at least as new as a request's ``epoch`` (one
        shared, spaced fetch), or refuses the request as ahead of the cluster."""
        if epoch > self.epoch:
            await self.refresh(at_least=epoch)
        self.check_reached(epoch, what)

    def _apply(self, table: scheduler_pb2.RoutingTable) -> None:
        self.table = table
        self.epoch = table.epoch
        self.owners = {job.job_id: list(job.owners) for job in table.jobs}
        self.created_epochs = {job.job_id: job.created_epoch for job in table.jobs}
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
        self._worker_ring = ring_of(tuple(self.workers), self._virtual_nodes)
        log.debug("routing table epoch %d: %d jobs, %d members", table.epoch, len(table.jobs),
                 len(table.members))

    def owner(self, job_id: str, partition: int) -> str | None:
        """The node owning a partition, or None if the table does not know it."""
        owners = self.owners.get(job_id)
        if owners is None or partition >= len(owners):
            return None
        return owners[partition]

    def partitions(self, job_id: str) -> int:
        """The job's partition count (one owner each), 0 for a job the table
        does not list."""
        return len(self.owners.get(job_id) or [])

    def in_first_epoch_of(self, job_id: str) -> bool:
        """Whether the table here is the first one that lists the job (an epoch
        the scheduler saved first, so never served again): the owners it names
        are the job's first, and no other worker can have taken input for them."""
        created = self.created_epochs.get(job_id, 0)
        return created != 0 and created == self.epoch

    def backups(self, job_id: str, partition: int, count: int) -> list[str]:
        """The workers holding copies of a partition's containers (their logs
        and the standby of their state): the ones that would own it next, in
        order. The first is the owner the scheduler's assignment gives the
        partition once the owner is gone, the second the one it gives once
        both are gone, and so on; so the worker that takes a partition over
        after a failure already holds its log and its state. Without a known
        owner: the first ``count`` workers on the ring."""
        if count <= 0:
            return []
        owner = self.owner(job_id, partition)
        if owner is None:
            return list(self._worker_ring.walk(f"{job_id}/{partition}"))[:count]
        holders: list[str] = []
        gone = {owner}
        while len(holders) < count:
            successor = self._successor(job_id, self.partitions(job_id), partition,
                                        frozenset(gone))
            if successor is None:
                break
            holders.append(successor)
            gone.add(successor)
        return holders

    def standby_holders(self, job_id: str, partition: int, count: int) -> list[str]:
        """The workers keeping a warm standby of a partition's state: its
        :meth:`backups` (the next owners if the owner dies), then every
        worker the scheduler's assignment would move the partition to when
        some *other* worker dies (bounded load moves a few partitions between
        survivors), so such a move adopts a standby too instead of reading
        the whole state. Logs stay with the backups only."""
        holders = self.backups(job_id, partition, count)
        owner = self.owner(job_id, partition)
        if owner is None or count <= 0:
            return holders
        partitions = self.partitions(job_id)
        for dead in self.workers:
            if dead == owner:
                continue
            mover = self._successor(job_id, partitions, partition, frozenset({dead}))
            if mover is not None and mover != owner and mover not in holders:
                holders.append(mover)
        return holders

    def _successor(self, job_id: str, partitions: int, partition: int,
                   gone: frozenset[str]) -> str | None:
        """The owner of ``partition`` in the assignment without the ``gone``
        workers (what the scheduler computes when they die), or None when no
        worker is left."""
        left = tuple(w for w in self.workers if w not in gone)
        if not left:
            return None
        key = (job_id, partitions, left)
        assignment = self._successors.get(key)
        if assignment is None:
            assignment = assign_partitions(ring_of(left, self._virtual_nodes), job_id,
                                           partitions)
            if len(self._successors) >= MAX_CACHED_ASSIGNMENTS:
                self._successors.clear()  # jobs come and go: start again
            self._successors[key] = assignment
        return assignment[partition]

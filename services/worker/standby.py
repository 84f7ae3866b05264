"""Warm standby state: a backup holder keeps each container's keyed state as
its primary's durable windows arrive, so a takeover does not read the whole
state back from the state servers.

Why: restoring a partition from the state servers means reading its base and
deltas and applying them, seconds per million keys, while the partition
stands still; recovery then grows with the state. The worker that takes a
partition over is its first backup holder (the next worker on the ring),
which already holds the partition's log. With a standby it holds the state
too: once a window is durable, the primary ships the window (the very chunks
it wrote to the state servers) to its backup holders
(:class:`StandbyShipper`), and each applies it onto the window before
(:class:`StandbyStore`). A takeover still claims the operator on the state
servers (which fences the previous owner) but reads only the deltas the
standby lacks, usually none, and adopts the standby's operators as they are.

The standby is a copy of durable windows, never a source of truth:

- a window is applied only onto its parent. One that does not chain (a
  missed shipment, a holder that just started, a new primary continuing from
  another window) makes the standby catch up from the state servers in the
  background: only the deltas after its window when they still hold it, the
  whole state otherwise. Windows arriving meanwhile wait and are applied
  after;
- a standby that is catching up is not used: the takeover reads the state
  servers as before;
- at takeover the restore (:func:`services.worker.restore.restore_task`)
  uses the standby only when the state servers' read continues it (their
  head is the standby's window, or their deltas start on it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import grpc
import msgpack

from gridstream.errors import GridstreamError
from gridstream.ids import operator_id
from gridstream.retry import Backoff
from gridstream.taskplan import results_from_state
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from services.worker.operators import OperatorChain
from services.worker.snapshots import apply_stored, freeze_grown_state

if TYPE_CHECKING:
    from gridstream.jobspec import JobSpec, Stage
    from gridstream.routing import RoutingView
    from services.worker.peers import Channels, StateClient
    from services.worker.tasks import TaskRunner

log = logging.getLogger(__name__)

ContainerKey = tuple[str, int, int]  # (job_id, task, partition)


class JobPlan(Protocol):
    """What a standby needs of a deployed job (a worker's ``JobRuntime``)."""

    spec: JobSpec
    tasks: list[list[Stage]]

MAX_SHIP_BYTES = 2 * 1024 * 1024
"""Largest window shipped with its entries. A holder applies a shipment in
one step (a few tens of milliseconds for this much); a bigger window (a whole
state) is shipped without entries and the holder reads it from the state
servers, a chunk at a time."""

MAX_QUEUED_WINDOWS = 16
"""Windows a primary keeps queued for its holders; older ones are dropped
(a holder that misses one catches up from the state servers)."""

MAX_WAITING_WINDOWS = 64
"""Windows a catching-up standby keeps to apply after its read."""

SHIP_TIMEOUT_S = 5.0

_unpackb = functools.partial(msgpack.unpackb, raw=False, strict_map_key=False)


def apply_shipped(chain: OperatorChain, chunk: bytes) -> int:
    """Applies one shipped chunk to ``chain``'s state: entries [stage, key,
    value] set a key and [stage, key] delete it, key and value each
    msgpack-encoded on their own (as the state servers store them). Returns
    how many entries were applied."""
    states = chain.states
    applied = 0
    for entry in _unpackb(chunk):
        state = states.get(entry[0])
        if state is None:
            continue
        if len(entry) == 3:
            state[_unpackb(entry[1])] = _unpackb(entry[2])
        else:
            state.pop(_unpackb(entry[1]), None)
        applied += 1
    return applied


@dataclass
class Standby:
    """One container's standby on a backup holder: the operators of its task
    with the state of ``window``, and that window's header."""

    chain: OperatorChain
    window: int | None = None
    """The newest window applied; None before the first."""
    header: bytes = b""
    epoch: int = 0
    """The newest primary epoch heard from."""
    catching_up: bool = False
    """Reading from the state servers; not usable until done."""
    waiting: list[worker_pb2.ShipStateRequest] = field(default_factory=list)
    """Windows that arrived while catching up, to apply after."""

    @property
    def usable(self) -> bool:
        """Whether a takeover may adopt it."""
        return self.window is not None and not self.catching_up

    def chains_on(self, request: worker_pb2.ShipStateRequest) -> bool:
        """Whether ``request`` applies onto what the standby holds."""
        if request.omitted:
            return False
        if not request.has_parent:
            return True
        return self.window is not None and request.parent_window == self.window

    def apply(self, request: worker_pb2.ShipStateRequest) -> None:
        """Applies a window that chains on (see :meth:`chains_on`)."""
        if not request.has_parent:
            self.chain.clear_state()
        before = sum(map(len, self.chain.states.values()))
        for chunk in request.chunks:
            apply_shipped(self.chain, chunk)
        freeze_grown_state(sum(map(len, self.chain.states.values())) - before)
        for touched in self.chain.touched.values():
            touched.clear()
        self.window = request.window
        self.header = request.header


class StandbyStore:
    """Every standby this worker holds as a backup holder, and the background
    catch-up of those that missed a window (:meth:`run`, owned by the
    worker's task group)."""

    def __init__(
        self,
        node_id: str,
        routing: RoutingView,
        channels: Channels,
        state: StateClient,
        job_plan: Callable[[str], JobPlan | None],
        backup_count: int,
    ) -> None:
        """``job_plan(job_id)`` is a deployed job's spec and task plan (None
        when the job is not deployed here)."""
        self.standbys: dict[ContainerKey, Standby] = {}
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self._state = state
        self._job_plan = job_plan
        self.backup_count = backup_count
        self._behind: set[ContainerKey] = set()
        self._wake = asyncio.Event()
        self.catch_ups = 0
        """Reads from the state servers made to catch a standby up."""
        self.taken = 0
        """Takeovers that adopted a standby."""

    def _holds(self, job_id: str, partition: int) -> bool:
        """Whether this worker keeps a standby of the partition now."""
        return self.node_id in self.routing.standby_holders(job_id, partition, self.backup_count)

    def _make_chain(self, job_id: str, task: int, partition: int) -> OperatorChain | None:
        """The operators a standby keeps (and a takeover adopts and runs: so
        with their placement, which a prepartitioned stage checks keys by)."""
        plan = self._job_plan(job_id)
        partitions = self.routing.partitions(job_id)
        if (plan is None or task >= len(plan.tasks) or not any(s.keyed for s in plan.tasks[task])
                or partition >= partitions):
            return None
        stages = plan.tasks[task]
        # Rows as the task's own chain makes them: none when they are read
        # from the stored state (what an adopted chain would build is never written).
        return OperatorChain(stages, f"standby of job {job_id}, task {task}",
                             results_from_state(plan.spec, stages) is None,
                             placement=(partition, partitions))

    def attach(self, runner: TaskRunner) -> None:
        """Gives a task starting here its standby (if this worker held one)
        and, when it keeps state and has backup holders, a shipper of its
        durable windows to their standbys."""
        runner.take_standby = self.take
        if runner.replicator is not None and runner.chain.states:
            job_id, _, partition = runner.key
            runner.standby = StandbyShipper(
                runner.key, self.node_id, self.routing, self.channels,
                lambda: self.routing.standby_holders(job_id, partition, self.backup_count),
                lambda: runner.epoch)

    def prune(self) -> None:
        """Drops the standbys of containers this worker neither holds nor owns
        any more (called when the routing table changes)."""
        self.keep_only(lambda key: self._holds(key[0], key[2])
                       or self.routing.owner(key[0], key[2]) == self.node_id)

    def receive(self, request: worker_pb2.ShipStateRequest) -> worker_pb2.ShipStateResponse:
        """Applies (or queues) a window a primary shipped."""
        key = (request.job_id, request.task, request.partition)
        if not self._holds(request.job_id, request.partition):
            if self.routing.owner(request.job_id, request.partition) != self.node_id:
                self.standbys.pop(key, None)  # moved on; a takeover here keeps its standby
            return worker_pb2.ShipStateResponse()
        standby = self.standbys.get(key)
        if standby is None:
            chain = self._make_chain(request.job_id, request.task, request.partition)
            if chain is None:
                return worker_pb2.ShipStateResponse()
            standby = self.standbys[key] = Standby(chain)
        if request.epoch < standby.epoch:
            # A primary older than one heard from: a newer owner's history wins.
            return self._held(standby)
        standby.epoch = request.epoch
        if standby.catching_up:
            standby.waiting.append(request)
            del standby.waiting[:-MAX_WAITING_WINDOWS]
        elif standby.chains_on(request):
            standby.apply(request)
        else:
            why = ("came without its entries" if request.omitted else
                   f"applies on {request.parent_window}, the standby holds {standby.window}")
            log.info("standby of %s catches up from the state servers: window %d %s",
                     operator_id(*key), request.window, why)
            standby.catching_up = True
            standby.waiting = [request]
            self._behind.add(key)
            self._wake.set()
        return self._held(standby)

    @staticmethod
    def _held(standby: Standby) -> worker_pb2.ShipStateResponse:
        return worker_pb2.ShipStateResponse(held_window=standby.window or 0,
                                            catching_up=standby.catching_up)

    def take(self, key: ContainerKey) -> Standby | None:
        """Hands a container's standby to the task taking the container over
        here (and forgets it); None when there is none ready to use."""
        standby = self.standbys.pop(key, None)
        self._behind.discard(key)
        if standby is not None and not standby.usable:
            log.info("standby of %s not used: it is catching up from the state servers "
                     "(at window %s)", operator_id(*key), standby.window)
        if standby is None or not standby.usable:
            return None
        self.taken += 1
        return standby

    def keep_only(self, wanted: Callable[[ContainerKey], bool]) -> None:
        """Drops the standbys of containers this worker no longer holds or owns."""
        for key in [k for k in self.standbys if not wanted(k)]:
            del self.standbys[key]
            self._behind.discard(key)

    def drop_job(self, job_id: str) -> None:
        """Forgets every standby of a job."""
        self.keep_only(lambda key: key[0] != job_id)

    @property
    def keys_held(self) -> int:
        """Keys held in every standby (for metrics)."""
        return sum(len(state) for standby in self.standbys.values()
                   for state in standby.chain.states.values())

    async def run(self) -> None:
        """Catches standbys up, one at a time (a read of a whole state costs
        CPU this worker's own tasks need too), until cancelled."""
        backoff = Backoff("catching a standby up", first_s=0.2, max_s=5.0)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._behind:
                key = self._behind.pop()
                standby = self.standbys.get(key)
                if standby is None or not standby.catching_up:
                    continue
                try:
                    if await self._catch_up(key, standby):
                        backoff.reset()
                    else:  # the state servers do not hold the shipped windows yet
                        await backoff.wait()
                except (GridstreamError, grpc.aio.AioRpcError) as exc:
                    log.info("standby %s: catching up from the state servers failed (%s); "
                             "retrying", operator_id(*key), exc)
                    self._behind.add(key)
                    await backoff.wait(exc)

    async def _catch_up(self, key: ContainerKey, standby: Standby) -> bool:
        """Reads what the standby lacks, then applies the windows that waited;
        False when it got nowhere (to wait before trying again)."""
        self.catch_ups += 1
        before, started = standby.window, time.monotonic()
        stored = await self._state.read_state(key[0], operator_id(*key), 0,
                                              after=standby.window)
        if self.standbys.get(key) is not standby:
            return True  # taken over or dropped meanwhile
        continues = bool(stored and stored.windows and stored.windows[0].parent is not None)
        if stored is not None:
            await apply_stored(standby.chain, stored)  # a whole state clears first
            standby.window = stored.window
            standby.header = stored.header or standby.header
        waiting = sorted(standby.waiting, key=lambda r: r.window)
        standby.waiting = []
        for request in waiting:
            if standby.window is not None and request.window <= standby.window:
                continue
            if not standby.chains_on(request):
                # Newer than what the state servers handed out: read again.
                standby.waiting = [r for r in waiting if r.window >= request.window]
                self._behind.add(key)
                self._wake.set()
                return standby.window != before
            standby.apply(request)
        standby.catching_up = False
        log.info("standby of %s caught up at window %s in %.3fs (%s)", operator_id(*key),
                 standby.window, time.monotonic() - started,
                 "nothing stored yet" if stored is None else
                 f"{stored.entries} chunks, {'deltas' if continues else 'whole state'}")
        return True


class StandbyShipper:
    """Ships one task's durable windows to its backup holders, in order and
    best effort: a holder that misses one catches up by itself."""

    def __init__(
        self,
        key: ContainerKey,
        node_id: str,
        routing: RoutingView,
        channels: Channels,
        holders: Callable[[], list[str]],
        epoch: Callable[[], int],
    ) -> None:
        self.key = key
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self.holders = holders
        self.epoch = epoch
        self._queue: list[worker_pb2.ShipStateRequest] = []
        self._wake = asyncio.Event()

    def offer(self, window: int, parent: int | None, header: bytes,
              chunks: list[tuple[bytes, int]]) -> None:
        """Queues a window that has just become durable."""
        omitted = sum(len(chunk) for chunk, _ in chunks) > MAX_SHIP_BYTES
        job_id, task, partition = self.key
        self._queue.append(worker_pb2.ShipStateRequest(
            job_id=job_id, task=task, partition=partition, primary=self.node_id,
            window=window, has_parent=parent is not None, parent_window=parent or 0,
            header=header, chunks=[] if omitted else [chunk for chunk, _ in chunks],
            omitted=omitted))
        del self._queue[:-MAX_QUEUED_WINDOWS]
        self._wake.set()

    async def run(self) -> None:
        """Ships queued windows until cancelled; owned by the task runner."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                request = self._queue.pop(0)
                request.epoch = self.epoch()
                await asyncio.gather(*(self._ship(holder, request)
                                       for holder in self.holders()))

    async def _ship(self, holder: str, request: worker_pb2.ShipStateRequest) -> None:
        address = self.routing.addresses.get(holder)
        if address is None:
            return
        stub = self.channels.stub(address, worker_pb2_grpc.WorkerStub)
        try:
            await stub.ShipState(request, timeout=SHIP_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            # Best effort: the holder catches up from the state servers.
            log.debug("shipping window %d of %s to %s failed: %s", request.window,
                      operator_id(*self.key), holder, exc.code().name)


__all__ = ["Standby", "StandbyShipper", "StandbyStore", "apply_shipped"]

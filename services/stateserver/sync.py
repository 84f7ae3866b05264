"""Replicas keeping one another whole: catch-up, hand-back, cleanup, retirement.

Each pass (after every membership change, and every ``sync_interval_s``):

1. **Catch up.** Ask every live peer for its digest (per operator: newest
   window, highest result version, fence). For each operator whose replicas
   (by :mod:`gridstream.placement`) include this server, copy the newest
   snapshot if a peer's is newer, and the rows and dead letters above our
   result version. A replica restarted after a crash, or one that just
   joined, so gets its share without an operator.
2. **Hand back.** A copy of an operator this server is no longer a replica
   of (it stood in while a replica was down, or the ring moved on a join or
   a retirement) is dropped once every current replica holds at least as
   much, so the number of copies never falls below R on the way.
3. **Clean up** (every ``cleanup_interval_s``): delete everything of jobs the
   scheduler lists as cancelled or failed (a replica that was down when a job
   was cancelled missed the delete). Superseded windows are deleted on every
   write (``keep_windows``).
4. **Retire.** A retiring server is in no operator's replicas, so step 2
   empties it; once nothing of a running job is left it deregisters and asks
   its process to stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from gridstream import codec, rpc
from gridstream.errors import GridstreamError, from_rpc_error
from gridstream.ids import checksum
from gridstream.placement import ReplicaSet
from gridstream.routing import RoutingView
from gridstream.v1 import (
    common_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    stateserver_pb2,
    stateserver_pb2_grpc,
)
from services.stateserver.layout import Entry, OperatorHoldings, SnapshotMeta, StateWindow
from services.stateserver.rows import decode_state_entries
from services.stateserver.store import SnapshotStore

log = logging.getLogger(__name__)

OperatorKey = tuple[str, str]
_ENDED_JOBS = (common_pb2.JOB_STATE_CANCELLED, common_pb2.JOB_STATE_FAILED)


@dataclass
class SyncFigures:
    """What the replica did, for logs, metrics and tests."""

    passes: int = 0
    snapshots_copied: int = 0
    rows_copied: int = 0
    operators_handed_back: int = 0
    jobs_cleaned: int = 0
    last_pass_s: float = 0.0


def _covers(theirs: stateserver_pb2.OperatorDigest | None, mine: OperatorHoldings) -> bool:
    """Whether a peer holds at least what we hold of an operator."""
    if theirs is None:
        return False
    if mine.latest_window is not None and (
        not theirs.has_snapshot or theirs.latest_window < mine.latest_window
    ):
        return False
    if mine.state_window is not None and (
        not theirs.has_state or theirs.state_window < mine.state_window
    ):
        return False
    return theirs.results_version >= mine.results_version


class ReplicaSync:
    """The background loop that implements the module's four steps for one
    state server. Owned by the server's TaskGroup; :meth:`notify` wakes it
    when the routing epoch moves."""

    def __init__(
        self,
        node_id: str,
        store: SnapshotStore,
        routing: RoutingView,
        scheduler: scheduler_pb2_grpc.SchedulerStub,
        channels: rpc.ChannelPool,
        sync_interval_s: float,
        cleanup_interval_s: float,
        incarnation: Callable[[], str],
        on_retired: Callable[[], None],
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.routing = routing
        self.scheduler = scheduler
        self.channels = channels
        self.sync_interval_s = sync_interval_s
        self.cleanup_interval_s = cleanup_interval_s
        self.incarnation = incarnation
        self.on_retired = on_retired
        self.figures = SyncFigures()
        self.caught_up = asyncio.Event()
        """Set after the first pass that reached every live peer."""
        self.staying = asyncio.Event()
        """Cleared while deregistering and after: the member agent must not
        register again when a heartbeat is answered "unknown member" then."""
        self.staying.set()
        self._wake = asyncio.Event()
        self._last_cleanup = time.monotonic()

    def notify(self) -> None:
        """Runs a pass soon (membership or ownership changed)."""
        self._wake.set()

    def _stub(self, address: str) -> stateserver_pb2_grpc.StateServerStub:
        return self.channels.stub(address, stateserver_pb2_grpc.StateServerStub)

    async def run(self) -> None:
        """Passes until cancelled; a failed pass is logged and retried."""
        while True:
            try:
                await self.run_pass()
            except asyncio.CancelledError:
                raise
            except GridstreamError as exc:
                log.warning("replica sync pass failed: %s; retrying", exc)
            except Exception:
                log.exception("replica sync pass failed; retrying")
            try:
                await asyncio.wait_for(self._wake.wait(), self.sync_interval_s)
            except TimeoutError:
                pass
            self._wake.clear()

    async def run_pass(self) -> None:
        """One pass of catch-up, hand-back, (timed) cleanup and retirement."""
        started = time.monotonic()
        await self.routing.refresh()
        replicas, epoch = self.routing.replica_set, self.routing.epoch
        peers = {n: a for n, a in replicas.readable.items() if n != self.node_id}
        digests, reached_all = await self._digests(peers)
        running = set(self.routing.owners)
        await self._catch_up(replicas, peers, digests, running)
        await self._hand_back(replicas, epoch, digests, running)
        if time.monotonic() - self._last_cleanup >= self.cleanup_interval_s:
            self._last_cleanup = time.monotonic()
            await self.clean_ended_jobs()
        if reached_all:
            self.caught_up.set()
        self.figures.passes += 1
        self.figures.last_pass_s = time.monotonic() - started
        await self._retire_if_leaving(running)

    async def _digests(
        self, peers: dict[str, str]
    ) -> tuple[dict[str, dict[OperatorKey, stateserver_pb2.OperatorDigest]], bool]:
        """Each reachable peer's holdings; and whether every peer answered."""

        async def ask(address: str) -> stateserver_pb2.DigestResponse:
            response: stateserver_pb2.DigestResponse = await self._stub(address).Digest(
                stateserver_pb2.DigestRequest(), timeout=rpc.CONTROL_TIMEOUT_S)
            return response

        nodes = sorted(peers)
        answers = await asyncio.gather(*(ask(peers[n]) for n in nodes), return_exceptions=True)
        digests = {}
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                log.info("no digest from %s (%s)", node, answer)
                continue
            digests[node] = {(d.job_id, d.operator_id): d for d in answer.operators}
        return digests, len(digests) == len(peers)

    async def _local(self) -> dict[OperatorKey, OperatorHoldings]:
        return {(h.job_id, h.operator_id): h for h in await self.store.holdings()}

    async def _catch_up(
        self,
        replicas: ReplicaSet,
        peers: dict[str, str],
        digests: dict[str, dict[OperatorKey, stateserver_pb2.OperatorDigest]],
        running: set[str],
    ) -> None:
        """Copies from peers what this replica should hold and lacks."""
        local = await self._local()
        for peer, operators in digests.items():
            for key, theirs in operators.items():
                job_id, operator_id = key
                if job_id not in running or self.node_id not in replicas.placement(operator_id):
                    continue
                mine = local.get(key)
                if theirs.has_snapshot and (
                    mine is None or mine.latest_window is None
                    or mine.latest_window < theirs.latest_window
                ):
                    await self._copy_snapshot(peers[peer], job_id, operator_id)
                if theirs.has_state and (
                    mine is None or mine.state_window is None
                    or mine.state_window < theirs.state_window
                ):
                    await self._copy_state(peers[peer], job_id, operator_id,
                                           mine.state_window if mine else None)
                if theirs.results_version > (mine.results_version if mine else 0):
                    await self._copy_rows(peers[peer], theirs,
                                          mine.results_version if mine else 0)
            local = await self._local()

    async def _copy_snapshot(self, address: str, job_id: str, operator_id: str) -> None:
        try:
            response = await self._stub(address).GetLatestSnapshot(
                stateserver_pb2.GetLatestSnapshotRequest(job_id=job_id, operator_id=operator_id),
                timeout=rpc.DATA_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.warning("copying the snapshot of %s from %s failed: %s", operator_id, address,
                        from_rpc_error(exc))
            return
        if not response.found or checksum(response.payload) != response.meta.checksum:
            return
        meta = response.meta
        created = await self.store.put_snapshot(
            SnapshotMeta(job_id=meta.job_id, operator_id=meta.operator_id, window=meta.window,
                         epoch=meta.epoch, size=meta.size, checksum=meta.checksum),
            bytes(response.payload), fenced=False)
        if created:
            self.figures.snapshots_copied += 1
            log.info("caught up %s to window %d from %s", operator_id, meta.window, address)

    async def _copy_state(self, address: str, job_id: str, operator_id: str,
                          after: int | None) -> None:
        """Copies a peer's keyed state of an operator: only the deltas after our
        head when the peer's chain holds it, else its whole state; stored in
        one transaction once every chunk arrived and checked out, so an
        interrupted copy leaves what we had."""
        windows: list[StateWindow] = []
        entries: list[Entry] = []
        first: stateserver_pb2.StateChunk | None = None
        try:
            async for chunk in rpc.idle_stream(self._stub(address).ReadState(
                stateserver_pb2.ReadStateRequest(
                    job_id=job_id, operator_id=operator_id, has_after=after is not None,
                    after_window=after or 0, packed=True)),
                    f"copying the state of {operator_id} from {address}"):
                body = chunk.header + chunk.entries
                if len(body) != chunk.meta.size or checksum(body) != chunk.meta.checksum:
                    log.error("a chunk of %s's state from %s failed its checksum; not copied",
                              operator_id, address)
                    return
                first = first or chunk
                entries.extend(decode_state_entries(chunk.entries, chunk.entry_count))
                if chunk.window_end:
                    windows.append(StateWindow(
                        job_id, operator_id, first.meta.window, first.meta.epoch,
                        first.parent_window if first.has_parent else None, first.header,
                        entries))
                    first, entries = None, []
        except (grpc.aio.AioRpcError, GridstreamError) as exc:
            error = from_rpc_error(exc) if isinstance(exc, grpc.aio.AioRpcError) else exc
            log.warning("copying the state of %s from %s failed: %s", operator_id, address,
                        error)
            return
        if first is not None:
            log.warning("the state of %s from %s ended inside a window; not copied",
                        operator_id, address)
            return
        try:
            stored = await self.store.states.put_copy(windows)
        except GridstreamError as exc:
            log.warning("storing the state of %s copied from %s failed: %s", operator_id,
                        address, exc)
            return
        if stored:
            self.figures.snapshots_copied += 1
            log.info("caught up %s's state to window %d from %s (%d windows)", operator_id,
                     windows[-1].window, address, stored)

    async def _copy_rows(self, address: str, theirs: stateserver_pb2.OperatorDigest,
                         after_version: int) -> None:
        """Copies rows and dead letters above ``after_version``; the version
        mark moves only once the whole stream arrived, so an interrupted copy
        is redone next pass rather than believed complete."""
        copied = 0
        try:
            async for chunk in self._stub(address).ReadOperator(
                stateserver_pb2.ReadOperatorRequest(
                    job_id=theirs.job_id, operator_id=theirs.operator_id,
                    after_version=after_version),
                timeout=rpc.DATA_TIMEOUT_S,
            ):
                rows = [(k, v, int(ver)) for k, v, ver in codec.unpack(chunk.rows)]
                dead = [(a, b, c, d, int(ver))
                        for a, b, c, d, ver in codec.unpack(chunk.dead_letters)]
                await self.store.write_versioned(theirs.job_id, theirs.operator_id, rows, dead,
                                                 track_version=False)
                copied += len(rows)
        except grpc.aio.AioRpcError as exc:
            log.warning("copying rows of %s from %s failed: %s", theirs.operator_id, address,
                        from_rpc_error(exc))
            return
        await self.store.mark(theirs.job_id, theirs.operator_id, theirs.epoch,
                              theirs.results_version)
        self.figures.rows_copied += copied

    async def _hand_back(
        self,
        replicas: ReplicaSet,
        epoch: int,
        digests: dict[str, dict[OperatorKey, stateserver_pb2.OperatorDigest]],
        running: set[str],
    ) -> None:
        """Drops copies of operators this server is not a replica of, once
        every replica of theirs holds as much.

        Two races are closed here. A write can reach this copy after it was
        compared with the replicas' digests (a writer whose routing table is
        older still counts this server in its quorum): the drop happens only
        if the copy still holds exactly what was compared, checked in the
        deleting transaction. And two servers whose routing tables differ can
        each find the other among the replicas covering it and both drop (a
        retirement that moves an operator back to a server still handing it
        over): nothing is dropped when the epoch moved since the digests
        were taken; the next pass decides on the new table.
        """
        candidates = []
        for key, mine in (await self._local()).items():
            job_id, operator_id = key
            if job_id not in running:
                continue
            placement = replicas.placement(operator_id)
            if self.node_id in placement or len(placement) < replicas.copies:
                continue
            if all(_covers(digests.get(node, {}).get(key), mine) for node in placement):
                candidates.append((mine, placement))
        if not candidates:
            return
        await self.routing.refresh()
        if self.routing.epoch != epoch:
            log.info("hand-back deferred: the routing epoch moved from %d to %d during the pass",
                     epoch, self.routing.epoch)
            self.notify()
            return
        for mine, placement in candidates:
            if await self.store.drop_operator(mine.job_id, mine.operator_id,
                                              unless_changed_from=mine):
                self.figures.operators_handed_back += 1
                log.info("handed %s back to %s", mine.operator_id, ", ".join(placement))
            else:
                log.info("hand-back of %s deferred: it was written after the replicas were "
                         "compared", mine.operator_id)

    async def clean_ended_jobs(self) -> int:
        """Deletes every job the scheduler lists as cancelled or failed."""
        try:
            listing = await self.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(),
                                                    timeout=rpc.CONTROL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.info("cleanup skipped, the scheduler did not answer: %s", exc.code().name)
            return 0
        ended = {job.job_id for job in listing.jobs if job.state in _ENDED_JOBS}
        cleaned = 0
        for job_id in await self.store.job_ids():
            if job_id in ended:
                await self.store.delete_job(job_id)
                cleaned += 1
                log.info("cleanup: deleted the state of ended job %s", job_id)
        self.figures.jobs_cleaned += cleaned
        return cleaned

    async def _retire_if_leaving(self, running: set[str]) -> None:
        me = next((m for m in self.routing.table.members if m.node_id == self.node_id), None)
        if me is None or me.state != scheduler_pb2.MEMBER_STATE_LEAVING:
            return
        left = [h for h in await self.store.holdings() if h.job_id in running]
        if left:
            log.info("retiring: %d operators not yet held by their replicas", len(left))
            return
        self.staying.clear()
        try:
            await self.scheduler.Deregister(
                scheduler_pb2.DeregisterRequest(node_id=self.node_id,
                                                incarnation=self.incarnation()),
                timeout=rpc.CONTROL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.staying.set()
            log.warning("deregistering failed: %s; will retry", from_rpc_error(exc))
            return
        log.info("retired: every operator is held by its replicas; leaving the cluster")
        self.on_retired()

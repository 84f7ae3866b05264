"""Trackers hosted on this worker: the XOR checkValues of roots, their
timeouts, and rebuilding them from the tasks.

The cluster has ``tracker_count`` trackers (from the routing table, so it can
change while jobs run). A root goes to the tracker the 32-bit tracker ring
gives it; tracker k is hosted by the worker that owns the key "tracker/<k>"
on the worker ring. Each hosted tracker keeps, per job, a compact
:class:`~gridstream.tracking.TrackingTable`.

- A report XORs values into roots; a root reaching zero is complete, and
  every worker of the job is told (its tasks drop the root's retained
  batches).
- A root still non-zero after its timeout has failed: the tracker rebuilds it
  (asks every worker for its tasks' contributions to it, which also tells
  them it failed, so a task that lost a batch of it appends that batch to its
  container again). Rebuilding also serves a tracker that moved to this
  worker (its host died, or the ring was resized): the roots' source tasks
  ask for it, and the checkValue is computed again from the tasks instead of
  being lost.
- A report that arrives while its root is being rebuilt is held back and
  applied afterwards unless the collected contributions already include it
  (reporter sequence numbers tell which).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import grpc
import numpy as np
import numpy.ma  # np.unique imports it at its first call (~8 ms): at start-up, not in a job

from gridstream import rpc
from gridstream.errors import StaleEpoch
from gridstream.routing import RoutingView
from gridstream.tracking import TrackingTable
from gridstream.v1 import worker_pb2, worker_pb2_grpc
from services.worker.tracker_layout import U64, TrackerLayout, pack, unpack
from services.worker.trackreports import TrackingReporter

log = logging.getLogger(__name__)
TICK_S = 0.1
"""How often timeouts are checked and pending events and rebuilds retried."""
ANNOUNCING_MAX = 4
"""Broadcasts of completions on their way at once, between ticks."""
HURRY_S = 1.0
"""For this long after someone asked about a draining job (:meth:`TrackerHost.hurry`),
completions are announced as they come instead of at the next tick."""
HANDOFF_TIMEOUT_S = 2.0
"""How long one tick waits for moved roots to reach their new trackers."""
MAX_ROOT_FAILURES = 3
"""Timeouts after which a root whose rebuilds never complete it is abandoned
(logged at ERROR and reported as data loss), so no root times out forever.
Only timeouts in a row at which no task held a batch of the root still on
its way count: a root behind a backlog is slow, not lost."""
COMPLETIONS_KEPT_S = 60.0
"""How long a worker remembers the roots it knows completed (at least twice a
job's tracking timeout): far longer than a restore takes, since a restored
source asks for its rebuilds at once."""


@dataclass
class _Rebuild:
    """Roots of one (job, tracker) being rebuilt, and reports held back meanwhile."""

    roots: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    held: list[tuple[str, int, U64, U64]] = field(default_factory=list)
    """(reporter, sequence, roots, values) that arrived during the rebuild."""


class TrackerHost:
    """The trackers this worker hosts, for every tracked job. Owned by the
    worker; :meth:`run` is a task of the worker's TaskGroup."""

    def __init__(self, node_id: str, routing: RoutingView, channels: rpc.ChannelPool) -> None:
        self.node_id = node_id
        self.routing = routing
        self.channels = channels
        self.tables: dict[tuple[str, int], TrackingTable] = {}
        self.timeouts: dict[str, float] = {}
        self._rebuilds: dict[tuple[str, int], _Rebuild] = {}
        self._events: dict[str, list[U64]] = {}
        """job -> completed roots not yet announced to every worker."""
        self._recently_completed: deque[tuple[float, str, U64]] = deque()
        """(when, job, roots) of completions this worker knows: those of its
        own trackers and those any tracker announced to it. A rebuild asks
        every worker, so a completion outlives the tracker host, the tasks
        and the partition owners that saw it, for as long as one worker
        that heard it lives."""
        self._handoffs: dict[str, list[U64]] = {}
        """job -> roots this host stopped tracking (moved by a resize, or its
        tracker went to another host) whose new trackers must rebuild them."""
        self._forwarder = TrackingReporter(node_id, routing, channels, self)
        self.completed = 0
        self.failed = 0
        self.rebuilt = 0
        self.abandoned = 0
        self._failures: dict[tuple[str, int], int] = {}
        """(job, root) -> times it timed out without completing since."""
        self._abandoned: dict[str, list[U64]] = {}
        """job -> abandoned roots not yet announced to every worker."""
        self._hurry_until = 0.0
        self._draining: dict[str, float] = {}
        """job -> until when (monotonic) a drain of it was last asked about here."""
        self._announce_now = asyncio.Event()
        """Set when completions should go out before the next tick."""
        self._announcing: set[asyncio.Task[None]] = set()
        """Announcements sent between ticks, still on their way (owned by :meth:`run`)."""

    def layout(self) -> TrackerLayout:
        """The current layout (cheap to rebuild; tables change rarely)."""
        return TrackerLayout.from_routing(self.routing)

    def _table(self, job_id: str, tracker: int) -> TrackingTable:
        key = (job_id, tracker)
        table = self.tables.get(key)
        if table is None:
            timeout = self.timeouts.get(job_id) or self.routing.table.tracking_timeout_s or 30.0
            table = self.tables[key] = TrackingTable(timeout, now=time.monotonic())
        return table

    @property
    def roots_held(self) -> int:
        """In-flight roots over every hosted tracker (the tracked-roots metric)."""
        return sum(len(t) for t in self.tables.values())

    @property
    def bytes_held(self) -> int:
        """Bytes of every hosted tracking table."""
        return sum(t.nbytes for t in self.tables.values())

    # -- reports -------------------------------------------------------------

    async def track(self, request: worker_pb2.TrackRequest) -> int:
        """Applies one report (or a rebuild request); the roots held for the job."""
        await self.routing.reach(request.epoch, f"a tracking report of job {request.job_id}")
        layout = self.layout()
        roots, values = unpack(request.roots), unpack(request.values)
        tracker = request.tracker
        if (tracker >= layout.count or layout.hosts[tracker] != self.node_id
                or (roots.size and bool(np.any(layout.trackers_of(roots) != tracker)))):
            raise StaleEpoch(
                f"stale epoch {self.routing.epoch}: tracker {tracker} of job {request.job_id} "
                f"is not hosted here for these roots (host "
                f"{layout.hosts[tracker] if tracker < layout.count else '-'}); refresh the "
                "routing table and resend", self.routing.epoch)
        owners = self.routing.owners.get(request.job_id, [])
        if (not request.rebuild and request.node_id and request.partition < len(owners)
                and owners[request.partition] != request.node_id):
            raise StaleEpoch(
                f"stale epoch {self.routing.epoch}: {request.node_id} no longer owns partition "
                f"{request.partition} of job {request.job_id} (its new owner "
                f"{owners[request.partition]} reports for it)", self.routing.epoch)
        key = (request.job_id, tracker)
        if request.rebuild:
            self._start_rebuild(key, {int(r) for r in roots}, failed=False)
            return len(self._table(*key))
        rebuild = self._rebuilds.get(key)
        if rebuild is not None and rebuild.roots:
            held = np.isin(roots, np.fromiter(rebuild.roots, dtype=np.uint64))
            if held.any():
                rebuild.held.append((request.reporter, request.sequence, roots[held],
                                     values[held]))
                roots, values = roots[~held], values[~held]
        if roots.size:
            self._apply(key, roots, values)
        return len(self._table(*key))

    def _apply(self, key: tuple[str, int], roots: U64, values: U64) -> None:
        """XORs a report's values into tracker ``key``'s table and queues
        the trees it completes for announcing."""
        table = self._table(*key)
        done = table.xor(roots, values)
        self._completed(key[0], done)
        if done.size and not len(table) and self._is_draining(key[0]):
            # The last tree this tracker held for a draining job is complete:
            # nothing is left to batch with it, and the drain waits for this
            # very announcement.
            self._announce_now.set()

    def _completed(self, job_id: str, roots: U64) -> None:
        if roots.size and self._failures:
            for root in roots.tolist():
                self._failures.pop((job_id, int(root)), None)
        if roots.size:
            self.completed += int(roots.size)
            self._events.setdefault(job_id, []).append(roots)
            now = time.monotonic()
            self._recently_completed.append((now, job_id, roots))
            if now < self._hurry_until:
                self._announce_now.set()

    def set_timeout(self, job_id: str, timeout_s: float) -> None:
        """The job's root timeout, known once a task of the job starts here.
        A table made before that (a rebuild asked of a worker that had just
        restarted) has the cluster default, which can be far longer than the
        period at which sources ask again for an overdue root: every request
        then rebuilt the root before it could time out, so a tree that lost a
        batch was never abandoned and the job never drained. Such a table's
        roots are rebuilt into one with the job's timeout."""
        if self.timeouts.get(job_id) == timeout_s:
            return
        self.timeouts[job_id] = timeout_s
        for key in [k for k in self.tables if k[0] == job_id]:
            table = self.tables[key]
            if table.timeout_s == timeout_s:
                continue
            del self.tables[key]
            pending = {int(r) for r in table.pending_ids()}
            if pending:
                self._start_rebuild(key, pending, failed=False)

    def heard_completed(self, job_id: str, roots: U64) -> None:
        """Remembers completions a tracker announced to this worker."""
        if roots.size:
            self._recently_completed.append((time.monotonic(), job_id, roots))

    def known_completed(self, job_id: str, roots: Collection[int]) -> U64:
        """Which of ``roots`` completed recently, as far as this worker knows."""
        asked = np.fromiter(roots, dtype=np.uint64, count=len(roots))
        return asked[np.isin(asked, self._recent(job_id))] if asked.size else asked

    def _start_rebuild(self, key: tuple[str, int], roots: set[int], failed: bool) -> None:
        rebuild = self._rebuilds.setdefault(key, _Rebuild())
        rebuild.roots |= roots
        if failed:
            rebuild.failed |= roots

    # -- the background loop ---------------------------------------------------

    def hurry(self) -> None:
        """Someone is draining a job (their progress query asked for a flush):
        for :data:`HURRY_S`, completions are announced as they come. While a
        job streams, announcing once a tick batches many completions into one
        broadcast to every worker; at the end of a drain nothing is left to
        batch, and waiting for the tick only adds up to ``TICK_S`` to it."""
        self._hurry_until = time.monotonic() + HURRY_S
        if self._events:
            self._announce_now.set()

    def drain_asked(self, job_id: str) -> None:
        """Someone asked about a drain of ``job_id`` (with a flush), perhaps
        while this worker's tasks were still busy, so :meth:`hurry` was not
        called. For :data:`HURRY_S`, the completion that leaves one of the
        job's trackers here holding no tree is announced at once rather than
        at the next tick (up to ``TICK_S`` later, which a drain would wait
        for): it can be batched with nothing."""
        now = time.monotonic()
        self._draining[job_id] = now + HURRY_S
        for job, until in list(self._draining.items()):
            if until <= now:
                del self._draining[job]

    def _is_draining(self, job_id: str) -> bool:
        return self._draining.get(job_id, 0.0) > time.monotonic()

    async def run(self) -> None:
        """Expires roots, rebuilds and announces, until cancelled: a full
        tick every ``TICK_S``, and announcements alone in between when
        :meth:`hurry` asked for them."""
        next_tick = time.monotonic() + TICK_S
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, next_tick - time.monotonic())):
                        await self._announce_now.wait()
                self._announce_now.clear()
                try:
                    now = time.monotonic()
                    if now >= next_tick:
                        try:
                            await self.tick(now)
                        finally:  # ticks stay TICK_S apart however long one takes
                            next_tick = time.monotonic() + TICK_S
                    else:
                        self._announce_between_ticks()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("tracker tick failed; retrying")
        finally:
            for task in self._announcing:
                task.cancel()
            await asyncio.gather(*self._announcing, return_exceptions=True)

    def _announce_between_ticks(self) -> None:
        """Sends the completions queued so far without waiting for the
        broadcasts still on their way: at the end of a drain, reports arrive
        a millisecond or two apart and a broadcast takes several, so waiting
        for each made the last completion wait for all the earlier ones. At
        most :data:`ANNOUNCING_MAX` broadcasts are on their way at once; what
        comes meanwhile goes with the next one, or at the next tick.
        Announcements are sets of completed roots: their order does not
        matter, and one that fails is queued again (see :meth:`_announce`)."""
        for job_id in list(self._events):
            if len(self._announcing) >= ANNOUNCING_MAX:
                return
            task = asyncio.ensure_future(self._announce(job_id))
            self._announcing.add(task)
            task.add_done_callback(self._announced)

    def _announced(self, task: asyncio.Task[None]) -> None:
        self._announcing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("announcing completions failed (%s); they go again at the next tick",
                        task.exception())
        if self._events and (time.monotonic() < self._hurry_until
                             or any(map(self._is_draining, self._events))):
            self._announce_now.set()  # what waited for a free slot goes now

    async def tick(self, now: float) -> None:
        """One round: drop roots that moved away, expire, rebuild, announce."""
        layout = self.layout()
        for (job_id, tracker), table in list(self.tables.items()):
            if job_id not in self.routing.owners:
                del self.tables[(job_id, tracker)]
                self._rebuilds.pop((job_id, tracker), None)
                continue
            if tracker >= layout.count or layout.hosts[tracker] != self.node_id:
                # The tracker moved away: its roots' new trackers rebuild them.
                del self.tables[(job_id, tracker)]
                rebuild = self._rebuilds.pop((job_id, tracker), None)
                self._hand_off(job_id, table.pending_ids())
                if rebuild is not None:
                    self._hand_off(job_id, np.fromiter(rebuild.roots, dtype=np.uint64))
                continue
            pending = table.pending_ids()
            if pending.size:
                moved = layout.trackers_of(pending) != tracker
                if moved.any():
                    table.remove(pending[moved])
                    self._hand_off(job_id, pending[moved])
            failed = table.expire(now)
            if failed.size:
                self.failed += int(failed.size)
                retry, give_up = self._count_failures(job_id, failed)
                if retry:
                    log.warning("job %s: %d roots on tracker %d timed out; rebuilding them "
                                "from the tasks' contributions", job_id, len(retry), tracker)
                    self._start_rebuild((job_id, tracker), set(retry), failed=True)
                if give_up:
                    self._abandon(job_id, give_up)
        kept = max(COMPLETIONS_KEPT_S, 2 * max(self.timeouts.values() or [0.0]))
        while self._recently_completed and now - self._recently_completed[0][0] > kept:
            self._recently_completed.popleft()
        for key in list(self._rebuilds):
            await self._rebuild(key)
        for job_id in list(self._events):
            await self._announce(job_id)
        for job_id in list(self._abandoned):
            await self._announce_abandoned(job_id)
        for job_id in list(self._handoffs):
            await self._send_handoffs(job_id)

    def _count_failures(self, job_id: str, failed: U64) -> tuple[list[int], list[int]]:
        """Splits timed-out roots into those to rebuild and those that have
        failed MAX_ROOT_FAILURES times (rebuilt each time, never complete)."""
        retry: list[int] = []
        give_up: list[int] = []
        for root in failed.tolist():
            key = (job_id, int(root))
            count = self._failures[key] = self._failures.get(key, 0) + 1
            (give_up if count >= MAX_ROOT_FAILURES else retry).append(int(root))
        return retry, give_up

    def _abandon(self, job_id: str, roots: list[int]) -> None:
        for root in roots:
            self._failures.pop((job_id, root), None)
        self.abandoned += len(roots)
        log.error("job %s: %d tuple trees still incomplete after %d rebuilds (e.g. root "
                  "%016x): a batch of each is gone; abandoning them and reporting data loss",
                  job_id, len(roots), MAX_ROOT_FAILURES, roots[0])
        self._abandoned.setdefault(job_id, []).append(np.asarray(roots, dtype=np.uint64))

    async def _announce_abandoned(self, job_id: str) -> None:
        """Tells every worker which roots were abandoned; kept until all have heard."""
        batches = self._abandoned.pop(job_id, None)
        if not batches:
            return
        roots = np.concatenate(batches)
        answers = await self._broadcast(worker_pb2.TrackingEventsRequest(
            job_id=job_id, abandoned=pack(roots)))
        if not all(a is not None for a in answers.values()):
            self._abandoned.setdefault(job_id, []).insert(0, roots)

    def _hand_off(self, job_id: str, roots: U64) -> None:
        if roots.size:
            self._handoffs.setdefault(job_id, []).append(roots)

    async def _send_handoffs(self, job_id: str) -> None:
        """Asks the new trackers of roots this host dropped to rebuild them.
        The roots' source tasks ask too when they see the move, but a task
        whose worker skipped the epoch in between does not see it, so the
        host that lets go of a root is the one that must not forget it.
        Rebuild requests are idempotent: resending after a timeout is safe."""
        parts = self._handoffs.pop(job_id, [])
        if not parts or job_id not in self.routing.owners:
            return
        roots = np.unique(np.concatenate(parts))
        try:
            await asyncio.wait_for(self._forwarder.rebuild(job_id, roots.tolist()),
                                   HANDOFF_TIMEOUT_S)
        except TimeoutError:
            self._handoffs.setdefault(job_id, []).append(roots)
            log.info("job %s: handing %d roots to their new trackers timed out; retrying",
                     job_id, roots.size)

    def _workers(self) -> dict[str, str]:
        return {w: self.routing.addresses[w] for w in self.routing.workers
                if w in self.routing.addresses}

    async def _announce(self, job_id: str) -> None:
        """Tells every worker which roots completed; kept until all have heard."""
        batches = self._events.pop(job_id, None)
        if not batches:
            return
        completed = np.concatenate(batches)
        request = worker_pb2.TrackingEventsRequest(job_id=job_id, completed=pack(completed))
        try:
            answers = await self._broadcast(request)
        except BaseException:
            self._events.setdefault(job_id, []).insert(0, completed)  # not heard: kept
            raise
        if not all(a is not None for a in answers.values()):
            # Completions that arrived meanwhile were queued afresh; keep both.
            self._events.setdefault(job_id, []).insert(0, completed)

    async def _broadcast(self, request: worker_pb2.TrackingEventsRequest
                         ) -> dict[str, worker_pb2.TrackingEventsResponse | None]:
        workers = self._workers()

        async def ask(address: str) -> worker_pb2.TrackingEventsResponse | None:
            stub = self.channels.stub(address, worker_pb2_grpc.WorkerStub)
            try:
                response: worker_pb2.TrackingEventsResponse = await stub.TrackingEvents(
                    request, timeout=rpc.CONTROL_TIMEOUT_S)
                return response
            except grpc.aio.AioRpcError as exc:
                log.debug("tracking events to %s failed: %s", address, exc.code().name)
                return None

        names = sorted(workers)
        results = await asyncio.gather(*(ask(workers[n]) for n in names))
        return dict(zip(names, results, strict=True))

    async def _rebuild(self, key: tuple[str, int]) -> None:
        """Computes the roots' checkValues again from every worker's tasks."""
        rebuild = self._rebuilds[key]
        job_id, tracker = key
        roots = np.fromiter(sorted(rebuild.roots), dtype=np.uint64)
        failed = np.fromiter(sorted(rebuild.failed), dtype=np.uint64)
        answers = await self._broadcast(worker_pb2.TrackingEventsRequest(
            job_id=job_id, collect=pack(roots), failed=pack(failed), epoch=self.routing.epoch))
        if any(a is None or not a.complete for a in answers.values()):
            return  # a worker is unreachable or still restoring: retry next tick
        epochs = {a.epoch for a in answers.values() if a is not None}
        if epochs and (len(epochs) > 1 or max(epochs) != self.routing.epoch):
            # Answers from different epochs may count a partition twice (its
            # old and new owner) or not at all: catch up and ask again.
            await self.routing.refresh(at_least=max(epochs))
            return
        # The tasks have been told; their lost batches are appended again.
        rebuild.failed -= {int(r) for r in failed}
        round_ = RebuildRound.of(roots, [a for a in answers.values() if a is not None])
        values, through = round_.values, round_.through
        # Roots added to the rebuild while the workers answered wait for the
        # next round, with the reports held for them.
        still_held = []
        for reporter, sequence, held_roots, held_values in rebuild.held:
            ours = np.isin(held_roots, roots)
            # Only a task that answered (it owns its partition at the round's
            # epoch) can have sent a report after its answer; a report from
            # any other task is its predecessor's, and the successor's answer
            # already counts it.
            if reporter in through and sequence > through[reporter]:
                for root, value in zip(held_roots[ours].tolist(), held_values[ours].tolist(),
                                       strict=True):
                    values[root] = values.get(root, 0) ^ value
            if not ours.all():
                still_held.append((reporter, sequence, held_roots[~ours], held_values[~ours]))
        rebuild.held = still_held
        rebuild.roots -= {int(r) for r in roots}
        if not rebuild.roots:
            self._rebuilds.pop(key, None)
        table = self._table(job_id, tracker)
        table.remove(roots)
        finished = round_.finished()
        for root in finished:
            values.pop(root)
        for root in round_.in_progress.intersection(values):
            # A batch of it is still on its way (a backlog, persistence
            # behind): its timeouts so far say nothing of a loss.
            self._failures.pop((job_id, root), None)
        if values:
            ids = np.fromiter(values, dtype=np.uint64, count=len(values))
            vals = np.fromiter(values.values(), dtype=np.uint64, count=len(values))
            self._completed(job_id, table.xor(ids, vals))
        if finished:
            self._completed(job_id, np.asarray(finished, dtype=np.uint64))
        self.rebuilt += len(roots)
        log.info("job %s tracker %d: rebuilt %d roots (%d finished)", job_id, tracker,
                 len(roots), len(finished))

    def _recent(self, job_id: str) -> U64:
        parts = [roots for _, job, roots in self._recently_completed if job == job_id]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


@dataclass
class RebuildRound:
    """The workers' answers to one rebuild round, summed per root."""

    values: dict[int, int]
    """root -> XOR of every task's contributions (zero: the tree is complete)."""
    through: dict[str, int]
    """reporter -> sequence of its last report the contributions include."""
    source_pending: set[int]
    """Roots a source task still holds as pending."""
    known_completed: set[int]
    """Roots some worker knows completed recently."""
    in_progress: set[int]
    """Roots a task still holds an unreported batch of: slow, not lost."""

    @classmethod
    def of(cls, roots: U64, answers: list[worker_pb2.TrackingEventsResponse]) -> RebuildRound:
        """Sums the answers for ``roots``."""
        round_ = cls({int(r): 0 for r in roots}, {}, set(), set(), set())
        for answer in answers:
            for root, value in unpack(answer.contributions).reshape(-1, 2).tolist():
                round_.values[root] = round_.values.get(root, 0) ^ value
            round_.through.update(answer.reported_through)
            round_.source_pending.update(unpack(answer.source_pending).tolist())
            round_.known_completed.update(unpack(answer.known_completed).tolist())
            round_.in_progress.update(unpack(answer.in_progress).tolist())
        return round_

    def finished(self) -> list[int]:
        """Roots that are finished whatever their sum: no source task holds
        them any more, or a worker knows they completed. The second case is
        a source restored from a snapshot taken before its root completed:
        it holds the root again, while the tasks that processed the rest of
        the tree let go of their contributions when it completed, so the
        sum can never reach zero again."""
        return [r for r in self.values
                if r not in self.source_pending or r in self.known_completed]

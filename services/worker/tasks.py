"""TaskRunner: one (job, task, partition) — a JobContainer feeding a JobOperator
chain, with its shuffle, double buffer, replicator and persister.

The loop, per batch, follows the seed's method: take the batch, run the
chain, emit the output and wait for its acknowledgement, then mark it done
(os=true, offset+1) and add it to the WindowSnapshot. When the window reaches
W records, its state and offsets go to the Persister, which writes them
asynchronously; sink rows go with them. When the container runs empty,
pending sink rows are flushed too (the seed persists its map "when its input
queue runs empty").

Recovery, when a runner starts, is :func:`services.worker.restore.restore_task`
(snapshot, log copy, replay from the snapshot's offset); the idempotence rule
that makes a replay exact is the JobContainer's (docs/recovery.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gridstream import codec
from gridstream.deadletters import encode_error, encode_message
from gridstream.errors import GridstreamError
from gridstream.faults import FAULTS, crash_point, drop_report, tasks_fail
from gridstream.ids import (
    batch_identity,
    container_id,
    first_row_version,
    key_text,
    operator_id,
    task_channel,
    tuple_id,
)
from gridstream.jobspec import JobSpec, Stage
from gridstream.metrics import Histogram
from gridstream.peercalls import next_boundary
from gridstream.retry import Backoff
from gridstream.taskplan import results_from_state, sink_row_prefix
from gridstream.v1 import common_pb2
from services.worker.containment import dead_batch, run_records
from services.worker.delivery import DeliveryPipeline
from services.worker.edges import Outbound
from services.worker.filesinks import writer_of
from services.worker.operators import (
    ChainResult,
    DeadLetter,
    OperatorChain,
    safe_text,
)
from services.worker.peers import Commit, OutSegment, PeerRouter, StateClient
from services.worker.queues import Entry, JobContainer, LostRange
from services.worker.replication import Replicator
from services.worker.restore import restore_task
from services.worker.snapshots import (
    LatestSnapshot,
    PendingSnapshot,
    Persister,
    WindowSnapshot,
    freeze_grown_state,
)
from services.worker.standby import Standby, StandbyShipper
from services.worker.taskprogress import task_progress
from services.worker.ticks import ticker_of
from services.worker.tracking import ReportWake, TaskTracking
from services.worker.watermarks import batch_time, batch_watermark, event_inputs

if TYPE_CHECKING:
    from services.worker.trackreports import TrackingReporter

log = logging.getLogger(__name__)

FetchedLog = tuple[int, dict[str, int], list[Entry]]  # (base, sequences, entries)
FetchLog = Callable[[tuple[str, int, int], int], Awaitable[FetchedLog | None]]
"""(container key, the new owner's epoch) -> the fullest copy of its log."""


def _row_key(key: Any) -> str:
    return key if isinstance(key, str) else key_text(key)


def window_is_due(since_close_s: float, flush_s: float) -> bool:
    """Whether the flush timer (a check every half ``flush_s``) closes the
    window now: one closed just after the check two steps back is due, else
    the timer would close one every 1.5 ``flush_s``."""
    return since_close_s >= flush_s * 0.75


class TaskRunner:
    """Runs one task of one partition until cancelled."""

    def __init__(
        self,
        job_id: str,
        spec: JobSpec,
        tasks: list[list[Stage]],
        task_index: int,
        partition: int,
        node_id: str,
        router: PeerRouter,
        state: StateClient,
        fetch_log: FetchLog,
        max_records: int,
        batch_records: int,
        backup_count: int,
        reporter: TrackingReporter | None = None,
        tracking_flush_s: float = 0.5,
        results_linger_s: float = 0.0,
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.task_index = task_index
        self.partition = partition
        self.key = (job_id, task_index, partition)
        self.node_id = node_id
        self.operator_id = operator_id(job_id, task_index, partition)
        self.container = JobContainer(
            container_id(job_id, task_index, partition), max_records,
            dedupe=spec.delivery != "at_least_once",
            name_losses=spec.delivery == "exactly_once",
        )
        stages = tasks[task_index]
        self.rows_from_state = results_from_state(spec, stages) is not None  # none written
        self.chain = OperatorChain(stages, f"job {spec.name}, task {task_index}",
                                   not self.rows_from_state, (partition, spec.partitions))
        self.outbound = Outbound.of_task(job_id, spec, task_index, partition,
                                         task_channel(task_index, partition), router,
                                         batch_records)
        """Every edge the task's output goes on (none for a task ending in a sink)."""
        self.row_prefix = sink_row_prefix(spec, stages)
        self.event_inputs = event_inputs(spec, task_index, partition)  # None: hears no time
        self.files = writer_of(self.chain, job_id, partition, lambda: self.chain,
                               lambda: self.epoch, self.operator_id)
        """The task's files sink, when its chain ends in one."""
        self.state_client = state
        self.fetch_log = fetch_log
        self.window_size = spec.window_size
        self.latest = LatestSnapshot()
        self.functions = [s.function for s in stages]
        """The seed's ``fun``: import paths of the chained stages, in every
        window snapshot's header."""
        self.window = WindowSnapshot()
        self.persister = Persister(self._write_rows, self._write_snapshot, self._durable,
                                   self.operator_id, results_linger_s)
        self.durable_offset = 0
        self.replicator: Replicator | None = None
        if spec.delivery != "at_most_once" and backup_count > 0:
            self.replicator = Replicator(
                self.key, self.container, node_id, router.routing, router.replication,
                backup_count, self.trim_bound, lambda: self.epoch,
            )
        self.standby: StandbyShipper | None = None
        """Ships durable windows to the backup holders' standbys (set by the node)."""
        self.take_standby: Callable[[tuple[str, int, int]], Standby | None] = lambda key: None
        self.ready = asyncio.Event()
        self._rows: dict[Any, Any] = {}
        self._dead: list[DeadLetter] = []
        self.records_processed = 0
        self.records_out = 0
        self.dead_letters = 0
        self.delivery = DeliveryPipeline(self.outbound, node_id)  # output on its way
        self.recovered_batches = 0
        """Batches after the snapshot's offset processed again on recovery."""
        self.recovered_records = 0
        self.recovery_seconds = 0.0
        self.restarts = 0
        """Times this task's loop failed on this worker before this runner."""
        self._tasks_fail = tasks_fail(node_id)
        self.last_error = ""
        self.epoch = 0
        self.first_owner = False
        """Started on this worker from the first table listing the job (set by
        the node): no owner came before, nothing of the task is stored or
        replicated, so recovery is skipped (no state read, no log fetch, no
        empty first replication round)."""
        self.tracking: TaskTracking | None = None
        if spec.delivery != "at_most_once" and reporter is not None:
            self.tracking = TaskTracking(is_source=task_index == 0)
        self.reporter = reporter
        self.reporter_id = f"{self.operator_id}@{uuid.uuid4().hex[:12]}"
        self.tracking_flush_s = tracking_flush_s
        self.tracking_lock = asyncio.Lock()
        """Held to report and to answer a tracker's collect: orders the two."""
        self._report_wake = ReportWake()
        self._close_requested = False
        self._close_when_idle = False  # a drain asked while the task was busy
        self._last_close = time.monotonic()
        self._state_keys = 0  # keys held at the last window close
        self._needs_rebuild: set[int] = set()
        self.invocations = 0
        self.latency = Histogram()  # ingest to sink, seconds (sink tasks only)
        self.internal_errors = 0
        """Batches dead-lettered whole because gridstream's own handling failed."""
        self._row_version = 0
        """Version of the last result write: increases with every write, and a later
        owner's are higher (windows numbered from epoch << 20): replicas keep the newest."""

    # -- life ----------------------------------------------------------------

    async def run(self, on_restored: Callable[[], None] | None = None) -> None:
        """Restores, then processes batches forever beside its persister and
        replicator. ``on_restored`` is told when the task resumed from earlier
        state (a snapshot or a log copy) rather than starting fresh."""
        if await restore_task(self) and on_restored is not None:
            on_restored()
        if self.files is not None:  # commit what the restored window names
            await self.files.recover(self.latest.offset)
        self.ready.set()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.persister.run(), name=f"persist {self.operator_id}")
            if self.replicator is not None:
                group.create_task(self.replicator.run(first_owner=self.first_owner),
                                  name=f"replicate {self.operator_id}")
            if self.standby is not None:
                group.create_task(self.standby.run(), name=f"ship state {self.operator_id}")
            if self.tracking is not None:
                group.create_task(self._report_loop(), name=f"track {self.operator_id}")
                group.create_task(self._flush_timer(), name=f"window timer {self.operator_id}")
            group.create_task(self.delivery.run(), name=f"deliver {self.operator_id}")
            if (ticker := ticker_of(self)) is not None:  # processing time while idle
                group.create_task(ticker.run(), name=f"tick {self.operator_id}")
            group.create_task(self._loop(), name=f"operate {self.operator_id}")

    # -- input ---------------------------------------------------------------

    async def append_segment(self, segment: OutSegment, timeout_s: float) -> Commit:
        """:meth:`append` for a segment produced on this worker."""
        return await self.append(
            segment.channel, segment.sequence, segment.keys, segment.values, timeout_s,
            segment.encoded, root=segment.root, previous_sequence=segment.previous_sequence,
        )

    async def append(
        self,
        channel: str,
        sequence: int,
        keys: list[Any] | None,
        values: list[Any],
        timeout_s: float | None,
        batch: common_pb2.RecordBatch | None = None,
        root: int = 0,
        previous_sequence: int = 0,
    ) -> Commit:
        """Appends a batch (unless it is a duplicate) and returns the wait for
        its commit, which answers whether it was accepted. The append and the
        wait are apart so that a sender of several batches appends them in
        order and then waits for all their commits at once: one replication
        round trip per container instead of one after another. ``root`` is
        the tracked root the batch descends from; 0 makes a client's batch
        its own root. ``previous_sequence`` lets the container name a gap."""
        async with asyncio.timeout(timeout_s):  # never loses a cancel, unlike wait_for
            await self.ready.wait()
        if not root and self.tracking is not None:
            root = tuple_id(self.task_index, self.partition, channel, sequence)
        losses_before = len(self.container.losses)
        accepted, offset = await self.container.append(
            channel, sequence, keys, values, timeout_s, batch, root, previous_sequence
        )
        if len(self.container.losses) > losses_before:
            self.record_losses(self.container.losses[losses_before:])
        if accepted and FAULTS.ack_before_replicate:
            # Test-only mutation: acknowledge before the backups hold the batch,
            # so the history checker can be shown to catch the loss it causes.
            await self.container.commit_through(offset + 1)
        if accepted and self.tracking is not None:
            if self.tracking.retain(offset, root):  # its registration waits for a report
                self._report_wake.registration_waiting()
        if self.replicator is None:
            await self.container.commit_through(self.container.next_offset)
        elif accepted:
            self.replicator.notify()
        return functools.partial(self._committed, accepted, offset, timeout_s)

    async def _committed(self, accepted: bool, offset: int, timeout_s: float | None) -> bool:
        if offset >= 0:
            await self.container.wait_committed(offset, timeout_s)
        return accepted

    # -- processing ----------------------------------------------------------

    async def _loop(self) -> None:
        container = self.container
        self.delivery.reset(self.latest.offset)
        while True:
            offset = self.latest.offset
            entry = await container.take(offset, lambda: self._close_requested)
            if entry is None:  # the window timer: close the window so reports can flow
                self._close_requested = False
                if self.window.batches:
                    self._close_window()
                continue
            if self._tasks_fail:
                raise RuntimeError(f"fault injection: tasks cannot run on {self.node_id}")
            batch_id = batch_identity(self.task_index, self.partition, entry.channel,
                                      entry.sequence)
            self.invocations += entry.count
            result, segments = self._run_batch(entry, batch_id)
            dead = result.dead_letters
            ingest = entry.batch.ingest_unix_s if entry.batch is not None else 0.0
            if segments:
                for segment in segments:
                    segment.root = entry.root
                    segment.encode().ingest_unix_s = ingest  # encoded by split already
                self.records_out += sum(len(s.values) for s in segments)
            # On its way while the next batch runs (services/worker/delivery.py).
            await self.delivery.submit(offset + 1, segments)
            if self.tracking is not None:
                self.tracking.processed(offset, self.tuple_id_of(entry), [
                    tuple_id(seg.task, seg.partition, seg.channel, seg.sequence)
                    for seg in segments])
            self.latest.finish(offset + 1)
            await container.mark_consumed(offset + 1)
            self.records_processed += entry.count
            self.window.add(entry.channel, entry.sequence, offset, entry.count)
            if result.sink_rows and not self.rows_from_state:
                if self.files is not None:
                    self.files.add(result.sink_rows)
                else:
                    self._rows.update(result.sink_rows)
            if ingest and self.chain.has_sink:
                self.latency.observe(max(0.0, time.time() - ingest), entry.count)
            entry.release()  # retained until trimmed: as bytes, not as objects
            if dead:
                self.dead_letters += len(dead)
                self._dead.extend(dead)
            if (self.window.records >= self.window_size or self._close_requested
                    or (self._close_when_idle and container.pending_batches == 0)):
                self._close_requested = self._close_when_idle = False
                self._close_window()
            elif (container.pending_batches == 0 and self.files is not None
                  and self.tracking is None and self.files.buffered):
                self._close_window()  # untracked and idle: commit the sink's files
            elif container.pending_batches == 0 and (self._rows or self._dead):
                self._flush()

    def _run_batch(self, entry: Entry, batch_id: str) -> tuple[ChainResult, list[OutSegment]]:
        """Runs a batch through the chain and splits its output for the shuffle.

        User errors are dead-lettered record by record inside the chain. An
        error anywhere else (gridstream's own handling of an odd record:
        hashing, encoding, depth) must not stop the partition either: the
        whole batch goes to dead letters with the error, the task goes on, and
        the error is logged at ERROR. A replay meets the same error at the
        same point, so the outcome is deterministic."""
        try:
            event = None if self.event_inputs is None else (
                entry.channel, batch_watermark(entry.batch), self.event_inputs)
            result = self.chain.process(entry.keys, entry.values, batch_id, event,
                                        batch_time(entry.batch))  # recorded: replays see it
            segments: list[OutSegment] = []
            if result.values or event is not None:  # a watermark may go on alone
                segments = self.outbound.split(result.keys, result.values, batch_id,
                                               result.dead_letters, event, self.chain.windows)
            return result, segments
        except Exception as exc:  # any error of one batch is contained
            error = f"{type(exc).__name__}: {safe_text(exc)}"  # for the log
            self.internal_errors += 1
            if not self.chain.states:
                # No keyed state was touched: only the records that fail alone
                # go to dead letters, the others go on.
                log.error("%s: batch %s could not be processed whole (%s); processing its "
                          "records one by one", self.operator_id, batch_id, error)
                return run_records(self.chain, self.outbound, entry, batch_id)
            log.error("%s: batch %s could not be processed (%s); its %d records go to dead "
                      "letters", self.operator_id, batch_id, error, entry.count)
            return dead_batch(entry, batch_id, encode_error(exc)), []

    def record_losses(self, losses: list[LostRange]) -> None:
        """Names lost ranges durably (as dead letters of the task, which users
        read with the results) besides the in-memory list progress reports."""
        for lost in losses:
            text = lost.describe(self.container.container_id)
            self._dead.append((f"loss/{self.container.container_id}/{lost.channel}#"
                               f"{lost.first}-{lost.last}", "<data loss>", "",
                               encode_message(text)))

    def _flush(self, snapshot: PendingSnapshot | None = None) -> None:
        rows, self._rows = self._rows, {}
        dead, self._dead = self._dead, []
        self.persister.submit(rows, dead, snapshot)

    def _close_window(self) -> None:
        # Only the keys the window touched go out (a delta on the window
        # before); the first window, or one after deltas could not be chained,
        # carries the whole state. Packing happens later, in the persister.
        offset = self.latest.offset
        if self.files is not None:  # the window's file joins the sink's state
            self.files.seal(self.window.window, offset)
        parent = None if self.persister.needs_root else self.persister.head
        changes = (self.chain.capture_delta() if parent is not None
                   else self.chain.capture_full())
        size, self._state_keys = self._state_keys, sum(map(len, self.chain.states.values()))
        freeze_grown_state(self._state_keys - size)
        header = codec.pack({
            "window": self.window.window,
            "offset": offset,
            **self.outbound.header(),
            "in_sequences": self.container.sequences_below(offset),
            "functions": self.functions,
            "batches": self.window.batches,
            "tracking": self.tracking.snapshot() if self.tracking is not None else [],
            "losses": [[lost.channel, lost.first, lost.last, lost.what]
                       for lost in self.container.losses],
        })
        self._last_close = time.monotonic()
        number = self.window.close()
        self._flush(PendingSnapshot(number, offset, header, changes, parent))

    async def _write_rows(self, rows: dict[Any, Any], dead: list[DeadLetter]) -> None:
        # Changed rows only, a chunk per write: encoding never holds the loop
        # long, and a claim on a state server waits for one chunk at most.
        items = list(rows.items())
        chunk = 2_000
        for start in range(0, max(len(items), 1), chunk):
            part = [[self.row_prefix + _row_key(k), codec.row_json(v)]
                    for k, v in items[start:start + chunk]]
            dead_part = dead if start == 0 else []
            if part or dead_part:
                self._row_version = max(self._row_version + 1,
                                        first_row_version(self.window.window))
                await self.state_client.write_results(
                    self.job_id, self.operator_id, part, dead_part, self.epoch,
                    self._row_version,
                )

    async def _write_snapshot(self, snapshot: PendingSnapshot,
                              chunks: list[tuple[bytes, int]]) -> None:
        # A window is durable only with every batch it covers delivered: a
        # replay from it must not skip output that never left this worker.
        await self.delivery.wait_delivered(snapshot.offset)
        if self.files is not None:  # the files the snapshot names exist first
            await self.files.prepare()
        write = asyncio.ensure_future(self.state_client.put_state(
            self.job_id, self.operator_id, snapshot.window, self.epoch, snapshot.parent,
            snapshot.header, chunks,
        ))
        try:
            await asyncio.sleep(0)  # the request is on its way
            crash_point(self.node_id, "window_persist")
            await write
            if self.files is not None:
                await self.files.commit(snapshot.window)
            if self.standby is not None:
                self.standby.offer(snapshot.window, snapshot.parent, snapshot.header, chunks)
        finally:
            if not write.done():
                write.cancel()

    def _durable(self, offset: int) -> None:
        self.durable_offset = max(self.durable_offset, offset)
        self.container.trim(self.trim_bound())
        if self.replicator is not None:
            self.replicator.notify()
        if self.tracking is not None:
            self._report_wake.now()

    def trim_bound(self) -> int:
        """Entries below this offset may leave the container and its backups:
        covered by a durable window, and (when tracked) of completed roots only."""
        bound = self.durable_offset
        if self.tracking is not None:
            keep = self.tracking.keep_from()
            if keep is not None:
                bound = min(bound, keep)
        return bound

    # -- tuple tracking ------------------------------------------------------

    def tuple_id_of(self, entry: Entry) -> int:
        """The batch's tracking id (a hash of its identity)."""
        return tuple_id(self.task_index, self.partition, entry.channel, entry.sequence)

    @property
    def idle(self) -> bool:
        """No batch waits for the operator here."""
        return self.container.pending_batches == 0

    async def flush_soon(self) -> None:
        """A caller is draining: lingering rows go now, and the window closes
        once the task is idle (now if it is), so its last trees complete."""
        self.persister.hurry()
        if self.tracking is not None and not self.idle:
            self._close_when_idle = True
        elif self.tracking is not None and self.tracking.unreported and self.window.batches:
            self._close_requested = True
            await self.container.poke()

    async def _flush_timer(self) -> None:
        """Closes the window when processed batches have waited ``tracking_flush_s``
        for a durable window (their trees complete without more input)."""
        assert self.tracking is not None
        while True:
            # All the worker's tasks check at the same moments: their windows share calls.
            step = self.tracking_flush_s / 2
            await asyncio.sleep(next_boundary(step, time.monotonic()) - time.monotonic())
            if (self.tracking.unreported and self.window.batches
                    and window_is_due(time.monotonic() - self._last_close,
                                      self.tracking_flush_s)):
                self._close_requested = True
                await self.container.poke()
            self.request_rebuild(self.tracking.overdue(time.monotonic(), self.tracking_timeout_s()))

    def tracking_timeout_s(self) -> float:
        """The job's root timeout, or the cluster's."""
        return (self.spec.tracking_timeout_s or self.state_client.routing.table.tracking_timeout_s
                or 30.0)

    async def _report_loop(self) -> None:
        """Sends contributions covered by a durable window, and rebuild requests."""
        assert self.tracking is not None and self.reporter is not None
        tracking, reporter = self.tracking, self.reporter
        backoff = Backoff(f"{self.operator_id}: tracking reports")
        while True:
            await self._report_wake.due(tracking)
            try:
                async with self.tracking_lock:
                    if self._needs_rebuild:
                        # Requests arriving while this one is on the wire wait
                        # for the next round instead of being cleared with it.
                        roots, self._needs_rebuild = self._needs_rebuild, set()
                        try:
                            await reporter.rebuild(self.job_id, sorted(roots))
                        except BaseException:
                            self._needs_rebuild |= roots
                            raise
                    registrations = tracking.registrations()
                    ready = tracking.reportable(self.durable_offset)
                    if (ready or registrations) and drop_report(self.node_id):
                        log.warning("%s: fault injection lost a tracking report of %d roots",
                                    self.operator_id, len(ready) + len(registrations))
                        tracking.mark_registered(registrations)  # believed delivered
                        tracking.mark_reported([o for o, _, _ in ready])
                    elif ready or registrations:
                        tracking.sequence += 1
                        await reporter.report(
                            self.job_id, self.partition, self.reporter_id, tracking.sequence,
                            registrations + [r for _, r, _ in ready],
                            registrations + [v for _, _, v in ready])
                        tracking.mark_registered(registrations)
                        tracking.mark_reported([o for o, _, _ in ready])
                backoff.reset()
            except GridstreamError as exc:
                log.info("%s: tracking report failed (%s); retrying", self.operator_id, exc)
                await backoff.wait(exc)
                self._report_wake.now()

    def request_rebuild(self, roots: set[int]) -> None:
        """Asks the roots' (new) trackers to rebuild them (their tracker moved)."""
        if self.tracking is not None and roots:
            self._needs_rebuild |= roots
            self._report_wake.now()

    async def tracking_events(
        self, completed: list[int], failed: list[int], collect: set[int],
        abandoned: list[int] | None = None,
    ) -> tuple[dict[int, int], int, set[int], set[int]]:
        """Applies a tracker's events. Returns, for ``collect``, this task's
        contributions, the sequence of its last report they include, which
        of the roots it holds pending as their source, and which it holds a
        batch of not yet reported (in progress)."""
        tracking = self.tracking
        if tracking is None:
            return {}, 0, set(), set()
        if abandoned:
            count = tracking.finished(abandoned, abandoned=True)
            if count and tracking.is_source:
                log.error("%s: %d tuple trees abandoned (incomplete after repeated rebuilds)",
                          self.operator_id, count)
        if completed:
            tracking.finished(completed)
            self.container.trim(self.trim_bound())
            if self.replicator is not None:
                self.replicator.notify()
        if failed and tracking.is_source:
            # A failed root is rebuilt by its tracker from the tasks'
            # contributions; nothing is processed again here: each batch of the
            # tree is processed once, by its holder's recovery (docs/recovery.md).
            tracking.figures.roots_failed += sum(1 for r in failed if r in tracking.pending)
        if not collect:
            return {}, 0, set(), set()
        async with self.tracking_lock:
            contributions = tracking.contributions(collect)
            through = tracking.sequence
        sources = {r for r in collect if r in tracking.pending} if tracking.is_source else set()
        return contributions, through, sources, tracking.in_progress(collect)

    def progress(self, node_id: str) -> common_pb2.TaskProgress:
        """Counters for the scheduler's drain check and for status displays."""
        return task_progress(self, node_id)

    def epoch_now(self) -> int:
        """The worker's current routing epoch."""
        return self.state_client.routing.epoch

"""Replicated JobContainers: the seed's "queue contents are backed up on other
nodes, so a restarted node restores its queues by JobContainerID".

Primary side — :class:`Replicator`, one per container: appended batches are
copied, in offset order and in groups, to the container's backup holders (the
``backup_count`` workers that would own the partition next, see
:meth:`gridstream.routing.RoutingView.backups`). A holder that is
new to the container first gets a full copy (``reset``). Only when every
holder has an entry is it committed: the operator may take it and its sender
is acknowledged.

With fewer than ``backup_count`` other live workers, nothing is committed:
the container *waits* for holders (a restarted worker, or a new one) rather
than acknowledge a batch with fewer copies than promised. Senders are told so
(UNAVAILABLE, naming the shortfall) when their push deadline passes, and
retry; :attr:`Replicator.shortfall` says it for status and logs. Nor does a
primary commit once the routing table its worker holds gives the partition to
another worker (its task is about to be handed off): the holders it would
compute are the new owner's backups, often this very worker, and a batch
acknowledged then would have a single copy.

Backup side — :class:`BackupStore`: holds the copies, serves them to whoever
takes the partition over (:meth:`WorkerNode.fetch_container`), and drops
entries a durable window snapshot covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gridstream.errors import GridstreamError, StaleEpoch
from gridstream.faults import FAULTS
from gridstream.retry import Backoff
from gridstream.routing import RoutingView
from gridstream.v1 import worker_pb2
from services.worker.queues import Entry, JobContainer, OwnerFenced
from services.worker.replicacalls import ReplicationCalls

log = logging.getLogger(__name__)

ContainerKey = tuple[str, int, int]  # (job_id, task, partition)
MAX_ENTRIES_PER_CALL = 64
REPLICATION_WARN_AFTER_S = 5.0
"""Replication failing for longer than this (more than a holder's restart
takes) is logged at WARNING; shorter failures at INFO."""


def fill_log_entry(target: worker_pb2.LogEntry, entry: Entry) -> worker_pb2.LogEntry:
    """Writes a container entry's wire form into ``target`` (a replication's
    entry added in place, so the batch is copied once: ``gridstream.pbcopy``
    says why by copy); returns it."""
    target.offset = entry.offset
    target.channel = entry.channel
    target.sequence = entry.sequence
    target.root = entry.root
    target.previous_sequence = entry.previous_sequence
    target.batch.CopyFrom(entry.wire())
    return target


def to_log_entry(entry: Entry) -> worker_pb2.LogEntry:
    """The wire form of a container entry, as a message of its own."""
    return fill_log_entry(worker_pb2.LogEntry(), entry)


@dataclass
class BackupLog:
    """A copy of one container's log held for its primary."""

    base: int = 0
    entries: dict[int, worker_pb2.LogEntry] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    primary: str = ""
    _held_below: int = field(default=0, init=False, repr=False)
    """Every offset from ``base`` up to this one is held (when above ``base``):
    where :attr:`next_offset` resumes its walk. Entries are only added, dropped
    below a new base (a trim keeps the contiguous run above it) or all
    dropped by a reset, which rewinds it."""

    @property
    def next_offset(self) -> int:
        """Offset after the contiguous run of entries from ``base``. Asked on
        every replication: walking from ``base`` each time cost as many steps
        as entries held (thousands of small batches retained for their
        trees), so the walk resumes where the last one ended."""
        offset = max(self.base, self._held_below)
        while offset in self.entries:
            offset += 1
        self._held_below = offset
        return offset

    def apply(self, request: worker_pb2.ReplicateRequest) -> int:
        """Applies a replication; returns the contiguous end."""
        if request.reset:
            self.base = self._held_below = request.base_offset
            self.entries = {}
            self.sequences = dict(request.sequences)
        for entry in request.entries:
            if entry.offset >= self.base:
                self.entries[entry.offset] = entry
                if entry.sequence > self.sequences.get(entry.channel, 0):
                    self.sequences[entry.channel] = entry.sequence
        if request.trim_below > self.base:
            # Only a contiguous prefix may go: compute its end before dropping.
            new_base = min(request.trim_below, self.next_offset)
            for offset in range(self.base, new_base):
                self.entries.pop(offset, None)
            self.base = new_base
        self.epoch = max(self.epoch, request.epoch)
        self.primary = request.primary
        return self.next_offset


class BackupStore:
    """Every backup copy this worker holds."""

    def __init__(self) -> None:
        self.logs: dict[ContainerKey, BackupLog] = {}

    def replicate(self, request: worker_pb2.ReplicateRequest) -> int:
        """Applies a primary's replication; refuses a primary older than one
        already heard from (a zombie after a pause)."""
        key = (request.job_id, request.task, request.partition)
        backup = self.logs.get(key)
        if backup is None:
            backup = self.logs[key] = BackupLog()
        if request.epoch < backup.epoch and request.primary != backup.primary:
            raise StaleEpoch(
                f"stale epoch {request.epoch}: {request.primary} is no longer the primary of "
                f"{key[0]}/t{key[1]}/p{key[2]} (epoch {backup.epoch} from {backup.primary})",
                backup.epoch,
            )
        return backup.apply(request)

    def fence(self, key: ContainerKey, epoch: int) -> None:
        """A new owner at ``epoch`` is reading this copy to take the container
        over: from now on, refuse appends from any primary older than that.
        A previous owner cut off from the scheduler (it does not know it was
        replaced) could otherwise still commit — and acknowledge — batches
        the new owner never sees."""
        backup = self.logs.get(key)
        if backup is None:
            backup = self.logs[key] = BackupLog()
        if epoch > backup.epoch:
            backup.epoch = epoch
            backup.primary = ""  # the new owner; it names itself when it replicates

    def drop_job(self, job_id: str) -> None:
        """Forgets every copy of a job's containers."""
        for key in [k for k in self.logs if k[0] == job_id]:
            del self.logs[key]


class Replicator:
    """Copies one primary container's appends to its backup holders and
    commits what they all hold."""

    def __init__(
        self,
        key: ContainerKey,
        container: JobContainer,
        node_id: str,
        routing: RoutingView,
        calls: ReplicationCalls,
        backup_count: int,
        trim_offset: Callable[[], int],
        owner_epoch: Callable[[], int] | None = None,
    ) -> None:
        self.key = key
        self.container = container
        self.node_id = node_id
        self.routing = routing
        self.calls = calls
        """The worker's replication calls, shared by its containers (one call
        per holder carries every container's replication waiting for it)."""
        self.backup_count = backup_count
        self.trim_offset = trim_offset
        self.owner_epoch = owner_epoch or (lambda: self.routing.epoch)
        """The epoch at which this primary took the container over: holders
        refuse it once a newer owner has fenced them (see BackupStore.fence)."""
        self._synced: dict[str, tuple[int, int]] = {}
        """holder -> (the offset it holds up to, the trim bound it was last sent)."""
        self.synced_epoch = 0
        self._wake = asyncio.Event()
        self.shortfall = ""
        """Why nothing can be committed now (too few live holders, or the
        partition moved to another worker), or empty."""

    def notify(self) -> None:
        """Something was appended (or a snapshot became durable)."""
        self._wake.set()

    def holders(self) -> list[str]:
        """Current backup holders of this container."""
        job_id, _, partition = self.key
        return self.routing.backups(job_id, partition, self.backup_count)

    def moved_to(self) -> str | None:
        """The worker the routing table this worker holds gives the partition
        to when that is not this worker ("" when the table lists no owner),
        or None while this worker owns it. A table can reach this worker
        (a replicator's or a shuffle's refresh) before its tasks are aligned
        with it; meanwhile :meth:`holders` are another owner's backups."""
        job_id, _, partition = self.key
        owner = self.routing.owner(job_id, partition)
        return None if owner == self.node_id else (owner or "")

    async def run(self, first_owner: bool = False) -> None:
        """Replicates until cancelled; owned by the task runner. Every round
        contacts every holder, even with nothing new to send, so a holder
        that lost its copy is found out and sent a full one. A job's
        ``first_owner`` has nothing to copy yet: its first round waits for
        the first append (which sends the holders a full copy)."""
        backoff = Backoff(f"replicating {self.container.container_id}", first_s=0.02, max_s=0.5)
        failing_since = 0.0
        shortfall_since, warned = 0.0, False
        moved_since = 0  # the epoch at which the partition was last seen moved away
        # The first round runs at once, with nothing appended: a restored log
        # is committed only once this owner's holders hold it, and no append
        # may ever come to wake us (the senders were all answered before the
        # restart), so waiting for one would hold its replay forever.
        if first_owner:
            self.synced_epoch = self.routing.epoch  # its holders hold nothing, as it does
        else:
            self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if FAULTS.ack_before_replicate:
                # The broken build acknowledges at once; lagging copies make the
                # window in which a kill loses acknowledged batches wide enough
                # for the checker to see it every time.
                await asyncio.sleep(0.5)
            epoch = self.routing.epoch
            # The end and the sequence map are captured together, with no await
            # between, so a full copy never claims a sequence it does not hold.
            end = self.container.next_offset
            sequences = self.container.sequences()
            holders = self.holders()
            moved_to = self.moved_to()
            if moved_to is not None:
                # The table this worker holds gives the partition to another
                # worker; the task is stopped once the worker aligns with it,
                # which can take a while on a loaded machine. The holders
                # computed now are the *new* owner's backups — this worker
                # itself, typically, when the partition goes back to a
                # restarted worker — so committing now would acknowledge
                # batches whose only copy is here, and a single failure of
                # this worker before the new owner has fetched the log would
                # lose them. Commit nothing: the senders get no acknowledgement
                # and send again to the new owner.
                if moved_since != epoch:
                    moved_since = epoch
                    log.info("%s: the routing table at epoch %d gives the partition to %s; "
                             "committing nothing more here until the task is handed off",
                             self.container.container_id, epoch, moved_to or "nobody")
                self.shortfall = (f"the routing table at epoch {epoch} gives the partition "
                                  f"to {moved_to or 'nobody'}")
                shortfall_since = 0.0
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._wake.wait()
                self._wake.set()
                continue
            moved_since = 0
            if len(holders) < self.backup_count:
                now = time.monotonic()
                if not shortfall_since:
                    shortfall_since, warned = now, False
                    log.info("%s: only %d of backup_count=%d backup holders are live; "
                             "holding appends uncommitted until enough workers are back",
                             self.container.container_id, len(holders), self.backup_count)
                elif not warned and now - shortfall_since > REPLICATION_WARN_AFTER_S:
                    warned = True
                    log.warning("%s: only %d of backup_count=%d backup holders are live "
                                "for %.0fs; appends stay uncommitted (senders wait, then "
                                "get UNAVAILABLE) until enough workers are back",
                                self.container.container_id, len(holders), self.backup_count,
                                now - shortfall_since)
                self.shortfall = (f"only {len(holders)} of backup_count={self.backup_count} "
                                  "backup holders are live")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self._wake.wait()
                self._wake.set()
                with contextlib.suppress(Exception):
                    await self.routing.refresh()
                continue
            self.shortfall, shortfall_since = "", 0.0
            try:
                await asyncio.gather(
                    *(self._sync(holder, end, sequences, epoch) for holder in holders)
                )
            except asyncio.CancelledError:
                raise
            except StaleEpoch as exc:
                # A newer owner took the container over since this primary's
                # epoch (perhaps at an epoch this worker never applied): stop,
                # so the task starts again from the newest state and log.
                raise OwnerFenced(f"{self.container.container_id}: {exc}") from None
            except Exception as exc:
                # A holder restarting (refused connections, a copy it no
                # longer has) is routine for a second or two: INFO; failing
                # for longer than a restart takes is worth a WARNING.
                now = time.monotonic()
                failing_since = failing_since or now
                log.log(logging.WARNING if now - failing_since > REPLICATION_WARN_AFTER_S
                        else logging.INFO, "%s: replication failed (%s); retrying",
                        self.container.container_id, exc)
                # Back off, but wake at once when the membership changes.
                await backoff.wait(exc, wake=self._wake)
                self._wake.set()
                if backoff.delay_s >= 0.16:
                    try:
                        await self.routing.refresh()
                    except Exception as refresh_error:  # scheduler briefly away
                        log.debug("routing refresh failed: %s", refresh_error)
                continue
            backoff.reset()
            failing_since = 0.0
            for holder in list(self._synced):
                if holder not in holders:
                    del self._synced[holder]
            self.synced_epoch = max(self.synced_epoch, epoch)
            await self.container.commit_through(end)
            if self.container.next_offset > end:
                self._wake.set()

    def _has_news_for(self, holder: str, end: int, epoch: int) -> bool:
        """Whether a round at ``epoch`` must call ``holder``. Not when it was
        synced to ``end`` at this very epoch and its trim bound has not moved:
        such a call would carry nothing (a window became durable while its
        roots are still pending, so nothing may be trimmed yet; at a drain that
        was a third of a job's replication calls). Any change of membership
        advances the epoch and wakes every replicator, so a holder that
        restarted and lost its copy is still called, and sent a full one."""
        return not (epoch == self.synced_epoch
                    and self._synced.get(holder) == (end, self.trim_offset()))

    async def _sync(self, holder: str, end: int, sequences: dict[str, int],
                    epoch: int) -> None:
        if not self._has_news_for(holder, end, epoch):
            return
        address = self.routing.addresses.get(holder)
        if address is None:
            raise LookupError(f"no address for backup holder {holder}")
        job_id, task, partition = self.key
        synced = self._synced.get(holder)
        reset = synced is None
        start = self.container.base_offset if synced is None else max(
            synced[0], self.container.base_offset)
        entries = self.container.entries(start, end)
        first = True
        held_to = 0
        while first or entries:
            chunk, entries = entries[:MAX_ENTRIES_PER_CALL], entries[MAX_ENTRIES_PER_CALL:]
            request = worker_pb2.ReplicateRequest(
                job_id=job_id, task=task, partition=partition, epoch=self.owner_epoch(),
                primary=self.node_id, reset=reset and first,
                base_offset=self.container.base_offset,
                sequences=sequences if reset and first else {},
                trim_below=self.trim_offset(),
            )
            for e in chunk:
                fill_log_entry(request.entries.add(), e)
            try:
                held_to = await self.calls.replicate(address, request,
                                                     f"replicating to {holder}")
            except GridstreamError:
                self._synced.pop(holder, None)
                raise
            first = False
        if held_to < end:
            # The holder lost its copy (it restarted): send it a full copy.
            self._synced.pop(holder, None)
            raise LookupError(f"{holder} holds {self.container.container_id} only up to "
                              f"{held_to}, not {end}; resending in full")
        self._synced[holder] = (end, request.trim_below)

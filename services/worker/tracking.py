"""One task's side of XOR tuple tracking, and of partial recovery.

Tracking is per batch: a batch from a client is a root; every batch a task
emits belongs to the tree of the one root its input batch belonged to (a
task turns one input batch into one output batch per destination partition).
When a task has processed a batch it owes the root's tracker
``id(batch) XOR id(each emitted batch)`` (the seed's rule), so the root's
checkValue reaches zero exactly when every batch of its tree was processed.

Reports are sent only once the window that processed the batch is durable.
A crash replays at most the batches after the durable window, and those are
reported when their own window is durable, so every contribution reaches the
tracker exactly once, however often a batch is processed.

The task also keeps what a tracker may need again:

- every retained batch of a pending root stays in the JobContainer (the
  task's replicated input) until the root completes, so a task that fails is
  recovered from there without running the stages upstream of it (partial
  recovery, seed 002);
- the contribution of every processed batch of a pending root, so a tracker
  that moved or was lost, or whose reports were lost, can rebuild the root's
  checkValue from the tasks.

Tracking never makes a task process a batch again: a root that times out is
rebuilt, and a batch is processed again only by a task's recovery, under the
idempotence rule (docs/recovery.md), so lost reports cost a rebuild, never a
second application.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from gridstream.ids import UNTRACKED_ROOT

REGISTRATION_LINGER_S = 1.0
"""How long a source task's registrations may wait for a report to carry them.

A registration (a root's id XORed in at its tracker) only has to be in
before the root's tree can complete, and the tree cannot complete before the
source task reports its own contribution, which it does once the window that
processed the root's batch is durable (windows close every
``cluster.tracking_flush_s`` while contributions wait). Registrations
therefore go with that report instead of one message per accepted batch: a
client sending every 50 ms made about 20 registration messages a second per
source partition, most of a tracker host's ``TrackStream`` traffic. This
bound covers a task whose windows do not become durable (state servers
unreachable): its registrations still reach their trackers. How late they go
changes nothing else: a recovered task counts every registration as sent and
a rebuild settles the tracker (:meth:`TaskTracking.restore`)."""


@dataclass
class TrackingFigures:
    """Counters for progress reports and metrics."""

    roots_finished: int = 0
    roots_failed: int = 0
    roots_abandoned: int = 0


@dataclass
class TaskTracking:
    """Pending roots, retained batches and contributions of one task."""

    is_source: bool
    pending: dict[int, set[int]] = field(default_factory=dict)
    """root -> offsets of this task's retained batches of the root."""
    root_at: dict[int, int] = field(default_factory=dict)
    """offset -> root, for retained batches."""
    unreported: dict[int, tuple[int, int]] = field(default_factory=dict)
    """offset -> (root, contribution) processed, window not yet durable."""
    reported: dict[int, tuple[int, int]] = field(default_factory=dict)
    """offset -> (root, contribution) sent to the root's tracker."""
    unregistered: list[int] = field(default_factory=list)
    """Source only: roots accepted here whose tracker has not yet been sent
    their registration (the root id XORed in, Storm's spout-side init)."""
    registered: set[int] = field(default_factory=set)
    """Source only: pending roots whose registration reached their tracker."""
    contributed: dict[int, set[int]] = field(default_factory=dict)
    """root -> ids of the batches of it this task has processed. In
    at_least_once mode a container may hold a batch twice (no dedupe after a
    recovery); its id must reach the tracker once, or the XOR never clears."""
    batch_at: dict[int, int] = field(default_factory=dict)
    """offset -> batch id, for processed batches that owed a contribution."""
    since: dict[int, float] = field(default_factory=dict)
    """Source only: root -> when it was registered, or last asked to be rebuilt."""
    figures: TrackingFigures = field(default_factory=TrackingFigures)
    sequence: int = 0
    """Reports sent so far (their sequence numbers)."""

    def retain(self, offset: int, root: int) -> bool:
        """A batch of ``root`` is in the container at ``offset`` (none of
        :data:`~gridstream.ids.UNTRACKED_ROOT`: a tick's tree is not tracked).
        True when its registration is now the only one waiting (it starts
        the registrations' linger, :class:`ReportWake`)."""
        if root == UNTRACKED_ROOT:
            return False
        self.root_at[offset] = root
        offsets = self.pending.setdefault(root, set())
        first = False
        if self.is_source and not offsets and root not in self.registered:
            first = not self.unregistered
            self.unregistered.append(root)
            self.since[root] = time.monotonic()
        offsets.add(offset)
        return first

    def registrations(self) -> list[int]:
        """Roots to register with their trackers (value: the root id itself)."""
        return [r for r in self.unregistered if r in self.pending]

    def mark_registered(self, roots: list[int]) -> None:
        """Their trackers applied these registrations."""
        done = set(roots)
        self.registered |= done & self.pending.keys()
        self.unregistered = [r for r in self.unregistered if r not in done]

    def registrations_due_at(self, linger_s: float) -> float | None:
        """monotonic() by which the pending registrations go even with no
        report to carry them: ``linger_s`` after the oldest was accepted;
        None when none is pending (roots that finished or were abandoned
        unregistered are dropped from the list here). ``unregistered`` is in
        the order the roots were accepted, and ``since`` says when."""
        waiting = self.registrations()
        if len(waiting) != len(self.unregistered):
            self.unregistered = waiting
        if not waiting:
            return None
        return self.since.get(waiting[0], time.monotonic()) + linger_s

    def processed(self, offset: int, batch_id: int, emitted: list[int]) -> None:
        """The batch at ``offset`` was processed and emitted ``emitted``."""
        root = self.root_at.get(offset)
        if root is None:
            return
        seen = self.contributed.setdefault(root, set())
        if batch_id in seen:  # a duplicate: processed, but owes nothing
            self.unreported[offset] = (root, 0)
            return
        seen.add(batch_id)
        self.batch_at[offset] = batch_id
        value = batch_id
        for child in emitted:
            value ^= child
        self.unreported[offset] = (root, value)

    def reportable(self, durable_offset: int) -> list[tuple[int, int, int]]:
        """(offset, root, value) of processed batches now covered by a durable window."""
        return [(o, r, v) for o, (r, v) in sorted(self.unreported.items()) if o < durable_offset]

    def mark_reported(self, offsets: list[int]) -> None:
        """The tracker acknowledged these batches' contributions."""
        for offset in offsets:
            entry = self.unreported.pop(offset, None)
            if entry is not None and offset in self.root_at:  # not completed meanwhile
                self.reported[offset] = entry

    def finished(self, roots: list[int], abandoned: bool = False) -> int:
        """Forgets completed (or abandoned) roots; returns how many were pending here."""
        count = 0
        for root in roots:
            offsets = self.pending.pop(root, None)
            if offsets is None:
                continue
            count += 1
            self.registered.discard(root)
            self.contributed.pop(root, None)
            self.since.pop(root, None)
            for offset in offsets:
                self.batch_at.pop(offset, None)
                self.root_at.pop(offset, None)
                self.unreported.pop(offset, None)
                self.reported.pop(offset, None)
        if self.is_source:
            if abandoned:
                self.figures.roots_abandoned += count
            else:
                self.figures.roots_finished += count
        return count

    def overdue(self, now: float, timeout_s: float) -> set[int]:
        """Source only: roots pending twice their timeout. A tracker fails a
        root at its timeout, so one this old is in no tracker at all (lost
        with a host, or with a move): asking for a rebuild puts it back, and
        it then completes or fails like any other. Marks them as asked."""
        if not self.is_source:
            return set()
        limit = 2 * timeout_s
        late = {r for r, t in self.since.items() if now - t > limit}
        for root in late:
            self.since[root] = now
        return late

    def contributions(self, roots: set[int]) -> dict[int, int]:
        """root -> XOR of this task's reported contributions, for a rebuild."""
        out: dict[int, int] = {}
        for root in self.registered & roots:
            out[root] = root
        for root, value in self.reported.values():
            if root in roots:
                out[root] = out.get(root, 0) ^ value
        return out

    def in_progress(self, roots: set[int]) -> set[int]:
        """The roots of ``roots`` with a batch retained here that is not yet
        reported: still queued, or processed in a window not yet durable.
        Their trees are slow (a backlog, persistence behind), not broken."""
        reported = self.reported
        return {root for root in roots & self.pending.keys()
                if any(offset not in reported for offset in self.pending[root])}

    def reported_roots(self) -> set[int]:
        """Roots this task has reported contributions (or a registration) to."""
        return {root for root, _ in self.reported.values()} | self.registered

    def keep_from(self) -> int | None:
        """The lowest offset that must stay in the container (a retained batch
        of a pending root), or None."""
        return min(self.root_at) if self.root_at else None

    @property
    def roots_pending(self) -> int:
        """Roots with a batch retained here (for a source task: roots it registered)."""
        return len(self.pending)

    def snapshot(self) -> list[list[int]]:
        """[offset, root, value, batch id] of processed batches of pending
        roots, for the window snapshot (a restarted task can then answer
        rebuilds, and still knows which batch ids it has contributed)."""
        rows = [[o, r, v, self.batch_at.get(o, 0)] for o, (r, v) in self.reported.items()]
        rows += [[o, r, v, self.batch_at.get(o, 0)] for o, (r, v) in self.unreported.items()]
        return sorted(rows)

    def restore(self, rows: list[list[int]], snapshot_offset: int) -> None:
        """Takes back the snapshot's contributions. Batches below the snapshot's
        offset may or may not have been reported before the crash: they count
        as reported, and the task asks for a rebuild of their roots."""
        for offset, root, value, batch_id in rows:
            if offset >= snapshot_offset:
                continue
            if offset not in self.root_at:
                if self.is_source:
                    continue  # not held here any more: a rebuild finds it finished
                # Processed (its window is durable) and in no log copy any
                # more: every copy died with its workers, or the root
                # completed after the snapshot and the batch was trimmed.
                # The contribution is still owed to the root's rebuild (a
                # complete tree would look lost without it), and a root
                # that did complete is finished by its rebuild.
                self.pending.setdefault(root, set()).add(offset)
            self.reported[offset] = (root, value)
            if batch_id:
                self.batch_at[offset] = batch_id
                self.contributed.setdefault(root, set()).add(batch_id)
        if self.is_source:
            # Registrations may or may not have been sent: all count as sent,
            # and a rebuild (which counts them) settles their trackers.
            self.registered = set(self.pending)
            self.unregistered = []
            now = time.monotonic()
            self.since = dict.fromkeys(self.pending, now)


class ReportWake:
    """When a task's report loop sends (owned by the task, awaited by its
    report loop): at once for contributions of a newly durable window, a
    rebuild or a retry (:meth:`now`); for registrations alone only once the
    oldest has waited :data:`REGISTRATION_LINGER_S` (a first registration
    merely starts that clock, :meth:`registration_waiting`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._now = False

    def now(self) -> None:
        """The loop sends at once."""
        self._now = True
        self._event.set()

    def registration_waiting(self) -> None:
        """A first registration waits: the loop starts its linger."""
        self._event.set()

    async def due(self, tracking: TaskTracking) -> None:
        """Returns when the loop has something to send."""
        while True:
            due = tracking.registrations_due_at(REGISTRATION_LINGER_S)
            try:
                async with asyncio.timeout(None if due is None
                                           else max(0.0, due - time.monotonic())):
                    await self._event.wait()
            except TimeoutError:
                return
            self._event.clear()
            if self._now:
                self._now = False
                return
            # Woken by a first registration: wait again, with its deadline.

"""JobContainer: the seed's in-memory task queue of one (job, task, partition).

An ordered log of batches. Each batch enters once: the container remembers the
highest sequence accepted per channel and acknowledges a repeat as a duplicate
without appending it, so senders may retry freely (idempotency keys). This is
the first half of gridstream's one idempotence rule (docs/recovery.md): every
sender sends a channel's batches in increasing sequence and only sends the
next once the previous one is acknowledged, so "at or below the highest
accepted" means "already here".

A sender also says which sequence it sent before (``previous_sequence``). A
container whose highest accepted sequence on the channel is below that has
lost acknowledged batches (every copy of its log died at once, more failures
than ``backup_count`` allows): it records the range in :attr:`losses`, logs it
at ERROR, and goes on with the batch, so the loss is named instead of silent.

An appended batch is *committed* once its backups hold it (at once when the
job has no backups); the operator only takes committed batches, and a sender
is only acknowledged after commit — so nothing the operator acted on, and
nothing a sender was told is safe, can vanish with this process.

Entries keep their offsets after they are consumed, until a durable window
snapshot covers them (``trim``); recovery replays from the snapshot's offset.
Only unconsumed records count against ``max_records``: a full container makes
``append`` wait, which is how a slow stage pushes back on its senders.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gridstream import codec
from gridstream.v1 import common_pb2

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Entry:
    """One batch in a container, at a fixed offset.

    Its records are held decoded only while the operator may need them: once
    processed, :meth:`release` drops the Python objects and keeps the wire
    form, which replication, handoff and a replay need anyway. A container
    retains a window's worth of processed batches (until a durable window and
    tracking let it trim them); held decoded, that was a Python object per
    record (taxi, 1M records: the cluster's peak memory 1,191 MB against
    1,093 MB released; latency bench at 244,000 words/s: p99 451-733 ms
    against 288-374 ms). A replay decodes them again, on first use
    (:attr:`keys`, :attr:`values`), and the loop releases them again."""

    offset: int
    channel: str
    sequence: int
    _keys: list[Any] | None
    _values: list[Any] | None
    """None once released (decoded again from ``batch`` on first use)."""
    batch: common_pb2.RecordBatch | None = field(default=None, repr=False)
    """The wire form, kept when the batch arrived over gRPC so replication
    does not encode it again."""
    channel_sequence_before: int = 0
    """The channel's highest sequence before this batch, to roll back to."""
    root: int = 0
    """Tuple tracking: the root (source batch) whose tree this batch is in."""
    previous_sequence: int = 0
    """What the sender said it had sent before on the channel (0: unknown)."""
    count: int = field(init=False, default=0)
    """Records in the batch."""

    def __post_init__(self) -> None:
        if self._values is None:
            if self.batch is None:
                raise ValueError("an entry needs its records or their wire form")
            self.count = self.batch.count
        else:
            self.count = len(self._values)

    @property
    def keys(self) -> list[Any] | None:
        """The records' keys (None for an unkeyed batch)."""
        if self._values is None:
            self._decode()
        return self._keys

    @property
    def values(self) -> list[Any]:
        """The records."""
        if self._values is None:
            self._decode()
        assert self._values is not None
        return self._values

    def _decode(self) -> None:
        assert self.batch is not None
        self._keys, self._values = codec.decode_batch(self.batch)

    def release(self) -> None:
        """Drops the decoded records if the wire form is held (every batch that
        arrived over gRPC or was encoded by the task that produced it)."""
        if self.batch is not None:
            self._keys = self._values = None

    def wire(self) -> common_pb2.RecordBatch:
        """The batch's wire form, encoded on first use."""
        if self.batch is None:
            self.batch = codec.encode_batch(self.values, self.keys)
        return self.batch


@dataclass(frozen=True, slots=True)
class LostRange:
    """Acknowledged batches that are gone: sequences ``first``..``last`` of
    ``channel``, or, for a log that restarted past a snapshot, offsets."""

    channel: str
    first: int
    last: int
    what: str = "sequences"

    def describe(self, container: str) -> str:
        """One line for status, logs and the caller's error."""
        count = self.last - self.first + 1
        return (f"{container}: {count} batch{'es' if count != 1 else ''} lost on channel "
                f"{self.channel} ({self.what} {self.first}..{self.last})")


class OwnerFenced(Exception):
    """This task's container or state was taken over by a newer owner (a
    backup holder or a state server refused it, perhaps after an epoch this
    worker never applied): the task must start again, from the newest state
    and log, at the epoch its worker knows now."""


class ContainerClosed(Exception):
    """The container was retired (its partition moved away); retry elsewhere."""


class JobContainer:
    """A bounded, deduplicating, offset-addressed queue of record batches."""

    def __init__(self, container_id: str, max_records: int, dedupe: bool = True,
                 name_losses: bool = True) -> None:
        self.container_id = container_id
        self.max_records = max_records
        self.dedupe = dedupe
        self.name_losses = dedupe and name_losses
        """Whether gaps count as losses (not in at-most-once jobs, which allow them)."""
        self._entries: deque[Entry] = deque()
        self._base = 0  # offset of _entries[0]
        self._next_offset = 0
        self._committed = 0  # entries below this offset are held by every backup
        self._restored_end = 0  # end of the log copy this container was restored from
        self._consumed = 0  # offset of the next entry the operator will take
        self._unconsumed_records = 0
        self._last_sequence: dict[str, int] = {}
        self._last_offset: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._closed = False
        self.records_in = 0
        self.losses: list[LostRange] = []
        """Ranges of acknowledged batches found missing (see the module doc)."""

    # -- state ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once retired."""
        return self._closed

    @property
    def base_offset(self) -> int:
        """Offset of the oldest retained entry."""
        return self._base

    @property
    def next_offset(self) -> int:
        """Offset the next appended batch will get."""
        return self._next_offset

    @property
    def committed_offset(self) -> int:
        """Entries below this offset are committed."""
        return self._committed

    @property
    def handoff_end(self) -> int:
        """Entries below this offset go to the next owner when the partition
        moves: the committed ones, and the log copy this container was
        restored from even before this owner has committed it again (the
        copy it was restored from may be gone by then)."""
        return max(self._committed, self._restored_end)

    @property
    def pending_batches(self) -> int:
        """Batches not yet taken by the operator."""
        return self._next_offset - self._consumed

    @property
    def pending_records(self) -> int:
        """Records not yet taken by the operator."""
        return self._unconsumed_records

    @property
    def retained_batches(self) -> int:
        """Batches held in memory, consumed or not."""
        return len(self._entries)

    def is_duplicate(self, channel: str, sequence: int) -> bool:
        """True when this (channel, sequence) was already accepted."""
        return self.dedupe and sequence <= self._last_sequence.get(channel, 0)

    def sequences(self) -> dict[str, int]:
        """Highest accepted sequence per channel."""
        return dict(self._last_sequence)

    def committed_sequences(self) -> dict[str, int]:
        """Highest sequence per channel among committed batches only: what a
        new owner may treat as already received. Uncommitted batches were never
        acknowledged, so their senders will send them again."""
        return self.sequences_below(self._committed)

    def sequences_below(self, offset: int) -> dict[str, int]:
        """Highest sequence per channel among the batches below ``offset``. A
        window snapshot records these for its offset: a batch appended after
        it may never be committed (then its sender sends it again, and a new
        owner must not take it for a duplicate), and a committed one is in
        the log copies the new owner replays from."""
        sequences = dict(self._last_sequence)
        for entry in reversed(self.entries(offset, self._next_offset)):
            if entry.channel_sequence_before:
                sequences[entry.channel] = entry.channel_sequence_before
            else:
                sequences.pop(entry.channel, None)
        return sequences

    def entries(self, start: int, end: int) -> list[Entry]:
        """Retained entries with offsets in [start, end)."""
        start = max(start, self._base)
        end = min(end, self._next_offset)
        return [self._entries[o - self._base] for o in range(start, end)]

    # -- appending and committing -------------------------------------------

    async def append(
        self,
        channel: str,
        sequence: int,
        keys: list[Any] | None,
        values: list[Any],
        timeout_s: float | None = None,
        batch: common_pb2.RecordBatch | None = None,
        root: int = 0,
        previous_sequence: int = 0,
    ) -> tuple[bool, int]:
        """Appends a batch unless it is a duplicate; waits while the container is
        full. Returns (accepted, offset), where for a duplicate the offset is
        the channel's latest entry (commit it before acknowledging). Raises
        TimeoutError if no space frees up within ``timeout_s``.
        ``previous_sequence`` (0: unknown) is the sender's acknowledged batch
        before this one; a gap up to it is recorded as lost."""
        async with self._changed:
            self._check_open()
            if self.is_duplicate(channel, sequence):
                return False, self._last_offset.get(channel, -1)
            if self._unconsumed_records > 0 and (
                self._unconsumed_records + len(values) > self.max_records
            ):
                async with asyncio.timeout(timeout_s):  # never loses a cancel, unlike wait_for
                    await self._changed.wait_for(
                        lambda: self._closed
                        or self._unconsumed_records == 0
                        or self._unconsumed_records + len(values) <= self.max_records
                        or self.is_duplicate(channel, sequence)
                    )
                self._check_open()
                if self.is_duplicate(channel, sequence):
                    return False, self._last_offset.get(channel, -1)
            last = self._last_sequence.get(channel, 0)
            if self.name_losses and last < previous_sequence < sequence:
                lost = LostRange(channel, last + 1, previous_sequence)
                self.losses.append(lost)
                log.error("DATA LOSS %s", lost.describe(self.container_id))
            offset = self._next_offset
            self._entries.append(Entry(offset, channel, sequence, keys, values, batch,
                                       last, root, previous_sequence))
            self._next_offset += 1
            self._unconsumed_records += len(values)
            self._last_sequence[channel] = sequence
            self._last_offset[channel] = offset
            self.records_in += len(values)
            self._changed.notify_all()
            return True, offset

    async def commit_through(self, end: int) -> None:
        """Marks every entry below ``end`` committed (held by the backups)."""
        async with self._changed:
            if end > self._committed:
                self._committed = min(end, self._next_offset)
                self._changed.notify_all()

    async def wait_committed(self, offset: int, timeout_s: float | None = None) -> None:
        """Waits until the entry at ``offset`` is committed."""
        async with self._changed:
            async with asyncio.timeout(timeout_s):  # never loses a cancel, unlike wait_for
                await self._changed.wait_for(lambda: self._closed or offset < self._committed)
            if offset >= self._committed:
                self._check_open()

    # -- consuming ----------------------------------------------------------

    async def take(self, offset: int, interrupted: Callable[[], bool] | None = None
                   ) -> Entry | None:
        """The committed entry at ``offset``, waiting until there is one; None
        when ``interrupted()`` turns true first (see :meth:`poke`)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._closed or offset < self._committed
                or (interrupted is not None and interrupted()))
            self._check_open()
            if offset >= self._committed:
                return None
            if offset < self._base:
                raise LookupError(
                    f"{self.container_id}: offset {offset} was trimmed (base {self._base})"
                )
            return self._entries[offset - self._base]

    async def poke(self) -> None:
        """Wakes a waiting :meth:`take` so it re-checks its ``interrupted``."""
        async with self._changed:
            self._changed.notify_all()

    def entry_at(self, offset: int) -> Entry | None:
        """The retained entry at ``offset``, or None if trimmed or not yet appended."""
        if self._base <= offset < self._next_offset:
            return self._entries[offset - self._base]
        return None

    def retained(self) -> list[Entry]:
        """Every entry still held, in offset order."""
        return list(self._entries)

    async def mark_consumed(self, offset: int) -> None:
        """Records that the operator is done with every entry below ``offset``."""
        async with self._changed:
            while self._consumed < min(offset, self._next_offset):
                if self._consumed >= self._base:
                    self._unconsumed_records -= self._entries[self._consumed - self._base].count
                self._consumed += 1
            self._changed.notify_all()

    def trim(self, below: int) -> int:
        """Drops consumed entries below ``below`` (covered by a durable snapshot);
        returns how many were dropped."""
        limit = min(below, self._consumed)
        dropped = 0
        while self._base < limit and self._entries:
            self._entries.popleft()
            self._base += 1
            dropped += 1
        return dropped

    # -- recovery -----------------------------------------------------------

    def restore(self, base: int, sequences: dict[str, int], entries: list[Entry],
                consumed: int, committed: bool = True) -> None:
        """Replaces the contents with a log fetched from a backup or a previous
        owner. ``consumed`` is the offset the operator resumes from (its
        snapshot's).

        With ``committed`` false the restored entries wait, like appends, until
        this owner's replicator has copied them to its own backup holders: the
        copy may come from a holder that was sent entries its primary never
        committed, and once restored a resent batch is acknowledged as a
        duplicate — which must not happen while this worker holds the only
        copy that a later owner would be handed (the old primary hands over
        its committed entries only). They can be handed over meanwhile
        (:attr:`handoff_end`)."""
        self._entries = deque(entries)
        self._base = base
        self._next_offset = base + len(entries)
        self._committed = self._next_offset if committed else base
        self._restored_end = self._next_offset
        self._consumed = max(min(consumed, self._next_offset), base)
        self._unconsumed_records = sum(e.count for e in entries if e.offset >= self._consumed)
        self._last_sequence = dict(sequences)
        self._last_offset = {}
        for e in entries:
            self._last_offset[e.channel] = e.offset
            self._last_sequence[e.channel] = max(self._last_sequence.get(e.channel, 0),
                                                 e.sequence)
        self.records_in = self._unconsumed_records

    def find_gaps(self, start: int, sequences: dict[str, int]) -> list[LostRange]:
        """Gaps among the retained entries from ``start``, given the highest
        sequence per channel before it: the losses a previous owner saw (and
        may have died with), found again from the log itself. Recorded in
        :attr:`losses` unless already there."""
        last = dict(sequences)
        found = []
        for entry in self.entries(start, self._next_offset):
            before = last.get(entry.channel, 0)
            if self.name_losses and before < entry.previous_sequence < entry.sequence:
                lost = LostRange(entry.channel, before + 1, entry.previous_sequence)
                if lost not in self.losses:
                    self.losses.append(lost)
                    found.append(lost)
            last[entry.channel] = max(before, entry.sequence)
        return found

    def skip_to(self, offset: int) -> None:
        """Moves the consumer to ``offset`` (at-most-once recovery skips replay)."""
        self._consumed = max(self._consumed, min(offset, self._next_offset))
        self._unconsumed_records = sum(e.count for e in self._entries if e.offset >= self._consumed)

    async def close(self) -> None:
        """Retires the container: waiters get ContainerClosed, the log stays
        readable for a handoff."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise ContainerClosed(f"{self.container_id} moved to another worker")

    def __repr__(self) -> str:
        return (
            f"JobContainer({self.container_id}, base={self._base}, next={self._next_offset}, "
            f"committed={self._committed}, consumed={self._consumed})"
        )

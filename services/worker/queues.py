"""JobContainer: the seed's in-memory task queue of one (job, task, partition).

An ordered log of batches. Each batch enters once: the container remembers the
highest sequence accepted per channel and acknowledges a repeat as a duplicate
without appending it, so senders may retry freely (idempotency keys).

Entries keep their offsets after they are consumed, until a durable window
snapshot covers them (``trim``); recovery replays from the snapshot's offset.
Only unconsumed records count against ``max_records``: a full container makes
``append`` wait, which is how a slow stage pushes back on its senders.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    """One batch in a container, at a fixed offset."""

    offset: int
    channel: str
    sequence: int
    keys: list[Any] | None
    values: list[Any]

    @property
    def count(self) -> int:
        """Records in the batch."""
        return len(self.values)


class JobContainer:
    """A bounded, deduplicating, offset-addressed queue of record batches."""

    def __init__(self, container_id: str, max_records: int) -> None:
        self.container_id = container_id
        self.max_records = max_records
        self._entries: deque[Entry] = deque()
        self._base = 0  # offset of _entries[0]
        self._next_offset = 0
        self._consumed = 0  # offset of the next entry the operator will take
        self._unconsumed_records = 0
        self._last_sequence: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self.records_in = 0

    @property
    def next_offset(self) -> int:
        """Offset the next appended batch will get."""
        return self._next_offset

    @property
    def pending_batches(self) -> int:
        """Batches not yet taken by the operator."""
        return self._next_offset - self._consumed

    @property
    def pending_records(self) -> int:
        """Records not yet taken by the operator."""
        return self._unconsumed_records

    def is_duplicate(self, channel: str, sequence: int) -> bool:
        """True when this (channel, sequence) was already accepted."""
        return sequence <= self._last_sequence.get(channel, 0)

    async def append(
        self,
        channel: str,
        sequence: int,
        keys: list[Any] | None,
        values: list[Any],
        timeout_s: float | None = None,
    ) -> bool:
        """Appends a batch unless it is a duplicate; waits while the container is
        full. Returns False for a duplicate. Raises TimeoutError if no space
        frees up within ``timeout_s``."""
        async with self._changed:
            if self.is_duplicate(channel, sequence):
                return False
            if self._unconsumed_records > 0 and (
                self._unconsumed_records + len(values) > self.max_records
            ):
                await asyncio.wait_for(
                    self._changed.wait_for(
                        lambda: self._unconsumed_records == 0
                        or self._unconsumed_records + len(values) <= self.max_records
                        or self.is_duplicate(channel, sequence)
                    ),
                    timeout_s,
                )
                if self.is_duplicate(channel, sequence):
                    return False
            self._entries.append(Entry(self._next_offset, channel, sequence, keys, values))
            self._next_offset += 1
            self._unconsumed_records += len(values)
            self._last_sequence[channel] = sequence
            self.records_in += len(values)
            self._changed.notify_all()
            return True

    async def take(self, offset: int) -> Entry:
        """The entry at ``offset``, waiting until it is appended. Marks everything
        before it consumed (the operator processes in order)."""
        async with self._changed:
            await self._changed.wait_for(lambda: offset < self._next_offset)
            if offset < self._base:
                raise LookupError(
                    f"{self.container_id}: offset {offset} was trimmed (base {self._base})"
                )
            return self._entries[offset - self._base]

    async def mark_consumed(self, offset: int) -> None:
        """Records that the operator is done with every entry below ``offset``."""
        async with self._changed:
            while self._consumed < min(offset, self._next_offset):
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

    @property
    def retained_batches(self) -> int:
        """Batches held in memory, consumed or not."""
        return len(self._entries)

    def sequences(self) -> dict[str, int]:
        """Highest accepted sequence per channel (replicated with the queue later)."""
        return dict(self._last_sequence)

    def waiting_entries(self) -> list[Entry]:
        """Unconsumed entries, oldest first (for inspection and tests)."""
        return [e for e in self._entries if e.offset >= self._consumed]

    def __repr__(self) -> str:
        return (
            f"JobContainer({self.container_id}, next={self._next_offset}, "
            f"consumed={self._consumed}, base={self._base})"
        )


def describe(entry: Entry, index: int) -> dict[str, Any]:
    """A small, human-readable description of one record, for dead letters."""
    key = None if entry.keys is None else entry.keys[index]
    return {"key": key, "value": entry.values[index], "channel": entry.channel,
            "sequence": entry.sequence, "index": index}

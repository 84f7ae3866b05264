"""Pipelined delivery of a task's output to the next tasks.

Delivering a batch's segments waits for every destination to hold them
(appended and replicated there). Done inside the operator loop, that wait is
stop-and-wait: one partition's throughput is one batch per round trip, and a
partition fed faster than that falls behind with its worker's CPU half idle.
Here the loop hands each processed batch's segments over and goes on with the
next batch; a delivery task sends whatever has queued, in processing order,
in one :meth:`~services.worker.edges.Outbound.deliver` call (several batches
in one round trip per destination), at most ``max_batches`` batches behind.

Nothing about exactly-once changes, because the order and the identities do
not: every segment keeps the channel and sequence the shuffle numbered, a
channel's segments are appended in sequence order (``deliver`` appends each
destination's segments in list order and stops at the first failure), and a
window snapshot is written only once every batch it covers is delivered
(:meth:`DeliveryPipeline.wait_delivered`): a crash replays from a window
whose batches all reached their destinations, and what was processed after
it, delivered or not, is processed again and deduplicated downstream by the
one idempotence rule.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gridstream.faults import crash_point
from services.worker.edges import Outbound
from services.worker.peers import OutSegment

MAX_BATCHES = 16
"""Processed batches whose output may wait for delivery before the operator
loop waits too (bounded memory: design invariant 8)."""


class DeliveryPipeline:
    """The processed batches of one task partition on their way downstream."""

    def __init__(self, outbound: Outbound, node_id: str, max_batches: int = MAX_BATCHES) -> None:
        self.outbound = outbound
        self.node_id = node_id
        self.max_batches = max_batches
        self._queued: deque[tuple[int, list[OutSegment]]] = deque()
        self._changed = asyncio.Condition()
        self._sending = False
        self.delivered_offset = 0
        """Every batch below this input offset has its output delivered."""
        self.pending_segments = 0
        """Segments handed over and not yet acknowledged by their owners."""

    def reset(self, offset: int) -> None:
        """Where the loop starts: every batch below ``offset`` is covered by
        the restored window (delivered before it was written)."""
        self.delivered_offset = offset

    async def submit(self, next_offset: int, segments: list[OutSegment]) -> None:
        """Hands over the output of the batch ending at ``next_offset``; waits
        only while ``max_batches`` batches are queued."""
        async with self._changed:
            if not segments and not self._queued and not self._sending:
                self.delivered_offset = next_offset  # nothing on its way: done
                self._changed.notify_all()
                return
            await self._changed.wait_for(lambda: len(self._queued) < self.max_batches)
            self._queued.append((next_offset, segments))
            self.pending_segments += len(segments)
            self._changed.notify_all()

    async def wait_delivered(self, offset: int) -> None:
        """Returns once every batch below ``offset`` is delivered."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.delivered_offset >= offset)

    async def run(self) -> None:
        """Delivers what queued, oldest first, until cancelled by the task's owner."""
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._queued))
                taken = list(self._queued)
                self._queued.clear()
                self._sending = True
                self._changed.notify_all()  # room for the loop again
            segments = [segment for _, batch in taken for segment in batch]
            if segments:
                await self.outbound.deliver(segments)
                crash_point(self.node_id, "after_emit")
            async with self._changed:
                self._sending = False
                self.pending_segments -= len(segments)
                self.delivered_offset = taken[-1][0]
                self._changed.notify_all()

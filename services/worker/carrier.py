"""Watermarks past the first event-time stage: a task that carries event time
(:class:`services.worker.watermarks.TimePlan`) sends its watermark on every
edge into a task that hears one, so a chain of event-time stages works (a
window of windows, a join after a window).

The watermark a carrying task sends is its event-time stage's
``output_watermark`` (the earliest time an output of it still to come can
have: a window's, the earliest start of a window not fired yet), or, for a
task without one (a map or a fan-out between two event-time stages), the
minimum over its input channels (a :class:`~services.worker.windows.Clock`
of its own, in the task's snapshot header with the marks sent). It never
comes from the records: the records of a fired window are not in event-time
order, and need not be. As on the first edge, the watermark rides on every
segment, and a destination partition the batch had no records for gets an
empty segment with it once it advanced by the destination's tick (any
advance, into a stage without event time of its own). Everything is a
function of the inputs, so a replay sends the same watermarks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gridstream.jobspec import JobSpec
from gridstream.taskplan import plan_graph
from gridstream.timers import event_config
from services.worker.peers import OutSegment
from services.worker.shuffle import Shuffle
from services.worker.watermarks import stamp_watermark, time_plan
from services.worker.windows import Clock, Event


class Carrier:
    """The carried watermark of one task of one partition (see the module
    docstring); made by :meth:`of_task`, used by the task's outbound edges."""

    def __init__(self, ticks: dict[int, tuple[float, bool]], partition: int) -> None:
        self.ticks = ticks
        """Edge index -> (the destination's tick, 0 for any advance; keyed)."""
        self.partition = partition
        self.clock = Clock({}, set(), None)
        """A task without an event-time stage: the minimum over its inputs."""
        self.sent: dict[int, dict[int, float]] = {}
        """Edge index -> destination partition -> the watermark last sent."""

    @classmethod
    def of_task(cls, spec: JobSpec, task: int, partition: int) -> Carrier | None:
        """The carrier of ``task``, or None when it carries no event time on
        (it has none, or no edge leads to a task that hears it)."""
        times = time_plan(spec)
        if task not in times.carries:
            return None
        ticks: dict[int, tuple[float, bool]] = {}
        for n, edge in enumerate(plan_graph(spec).tasks[task].edges):
            if edge.task not in times.hears:
                continue
            stage = edge.stage
            config = event_config(stage)
            tick = 0.0 if config is None else config.tick
            ticks[n] = (tick, edge.keyed)
        return cls(ticks, partition) if ticks else None

    def mark(self, event: Event | None, windows: Sequence[Any]) -> float | None:
        """The watermark to send after a batch: the chain's event-time stage's,
        or the minimum over the inputs (None before there is one)."""
        if windows:
            mark: float | None = windows[-1].output_watermark
            return mark
        if event is None:
            return None
        self.clock.advance(event)
        now = self.clock.watermark
        return None if now == -math.inf else now

    def stamp(self, index: int, edge: Shuffle, segments: list[OutSegment],
              mark: float | None) -> list[OutSegment]:
        """``segments`` of edge ``index`` with the watermark on each, and empty
        segments with it to the destination partitions that need to hear it."""
        found = self.ticks.get(index)
        if found is None or mark is None:
            return segments
        tick, keyed = found
        partitions = range(edge.partitions) if keyed else (self.partition,)
        return stamp_watermark(edge, segments, mark, self.sent.setdefault(index, {}), tick,
                               partitions)

    def header(self) -> dict[str, Any]:
        """The carrier's state for the task's window snapshot header."""
        return {"sent": {n: dict(s) for n, s in self.sent.items()},
                "marks": dict(self.clock.marks)}

    def restore(self, saved: dict[str, Any]) -> None:
        """Puts back :meth:`header`'s state."""
        self.sent = {int(n): {int(p): float(m) for p, m in s.items()}
                     for n, s in saved.get("sent", {}).items()}
        self.clock.marks.clear()
        self.clock.marks.update(saved.get("marks", {}))

"""The sending side of event time: the watermark of a partition, carried on
the segments of the shuffle into a window stage (:mod:`services.worker.windows`
has the whole design)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gridstream.eventtime import EVENT_TIME_KINDS, event_time, window_config
from gridstream.ids import task_channel
from gridstream.jobspec import JobSpec, Stage
from gridstream.taskplan import plan_graph
from services.worker.operators import DeadLetter
from services.worker.peers import OutSegment, PeerRouter
from services.worker.shuffle import Shuffle


def event_inputs(job: JobSpec, task: int) -> tuple[str, ...] | None:
    """The channels a task starting with a window stage hears from (every
    partition of every upstream task), or None for any other task."""
    plan = plan_graph(job).tasks[task]
    if not plan.stages or plan.stages[0].kind not in EVENT_TIME_KINDS:
        return None
    return tuple(task_channel(i, p) for i in sorted(set(plan.inputs))
                 for p in range(job.partitions))


def batch_watermark(batch: Any) -> float | None:
    """The watermark a received batch carries, if any."""
    if batch is not None and batch.HasField("watermark"):
        return float(batch.watermark)
    return None


class TimedShuffle(Shuffle):
    """A shuffle into a window stage: also numbers the sending partition's
    watermark on every segment (see the module docstring)."""

    def __init__(self, job_id: str, dest_task: int, stage: Stage, partitions: int,
                 key_fn: Callable[[Any], Any], timestamp: Callable[[Any], Any], channel: str,
                 router: PeerRouter, batch_records: int) -> None:
        super().__init__(job_id, dest_task, stage.name, partitions, key_fn, channel, router,
                         batch_records)
        self.config = window_config(stage.params, stage.name)
        self.timestamp = timestamp
        self.max_time: float | None = None
        self.sent: dict[int, float] = {}
        """The watermark last sent to each destination partition."""

    def split(self, values: list[Any], batch_id: str,
              dead: list[DeadLetter]) -> list[OutSegment]:
        stamp = self.timestamp
        for value in values:
            try:  # a record without a time is the window stage's dead letter
                ts = event_time(stamp, value)
            except Exception:
                continue
            if self.max_time is None or ts > self.max_time:
                self.max_time = ts
        segments = super().split(values, batch_id, dead)
        if self.max_time is None:
            return segments
        mark = self.max_time - self.config.max_delay
        tick = self.config.tick
        for segment in segments:
            segment.encode().watermark = mark
            self.sent[segment.partition] = mark
        having = {segment.partition for segment in segments}
        for p in range(self.partitions):
            last = self.sent.get(p)
            if p in having or (last is not None and mark // tick <= last // tick):
                continue
            seq = self.sequences.get(p, 0) + 1
            self.sequences[p] = seq
            empty = OutSegment(self.dest_task, p, self.channel, seq, [], [],
                               previous_sequence=seq - 1)
            empty.encode().watermark = mark
            self.sent[p] = mark
            segments.append(empty)
        return segments

    def header(self) -> list[Any]:
        """The edge's event-time state for a window snapshot's header."""
        return [self.max_time, dict(self.sent)]

    def restore(self, saved: list[Any]) -> None:
        """Puts back :meth:`header`'s state."""
        self.max_time = None if saved[0] is None else float(saved[0])
        self.sent = {int(p): float(w) for p, w in saved[1].items()}

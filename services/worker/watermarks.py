"""The sending side of event time: which tasks hear watermarks
(:func:`time_plan`), the watermark of a partition computed from its records
on the shuffle into a first event-time stage (:class:`TimedShuffle`;
:mod:`services.worker.windows` has the whole design), and the watermark
carried on past an event-time stage (:mod:`services.worker.carrier`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gridstream.eventtime import event_time
from gridstream.ids import task_channel
from gridstream.jobspec import JobSpec, Stage
from gridstream.taskplan import plan_graph
from gridstream.timers import event_config, has_event_time
from services.worker.operators import DeadLetter
from services.worker.peers import OutSegment, PeerRouter
from services.worker.shuffle import Shuffle


@dataclass(frozen=True)
class TimePlan:
    """Which tasks of a job hear watermarks and which carry one on.

    A task *carries* event time when its chain has an event-time stage (a
    window or join) or a task sending to it carries it: its output's
    watermark comes from that stage (its :attr:`output_watermark`) or from
    its inputs (the minimum over them), not from its records. A task *hears*
    watermarks when it starts with an event-time stage, or carries event time
    and sends on (through any tasks) to one. An edge into a hearing task
    carries the watermark: the carried one from a carrying task, else one
    computed from the records (:class:`TimedShuffle`)."""

    carries: frozenset[int]
    hears: frozenset[int]


def time_plan(job: JobSpec) -> TimePlan:
    """The :class:`TimePlan` of a (validated) job."""
    plan = plan_graph(job)
    starts = {t.index for t in plan.tasks
              if t.stages and has_event_time(t.stages[0])}
    carries: set[int] = set()
    for task in plan.tasks:  # an edge always goes to a later task
        if task.index in starts or carries.intersection(task.inputs):
            carries.add(task.index)
    reach: set[int] = set()
    for task in reversed(plan.tasks):
        if any(e.task in starts or e.task in reach for e in task.edges):
            reach.add(task.index)
    hears = starts | {t.index for t in plan.tasks
                      if t.index in reach and carries.intersection(t.inputs)}
    return TimePlan(frozenset(carries), frozenset(hears))


def event_inputs(job: JobSpec, task: int,
                 partition: int | None = None) -> tuple[str, ...] | None:
    """The channels a task that hears watermarks hears from (every partition
    of every upstream task; over a forward edge, ``partition``'s own only),
    or None for any other task."""
    if task not in time_plan(job).hears:
        return None
    plan = plan_graph(job)
    channels: list[str] = []
    for i in sorted(set(plan.tasks[task].inputs)):
        keyed = any(e.keyed for e in plan.tasks[i].edges if e.task == task)
        channels += [task_channel(i, p) for p in range(job.partitions)
                     if keyed or partition is None or p == partition]
    return tuple(channels)


def batch_watermark(batch: Any) -> float | None:
    """The watermark a received batch carries, if any."""
    if batch is not None and batch.HasField("watermark"):
        return float(batch.watermark)
    return None


def batch_time(batch: Any) -> float:
    """The processing time recorded with a batch (its client's send time,
    passed on with every output; 0.0: none), as replicated with it: what a
    timed stateful stage's clock reads (services.worker.timers)."""
    return 0.0 if batch is None else float(batch.ingest_unix_s)


def stamp_watermark(edge: Shuffle, segments: list[OutSegment], mark: float,
                    sent: dict[int, float], tick: float,
                    partitions: Iterable[int]) -> list[OutSegment]:
    """``segments`` of ``edge`` with the watermark ``mark`` on each, plus an
    empty segment carrying it to each of ``partitions`` that got no records,
    once it moved on by a ``tick`` (any advance when ``tick`` is 0) since the
    last one ``sent`` there; empty segments take the edge's next sequences, so
    a replay sends the same. ``sent`` is updated."""
    for segment in segments:
        segment.encode().watermark = mark
        sent[segment.partition] = mark
    having = {segment.partition for segment in segments}
    for p in partitions:
        last = sent.get(p)
        if p in having or (last is not None and (
                mark // tick <= last // tick if tick else mark <= last)):
            continue
        seq = edge.sequences.get(p, 0) + 1
        edge.sequences[p] = seq
        empty = OutSegment(edge.dest_task, p, edge.channel, seq, [], [],
                           previous_sequence=seq - 1)
        empty.encode().watermark = mark
        sent[p] = mark
        segments.append(empty)
    return segments


class TimedShuffle(Shuffle):
    """A shuffle into a window stage: also numbers the sending partition's
    watermark on every segment (see the module docstring)."""

    def __init__(self, job_id: str, dest_task: int, stage: Stage, partitions: int,
                 key_fn: Callable[[Any], Any], timestamp: Callable[[Any], Any], channel: str,
                 router: PeerRouter, batch_records: int) -> None:
        super().__init__(job_id, dest_task, stage.name, partitions, key_fn, channel, router,
                         batch_records)
        config = event_config(stage)
        assert config is not None
        self.config = config
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
        return stamp_watermark(self, segments, mark, self.sent, self.config.tick,
                               range(self.partitions))

    def header(self) -> list[Any]:
        """The edge's event-time state for a window snapshot's header."""
        return [self.max_time, dict(self.sent)]

    def restore(self, saved: list[Any]) -> None:
        """Puts back :meth:`header`'s state."""
        self.max_time = None if saved[0] is None else float(saved[0])
        self.sent = {int(p): float(w) for p, w in saved[1].items()}

"""A task's outbound edges: where the output of its chain goes.

A task sends its output on every edge of its plan
(:func:`gridstream.taskplan.plan_graph`): a keyed edge shuffles it by the
destination stage's key (:class:`~services.worker.shuffle.Shuffle`), a
forward edge keeps each record in this partition with its key
(:class:`Forward`). Every edge numbers its segments per destination
partition on the channel ``t<task>/p<partition>`` of this task: a task has
at most one edge to a given task, so a destination container (a union reads
several tasks) never sees two senders on one channel.

The sequences of every edge go into each window snapshot's header, so a
replay after recovery emits the same (channel, sequence) on every edge and
the receivers drop what they already hold (the idempotence rule,
docs/recovery.md). A task with one edge writes them as it always did
(``out_sequences``: partition -> sequence); with several, ``edge_sequences``
holds them per destination task as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gridstream.codec import decode_batch
from gridstream.combiners import COMBINERS
from gridstream.jobspec import JobSpec, resolve
from gridstream.taskplan import plan_graph
from gridstream.timers import event_config
from services.worker.carrier import Carrier
from services.worker.operators import DeadLetter
from services.worker.peers import OutSegment, PeerRouter
from services.worker.shuffle import Shuffle
from services.worker.watermarks import TimedShuffle
from services.worker.windows import Event


def _no_key(value: Any) -> Any:  # pragma: no cover - a forward edge never keys
    raise RuntimeError("a forward edge keys nothing")


class Forward(Shuffle):
    """A forward edge: the records stay in this partition, keyed as they are,
    cut into segments of at most ``batch_records``."""

    def __init__(self, job_id: str, dest_task: int, dest_stage: str, partition: int,
                 partitions: int, channel: str, router: PeerRouter,
                 batch_records: int) -> None:
        super().__init__(job_id, dest_task, dest_stage, partitions, _no_key, channel, router,
                         batch_records)
        self.partition = partition

    def split_keyed(self, keys: list[Any] | None, values: list[Any], batch_id: str,
                    dead: list[DeadLetter]) -> list[OutSegment]:
        """The records as segments to this partition of the destination task."""
        segments: list[OutSegment] = []
        size = self.batch_records
        p = self.partition
        for start in range(0, len(values), size):
            seq = self.sequences.get(p, 0) + 1
            self.sequences[p] = seq
            segment = OutSegment(self.dest_task, p, self.channel, seq,
                                 None if keys is None else keys[start:start + size],
                                 values[start:start + size], previous_sequence=seq - 1)
            self._encode(segment, batch_id, dead)
            segments.append(segment)
        return segments


class Outbound:
    """Every edge of one task of one partition."""

    def __init__(self, edges: list[Shuffle], carrier: Carrier | None = None) -> None:
        self.edges = edges
        self.carrier = carrier
        """The watermark carried on past an event-time stage (services.worker.carrier)."""

    @classmethod
    def of_task(cls, job_id: str, spec: JobSpec, task: int, partition: int, channel: str,
                router: PeerRouter, batch_records: int,
                resolve_key: Callable[[str, str], Callable[[Any], Any]] = resolve
                ) -> Outbound:
        """The edges the job's plan gives ``task``, sending on ``channel``."""
        edges: list[Shuffle] = []
        carrier = Carrier.of_task(spec, task, partition)
        for edge in plan_graph(spec).tasks[task].edges:
            stage = edge.stage
            timed = event_config(stage) if edge.keyed and carrier is None else None
            if timed is not None:  # the watermark computed from the records
                where = f"job {spec.name}, stage {stage.name}"
                edges.append(TimedShuffle(
                    job_id, edge.task, stage, spec.partitions,
                    resolve_key(stage.key, f"{where}, key"),
                    resolve_key(timed.timestamp, f"{where}, timestamp"),
                    channel, router, batch_records))
            elif edge.keyed:
                key_fn = resolve_key(stage.key, f"job {spec.name}, stage {stage.name}, key")
                combine = COMBINERS[edge.combine].partials if edge.combine else None
                edges.append(Shuffle(job_id, edge.task, stage.name, spec.partitions, key_fn,
                                     channel, router, batch_records, combine))
            else:
                edges.append(Forward(job_id, edge.task, stage.name, partition,
                                     spec.partitions, channel, router, batch_records))
        return cls(edges, carrier)

    def split(self, keys: list[Any] | None, values: list[Any], batch_id: str,
              dead: list[DeadLetter], event: Event | None = None,
              windows: Sequence[Any] = ()) -> list[OutSegment]:
        """The chain's output as segments for every edge (edge by edge, each
        edge's in sequence order). Every edge sees the same records: a record
        whose key function fails on one edge goes to dead letters for that
        edge's stage only. A task that carries event time on stamps its
        watermark (from the batch's ``event`` and the chain's event-time
        ``windows``) on the edges that need it, even without records."""
        carrier = self.carrier
        mark = None if carrier is None else carrier.mark(event, windows)
        if not values and mark is None:
            return []
        segments: list[OutSegment] = []
        for n, edge in enumerate(self.edges):
            if not values:
                made = []
            elif isinstance(edge, Forward):
                made = edge.split_keyed(keys, values, batch_id, dead)
            else:
                made = edge.split(values, batch_id, dead)
            if carrier is not None:
                made = carrier.stamp(n, edge, made, mark)
            if n:
                # Each further edge gets records of its own, as decoded from
                # the wire: a branch on this worker never sees what another
                # branch's operator did to a shared record, and a replay
                # (which decodes its log) sees what the first run saw.
                for segment in made:
                    segment.keys, segment.values = decode_batch(segment.encode())
            segments += made
        return segments

    async def deliver(self, segments: list[OutSegment]) -> None:
        """Returns once every segment of every edge is acknowledged by its owner."""
        if segments:
            await self.edges[0].router.deliver(self.edges[0].job_id, segments)

    def header(self) -> dict[str, Any]:
        """The edges' sequences for a window snapshot's header."""
        out: dict[str, Any] = {
            "out_sequences": dict(self.edges[0].sequences) if self.edges else {}}
        if len(self.edges) > 1:
            out["edge_sequences"] = {edge.dest_task: dict(edge.sequences)
                                     for edge in self.edges}
        timed = {edge.dest_task: edge.header() for edge in self.edges
                 if isinstance(edge, TimedShuffle)}
        if timed:  # only a job with event time has it
            out["event_time"] = timed
        if self.carrier is not None:
            out["carried_time"] = self.carrier.header()
        return out

    def restore(self, saved: dict[str, Any]) -> None:
        """Puts back the sequences of a window snapshot's header."""
        per_task = saved.get("edge_sequences")
        for i, edge in enumerate(self.edges):
            if per_task is not None:
                found = per_task.get(edge.dest_task, per_task.get(str(edge.dest_task), {}))
            else:
                found = saved.get("out_sequences", {}) if i == 0 else {}
            edge.sequences = {int(p): int(s) for p, s in found.items()}
            timed = saved.get("event_time") or {}
            mark = timed.get(edge.dest_task, timed.get(str(edge.dest_task)))
            if mark is not None and isinstance(edge, TimedShuffle):
                edge.restore(mark)
        if self.carrier is not None and saved.get("carried_time") is not None:
            self.carrier.restore(saved["carried_time"])

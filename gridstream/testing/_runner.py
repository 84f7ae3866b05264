"""Runs a job, the whole graph, in this process with the cluster's semantics.

Nothing is reimplemented that a worker does: each stage runs in the
worker's own :class:`~services.worker.operators.OperatorChain` (so dead
letters, reduce and stateful state, params and sink rows are the worker's),
and records reach a keyed stage through the worker's
:class:`~services.worker.shuffle.Shuffle` (the same key checks, partitions,
batch ids and msgpack encoding). What is local is only the scheduling: the
sent records are cut into batches as :meth:`gridstream.Client.send` cuts
them, and every stage processes its input batches in order, one partition
after another.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from gridstream import filesink
from gridstream.client import DEFAULT_BATCH_SIZE
from gridstream.codec import decode_batch, encode_batch, row_json
from gridstream.config import ClusterConfig
from gridstream.dataflow import Dataflow
from gridstream.deadletters import encode_error, encode_record
from gridstream.ids import batch_identity, key_text, partition_for_key, task_channel
from gridstream.jobspec import (
    JobSpec,
    Stage,
    allow_job_modules,
    allowed_job_modules,
    check_allowed_path,
    validate,
)
from gridstream.taskplan import TaskPlan, plan_graph
from gridstream.timers import event_paths
from gridstream.types import DeadLetter
from gridstream.validation import check_nesting
from services.worker.edges import Outbound
from services.worker.operators import DeadLetter as StoredDeadLetter
from services.worker.operators import OperatorChain
from services.worker.peers import PeerRouter
from services.worker.watermarks import batch_watermark, event_inputs

SOURCE_CHANNEL = "src/local"
"""The channel of the sent records (a client's is ``src/<producer>``)."""


@dataclass(frozen=True)
class TestSource:
    """Records sent to a job as ``Client.send(job_id, values, keys=keys)``
    sends them: with ``keys``, each record goes to its key's partition and
    keeps its order among its key's records, and its key stays on it to the
    sink; without, batches of ``batch_size`` go to the partitions in turn."""

    __test__ = False  # not a pytest test class, despite its name

    values: Sequence[Any]
    keys: Sequence[Any] | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    times: Sequence[float] | None = None
    """The processing time each record is sent at (Unix seconds, say); a
    batch's is its last record's, as a client stamps a batch when it sends
    it. It is what a timed stateful stage's ``ctx.now()`` returns and what
    fires its processing-time timers (docs/dataflow.md, "Timers"); None:
    0.0, no time recorded."""


@dataclass
class TestSink:
    """What one sink received: ``rows`` as ``Client.results`` returns them
    (str keys, values through JSON) and ``records``, every value that reached
    the sink in the order it did (an append sink stores each as a row)."""

    __test__ = False

    name: str
    mode: str
    rows: dict[str, Any] = field(default_factory=dict)
    records: list[Any] = field(default_factory=list)


@dataclass
class LocalResult:
    """The outcome of :func:`run_local`: each sink's rows and records, and the
    dead letters as ``Client.dead_letters`` returns them."""

    sinks: dict[str, TestSink]
    dead_letters: list[DeadLetter]

    def results(self, sink: str | None = None) -> dict[str, Any]:
        """One sink's rows, like ``Client.results``; ``sink`` may be left out
        when the job has one sink."""
        return self.sink(sink).rows

    def sink(self, name: str | None = None) -> TestSink:
        """One sink by name (the only one when ``name`` is None)."""
        if name is None:
            if len(self.sinks) != 1:
                raise KeyError(f"the job has sinks {sorted(self.sinks)}; name one")
            return next(iter(self.sinks.values()))
        return self.sinks[name]


@dataclass
class _Batch:
    """A batch between stages: where it lives, its identity, its records."""

    partition: int
    batch_id: str
    keys: list[Any] | None
    values: list[Any]
    channel: str = SOURCE_CHANNEL
    watermark: float | None = None
    """The watermark the batch carries (into a window stage only)."""
    time: float = 0.0
    """The processing time recorded with the batch (a client's send time),
    passed on with its outputs as a worker passes it on."""


class _NoRouter:
    """The shuffle's router: never used, since the local runner reads the
    segments a shuffle makes instead of delivering them."""

    async def deliver(self, job_id: str, segments: list[Any]) -> None:
        raise RuntimeError("the local runner delivers no segments")


def _wire(values: list[Any], keys: list[Any] | None) -> tuple[list[Any] | None, list[Any]]:
    """The records as a worker decodes them from the wire (tuples are lists)."""
    return decode_batch(encode_batch(values, keys))


def source_batches(source: TestSource, partitions: int) -> list[_Batch]:
    """The sent records as the client batches them, partition by partition,
    each batch with the sequence a fresh client gives it."""
    values = list(source.values)
    check_nesting(values, "record")
    times = [0.0] * len(values) if source.times is None else [float(t) for t in source.times]
    if len(times) != len(values):
        raise ValueError("times and values differ in length")
    per_partition: dict[int, list[tuple[list[Any] | None, list[Any], float]]] = {}
    size = max(1, source.batch_size)
    if source.keys is not None:
        keys = list(source.keys)
        if len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        check_nesting(keys, "key")
        grouped: dict[int, tuple[list[Any], list[Any], list[float]]] = {}
        for k, v, t in zip(keys, values, times, strict=True):
            bucket = grouped.setdefault(partition_for_key(k, partitions), ([], [], []))
            bucket[0].append(k)
            bucket[1].append(v)
            bucket[2].append(t)
        for p, (bk, bv, bt) in grouped.items():
            per_partition[p] = [(bk[i:i + size], bv[i:i + size], max(bt[i:i + size]))
                                for i in range(0, len(bv), size)]
    else:
        for n, start in enumerate(range(0, len(values), size)):
            per_partition.setdefault(n % partitions, []).append(
                (None, values[start:start + size], max(times[start:start + size])))
    batches = []
    for p in sorted(per_partition):
        for sequence, (sent_keys, sent_values, sent_at) in enumerate(per_partition[p], start=1):
            wire_keys, wire_values = _wire(sent_values, sent_keys)
            batches.append(_Batch(p, batch_identity(0, p, SOURCE_CHANNEL, sequence),
                                  wire_keys, wire_values, time=sent_at))
    return batches


@contextlib.contextmanager
def _allowing(modules: tuple[str, ...]) -> Iterator[None]:
    """Lets the job's functions resolve in this process for the run only."""
    previous = allowed_job_modules()
    allow_job_modules(modules)
    try:
        yield
    finally:
        allow_job_modules(previous)


class _Run:
    """One run: the chain and the outbound edges of every (task, partition) of
    the cluster's plan (:func:`gridstream.taskplan.plan_graph`), and what the
    sinks and dead letters received."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job
        self.plan = plan_graph(job)
        self.dead: list[StoredDeadLetter] = []
        self.sinks = {s.name: TestSink(s.name, s.mode) for s in job.stages if s.kind == "sink"}
        self._chains: dict[tuple[int, int], OperatorChain] = {}
        self._outbound: dict[tuple[int, int], Outbound] = {}
        self._inputs: dict[tuple[int, int], tuple[str, ...] | None] = {}
        self.files: dict[tuple[str, int], list[Any]] = {}
        """A files sink's records per (sink, partition), for :meth:`write_files`."""

    def write_files(self, job_id: str) -> None:
        """Writes each files sink's records as the cluster commits them, one
        file per partition here (the cluster writes one per window), under
        ``<path>/<job_id>/<sink>/`` (:func:`gridstream.filesink.read_records`)."""
        stages = {s.name: s for s in self.job.stages}
        for (name, partition), records in sorted(self.files.items()):
            params = stages[name].params
            fmt = str(params.get("format", "jsonl"))
            final = filesink.final_name(partition, 0, len(records), fmt)
            filesink.write_durably(filesink.sink_dir(str(params["path"]), job_id, name),
                                   final, filesink.encode(records, fmt))

    def chain(self, task: TaskPlan, partition: int) -> OperatorChain:
        """The task's operator chain in one partition (keyed state is per partition)."""
        found = self._chains.get((task.index, partition))
        if found is None:
            where = f"job {self.job.name}, task {task.index}"
            found = self._chains[(task.index, partition)] = OperatorChain(
                list(task.stages), where, placement=(partition, self.job.partitions))
        return found

    def inputs(self, task: TaskPlan, partition: int) -> tuple[str, ...] | None:
        """The channels a task's partition hears watermarks from, if any."""
        if (task.index, partition) not in self._inputs:
            self._inputs[(task.index, partition)] = event_inputs(self.job, task.index, partition)
        return self._inputs[(task.index, partition)]

    def outbound(self, task: TaskPlan, partition: int) -> Outbound:
        """The task's edges in one partition, numbering segments as a worker does."""
        found = self._outbound.get((task.index, partition))
        if found is None:
            found = self._outbound[(task.index, partition)] = Outbound.of_task(
                self.job.name, self.job, task.index, partition,
                task_channel(task.index, partition), cast(PeerRouter, _NoRouter()),
                DEFAULT_BATCH_SIZE)
        return found

    def process(self, task: TaskPlan, batches: list[_Batch]) -> dict[int, list[_Batch]]:
        """Runs the task over its input batches in order; the batches its edges
        send, per destination task, named as the receiving containers name them."""
        out: dict[int, list[_Batch]] = {}
        for batch in batches:
            chain = self.chain(task, batch.partition)
            inputs = self.inputs(task, batch.partition)
            event = None if inputs is None else (batch.channel, batch.watermark, inputs)
            try:
                result = chain.process(batch.keys, batch.values, batch.batch_id, event,
                                       batch.time)
            except Exception as exc:  # as a worker dead-letters a batch it cannot run
                keys = batch.keys or [None] * len(batch.values)
                self.dead.extend((f"{batch.batch_id}:<task>:{i}", "<task>",
                                  encode_record(k, v), encode_error(exc))
                                 for i, (k, v) in enumerate(zip(keys, batch.values, strict=True)))
                continue
            self.dead.extend(result.dead_letters)
            if chain.has_sink:
                sink = self.sinks[task.stages[-1].name]
                if chain.file_sink:
                    self.files.setdefault((sink.name, batch.partition), []).extend(
                        result.sink_rows.values())
                for key, value in result.sink_rows.items():
                    stored = json.loads(row_json(value))
                    sink.rows[key if isinstance(key, str) else key_text(key)] = stored
                    sink.records.append(stored)
            elif result.values or event is not None:  # a watermark may go on alone
                segments = self.outbound(task, batch.partition).split(
                    result.keys, result.values, batch.batch_id, self.dead, event, chain.windows)
                for segment in segments:
                    wire_keys, wire_values = decode_batch(segment.encode())
                    out.setdefault(segment.task, []).append(_Batch(
                        segment.partition, batch_identity(segment.task, segment.partition,
                                                          segment.channel, segment.sequence),
                        wire_keys, wire_values, segment.channel,
                        batch_watermark(segment.encode()), batch.time))
        return out


def run_local(job: JobSpec | Dataflow, inputs: TestSource | Sequence[Any], *,
              partitions: int = 0, job_modules: tuple[str, ...] | None = None,
              job_id: str = "local") -> LocalResult:
    """Runs ``job`` (every stage of its graph) over ``inputs`` in this
    process, with the worker's operators: per-key order, keyed state,
    params, sink modes and dead letters as on the cluster, without faults.

    ``inputs`` is a :class:`TestSource` or a plain sequence of records (sent
    without keys). ``partitions`` defaults to the job's, or the cluster
    default. ``job_modules`` (default: the modules the job names) limits what
    the job may import, as ``cluster.job_modules`` does on the cluster; this
    process's allowed modules are set for the run and restored after it, so
    do not run jobs in other threads meanwhile. A files sink's records are
    in its ``records`` and written under ``<path>/<job_id>/<sink>/``, a
    file per partition, where :func:`gridstream.filesink.read_records`
    reads them as it reads a cluster job's.

    >>> from gridstream.examples import wordcount
    >>> result = run_local(wordcount.job(), ["a b a", "b a"])
    >>> sorted(result.results().items())
    [('a', 3), ('b', 2)]
    """
    spec = inputs if isinstance(inputs, TestSource) else TestSource(list(inputs))
    job = job.job() if isinstance(job, Dataflow) else job
    validate(job)
    parts = partitions or job.partitions or ClusterConfig().partitions
    named = {path.partition(":")[0] for stage in job.stages
             for path in _paths(stage) if path}
    allowed = tuple(sorted(named)) if job_modules is None else job_modules
    for stage in job.stages:  # refused before anything is imported, as on the cluster
        for path in _paths(stage):
            if path:
                check_allowed_path(path, f"job {job.name}, stage {stage.name}", allowed)
    with _allowing(allowed):
        run = _Run(job.with_defaults(parts, 1))
        inbox: dict[int, list[_Batch]] = {0: source_batches(spec, parts)}
        for task in run.plan.tasks:  # an edge goes to a later task: every input is ready
            sent = run.process(task, sorted(inbox.pop(task.index, []), key=_partition))
            for destination, batches in sent.items():
                inbox.setdefault(destination, []).extend(batches)
        run.write_files(job_id)
    return LocalResult(run.sinks, [DeadLetter.from_stored(*d) for d in run.dead])


def _paths(stage: Stage) -> tuple[str, ...]:
    """The import paths a stage names (a window's timestamp function too)."""
    if event_paths(stage):
        return stage.function, stage.key, *event_paths(stage)
    if stage.function == "gridstream.eventtime:tag":  # a join side's key and time
        return stage.function, str(stage.params["key"]), str(stage.params["time"])
    return stage.function, stage.key


def _partition(batch: _Batch) -> int:
    return batch.partition

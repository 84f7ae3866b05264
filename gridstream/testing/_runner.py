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

from gridstream.client import DEFAULT_BATCH_SIZE
from gridstream.codec import decode_batch, encode_batch, row_json
from gridstream.config import ClusterConfig
from gridstream.dataflow import Dataflow
from gridstream.deadletters import encode_error, encode_record
from gridstream.ids import batch_identity, key_text, partition_for_key, task_channel
from gridstream.jobspec import (
    SOURCE,
    JobSpec,
    Stage,
    allow_job_modules,
    allowed_job_modules,
    check_allowed_path,
    effective_inputs,
    is_linear,
    resolve,
    validate,
)
from gridstream.types import DeadLetter
from gridstream.validation import check_nesting
from services.worker.operators import DeadLetter as StoredDeadLetter
from services.worker.operators import OperatorChain
from services.worker.peers import PeerRouter
from services.worker.shuffle import Shuffle

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
    upstream: str = SOURCE


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
    per_partition: dict[int, list[tuple[list[Any] | None, list[Any]]]] = {}
    size = max(1, source.batch_size)
    if source.keys is not None:
        keys = list(source.keys)
        if len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        check_nesting(keys, "key")
        grouped: dict[int, tuple[list[Any], list[Any]]] = {}
        for k, v in zip(keys, values, strict=True):
            bucket = grouped.setdefault(partition_for_key(k, partitions), ([], []))
            bucket[0].append(k)
            bucket[1].append(v)
        for p, (bk, bv) in grouped.items():
            per_partition[p] = [(bk[i:i + size], bv[i:i + size]) for i in range(0, len(bv), size)]
    else:
        for n, start in enumerate(range(0, len(values), size)):
            per_partition.setdefault(n % partitions, []).append((None, values[start:start + size]))
    batches = []
    for p in sorted(per_partition):
        for sequence, (sent_keys, sent_values) in enumerate(per_partition[p], start=1):
            wire_keys, wire_values = _wire(sent_values, sent_keys)
            batches.append(_Batch(p, batch_identity(0, p, SOURCE_CHANNEL, sequence),
                                  wire_keys, wire_values))
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


def _task_indices(job: JobSpec) -> dict[str, int]:
    """Each stage's task as the cluster numbers them: a keyed stage starts
    the next task (for a linear job, the index of :func:`plan_tasks`)."""
    tasks = {SOURCE: 0}
    for stage, inputs in zip(job.stages, effective_inputs(job), strict=True):
        tasks[stage.name] = max(tasks[n] for n in inputs) + (1 if stage.keyed else 0)
    return tasks


class _Run:
    """One run: the chains of every (stage, partition), the shuffles of every
    edge into a keyed stage, and what the sinks and dead letters received."""

    def __init__(self, job: JobSpec, partitions: int) -> None:
        self.job = job
        self.partitions = partitions
        self.tasks = _task_indices(job)
        self.dead: list[StoredDeadLetter] = []
        self.sinks = {s.name: TestSink(s.name, s.mode) for s in job.stages if s.kind == "sink"}
        self._chains: dict[tuple[str, int], OperatorChain] = {}
        self._shuffles: dict[tuple[str, str, int], Shuffle] = {}
        self._linear = is_linear(job)

    def chain(self, stage: Stage, partition: int) -> OperatorChain:
        """The stage's operator in one partition (keyed state is per partition)."""
        found = self._chains.get((stage.name, partition))
        if found is None:
            where = f"job {self.job.name}, task {self.tasks[stage.name]}"
            found = self._chains[(stage.name, partition)] = OperatorChain([stage], where)
        return found

    def shuffle(self, stage: Stage, batch: _Batch) -> list[_Batch]:
        """A batch on its way into a keyed stage, keyed and split by partition
        by the worker's shuffle; one batch per segment, as the receiving
        container names it."""
        edge = (batch.upstream, stage.name, batch.partition)
        shuffle = self._shuffles.get(edge)
        upstream_task = self.tasks[batch.upstream]
        if shuffle is None:
            channel = task_channel(upstream_task, batch.partition)
            if not self._linear:
                channel = f"{channel}/{batch.upstream}"  # one channel per edge of a graph
            key_fn = resolve(stage.key, f"job {self.job.name}, stage {stage.name}, key")
            shuffle = self._shuffles[edge] = Shuffle(
                self.job.name, self.tasks[stage.name], stage.name, self.partitions, key_fn,
                channel, cast(PeerRouter, _NoRouter()), DEFAULT_BATCH_SIZE)
        out = []
        for segment in shuffle.split(batch.values, batch.batch_id, self.dead):
            keys, values = decode_batch(segment.encode())
            out.append(_Batch(segment.partition,
                              batch_identity(self.tasks[stage.name], segment.partition,
                                             segment.channel, segment.sequence), keys, values))
        return out

    def process(self, stage: Stage, batches: list[_Batch]) -> list[_Batch]:
        """Runs the stage over its input batches in order; its output batches."""
        if stage.keyed:
            batches = [b for batch in batches for b in self.shuffle(stage, batch)]
        out = []
        for batch in batches:
            try:
                result = self.chain(stage, batch.partition).process(
                    batch.keys, batch.values, batch.batch_id)
            except Exception as exc:  # as a worker dead-letters a batch it cannot run
                keys = batch.keys or [None] * len(batch.values)
                self.dead.extend((f"{batch.batch_id}:<task>:{i}", "<task>",
                                  encode_record(k, v), encode_error(exc))
                                 for i, (k, v) in enumerate(zip(keys, batch.values, strict=True)))
                continue
            self.dead.extend(result.dead_letters)
            if stage.kind == "sink":
                sink = self.sinks[stage.name]
                for key, value in result.sink_rows.items():
                    stored = json.loads(row_json(value))
                    sink.rows[key if isinstance(key, str) else key_text(key)] = stored
                    sink.records.append(stored)
            else:
                out.append(_Batch(batch.partition, batch.batch_id, result.keys, result.values,
                                  stage.name))
        return out


def run_local(job: JobSpec | Dataflow, inputs: TestSource | Sequence[Any], *,
              partitions: int = 0, job_modules: tuple[str, ...] | None = None) -> LocalResult:
    """Runs ``job`` (every stage of its graph) over ``inputs`` in this
    process, with the worker's operators: per-key order, keyed state,
    params, sink modes and dead letters as on the cluster, without faults.

    ``inputs`` is a :class:`TestSource` or a plain sequence of records (sent
    without keys). ``partitions`` defaults to the job's, or the cluster
    default. ``job_modules`` (default: the modules the job names) limits what
    the job may import, as ``cluster.job_modules`` does on the cluster; this
    process's allowed modules are set for the run and restored after it, so
    do not run jobs in other threads meanwhile.

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
             for path in (stage.function, stage.key) if path}
    allowed = tuple(sorted(named)) if job_modules is None else job_modules
    for stage in job.stages:  # refused before anything is imported, as on the cluster
        for path in (stage.function, stage.key):
            if path:
                check_allowed_path(path, f"job {job.name}, stage {stage.name}", allowed)
    with _allowing(allowed):
        run = _Run(job, parts)
        outputs: dict[str, list[_Batch]] = {SOURCE: source_batches(spec, parts)}
        for stage, names in zip(job.stages, effective_inputs(job), strict=True):
            batches = [b for name in names for b in outputs[name]]
            outputs[stage.name] = run.process(stage, sorted(batches, key=_partition))
    return LocalResult(run.sinks, [DeadLetter.from_stored(*d) for d in run.dead])


def _partition(batch: _Batch) -> int:
    return batch.partition

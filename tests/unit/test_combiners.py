"""Map-side combining (gridstream.combiners): where the plan combines, what
the shuffle sends, and that the results stay those of record by record."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, cast

from gridstream.dataflow import Dataflow
from gridstream.examples import wordcount
from gridstream.jobspec import JobSpec, Stage
from gridstream.taskplan import plan_graph
from gridstream.testing import TestSource, run_local
from services.worker.edges import Outbound
from services.worker.peers import PeerRouter

B = "gridstream.builtins"


def _count_job(*after: Stage, sink_mode: str = "latest", function: str = f"{B}:count",
               params: dict[str, Any] | None = None) -> JobSpec:
    return JobSpec(name="counts", partitions=4, stages=(
        Stage("split", "flat_map", f"{B}:split_words"),
        Stage("count", "reduce", function, key=f"{B}:identity", initial=0,
              params=params or {}),
        *after,
        Stage("store", "sink", mode=sink_mode),
    ))


def test_a_count_into_a_latest_sink_combines() -> None:
    plan = plan_graph(wordcount.job(partitions=4))
    (edge,) = plan.tasks[0].edges
    assert edge.combine == f"{B}:count"
    assert edge.stage.function == f"{B}:count"  # the key and name the sender uses
    reduce, _sink = plan.tasks[1].stages
    assert reduce.function == f"{B}:sum_values"  # the reduce adds the partial counts
    assert reduce.initial == 0


def test_nothing_combines_where_the_running_values_could_be_seen() -> None:
    cases = {
        "append sink": _count_job(sink_mode="append"),
        "a stage after the reduce": _count_job(Stage("show", "map", f"{B}:identity")),
        "a function gridstream cannot merge": _count_job(function=f"{B}:sum_values"),
        "params": _count_job(params={"unused": 1}),
    }
    for why, job in cases.items():
        plan = plan_graph(job)
        assert all(not e.combine for t in plan.tasks for e in t.edges), why
        assert plan.tasks[1].stages[0].function == job.stages[1].function, why


def test_the_shuffle_sends_each_key_once_per_batch_with_its_count() -> None:
    job = wordcount.job(partitions=4)
    outbound = Outbound.of_task("j", job, 0, 0, "t0/p0", cast(PeerRouter, None), 100_000)
    rng = random.Random(7)
    words = [rng.choice(["a", "bb", "ccc", "dddd", "e"]) for _ in range(5_000)]
    segments = outbound.split(None, words, "b1", [])
    sent: Counter[str] = Counter()
    for segment in segments:
        assert segment.keys is not None
        assert len(segment.keys) == len(set(segment.keys))  # each key once
        sent.update(dict(zip(segment.keys, segment.values, strict=True)))
    assert sent == Counter(words)
    # A replay splits the same batch into the same segments.
    again = Outbound.of_task("j", job, 0, 0, "t0/p0", cast(PeerRouter, None), 100_000)
    replayed = again.split(None, words, "b1", [])
    assert [(s.partition, s.sequence, s.keys, s.values) for s in replayed] == \
        [(s.partition, s.sequence, s.keys, s.values) for s in segments]


def test_combined_counts_equal_the_reference() -> None:
    lines = wordcount.generate(20_000, seed=3)
    result = run_local(wordcount.job(partitions=3), TestSource(lines, batch_size=97))
    assert result.sink("store").rows == wordcount.reference(lines)


def test_a_dataflow_count_combines_and_counts_right() -> None:
    flow = Dataflow("words", partitions=2)
    (flow.source().flat_map("split", f"{B}:split_words")
     .key_by(f"{B}:identity").reduce("count", f"{B}:count", initial=0)
     .sink("store"))
    plan = plan_graph(flow.job())
    assert [e.combine for e in plan.tasks[0].edges] == [f"{B}:count"]
    lines = ["a b a", "c a b", "a"]
    assert run_local(flow, lines).sink("store").rows == {"a": 4, "b": 2, "c": 1}

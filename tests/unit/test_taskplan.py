"""How a job's graph is cut into tasks and edges, and a task's outbound edges
on a worker (every edge's segments, sequences in the window header, restore)."""

from __future__ import annotations

import random
from typing import Any, cast

from gridstream import codec
from gridstream.examples import taxi, wordcount
from gridstream.jobspec import JobSpec, Stage, plan_tasks
from gridstream.taskplan import plan_graph, sink_row_prefix, sink_rows
from services.worker.edges import Forward, Outbound
from services.worker.peers import PeerRouter
from services.worker.shuffle import Shuffle

B = "gridstream.builtins"


def _old_plan(job: JobSpec) -> list[list[str]]:
    """The linear plan as it was before graphs: a new task at every keyed stage."""
    tasks: list[list[str]] = [[]]
    for stage in job.stages:
        if stage.keyed:
            tasks.append([stage.name])
        else:
            tasks[-1].append(stage.name)
    return tasks


def test_a_linear_job_plans_exactly_as_before() -> None:
    rng = random.Random(7)
    jobs = [taxi.job(), wordcount.job()]
    for n in range(200):
        stages = []
        for i in range(rng.randint(0, 6)):
            if rng.random() < 0.4:
                stages.append(Stage(f"s{i}", "reduce", f"{B}:count", f"{B}:identity", 0))
            else:
                stages.append(Stage(f"s{i}", "map", f"{B}:identity"))
        stages.append(Stage("out", "sink"))
        jobs.append(JobSpec(f"j{n}", tuple(stages), 4))
    for job in jobs:
        assert [[s.name for s in t] for t in plan_tasks(job)] == _old_plan(job)
        plan = plan_graph(job)
        for task in plan.tasks[:-1]:  # one keyed edge to the next task
            assert [(e.task, e.keyed) for e in task.edges] == [(task.index + 1, True)]
        assert plan.tasks[-1].edges == ()
        assert sink_row_prefix(job, plan_tasks(job)[-1]) == ""


def branching() -> JobSpec:
    """parse fans out to an append sink, a keyed count and a filter; the
    filter and the count's output meet in a union sink."""
    return JobSpec("g", (
        Stage("parse", "map", f"{B}:identity"),
        Stage("raw", "sink", mode="append"),
        Stage("count", "reduce", f"{B}:count", f"{B}:identity", 0, inputs=("parse",)),
        Stage("counts", "sink"),
        Stage("keep", "filter", f"{B}:identity", inputs=("parse",)),
        Stage("both", "map", f"{B}:identity", inputs=("count", "keep")),
        Stage("all", "sink", mode="append"),
    ), 3)


def test_a_graph_is_cut_at_keyed_stages_unions_and_fan_out() -> None:
    plan = plan_graph(branching())
    assert [[s.name for s in t.stages] for t in plan.tasks] == [
        ["parse"], ["raw"], ["count"], ["counts"], ["keep"], ["both", "all"]]
    edges = {t.index: [(e.task, e.stage.name, e.keyed) for e in t.edges] for t in plan.tasks}
    assert edges == {0: [(1, "raw", False), (2, "count", True), (4, "keep", False)],
                     1: [], 2: [(3, "counts", False), (5, "both", False)], 3: [],
                     4: [(5, "both", False)], 5: []}
    assert plan.tasks[5].inputs == (2, 4)
    assert plan.sinks == ("raw", "counts", "all")
    assert plan.task_of("all") == 5


def test_a_stage_reading_the_source_beside_another_gets_a_task_of_its_own() -> None:
    job = JobSpec("s", (Stage("a", "map", f"{B}:identity"), Stage("o1", "sink"),
                        Stage("b", "map", f"{B}:identity", inputs=("@source",)),
                        Stage("o2", "sink")), 2)
    plan = plan_graph(job)
    assert [[s.name for s in t.stages] for t in plan.tasks] == [[], ["a", "o1"], ["b", "o2"]]
    assert [(e.task, e.keyed) for e in plan.tasks[0].edges] == [(1, False), (2, False)]


def test_several_sinks_keep_their_rows_apart() -> None:
    job = branching()
    tasks = plan_tasks(job)
    assert sink_row_prefix(job, tasks[1]) == "raw/"
    assert sink_row_prefix(job, tasks[0]) == ""  # no sink in the task
    rows: dict[str, object] = {"raw/t0/p0/src/x#1:0": 1, "counts/a": 2, "counts/b/c": 3}
    assert sink_rows(job, rows, "counts") == {"a": 2, "b/c": 3}
    assert sink_rows(job, rows, "all") == {}
    try:
        sink_rows(job, rows, "nope")
    except KeyError as exc:
        assert "raw, counts, all" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("an unknown sink was accepted")


class _Router:
    async def deliver(self, job_id: str, segments: list[Any]) -> None:  # pragma: no cover
        raise AssertionError("not delivered in this test")


def _outbound(task: int, partition: int = 1) -> Outbound:
    return Outbound.of_task("job", branching(), task, partition, f"t{task}/p{partition}",
                            cast(PeerRouter, _Router()), 2)


def test_every_edge_gets_the_output_with_sequences_of_its_own() -> None:
    out = _outbound(0)
    assert [type(e) for e in out.edges] == [Forward, Shuffle, Forward]
    dead: list[Any] = []
    segments = out.split(["k1", "k2", "k3"], ["a", "b", "a"], "b#1", dead)
    forward = [s for s in segments if s.task == 1]
    assert [(s.partition, s.sequence, s.keys, s.values) for s in forward] == [
        (1, 1, ["k1", "k2"], ["a", "b"]), (1, 2, ["k3"], ["a"])]
    keyed = [s for s in segments if s.task == 2]
    assert sorted(v for s in keyed for v in s.values) == ["a", "a", "b"]
    assert all(s.keys == s.values for s in keyed)  # keyed by the count's key function
    assert {(s.task, s.channel) for s in segments} == {(1, "t0/p1"), (2, "t0/p1"),
                                                       (4, "t0/p1")}
    assert not dead
    # A further edge's records are its own (decoded), not the first edge's objects.
    record = {"x": 1}
    first, *rest = out.split(None, [record], "b#2", dead)
    assert first.values[0] is record and all(s.values[0] is not record for s in rest)
    assert all(s.values == [record] for s in rest)


def test_the_window_header_carries_every_edge_and_restore_puts_them_back() -> None:
    out = _outbound(0)
    out.split(["k"] * 5, ["a", "b", "c", "d", "e"], "b#1", [])
    header = codec.unpack(codec.pack(out.header()))
    again = _outbound(0)
    again.restore(header)
    assert [e.sequences for e in again.edges] == [e.sequences for e in out.edges]
    assert again.edges[0].sequences == {1: 3}
    # One edge: the header is what a linear task always wrote.
    single = Outbound.of_task("job", wordcount.job(partitions=4), 0, 0, "t0/p0",
                              cast(PeerRouter, _Router()), 100)
    single.split(None, ["a", "b"], "b#1", [])
    assert set(single.header()) == {"out_sequences"}
    restored = Outbound.of_task("job", wordcount.job(partitions=4), 0, 0, "t0/p0",
                                cast(PeerRouter, _Router()), 100)
    restored.restore(codec.unpack(codec.pack(single.header())))
    assert restored.edges[0].sequences == single.edges[0].sequences
    assert Outbound([]).header() == {"out_sequences": {}}


def test_a_tree_over_several_edges_completes_only_when_every_child_is_processed() -> None:
    from gridstream.ids import tuple_id
    from services.worker.tracking import TaskTracking

    root = tuple_id(0, 1, "src/p", 1)
    source = TaskTracking(is_source=True)
    source.retain(0, root)
    segments = _outbound(0).split(["k1", "k2"], ["a", "b"], "b#1", [])
    assert len({s.task for s in segments}) == 3  # a tree that branches
    children = [tuple_id(s.task, s.partition, s.channel, s.sequence) for s in segments]
    source.processed(0, root, children)
    check = root  # the registration
    check ^= source.unreported[0][1]
    downstream = []
    for n, child in enumerate(children):
        task = TaskTracking(is_source=False)
        task.retain(n, root)
        task.processed(n, child, [])
        downstream.append(task.unreported[n][1])
    for value in downstream:
        assert check != 0  # a child on some edge not yet processed keeps the tree open
        check ^= value
    assert check == 0  # every batch of every edge seen twice

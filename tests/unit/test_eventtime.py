"""Event time: watermarks carried on the segments into a window stage (the
minimum over the stage's input channels, idle ones left out), tumbling,
sliding and session windows firing once, allowed lateness and the side
output of late records, and recovery from a snapshot neither firing a window
again nor skipping one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.examples import trips
from gridstream.ids import partition_for_key
from gridstream.jobspec import JobSpec, Stage, validate
from gridstream.taskplan import plan_graph
from gridstream.testing import TestSource, run_local
from gridstream.testing._runner import _Run, source_batches
from services.worker.operators import OperatorChain
from services.worker.watermarks import event_inputs


def stamp(record: dict[str, Any]) -> float:
    return float(record["t"])


def key_of(record: dict[str, Any]) -> str:
    return str(record["k"])


def add(total: int, record: dict[str, Any]) -> int:
    return total + int(record["v"])


def key_in(partition: int, partitions: int, n: int = 0) -> str:
    """A key of ``partition``: records sent with it reach that source partition."""
    found = [k for k in (f"key{i}" for i in range(500))
             if partition_for_key(k, partitions) == partition]
    return found[n]


def flow(partitions: int = 1, *, max_delay: float = 0, idle_timeout: float | None = None,
         lateness: float = 0, **window: Any) -> Dataflow:
    f = Dataflow("ev", partitions=partitions)
    fired = (f.source().with_timestamps(stamp, max_delay=max_delay, idle_timeout=idle_timeout)
             .key_by(key_of).window("w", add, initial=0, lateness=lateness, **window))
    fired.sink("fired", mode="append")
    fired.late("late_records").sink("late", mode="append")
    return f


def run(f: Dataflow, records: list[dict[str, Any]], partitions: int = 1) -> Any:
    return run_local(f, TestSource(records, keys=[r["k"] for r in records], batch_size=1),
                     partitions=partitions)


def windows(result: Any) -> list[tuple[str, float, float, int]]:
    return sorted((r["key"], r["start"], r["end"], r["value"])
                  for r in result.sink("fired").records)


def rec(k: str, t: float, v: int = 1) -> dict[str, Any]:
    return {"k": k, "t": t, "v": v}


def test_trips_windows_fire_once_with_the_reference_values() -> None:
    keys, values = trips.generate(3_000)
    closing_keys, closing = trips.closing(4)
    result = run_local(trips.flow(4), TestSource(values + closing, keys=keys + closing_keys,
                                                 batch_size=100))
    assert trips.summaries(result.sink("summaries").records) == trips.reference(values)
    assert result.sink("late").records == [] and result.dead_letters == []


def test_tumbling_fires_when_the_watermark_passes_and_late_records_go_to_the_side() -> None:
    data = [rec("a", 1), rec("a", 4), rec("b", 9), rec("a", 25), rec("a", 5, 7), rec("a", 99)]
    result = run(flow(tumbling=10), data)
    # t=25 moved the watermark past [0, 10): it fired without the t=5 record,
    # which is late and read from the side output; [20, 30) fired at t=99.
    assert windows(result) == [("a", 0, 10, 2), ("a", 20, 30, 1), ("b", 0, 10, 1)]
    assert result.sink("late").records == [rec("a", 5, 7)]


def test_allowed_lateness_keeps_a_window_open_and_max_delay_holds_time_back() -> None:
    data = [rec("a", 1), rec("a", 25), rec("a", 5, 7), rec("a", 99)]
    assert windows(run(flow(tumbling=10, lateness=20), data)) == [
        ("a", 0, 10, 8), ("a", 20, 30, 1)]
    assert windows(run(flow(tumbling=10, max_delay=16), data)) == [
        ("a", 0, 10, 8), ("a", 20, 30, 1)]
    late = run(flow(tumbling=10, lateness=14), data)  # 25 >= 10 + 14: fired before t=5
    assert windows(late) == [("a", 0, 10, 1), ("a", 20, 30, 1)]
    assert late.sink("late").records == [rec("a", 5, 7)]


def test_sliding_and_session_windows() -> None:
    data = [rec("a", 7), rec("a", 12), rec("a", 100)]
    assert windows(run(flow(sliding=(10, 5)), data)) == [
        ("a", 0, 10, 1), ("a", 5, 15, 2), ("a", 10, 20, 1)]
    data = [rec("a", 0), rec("a", 5), rec("a", 30, 4), rec("b", 25), rec("a", 38, 2),
            rec("b", 2), rec("a", 100)]
    sessions = run(flow(session=10), data)
    assert windows(sessions) == [("a", 0, 15, 2), ("a", 30, 48, 6), ("b", 25, 35, 1)]
    assert sessions.sink("late").records == [rec("b", 2)]


def test_the_slowest_input_partition_holds_time_back_unless_idle() -> None:
    slow, fast = key_in(0, 2), key_in(1, 2)
    data = [rec(slow, 1), rec(fast, 2)] + [rec(fast, t) for t in range(10, 500, 10)]
    held = run(flow(2, tumbling=10), data, partitions=2)
    assert windows(held) == []  # partition 0 is at t=1: nothing may fire
    idle = run(flow(2, tumbling=10, idle_timeout=100), data, partitions=2)
    assert (slow, 0, 10, 1) in windows(idle) and (fast, 0, 10, 1) in windows(idle)
    # partition 0, more than 100 behind, is idle: time is partition 1's, 490
    assert (fast, 480, 490, 1) in windows(idle) and (fast, 490, 500, 1) not in windows(idle)


def window_batches(job: JobSpec, records: list[dict[str, Any]]) -> tuple[Any, list[Any]]:
    """The batches the window task of ``job`` receives, as a worker gets them."""
    local = _Run(job)
    plan = plan_graph(job)
    batches = source_batches(TestSource(records, keys=[r["k"] for r in records],
                                        batch_size=3), job.partitions)
    sent = local.process(plan.tasks[0], sorted(batches, key=lambda b: b.partition))
    return plan.tasks[1], [b for b in sent[1] if b.partition == 0]


def outputs(chain: OperatorChain, batches: list[Any], inputs: tuple[str, ...]) -> list[Any]:
    out: list[Any] = []
    for b in batches:
        result = chain.process(b.keys, b.values, b.batch_id, (b.channel, b.watermark, inputs))
        out.append(result.values)
    return out


@pytest.mark.parametrize("drop_marks", [False, True])
def test_a_task_restored_from_any_snapshot_neither_fires_again_nor_skips(
        drop_marks: bool) -> None:
    job = flow(2, tumbling=10, max_delay=3).job().with_defaults(2, 1)
    records = [rec(key_in(i % 2, 2, i % 3), t) for i, t in enumerate(range(0, 300, 2))]
    task, batches = window_batches(job, records)
    inputs = event_inputs(job, 1)
    assert inputs == ("t0/p0", "t0/p1")
    assert all(b.watermark is not None for b in batches)
    assert any(not b.values for b in batches)  # a watermark alone, to a partition
    fresh = OperatorChain(list(task.stages), "test")
    whole = outputs(fresh, batches, inputs)
    fired = [row for rows in whole for row in rows]
    assert len(fired) > 20 and len({(r["key"], r["start"]) for r in fired}) == len(fired)
    mismatches = 0
    for cut in range(len(batches)):
        before = OperatorChain(list(task.stages), "test")
        outputs(before, batches[:cut], inputs)
        saved = before.capture_full()
        after = OperatorChain(list(task.stages), "test")
        after.apply_entries([[stage, k, v] for stage, state in saved.items()
                             for k, v in state.items()
                             if not (drop_marks and stage.endswith("@wm"))])
        mismatches += outputs(after, batches[cut:], inputs) != whole[cut:]
    assert (mismatches > 0) == drop_marks


def test_the_sender_restored_from_its_header_sends_the_same_watermarks() -> None:
    job = flow(2, tumbling=10, max_delay=3).job().with_defaults(2, 1)
    records = [rec(key_in(i % 2, 2), t) for i, t in enumerate(range(0, 100, 3))]
    local = _Run(job)
    upstream = plan_graph(job).tasks[0]
    edge = local.outbound(upstream, 0)
    values = [[r] for r in records]
    first = [edge.split([r["k"] for r in v], v, f"b{i}", []) for i, v in enumerate(values)]
    marks = [[(s.partition, s.sequence, s.encode().watermark) for s in segs] for segs in first]
    header = None
    for cut in range(1, len(values)):
        again = _Run(job).outbound(upstream, 0)
        replay = _Run(job).outbound(upstream, 0)
        for i, v in enumerate(values[:cut]):
            again.split([r["k"] for r in v], v, f"b{i}", [])
        header = again.header()
        assert "event_time" in header
        replay.restore(header)
        rest = [[(s.partition, s.sequence, s.encode().watermark)
                 for s in replay.split([r["k"] for r in v], v, f"b{cut + i}", [])]
                for i, v in enumerate(values[cut:])]
        assert rest == marks[cut:]


def test_jobs_without_event_time_carry_no_watermark() -> None:
    f = Dataflow("plain", partitions=2)
    f.source().key_by(key_of).reduce("sum", add, initial=0).sink("out")
    job = f.job().with_defaults(2, 1)
    edge = _Run(job).outbound(plan_graph(job).tasks[0], 0)
    segments = edge.split(["a", "b"], [rec("a", 1), rec("b", 2)], "b0", [])
    assert segments and not any(s.encode().HasField("watermark") for s in segments)
    assert set(edge.header()) == {"out_sequences"}
    assert event_inputs(job, 1) is None


def test_window_stages_are_checked_and_travel_on_the_wire() -> None:
    job = flow(tumbling=10).job()
    assert JobSpec.from_proto(job.to_proto()) == job
    good = job.stages[0]
    for bad, message in (({"type": "hopping", "size": 1, "timestamp": "a.b:c"}, "type"),
                         ({"size": 0, "timestamp": "a.b:c"}, "size"),
                         ({"size": 5}, "timestamp"),
                         ({"type": "sliding", "size": 5, "slide": 9, "timestamp": "a.b:c"},
                          "slide"),
                         ({"size": 5, "timestamp": "a.b:c", "period": 1}, "unknown")):
        stage = Stage(good.name, "window", good.function, good.key, 0, (),
                      {"window": bad})
        with pytest.raises(InvalidArgument, match=message):
            validate(JobSpec("ev", (stage, Stage("out", "sink")), 1))
    with pytest.raises(InvalidArgument, match="with_timestamps"):
        Dataflow("x").source().key_by(key_of).window("w", add, initial=0, tumbling=1)
    with pytest.raises(InvalidArgument, match="exactly one"):
        Dataflow("x").source().with_timestamps(stamp).key_by(key_of).window(
            "w", add, initial=0, tumbling=1, session=2)


def test_snapshot_every_is_window_size_by_its_unmistakable_name() -> None:
    from gridstream.jobspec import from_mapping

    stages = [{"name": "out", "kind": "sink"}]
    assert from_mapping({"job": {"snapshot_every": 500}, "stages": stages}).window_size == 500
    assert from_mapping({"job": {"window_size": 400}, "stages": stages}).window_size == 400
    with pytest.raises(InvalidArgument, match="snapshot_every"):
        from_mapping({"job": {"snapshot_every": 5, "window_size": 6}, "stages": stages})
    assert Dataflow("d", snapshot_every=300).window_size == 300
    with pytest.raises(InvalidArgument, match="snapshot_every"):
        Dataflow("d", snapshot_every=3, window_size=4)


def is_table(record: dict[str, Any]) -> bool:
    return "name" in record


def is_event(record: dict[str, Any]) -> bool:
    return "name" not in record


def named(record: dict[str, Any], table: dict[str, Any] | None) -> list[Any]:
    return [record["k"], record["t"], None if table is None else table["name"]]


def join_flow(how: str, partitions: int = 1, max_delay: float = 0) -> Dataflow:
    f = Dataflow("join", partitions=partitions)
    source = f.source()
    events = source.filter("events", is_event).with_timestamps(stamp, max_delay=max_delay)
    table = source.filter("table", is_table).with_timestamps(stamp, max_delay=max_delay)
    joined = events.join_table("enrich", table, key=key_of, table_key=key_of, fn=named,
                               how=how)
    joined.sink("joined", mode="append")
    joined.late("late_events").sink("late", mode="append")
    return f


def name(k: str, t: float, n: str) -> dict[str, Any]:
    return {"k": k, "t": t, "name": n}


def test_a_stream_table_join_takes_the_table_as_of_each_records_time() -> None:
    data = [rec("a", 1), name("a", 2, "ann"), rec("a", 3), rec("b", 4), name("a", 9, "anna"),
            rec("a", 8), rec("a", 9), name("b", 20, "bob"), rec("a", 30), rec("a", 5),
            rec("a", 100), name("a", 100, "end")]
    left = run(join_flow("left"), data)
    # each record waits until both sides' watermarks pass its time: a at 5
    # and at 8 get ann, though anna (9) reached the join before them
    assert sorted(map(tuple, left.sink("joined").records)) == [
        ("a", 1, None), ("a", 3, "ann"), ("a", 5, "ann"), ("a", 8, "ann"), ("a", 9, "anna"),
        ("a", 30, "anna"), ("b", 4, None)]
    inner = run(join_flow("inner"), data)
    assert sorted(map(tuple, inner.sink("joined").records)) == [
        ("a", 3, "ann"), ("a", 5, "ann"), ("a", 8, "ann"), ("a", 9, "anna"), ("a", 30, "anna")]


def test_a_record_after_the_joins_watermark_goes_to_the_side_output() -> None:
    job = join_flow("left").job().with_defaults(1, 1)
    task = plan_graph(job).tasks[plan_graph(job).task_of("enrich")]
    chain = OperatorChain(list(task.stages), "test")
    inputs = ("x",)
    chain.process(["a"], [["table", "a", 2, name("a", 2, "ann")]], "b1", ("x", None, inputs))
    first = chain.process(["a"], [["stream", "a", 5, rec("a", 5)]], "b2", ("x", 10, inputs))
    assert [v["value"] for v in first.values] == [["a", 5, "ann"]]
    late = chain.process(["a"], [["stream", "a", 3, rec("a", 3)]], "b3", ("x", 11, inputs))
    assert late.values == [{"tag": "late", "key": "a", "time": 3, "record": rec("a", 3)}]


def test_the_join_does_not_depend_on_the_order_records_come_in() -> None:
    keys = [key_in(p, 2, n) for p in range(2) for n in range(3)]
    rng = random.Random(7)
    data = []
    for t in range(400):
        k = rng.choice(keys)
        data.append(name(k, t, f"n{t}") if t % 7 == 0 else rec(k, t))
    closing = [r for p in range(2) for r in (name(key_in(p, 2), 10_000, "end"),
                                             rec(key_in(p, 2), 10_000))]
    results = set()
    for shuffle_seed in range(4):  # disorder within max_delay, a different order each run
        jitter = random.Random(shuffle_seed)
        jittered = [r for _, r in sorted(((r["t"] + jitter.uniform(0, 5), i), r)
                                         for i, r in enumerate(data))]
        result = run(join_flow("left", 2, max_delay=6), jittered + closing, partitions=2)
        assert result.sink("late").records == []
        results.add(tuple(sorted(map(tuple, result.sink("joined").records))))
    assert len(results) == 1 and len(next(iter(results))) == 400 - 58  # every event once


def test_run_local_allows_the_modules_only_a_join_side_names() -> None:
    f = Dataflow("j", partitions=1)
    source = f.source()
    events = source.filter("events", is_event).with_timestamps(trips.event_time)
    table = source.filter("table", is_table).with_timestamps(trips.event_time)
    events.join_table("enrich", table, key=trips.device_of,
                      table_key=trips.device_of).sink("joined", mode="append")
    data = [{"device": "d", "t": 1, "name": "x"}, {"device": "d", "t": 2},
            {"device": "d", "t": 9, "name": "y"}, {"device": "d", "t": 9}]
    result = run_local(f, data)
    assert result.dead_letters == []
    assert result.sink("joined").records == [
        {"record": {"device": "d", "t": 2}, "table": {"device": "d", "t": 1, "name": "x"}}]


def batches_into(job: JobSpec, stage: str, records: list[Any]) -> tuple[Any, list[Any]]:
    """The task of ``stage`` and the batches its partition 0 receives, as a
    worker gets them (every task before it run as run_local runs them)."""
    local = _Run(job)
    plan = plan_graph(job)
    target = plan.task_of(stage)
    inbox = {0: source_batches(TestSource(records, keys=[r["k"] for r in records],
                                          batch_size=3), job.partitions)}
    for task in plan.tasks[:target]:
        sent = local.process(task, sorted(inbox.pop(task.index, []), key=lambda b: b.partition))
        for destination, batches in sent.items():
            inbox.setdefault(destination, []).extend(batches)
    return plan.tasks[target], [b for b in inbox[target] if b.partition == 0]


@pytest.mark.parametrize("drop_state", [False, True])
def test_a_join_restored_from_any_snapshot_emits_what_it_would_have(drop_state: bool) -> None:
    job = join_flow("left", 2, max_delay=3).job().with_defaults(2, 1)
    records = [name(key_in(i % 2, 2, i % 3), t, f"n{t}") if t % 5 == 0
               else rec(key_in(i % 2, 2, i % 3), t) for i, t in enumerate(range(0, 300, 2))]
    task, batches = batches_into(job, "enrich", records)
    inputs = event_inputs(job, task.index)
    assert inputs is not None and len(inputs) == 4  # two sides, two partitions each
    whole = outputs(OperatorChain(list(task.stages), "test"), batches, inputs)
    assert sum(len(out) for out in whole) > 30
    mismatches = 0
    for cut in range(len(batches)):
        before = OperatorChain(list(task.stages), "test")
        outputs(before, batches[:cut], inputs)
        saved = before.capture_full()
        after = OperatorChain(list(task.stages), "test")
        after.apply_entries([[stage, k, v] for stage, state in saved.items()
                             for k, v in state.items()
                             if not (drop_state and stage == "enrich")])
        mismatches += outputs(after, batches[cut:], inputs) != whole[cut:]
    assert (mismatches > 0) == drop_state

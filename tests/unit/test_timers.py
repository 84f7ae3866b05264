"""Per-key timers of ``stateful``: event-time timers fire once when the
watermark reaches them, by (time, key); deleted timers do not fire; a task
restored from a snapshot (a base and deltas) neither fires a timer again nor
skips one; a replay after a kill hands out the same recorded clock values and
fires the same processing-time timers; the TOML form is checked."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from gridstream import codec
from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.examples import trips, trips_timers
from gridstream.jobspec import JobSpec, Stage, check_imports, from_mapping, validate
from gridstream.taskplan import plan_graph
from gridstream.testing import TestSource, run_local
from gridstream.testing._runner import _Run, source_batches
from gridstream.timers import Context, Timer
from services.worker.operators import DELETED, OperatorChain
from services.worker.watermarks import event_inputs


def stamp(record: dict[str, Any]) -> float:
    return float(record["t"])


def key_of(record: dict[str, Any]) -> str:
    return str(record["k"])


def remind(state: list[Any], record: dict[str, Any], ctx: Context) -> tuple[list[Any], list[Any]]:
    """Sets an event-time timer at the record's ``at`` (deleting ``drop``),
    and a processing-time one at ``now + wait`` when given; outputs the
    clock it was handed."""
    if "at" in record:
        ctx.set_timer(record["at"])
    if "drop" in record:
        ctx.delete_timer(record["drop"])
    if "wait" in record:
        ctx.set_processing_timer(ctx.now() + record["wait"])
    if "unwait" in record:
        ctx.delete_processing_timer(record["unwait"])
    return [*state, record.get("v")], [["saw", ctx.key, ctx.now(), ctx.random()]]


def fired(state: list[Any], timer: Timer, ctx: Context) -> tuple[list[Any], list[Any]]:
    """Outputs what fired, for which key, with the clocks and the state."""
    return [], [[timer.domain, ctx.key, timer.time, ctx.now(), ctx.watermark, state]]


def timed_flow(partitions: int = 1, max_delay: float = 0) -> Dataflow:
    f = Dataflow("timed", partitions=partitions)
    out = (f.source().with_timestamps(stamp, max_delay=max_delay).key_by(key_of)
           .stateful("remind", remind, initial=[], on_timer=fired))
    out.sink("out", mode="append")
    return f


def run(records: list[dict[str, Any]], times: list[float] | None = None, partitions: int = 1,
        max_delay: float = 0) -> list[Any]:
    source = TestSource(records, keys=[r["k"] for r in records], batch_size=1, times=times)
    result = run_local(timed_flow(partitions, max_delay), source, partitions=partitions)
    assert not result.dead_letters, result.dead_letters
    return result.sink("out").records


def timers_fired(out: list[Any]) -> list[Any]:
    return [row[:3] for row in out if row[0] != "saw"]


def test_event_timers_fire_once_when_the_watermark_passes_by_time_then_key() -> None:
    records = [{"k": "b", "t": 1, "at": 5}, {"k": "a", "t": 2, "at": 5},
               {"k": "c", "t": 3, "at": 4}, {"k": "a", "t": 4, "at": 5},  # the same timer
               {"k": "z", "t": 5}, {"k": "z", "t": 9}, {"k": "z", "t": 20}]
    out = run(records)
    assert timers_fired(out) == [["event", "c", 4], ["event", "a", 5], ["event", "b", 5]]
    by_key = {row[1]: row for row in out if row[0] == "event"}
    assert by_key["a"][4] == 5 and by_key["a"][5] == [None, None]  # watermark, state
    assert out.index(["event", "c", 4, 0.0, 4, [None]]) == 4  # after the record at t=4


def test_keys_of_other_partitions_fire_by_the_minimum_watermark() -> None:
    records = [{"k": f"k{i}", "t": i, "at": 50 - i} for i in range(20)]
    records += [{"k": f"k{i}", "t": 100} for i in range(20)]
    out = run(records, partitions=3, max_delay=10)
    assert sorted(timers_fired(out)) == sorted(["event", f"k{i}", 50 - i] for i in range(20))


def test_deleted_timers_do_not_fire() -> None:
    records = [{"k": "a", "t": 1, "at": 5}, {"k": "a", "t": 2, "at": 6},
               {"k": "a", "t": 3, "drop": 5}, {"k": "b", "t": 3, "wait": 10},
               {"k": "b", "t": 4, "unwait": 110}, {"k": "c", "t": 30}]
    out = run(records, times=[100, 100, 100, 100, 101, 500])
    assert timers_fired(out) == [["event", "a", 6]]


def test_processing_timers_fire_with_the_first_batch_whose_recorded_time_reaches_them() -> None:
    records = [{"k": "a", "t": 1, "wait": 10}, {"k": "b", "t": 2, "wait": 5},
               {"k": "c", "t": 3}, {"k": "c", "t": 4}, {"k": "c", "t": 5}]
    out = run(records, times=[100, 101, 104, 90, 200])  # a clock never goes back
    assert [row[2] for row in out if row[0] == "saw"] == [100, 101, 104, 104, 200]
    assert [row[:4] for row in out if row[0] == "processing"] == [
        ["processing", "b", 106, 200], ["processing", "a", 110, 200]]
    assert out.index(["processing", "b", 106, 200, 4, [None]]) == 4  # before the last record


def test_a_stateful_without_timers_keeps_its_signature() -> None:
    f = Dataflow("plain", partitions=1)
    f.source().stateful("count", "tests.unit.test_timers:count", key=key_of,
                        initial=0).sink("out")
    assert "timers" not in f.job().stages[1].params
    assert run_local(f, [{"k": "a"}, {"k": "a"}]).results() == {"a": 2}


def count(state: int, record: Any) -> tuple[int, list[int]]:
    return state + 1, [state + 1]


def chain_batches(records: list[dict[str, Any]], times: list[float], partitions: int = 2
                  ) -> tuple[Any, list[Any], tuple[str, ...]]:
    """The timed task of the flow and the batches its partition 0 receives,
    as a worker gets them (each with its recorded time)."""
    job = timed_flow(partitions, max_delay=3).job().with_defaults(partitions, 1)
    plan = plan_graph(job)
    batches = source_batches(TestSource(records, keys=[r["k"] for r in records], batch_size=2,
                                        times=times), partitions)
    sent = _Run(job).process(plan.tasks[0], sorted(batches, key=lambda b: b.partition))
    inputs = event_inputs(job, 1)
    assert inputs is not None
    return plan.tasks[1], [b for b in sent[1] if b.partition == 0], inputs


def outputs(chain: OperatorChain, batches: list[Any], inputs: tuple[str, ...]) -> list[Any]:
    return [list(chain.process(b.keys, b.values, b.batch_id, (b.channel, b.watermark, inputs),
                               b.time).sink_rows.values()) for b in batches]


def workload() -> tuple[list[dict[str, Any]], list[float]]:
    records: list[dict[str, Any]] = []
    for i in range(120):
        record: dict[str, Any] = {"k": f"k{i % 7}", "t": i, "at": i + (i % 5) * 4, "v": i}
        if i % 3 == 0:
            record["wait"] = i % 4
        if i % 11 == 0:
            record["drop"] = i + 8
        records.append(record)
    return records, [1000.0 + i * 0.5 for i in range(len(records))]


def saved_entries(saved: dict[str, dict[Any, Any]]) -> list[list[Any]]:
    """A captured state as a restore applies it, through msgpack."""
    entries = [[stage, k] if v is DELETED else [stage, k, v]
               for stage, state in saved.items() for k, v in state.items()]
    return list(codec.unpack(codec.pack(entries)))


@pytest.mark.parametrize("drop", ["", "@timers", "@wm"])
def test_a_task_restored_from_a_base_and_a_delta_neither_fires_again_nor_skips(
        drop: str) -> None:
    task, batches, inputs = chain_batches(*workload())
    whole = outputs(OperatorChain(list(task.stages), "test"), batches, inputs)
    assert sum(row[0] == "event" for rows in whole for row in rows) > 20
    assert sum(row[0] == "processing" for rows in whole for row in rows) > 5
    mismatches = 0
    for base in range(0, len(batches), 3):
        for cut in (base, min(len(batches), base + 4)):
            before = OperatorChain(list(task.stages), "test")
            outputs(before, batches[:base], inputs)
            full = before.capture_full()
            outputs(before, batches[base:cut], inputs)
            delta = before.capture_delta()
            after = OperatorChain(list(task.stages), "test")
            for saved in (full, delta):
                after.apply_entries([e for e in saved_entries(saved)
                                     if not (drop and e[0].endswith(drop))])
            mismatches += outputs(after, batches[cut:], inputs) != whole[cut:]
    assert (mismatches > 0) == bool(drop)


def test_a_replay_after_a_kill_sees_the_same_clock_and_fires_the_same_timers() -> None:
    task, batches, inputs = chain_batches(*workload())
    for snapshot_at in (0, 5, 11):
        first = OperatorChain(list(task.stages), "test")
        outputs(first, batches[:snapshot_at], inputs)
        saved = first.capture_full()
        emitted = outputs(first, batches[snapshot_at:], inputs)  # then the worker dies
        replaced = OperatorChain(list(task.stages), "test")
        replaced.apply_entries(saved_entries(saved))
        replayed = outputs(replaced, batches[snapshot_at:], inputs)  # from the queue copy
        assert replayed == emitted
        clocks = [row[2] for rows in replayed for row in rows if row[0] == "saw"]
        assert clocks and clocks == sorted(clocks) and clocks[0] >= 1000


def test_trips_come_out_in_event_time_order_whatever_order_they_arrive_in() -> None:
    keys, values = trips.generate(2000, drivers_every=0, seed=5)
    closing_keys, closing_values = trips.closing(3)
    f = Dataflow("ordered", partitions=3)
    timed = (f.source().map("parse", trips.parse).filter("trips", trips.is_trip)
             .with_timestamps(trips.event_time, max_delay=trips.JITTER_S))
    trips_timers.add_in_order(timed)
    result = run_local(f, TestSource(values + closing_values, keys=keys + closing_keys))
    verdict, differ = trips_timers.check(result.results("ordered"), values)
    assert verdict.ok and verdict.keys == 50 and not differ, (verdict, differ)
    assert not trips_timers.problems(result.results("ordered"), values)
    wrong = {d: [*s[:5], s[5] + 1] if d == "1000" else s
             for d, s in result.results("ordered").items()}
    assert trips_timers.problems(wrong, values) == [
        "1 devices' released trips differ, e.g. ['1000']"]


TIMED_TOML = """
[job]
name = "timed"

[[stages]]
name = "remind"
kind = "stateful"
function = "tests.unit.test_timers:remind"
key = "tests.unit.test_timers:key_of"
initial = []

[stages.params.timers]
on_timer = "tests.unit.test_timers:fired"
timestamp = "tests.unit.test_timers:stamp"
max_delay = 2

[[stages]]
name = "out"
kind = "sink"
mode = "append"
"""


def test_timers_in_toml_are_checked_and_run() -> None:
    job = from_mapping(tomllib.loads(TIMED_TOML))
    check_imports(job, ("tests",))
    assert event_inputs(job.with_defaults(1, 1), 1) is not None  # event-time aware
    records = [{"k": "a", "t": 1, "at": 3}, {"k": "b", "t": 10}]
    out = run_local(job, TestSource(records, keys=["a", "b"], batch_size=1), partitions=1)
    assert timers_fired(out.sink("out").records) == [["event", "a", 3]]
    for bad, says in (({"on_timer": "nope"}, "import path"),
                      ({"on_timer": "m:f", "colour": 1}, "unknown timers settings"),
                      ({"on_timer": "m:f", "max_delay": 3}, "need a timestamp"),
                      ({"timestamp": "m:f", "max_delay": -1}, "max_delay")):
        stage = Stage("s", "stateful", "m:f", key="m:k", initial=0, params={"timers": bad})
        with pytest.raises(InvalidArgument, match=says):
            validate(JobSpec("j", stages=(stage, Stage("o", "sink"))))
    with pytest.raises(InvalidArgument, match="on_timer"):
        Dataflow("x").source().key_by(key_of).stateful("s", remind, on_timer=count)

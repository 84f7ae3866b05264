"""The windowed stream-stream join (inner and left, tumbling and sliding) and
watermarks carried past a first event-time stage: a window of windows, a
join after a window, through a fan-out; each fires once, in an order that
does not depend on how records arrive, and a task restored from any
snapshot emits what it would have."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gridstream.dataflow import Dataflow
from gridstream.errors import InvalidArgument
from gridstream.jobspec import JobSpec, Stage, validate
from gridstream.testing import TestSource, run_local
from services.worker.operators import OperatorChain
from services.worker.watermarks import event_inputs, time_plan
from tests.unit.test_eventtime import add, batches_into, key_in, key_of, outputs, stamp


def is_left(record: dict[str, Any]) -> bool:
    return record["s"] in ("l", "close")


def is_right(record: dict[str, Any]) -> bool:
    return record["s"] in ("r", "close")


def fired_key(fired: dict[str, Any]) -> str:
    return str(fired["key"])


def add_fired(total: int, fired: dict[str, Any]) -> int:
    return total + int(fired["value"])


def rec(s: str, k: str, t: int, v: int = 1) -> dict[str, Any]:
    return {"s": s, "k": k, "t": t, "v": v}


def closing(partitions: int) -> list[dict[str, Any]]:
    """A far-future record in every source partition: every window fires."""
    return [rec("close", key_in(p, partitions, 7), 10**6) for p in range(partitions)]


def join_flow(how: str, partitions: int = 2, **window: Any) -> Dataflow:
    f = Dataflow("wj", partitions=partitions)
    src = f.source()
    left = src.filter("left", is_left).with_timestamps(stamp, max_delay=5)
    right = src.filter("right", is_right).with_timestamps(stamp, max_delay=5)
    joined = left.join_window("j", right, key=key_of, how=how, **(window or {"tumbling": 10}))
    joined.sink("joined", mode="append")
    joined.late("late_j").sink("late", mode="append")
    return f


def run(f: Dataflow, records: list[dict[str, Any]], partitions: int = 2,
        batch_size: int = 2) -> Any:
    return run_local(f, TestSource(records, keys=[r["k"] for r in records],
                                   batch_size=batch_size), partitions=partitions)


def pairs(result: Any, sink: str = "joined") -> list[tuple[Any, ...]]:
    """(key, left time, right time) per joined record, each key's in the
    order they came (partitions come out one after another)."""
    return sorted([(r["left"]["k"], r["left"]["t"], r["right"] and r["right"]["t"])
                   for r in result.sink(sink).records if r["left"]["s"] != "close"],
                  key=lambda p: p[0])


def test_inner_and_left_window_joins_give_every_pair_of_a_window_once() -> None:
    a, b = key_in(0, 2), key_in(1, 2)
    records = [rec("l", a, 1), rec("r", a, 3), rec("r", a, 2), rec("l", a, 4),
               rec("l", b, 5), rec("r", a, 12), rec("l", a, 15), rec("l", a, 8),
               *closing(2)]
    inner = run(join_flow("inner"), records)
    assert pairs(inner) == [(a, 1, 2), (a, 1, 3), (a, 4, 2), (a, 4, 3), (a, 8, 2), (a, 8, 3),
                            (a, 15, 12)]
    left = run(join_flow("left"), records)
    assert pairs(left) == sorted([(a, 1, 2), (a, 1, 3), (a, 4, 2), (a, 4, 3), (a, 8, 2),
                                  (a, 8, 3), (a, 15, 12), (b, 5, None)], key=lambda p: p[0])
    assert not inner.sink("late").records and not left.sink("late").records


def test_a_sliding_window_join_joins_a_pair_once_per_window_it_shares() -> None:
    a = key_in(0, 2)
    records = [rec("l", a, 6), rec("r", a, 8), rec("l", a, 14), *closing(2)]
    result = run(join_flow("inner", sliding=(10, 5)), records)
    starts = [(r["left"]["t"], r["right"]["t"]) for r in result.sink("joined").records
              if r["left"]["s"] != "close"]
    assert starts == [(6, 8), (6, 8), (14, 8)]  # windows [0, 10), [5, 15), [5, 15)


def test_the_window_join_does_not_depend_on_the_order_records_come_in() -> None:
    keys = [key_in(p % 2, 2, p // 2) for p in range(4)]
    rng = random.Random(5)
    base = [rec(rng.choice("lr"), rng.choice(keys), t, rng.randrange(3))
            for t in range(0, 200, 2)]
    expected = None
    for seed in range(4):
        shuffled = list(base)
        jitter = random.Random(seed)
        for i in range(len(shuffled) - 1):  # swaps within max_delay keep every record on time
            if jitter.random() < 0.4 and shuffled[i + 1]["t"] - shuffled[i]["t"] <= 4:
                shuffled[i], shuffled[i + 1] = shuffled[i + 1], shuffled[i]
        result = run(join_flow("left"), shuffled + closing(2))
        got = [(r["left"], r["right"]) for r in result.sink("joined").records]
        assert not result.sink("late").records
        assert expected is None or got == expected
        expected = got
    assert expected is not None and len(expected) > 50


def test_a_record_whose_windows_fired_goes_to_the_side_output() -> None:
    records = [rec("l", "a", 1), rec("l", "a", 50), rec("r", "a", 40), rec("r", "a", 3),
               *closing(1)]
    result = run(join_flow("left", 1), records, 1, batch_size=1)
    assert pairs(result) == [("a", 1, None), ("a", 50, None)]
    assert result.sink("late").records == [rec("r", "a", 3)]


@pytest.mark.parametrize("drop_state", [False, True])
def test_a_window_join_restored_from_any_snapshot_emits_what_it_would_have(
        drop_state: bool) -> None:
    job = join_flow("left").job().with_defaults(2, 1)
    rng = random.Random(1)
    records = [rec(rng.choice("lr"), key_in(i % 2, 2, i % 3), t) for i, t in
               enumerate(range(0, 300, 2))]
    task, batches = batches_into(job, "j", records)
    inputs = event_inputs(job, task.index, 0)
    assert inputs is not None and len(inputs) == 4  # two sides, two partitions each
    whole = outputs(OperatorChain(list(task.stages), "test"), batches, inputs)
    assert sum(len(out) for out in whole) >= 20
    mismatches = 0
    for cut in range(len(batches)):
        before = OperatorChain(list(task.stages), "test")
        outputs(before, batches[:cut], inputs)
        saved = before.capture_full()
        after = OperatorChain(list(task.stages), "test")
        after.apply_entries([[stage, k, v] for stage, state in saved.items()
                             for k, v in state.items() if not (drop_state and stage == "j")])
        mismatches += outputs(after, batches[cut:], inputs) != whole[cut:]
    assert (mismatches > 0) == drop_state


def chained_flow(fan_out: bool) -> Dataflow:
    """Per-10 windows, a per-20 window of them, and the windows joined with
    the raw records; with ``fan_out`` the fired windows are also sunk, so
    they reach the second stages through a task of their own."""
    f = Dataflow("chain", partitions=2)
    timed = f.source().filter("left", is_left).with_timestamps(stamp, max_delay=5)
    tens = timed.key_by(key_of).window("tens", add, initial=0, tumbling=10)
    if fan_out:
        tens.sink("tens_out", mode="append")
    tens.key_by(fired_key).window("twenties", add_fired, initial=0,
                                  tumbling=20).sink("twenties_out", mode="append")
    tens.join_window("with_raw", timed, key=fired_key, right_key=key_of, tumbling=10,
                     how="left").sink("joined", mode="append")
    return f


@pytest.mark.parametrize("fan_out", [False, True])
def test_a_second_event_time_stage_hears_the_first_ones_watermark(fan_out: bool) -> None:
    a, b = key_in(0, 2), key_in(1, 2, 1)
    records = [rec("l", k, t, t) for t in range(0, 60, 3) for k in (a, b)] + closing(2)
    job = chained_flow(fan_out).job().with_defaults(2, 1)
    times = time_plan(job)
    assert times.hears and times.carries
    result = run(chained_flow(fan_out), records)
    twenties = sorted((r["key"], r["start"], r["value"])
                      for r in result.sink("twenties_out").records)
    want = sorted((k, s, sum(t for t in range(0, 60, 3) if s <= t < s + 20))
                  for k in (a, b) for s in (0, 20, 40))
    assert twenties == want
    joined = result.sink("joined").records
    assert len(joined) == 2 * 20  # every raw record with its window's sum
    assert all(r["left"]["start"] <= r["right"]["t"] < r["left"]["end"] for r in joined)


def test_window_join_stages_are_checked_and_travel_in_toml_form() -> None:
    tag = {"side": "left", "key": "tests.unit.test_eventtime:key_of",
           "time": "tests.unit.test_eventtime:stamp"}
    window = {"type": "tumbling", "size": 10, "how": "left",
              "timestamp": "gridstream.eventtime:tagged_time"}

    def job(**change: Any) -> JobSpec:
        return JobSpec("wj", [
            Stage("l", "map", "gridstream.eventtime:tag", params=tag),
            Stage("r", "map", "gridstream.eventtime:tag", inputs=("@source",),
                  params={**tag, "side": "right"}),
            Stage("j", "join", "gridstream.eventtime:both", "gridstream.eventtime:tagged_key",
                  inputs=("l", "r"), params={"window": {**window, **change}}),
            Stage("out", "sink", inputs=("j",), mode="append")])

    validate(job())
    for bad in ({"type": "session", "gap": 3}, {"how": "outer"}, {"type": "inner"}):
        with pytest.raises(InvalidArgument):
            validate(job(**bad))
    timed = Dataflow("x").source().with_timestamps(stamp)
    with pytest.raises(InvalidArgument, match="how must be"):
        timed.join_window("j", timed, key=key_of, tumbling=10, how="outer")
